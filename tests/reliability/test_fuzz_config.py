"""Fuzzing ``load_config`` with generated and mutated kiln.toml files.

Documents are drawn key by key from known-good and known-bad values (unknown
keys, wrong types, non-canonical origins, bad variable names, out-of-range and
huge numbers, NaN, bad ids, clashing ports, refused vLLM options), written as
real TOML files and loaded.  Properties: only ``ConfigError`` with a
``config.*`` or ``policy.*`` rule escapes; a document with no planted fault
loads and keeps its values; a document with any planted fault is refused; raw
byte edits, invalid UTF-8 and oversized files are refused or load validly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiln_registry.config.loader import MAX_CONFIG_BYTES, load_config
from kiln_registry.config.settings import KilnConfig
from kiln_registry.domain.errors import ConfigError, KilnError
from tests.reliability.strategies import attempt, fuzz_settings, mutated_bytes, to_toml

PREFIXES = ("config.", "policy.")
TOML_INT_MAX = 2**63 - 1


@dataclass
class Doc:
    """A kiln.toml document as nested tables, and the faults planted in it."""

    data: dict[str, Any] = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)


# --- values ---------------------------------------------------------------------------------

toml_scalars = (
    st.booleans()
    | st.integers(-TOML_INT_MAX - 1, TOML_INT_MAX)
    | st.floats()
    | st.text(st.characters(codec="utf-8"), max_size=20)
)
toml_values = st.recursive(
    toml_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=6).map(lambda s: "x-" + s), inner, max_size=3)
    ),
    max_leaves=6,
)
_KINDS: dict[str, st.SearchStrategy[object]] = {
    "str": st.text(max_size=8),
    "int": st.integers(-TOML_INT_MAX - 1, TOML_INT_MAX),
    "float": st.floats(),
    "bool": st.booleans(),
    "list": st.lists(st.integers(0, 9), max_size=2),
    "table": st.fixed_dictionaries({"x-a": st.integers(0, 9)}),
}
# Kinds a field of each kind refuses (a float field also takes TOML integers).
_WRONG = {
    "str": ("int", "float", "bool", "list", "table"),
    "int": ("str", "float", "bool", "list", "table"),
    "float": ("str", "bool", "list", "table"),
    "bool": ("str", "int", "float", "list", "table"),
    "list": ("str", "int", "float", "bool", "table"),
}
FIELD_KIND = {
    "port": "int", "max_top_k": "int", "max_model_len": "int", "workers": "int",
    "concurrency": "int", "max_prompt_logprob_candidates": "int",
    "probe_timeout_s": "float", "ready_deadline_s": "float", "local_launch_deadline_s": "float",
    "cache": "bool", "vllm_args": "list", "devices": "list",
}  # fmt: skip


@dataclass(frozen=True)
class Choice:
    good: st.SearchStrategy[object]
    bad: st.SearchStrategy[object]


def seconds(high: float) -> Choice:
    return Choice(
        st.floats(min_value=0.001, max_value=high),
        st.sampled_from((0.0, -1.0, high * 2, math.nan, math.inf, -math.inf)),
    )


def relative_paths() -> st.SearchStrategy[object]:
    return st.sampled_from(("data/a.db", "x", "/var/lib/kiln/x", "./rel/../y", "é/ü"))


GOOD_ORIGINS = (
    "https://teacher.example.com:8443",
    "https://a.b",
    "https://127.0.0.1:9000",
    "https://[::1]:8443",
    "https://xn--bcher-kva.example",
    "https://[2001:db8::1]",
)
BAD_ORIGINS = (
    "http://a.com",
    "https://A.com",
    "https://a.com:443",
    "https://a.com/",
    "https://a.com/p",
    "https://u@a.com",
    "https://a.com:0",
    "https://a.com:99999",
    "https:/a.com",
    "",
    "https://a.com?x",
    " https://a.com",
    "https://[::0001]",
    "https://bücher.example",
)
BAD_PATHS = st.sampled_from(("", "~/x", "~", "a\x00b", "x" * 4097))
SERVER = {
    "host": Choice(
        st.sampled_from(("127.0.0.1", "localhost", "::1", "0.0.0.0", "teacher.example.com")),
        st.sampled_from(("Example.COM", "[::1]", "", "a..b", "-a", "host name", "::g")),
    ),
    "database": Choice(relative_paths(), BAD_PATHS),
    "log_format": Choice(st.sampled_from(("text", "json")), st.sampled_from(("TEXT", "xml", ""))),
    "legacy_registry": Choice(relative_paths(), BAD_PATHS),
    "probe_timeout_s": seconds(600.0),
    "teacher_ca_file": Choice(relative_paths(), BAD_PATHS),
    "local_launch_deadline_s": seconds(86400.0),
}
CREDENTIAL = {
    "origin": Choice(st.sampled_from(GOOD_ORIGINS), st.sampled_from(BAD_ORIGINS)),
    "api_key_env": Choice(
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,30}", fullmatch=True),
        st.sampled_from(("", "1ABC", "KEY-NAME", "sk-live-123", "A" * 129, "KEY NAME", "KÉY")),
    ),
}
GOOD_ARGS = ("--seed=0", "--gpu-memory-utilization=0.9", "--max-num-seqs=4", "--enforce-eager")
BAD_ARGS = ("--api-key=x", "--host=0.0.0.0", "--port=1", "--trust-remote-code", "--bogus", "--seed")
JOBS = {
    "workers": Choice(st.integers(1, 16), st.sampled_from((0, 17, -1, TOML_INT_MAX))),
    "concurrency": Choice(st.integers(1, 64), st.sampled_from((0, 65, -(2**63)))),
    "devices": Choice(
        st.lists(st.sampled_from(("cpu", "cuda:0", "cuda:1", "cuda:15")), min_size=1, unique=True),
        st.sampled_from(([], ["gpu"], ["cuda:01"], ["cpu", "cpu"], ["cuda:10000"], ["cpu"] * 65)),
    ),
    "corpus_root": Choice(relative_paths(), BAD_PATHS),
    "result_root": Choice(relative_paths(), BAD_PATHS),
    "cache": Choice(st.booleans(), st.nothing()),
}
good_ids = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)
bad_ids = st.sampled_from(("", "a.b", "x" * 65, "é", "a b", "a/b"))


class Builder:
    """Draws one document; every deliberately invalid part is named in ``doc.faults``."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.doc = Doc()
        # None: faults anywhere at a 10% rate; else at most the fault point with this index.
        self.only: int | None = draw(st.none() | st.sampled_from(range(40)))
        self.points = 0

    def faulty(self) -> bool:
        self.points += 1
        if self.only is None:
            return self.draw(st.integers(0, 9)) == 0
        return self.points - 1 == self.only

    def value(self, table: dict[str, Any], key: str, choice: Choice, where: str) -> None:
        kind = FIELD_KIND.get(key, "str")
        if self.faulty():
            if self.draw(st.booleans()):
                table[key] = self.draw(st.sampled_from(_WRONG[kind]).flatmap(_KINDS.__getitem__))
                self.doc.faults.append(f"{where}.{key}: wrong type")
                return
            bad = self.draw(st.none() | choice.bad)
            if bad is not None:
                table[key] = bad
                self.doc.faults.append(f"{where}.{key}: bad value {bad!r}"[:120])
                return
        table[key] = self.draw(choice.good)

    def optional(self, table: dict[str, Any], spec: dict[str, Choice], where: str) -> None:
        for key in self.draw(st.lists(st.sampled_from(sorted(spec)), unique=True)):
            self.value(table, key, spec[key], where)

    def unknown_key(self, table: dict[str, Any], where: str) -> None:
        if self.faulty():
            table["x-" + self.draw(st.text(max_size=10))] = self.draw(toml_values)
            self.doc.faults.append(f"{where}: unknown key")

    def entry_id(self, taken: dict[str, Any], where: str) -> str:
        if self.faulty():
            new = self.draw(bad_ids)
            if new not in taken:
                self.doc.faults.append(f"{where}: bad id {new!r}")
                return new
        return self.draw(good_ids.filter(lambda i: i not in taken))

    def required(self, table: dict[str, Any], key: str, value: object, where: str) -> None:
        if self.faulty() and self.draw(st.booleans()):
            self.doc.faults.append(f"{where}.{key}: missing")
            return
        table[key] = value

    def ports(self, count: int) -> list[int]:
        ports: list[int] = self.draw(
            st.lists(st.integers(1, 65535), min_size=count, max_size=count, unique=True)
        )
        return ports

    def local(self, port: int, server_port: int, where: str) -> dict[str, Any]:
        table: dict[str, Any] = {}
        for key in ("model_path", "snapshot_root", "cache_root"):
            self.value(table, key, Choice(relative_paths(), BAD_PATHS), where)
        served = Choice(
            st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,40}", fullmatch=True),
            st.sampled_from(("-x", "", "a b", "x" * 257, ".x", "é")),
        )
        optional = {"adapter_path": Choice(relative_paths(), BAD_PATHS), "served_model_id": served}
        optional["ready_deadline_s"] = seconds(86400.0)
        self.optional(table, optional, where)
        self.value(table, "max_top_k", Choice(st.integers(1, 65536), st.just(65537)), where)
        model_len = Choice(st.integers(1, 16_777_216), st.sampled_from((0, 16_777_217)))
        self.value(table, "max_model_len", model_len, where)
        self.candidates(table, where)
        clash = self.faulty()
        table["port"] = server_port if clash else port
        if clash:
            self.doc.faults.append(f"{where}.port: repeats server.port")
        args = list(self.draw(st.lists(st.sampled_from(GOOD_ARGS), unique=True)))
        if self.faulty():
            args.insert(self.draw(st.integers(0, len(args))), self.draw(st.sampled_from(BAD_ARGS)))
            self.doc.faults.append(f"{where}.vllm_args: refused option")
        keep_empty: bool = self.draw(st.booleans())
        if args or keep_empty:
            table["vllm_args"] = args
        self.unknown_key(table, where)
        return table

    def candidates(self, table: dict[str, Any], where: str) -> None:
        k, length = table.get("max_top_k"), table.get("max_model_len")
        if type(k) is not int or type(length) is not int or not self.draw(st.booleans()):
            return
        ceiling = min(1_000_000, length * (k + 1))
        if ceiling < 1:  # max_model_len is already a planted fault
            return
        if self.faulty():
            bad = [0, 1_000_001] + ([ceiling + 1] if ceiling < 1_000_000 else [])
            table["max_prompt_logprob_candidates"] = self.draw(st.sampled_from(bad))
            self.doc.faults.append(f"{where}.max_prompt_logprob_candidates: out of range")
        else:
            table["max_prompt_logprob_candidates"] = self.draw(st.integers(1, ceiling))

    def teachers(self, ports: list[int], server_port: int) -> dict[str, Any]:
        credentials: dict[str, Any] = {}
        for _ in range(self.draw(st.integers(0, 3))):
            entry = self.entry_id(credentials, "teachers.credentials")
            where = f"teachers.credentials.{entry}"
            table: dict[str, Any] = {}
            for key, choice in CREDENTIAL.items():
                self.value(table, key, choice, where)
            self.unknown_key(table, where)
            credentials[entry] = table
        local: dict[str, Any] = {}
        for port in ports:
            entry = self.entry_id(local, "teachers.local")
            local[entry] = self.local(port, server_port, f"teachers.local.{entry}")
        return {"credentials": credentials, "local": local}

    def build(self) -> Doc:
        data = self.doc.data
        server_port, *local_ports = self.ports(1 + self.draw(st.integers(0, 2)))
        server: dict[str, Any] = {}
        self.value(
            server, "port", Choice(st.just(server_port), st.sampled_from((0, 65536))), "server"
        )
        self.optional(server, SERVER, "server")
        self.unknown_key(server, "server")
        data["server"] = server
        student = Choice(st.just("student"), st.sampled_from(("missing-dir", "kiln.toml", "")))
        data["student"] = {}
        self.value(data["student"], "model_path", student, "student")
        teachers = self.teachers(local_ports, server_port)
        if any(teachers.values()) or self.draw(st.booleans()):
            data["teachers"] = teachers
        jobs: dict[str, Any] = {}
        self.optional(jobs, JOBS, "jobs")
        data["jobs"] = jobs
        self.unknown_key(data, "the top level")
        if self.faulty():
            section = self.draw(st.sampled_from(("server", "student", "jobs")))
            if self.draw(st.booleans()) or section != "student":
                data[section] = self.draw(st.sampled_from((1, "x", [1], True)))
                self.doc.faults.append(f"{section}: not a table")
            else:
                del data[section]
                self.doc.faults.append("student: missing")
        return self.doc


