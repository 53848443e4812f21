"""Fuzzing ``parse_completion`` + ``verify_completion`` with mutated completion bodies.

The seeds are the real vLLM bodies in ``tests/data/vllm_responses`` (re-signed
with a real Kiln fingerprint, as ``tests/probe/test_verify.py`` does) and
reference-style bodies built by ``tests/probe/teacher_server.py``.  Everything
goes through the public ``parse_completion``, so a fast path inside it is
held to the same answers as the slow one.  Properties: only ``ProbeFailed`` /
``IdentityMismatch`` with a ``probe.*`` rule ever escapes; every structurally
invalid mutation is refused; every semantically neutral one (unknown fields,
as vLLM 0.33 adds, key order anywhere -- rows are maps, as in Kiln's
remote_teacher.rs --, white space, escapes, number spelling, decoded tokens of
any JSON type) is accepted with exactly the same result; random
byte edits either are refused or yield a result that satisfies the invariants.
Every body is also parsed by ``probe.candidate_scan.parse_completion_fast``, which
must give exactly the strict parser's answer: the same columns, or the same
refusal (rule and message).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiln_registry.domain.errors import IdentityMismatch, KilnError, ProbeFailed
from kiln_registry.probe.candidate_scan import parse_completion_fast
from kiln_registry.probe.parse import ParsedCompletion, parse_completion, response_body_limit
from kiln_registry.probe.verify import RowsCheck
from tests.probe.teacher_server import completion_body, make_identity
from tests.probe.test_verify import FP, check
from tests.probe.test_verify import captured as captured_case
from tests.reliability.strategies import (
    attempt,
    fuzz_settings,
    json_values,
    mutated_bytes,
    mutated_text,
    spell,
    spellings,
)

CAPTURED = ("pl1", "pl1_greedy_tail", "pl32", "fp32_pl32_64tok")
VOCAB = 512
REFUSALS = (ProbeFailed, IdentityMismatch)
OTHER_FP = make_identity(base="d" * 64).fingerprint()
_ROW_SENTINEL = "\x00fuzz-row\x00"


@dataclass
class Probe:
    """A body to check: the decoded top-level object, or raw bytes once edited as text."""

    top: Any
    prompt: list[int]
    k: int
    raw: bytes | None = None

    def body(self) -> bytes:
        return self.raw if self.raw is not None else encode(self.top)

    def plp(self) -> list[Any]:
        value: list[Any] = self.top["choices"][0]["prompt_logprobs"]
        return value


def encode(top: object) -> bytes:
    return json.dumps(top, separators=(",", ":"), ensure_ascii=False).encode()


@cache
def _captured(name: str) -> tuple[str, tuple[int, ...], int]:
    top, prompt, k = captured_case(name)
    return json.dumps(top), tuple(prompt), k


@st.composite
def probes(draw: st.DrawFn) -> Probe:
    """A valid body: a captured vLLM body (mostly the small ones) or a reference-style one."""
    source = draw(st.sampled_from((*CAPTURED[:3], *CAPTURED[:3], CAPTURED[3], "reference")))
    if source != "reference":
        text, seed_prompt, seed_k = _captured(source)
        return Probe(json.loads(text), list(seed_prompt), seed_k)
    prompt = draw(st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=12))
    k = draw(st.integers(1, 32))
    inside = draw(st.booleans())
    body = completion_body(model="teacher-tiny", fingerprint=FP, prompt=prompt, k=k, inside=inside)
    return Probe(json.loads(body), prompt, k)


def run(target: str, probe: Probe) -> RowsCheck | KilnError:
    body = probe.body()
    assert_paths_agree(body, probe)
    outcome = attempt(
        target,
        lambda: check(body, probe.prompt, probe.k),
        refusal=REFUSALS,
        prefixes=("probe.",),
    )
    if isinstance(outcome, RowsCheck):
        assert_invariants(outcome, probe)
    return outcome


def _parsed(parse: object, body: bytes, probe: Probe) -> ParsedCompletion | tuple[str, ...]:
    assert callable(parse)
    try:
        value = parse(
            body,
            expected_prompt_len=len(probe.prompt),
            k=probe.k,
            vocab_size=VOCAB,
            max_candidates=1_000_000,
        )
    except ProbeFailed as exc:
        return (type(exc).__name__, str(exc.rule), exc.message)
    assert isinstance(value, ParsedCompletion)
    return value


def assert_paths_agree(body: bytes, probe: Probe) -> None:
    """The fast path returns exactly what the strict parser returns, refusals included."""
    strict = _parsed(parse_completion, body, probe)
    fast = _parsed(parse_completion_fast, body, probe)
    assert fast == strict, f"fast path {fast!r:.300} != strict parser {strict!r:.300}"


def assert_invariants(result: RowsCheck, probe: Probe) -> None:
    rows = len(probe.prompt) - 1
    assert list(result.actual_ids) == probe.prompt[1:]
    assert result.topk_ids.shape == result.topk_logprobs.shape == (rows, probe.k)
    lps = np.concatenate([result.actual_logprobs.ravel(), result.topk_logprobs.ravel()])
    assert np.all(np.isfinite(lps)) and np.all(lps <= 0.0)
    assert np.all(np.diff(result.topk_logprobs, axis=1) <= 0.0)
    assert result.fingerprint == FP


def same_result(a: RowsCheck, b: RowsCheck) -> bool:
    names = ("actual_ids", "actual_logprobs", "actual_ranks", "topk_ids", "topk_logprobs")
    return all(np.array_equal(getattr(a, n), getattr(b, n)) for n in names) and (
        a.candidate_count,
        a.min_row_width,
        a.max_row_width,
    ) == (b.candidate_count, b.min_row_width, b.max_row_width)


# --- structurally invalid mutations: each must be refused ---------------------------------

# ``st.DrawFn`` or ``st.DataObject.draw``: the mutators are used from both.
Draw = Callable[[st.SearchStrategy[Any]], Any]
Mutation = Callable[[Draw, Probe], bool]  # False: not applicable to this body


def _row(draw: Draw, probe: Probe, min_width: int = 1) -> dict[str, Any] | None:
    rows = [r for r in probe.plp()[1:] if len(r) >= min_width]
    return draw(st.sampled_from(rows)) if rows else None


def _candidate(draw: Draw, probe: Probe) -> dict[str, Any]:
    row = _row(draw, probe)
    assert row is not None
    key: str = draw(st.sampled_from(sorted(row)))
    cand: dict[str, Any] = row[key]
    return cand


def _set_pairs(row: dict[str, Any], pairs: list[tuple[str, Any]]) -> None:
    row.clear()
    row.update(pairs)


def bad_logprob(draw: Draw, probe: Probe) -> bool:
    cand = _candidate(draw, probe)
    cand["logprob"] = draw(
        st.floats(min_value=2.0**-100, max_value=2.0**100, width=32)  # positive
        | st.floats(max_value=-3.4028235677973366e38, allow_infinity=False)  # float32 overflow
        | st.sampled_from(["-1.0", None, True, [], {}, 10**400, -(10**400), 1e-100])
    )
    return True


def nonfinite_literal(draw: Draw, probe: Probe) -> bool:
    _candidate(draw, probe)["logprob"] = -1234.5  # float32-exact, unique in every seed body
    literal = draw(st.sampled_from(("NaN", "Infinity", "-Infinity", "-1e999", "1e999", "-NaN")))
    probe.raw = probe.body().replace(b"-1234.5", literal.encode(), 1)
    return True


def bad_rank(draw: Draw, probe: Probe) -> bool:
    bad = st.sampled_from([0, -1, VOCAB + 1, 10**30, 1.0, "1", True, None, [1]])
    _candidate(draw, probe)["rank"] = draw(bad)
    return True


def bad_token_key(draw: Draw, probe: Probe) -> bool:
    row = _row(draw, probe)
    assert row is not None
    pairs = list(row.items())
    at = draw(st.integers(0, len(pairs) - 1))
    key = pairs[at][0]
    forms = ("0{}", "+{}", " {}", "{} ", "{}.0", "-{}", "{}e0", "\uff11{}", "")
    new = draw(st.sampled_from(forms)).format(key) or str(VOCAB + draw(st.integers(0, 10**6)))
    pairs[at] = (new, pairs[at][1])
    _set_pairs(row, pairs)
    return True


def duplicate_id(draw: Draw, probe: Probe) -> bool:
    plp = probe.plp()
    pos = draw(st.integers(1, len(plp) - 1))
    pairs = list(plp[pos].items())
    pairs.insert(draw(st.integers(0, len(pairs))), draw(st.sampled_from(pairs)))
    plp[pos] = _ROW_SENTINEL
    row_text = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in pairs) + "}"
    probe.raw = probe.body().replace(json.dumps(_ROW_SENTINEL).encode(), row_text.encode(), 1)
    return True


def reorder_topk(draw: Draw, probe: Probe) -> bool:
    """Shuffle the ranks of a row's top-K candidates (distinct logprobs, so no tie saves it).

    Their wire order is not shuffled here: rows are maps (a neutral edit).
    """
    row = _row(draw, probe, min_width=3)
    if row is None:
        return False
    pairs = list(row.items())
    if len({cand["logprob"] for _, cand in pairs[1:]}) != len(pairs) - 1:
        return False
    order = draw(st.permutations(range(1, len(pairs))))
    if order == sorted(order):
        order = order[1:] + order[:1]
    ranks = [pairs[i][1]["rank"] for i in order]
    for (_, cand), rank in zip(pairs[1:], ranks, strict=True):
        cand["rank"] = rank
    return True


def misplace_actual(draw: Draw, probe: Probe) -> bool:
    """Drop the observed prompt token of a row (moving it is neutral: rows are maps)."""
    row = _row(draw, probe)
    assert row is not None
    pairs = list(row.items())
    pairs.pop(0)
    _set_pairs(row, pairs)
    return True


def raise_logprob(draw: Draw, probe: Probe) -> bool:
    """A top-K logprob above the one before it, or an outside token above the K-th."""
    row = _row(draw, probe, min_width=3)
    pairs = list(row.items()) if row is not None else []
    if row is not None and pairs[1][1]["logprob"] < 0.0:
        at = draw(st.integers(2, len(pairs) - 1))
        pairs[at][1]["logprob"] = pairs[at - 1][1]["logprob"] / 2 if at > 1 else 0.0
        if pairs[at - 1][1]["logprob"] < 0.0:
            return True
    outside = [r for r in probe.plp()[1:] if len(r) == probe.k + 1]
    if not outside:
        return False
    chosen = draw(st.sampled_from(outside))
    last = list(chosen.values())[-1]["logprob"]
    if last >= 0.0:
        return False
    next(iter(chosen.values()))["logprob"] = last / 2
    return True


def extra_candidate(draw: Draw, probe: Probe) -> bool:
    row = _row(draw, probe)
    assert row is not None
    free = [t for t in range(VOCAB) if str(t) not in row]
    token = draw(st.sampled_from(free))
    lowest = min(cand["logprob"] for cand in row.values())  # never ties the observed token
    row[str(token)] = {
        "logprob": lowest - 1.0,
        "rank": draw(st.integers(1, VOCAB)),
        "decoded_token": "",
    }
    return True


def too_much_mass(draw: Draw, probe: Probe) -> bool:
    row = _row(draw, probe, min_width=2)
    if row is None:
        return False
    for cand in row.values():
        cand["logprob"] = 0.0
    return True


def bad_rows(draw: Draw, probe: Probe) -> bool:
    plp = probe.plp()
    kind = draw(st.sampled_from(("drop", "extra", "first", "type", "empty", "cand")))
    pos = draw(st.integers(1, len(plp) - 1))
    if kind == "drop":
        plp.pop(pos)
    elif kind == "extra":
        plp.append(copy.deepcopy(plp[pos]))
    elif kind == "first":
        plp[0] = draw(st.sampled_from(({}, copy.deepcopy(plp[pos]), 0, [])))
    elif kind == "type":
        plp[pos] = draw(st.sampled_from((None, [], 0, "row", list(plp[pos].items()))))
    elif kind == "empty":
        plp[pos] = {}
    else:
        cand = _candidate(draw, probe)
        cand.pop(draw(st.sampled_from(("logprob", "rank"))))
    return True


def bad_envelope(draw: Draw, probe: Probe) -> bool:
    top, choice = probe.top, probe.top["choices"][0]
    kind = draw(st.sampled_from(("object", "model", "usage", "index", "choices", "top", "fp")))
    if kind == "object":
        top["object"] = draw(st.text().filter(lambda s: s != "text_completion") | json_values)
    elif kind == "model":
        top["model"] = draw(st.text().filter(lambda s: s != "teacher-tiny") | json_values)
    elif kind == "usage":
        top["usage"] = draw(
            st.sampled_from((None, [], {}, {"prompt_tokens": len(probe.prompt) + 1}))
        )
    elif kind == "index":
        choice["index"] = draw(st.sampled_from((1, -1, None, "0", 0.0, True)))
    elif kind == "choices":
        top["choices"] = draw(st.sampled_from(([], [choice, choice], choice, None)))
    elif kind == "top":
        probe.top = draw(st.sampled_from(([top], None, "body", 0)))
    else:
        fingerprint = draw(mutated_text(FP).filter(lambda s: s != FP))
        top["system_fingerprint"] = draw(st.sampled_from((fingerprint, OTHER_FP, None, 1)))
    return True


def bad_bytes(draw: Draw, probe: Probe) -> bool:
    body = probe.body()
    kind = draw(st.sampled_from(("utf8", "oversize", "truncate", "trailing", "dup_key")))
    if kind == "utf8":
        at = body.index(b'"model":"') + len(b'"model":"')
        probe.raw = (
            body[:at] + draw(st.sampled_from((b"\xff", b"\xc3", b"\xed\xa0\x80"))) + body[at:]
        )
    elif kind == "oversize":
        limit = response_body_limit(len(probe.prompt), probe.k)
        probe.raw = body + b" " * (limit - len(body) + draw(st.integers(1, 4096)))
    elif kind == "truncate":
        probe.raw = body[: draw(st.integers(0, len(body) - 1))]
    elif kind == "trailing":
        probe.raw = body + draw(st.sampled_from((b"x", b"{}", b"\x00", b",")))
    else:
        probe.raw = body[:-1] + b',"model":"teacher-tiny"}'
    return True


INVALID: dict[str, Mutation] = {
    f.__name__: f
    for f in (
        bad_logprob,
        nonfinite_literal,
        bad_rank,
        bad_token_key,
        duplicate_id,
        reorder_topk,
        misplace_actual,
        raise_logprob,
        extra_candidate,
        too_much_mass,
        bad_rows,
        bad_envelope,
        bad_bytes,
    )
}


@fuzz_settings(3)
@given(probes(), st.sampled_from(sorted(INVALID)), st.data())
def test_invalid_mutations_are_refused(probe: Probe, name: str, data: st.DataObject) -> None:
    if not INVALID[name](data.draw, probe):
        extra_candidate(data.draw, probe)
    outcome = run("probe_body.invalid", probe)
    assert isinstance(outcome, KilnError), f"{name}: an invalid body was accepted"


@fuzz_settings()
@given(probes(), st.data())
def test_a_wrong_prompt_is_refused(probe: Probe, data: st.DataObject) -> None:
    at = data.draw(st.integers(1, len(probe.prompt) - 1))
    # Not a token the row lists: in a K-wide row any listed token may be the observed one
    # (rows are maps in Kiln's remote_teacher.rs), so that prompt would be consistent.
    listed = probe.plp()[at]
    probe.prompt[at] = data.draw(st.integers(0, VOCAB - 1).filter(lambda t: str(t) not in listed))
    assert isinstance(run("probe_body.wrong_prompt", probe), KilnError)


# --- semantically neutral mutations: each must be accepted with the same result -----------


def _is_row(obj: dict[str, object]) -> bool:
    return bool(obj) and all(isinstance(v, dict) and "logprob" in v for v in obj.values())


unknown_keys = st.text(max_size=12).map(lambda s: "x-" + s)


@st.composite
def neutral_edits(draw: Draw, probe: Probe) -> None:
    top, choice = probe.top, probe.top["choices"][0]
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(
            st.sampled_from(("top", "choice", "usage", "candidate", "token", "order", "cosmetic"))
        )
        if kind in ("top", "choice", "usage"):
            target = {"top": top, "choice": choice, "usage": top["usage"]}[kind]
            target[draw(unknown_keys)] = draw(json_values)
        elif kind == "candidate":
            _candidate(draw, probe)[draw(unknown_keys)] = draw(json_values)
        elif kind == "token":
            cand = _candidate(draw, probe)
            if draw(st.booleans()):
                cand.pop("decoded_token", None)
            else:
                cand["decoded_token"] = draw(json_values)  # Kiln ignores it, any type
        elif kind == "order":
            row = _row(draw, probe)
            assert row is not None
            _set_pairs(row, draw(st.permutations(list(row.items()))))
        else:
            key = draw(st.sampled_from(("id", "created", "service_tier")))
            top[key] = draw(json_values)
            choice[draw(st.sampled_from(("text", "finish_reason", "token_ids")))] = draw(
                json_values
            )


@pytest.mark.slow
@fuzz_settings(2)
@given(probes(), st.data())
def test_neutral_mutations_are_accepted_unchanged(probe: Probe, data: st.DataObject) -> None:
    baseline = check(probe.body(), probe.prompt, probe.k)
    if data.draw(st.booleans()):
        data.draw(neutral_edits(probe))
    if data.draw(st.booleans()):
        probe.raw = spell(probe.top, data.draw(spellings()), keep_order=_is_row).encode("utf-8")
    outcome = run("probe_body.neutral", probe)
    assert isinstance(outcome, RowsCheck), f"a neutral edit was refused: {outcome}"
    assert same_result(outcome, baseline)


@fuzz_settings(3)
@given(probes().flatmap(lambda p: st.tuples(st.just(p), mutated_bytes(p.body()))))
def test_random_byte_edits_never_crash(case: tuple[Probe, bytes]) -> None:
    probe, body = case
    probe.raw = body
    run("probe_body.byte_edit", probe)


def _surrogate_body(edit: str) -> Probe:
    text, prompt, k = _captured("pl1")
    top = json.loads(text)
    if edit in ("object", "model"):
        top[edit] = "x\ud800"
    elif edit == "stock_fingerprint":
        top["system_fingerprint"] = "vllm-\ud800"
    elif edit == "token_key":
        row = top["choices"][0]["prompt_logprobs"][1]
        first, second = list(row.items())
        _set_pairs(row, [first, ("\ud800", second[1])])
    body = json.dumps(top).encode()  # ensure_ascii: the surrogate travels as \ud800
    if edit == "duplicate_key":
        body = body[:-1] + b', "\\ud800": 1, "\\ud800": 2}'
    return Probe(top, list(prompt), k, raw=body)


@pytest.mark.parametrize(
    "edit", ["object", "model", "stock_fingerprint", "token_key", "duplicate_key"]
)
def test_lone_surrogate_escapes_are_refused(edit: str) -> None:
    assert isinstance(run("probe_body.surrogate", _surrogate_body(edit)), ProbeFailed)