@st.composite
def documents(draw: st.DrawFn) -> Doc:
    return Builder(draw).build()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a student model (config.json, tokenizer.json) beside kiln.toml."""
    root = tmp_path_factory.mktemp("fuzz-config")
    (root / "student").mkdir()
    (root / "student" / "config.json").write_text('{"vocab_size": 8}')
    (root / "student" / "tokenizer.json").write_text("{}")
    return root


def load(target: str, workdir: Path, data: bytes) -> KilnConfig | KilnError:
    path = workdir / "kiln.toml"
    path.write_bytes(data)
    return attempt(target, lambda: load_config(path), refusal=ConfigError, prefixes=PREFIXES)


def assert_kept(config: KilnConfig, data: dict[str, Any], workdir: Path) -> None:
    assert config.server.port == data["server"]["port"]
    assert config.student.model_path == workdir / "student"
    teachers = data.get("teachers", {})
    for entry, table in teachers.get("credentials", {}).items():
        credential = config.teachers.credentials[entry]
        assert (credential.origin, credential.api_key_env) == (
            table["origin"],
            table["api_key_env"],
        )
    assert set(config.teachers.local) == set(teachers.get("local", {}))
    ports = [config.server.port] + [p.port for p in config.teachers.local.values()]
    assert len(set(ports)) == len(ports)


@pytest.mark.slow
@fuzz_settings(3)
@given(documents())
def test_generated_documents(workdir: Path, doc: Doc) -> None:
    text = to_toml(doc.data)
    outcome = load("config.generated", workdir, text.encode("utf-8"))
    if doc.faults:
        assert isinstance(outcome, ConfigError), f"accepted despite {doc.faults}:\n{text}"
    else:
        assert isinstance(outcome, KilnConfig), f"refused a valid file: {outcome}\n{text}"
        assert_kept(outcome, doc.data, workdir)


@fuzz_settings(2)
@given(documents().flatmap(lambda d: mutated_bytes(to_toml(d.data).encode("utf-8"))))
def test_byte_edits_never_crash(workdir: Path, data: bytes) -> None:
    load("config.byte_edit", workdir, data)


@fuzz_settings(0.2)
@given(documents(), st.sampled_from(("oversize", "utf8", "bom", "nul")), st.data())
def test_bad_encodings_and_sizes_are_refused(
    workdir: Path, doc: Doc, kind: str, data: st.DataObject
) -> None:
    raw = to_toml(doc.data).encode("utf-8")
    at = data.draw(st.integers(0, len(raw)))
    if kind == "oversize":
        raw += b"#" + b"x" * (MAX_CONFIG_BYTES - len(raw) + data.draw(st.integers(0, 4096)))
    elif kind == "utf8":
        raw = raw[:at] + data.draw(st.sampled_from((b"\xff", b"\xc3", b"\xed\xa0\x80"))) + raw[at:]
    elif kind == "bom":
        raw = b"\xef\xbb\xbf" + raw
    else:
        raw = raw[:at] + b"\x00" + raw[at:]
    assert isinstance(load("config.encoding", workdir, raw), ConfigError)
