"""``kiln demo``: a tiny model, a reference teacher and the registry, end to end.

Owns the demo run: the cached tiny model (``<cache>/model-v1``, built into a
temporary directory beside it and renamed into place only when complete;
reused when its ``complete.json`` still matches every file), the two child
processes (``kiln reference-teacher`` on a free loopback port and
``kiln serve`` with a generated ``kiln.toml`` whose student is the same model
and whose database lives in a temporary work directory), the registration
through the HTTP API with ``RegistryClient``, and the shutdown (at once, or
with ``--keep`` when Ctrl-C arrives).  The tiny model's tokenizer has a chat
template, so off-policy generation jobs run against the demo too.

Shutdown is unconditional: on success, failure, Ctrl-C or SIGTERM every child
gets SIGTERM on its own process group, then SIGKILL after a grace period, is
reaped, and the work directory is removed.  While cleaning up, further
SIGINT/SIGTERM are ignored so the cleanup cannot be cut short.  On Linux the
children also get SIGTERM if the demo itself dies (``PR_SET_PDEATHSIG``).

The child processes and the cleanup live in ``kiln_registry.demo.processes``.

Imports: standard library, httpx (the teacher's ``/health``, its failures mapped by
the client's ``translate_errors``), platformdirs and kiln_registry's client,
errors, ``demo.processes`` and (inside ``ensure_demo_model``) the tiny model
builder; torch only through that builder and the child processes.  No
network beyond loopback.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import platformdirs

from kiln_registry.client.core import translate_errors
from kiln_registry.client.sync import RegistryClient, RegistryClientError
from kiln_registry.demo.processes import Child, DemoRun, cleaned_up, free_port, wait_for
from kiln_registry.domain.errors import InputError, LauncherError

RESULT_SCHEMA = "kiln.demo-result.v1"
MODEL_DIR_NAME = "model-v2"  # v2: the tokenizer has a chat template (generation jobs)
COMPLETE_NAME = "complete.json"
COMPLETE_SCHEMA = "kiln.demo-model.v1"
SERVED_MODEL_ID = "kiln-demo-teacher"
ALIAS = "demo-teacher@reference"
MAX_TOP_K = 8
MAX_MODEL_LEN = 256
TEACHER_START_S = 180.0
REGISTRY_START_S = 60.0
REGISTRY_ATTEMPTS = 3
MAX_MODEL_FILES = 64
KEPT_POLL_S = 0.5
# A plain role-tagged template: the off-policy generation job renders prompts with it.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
EXAMPLE_PROMPTS = (
    {"id": "hello", "messages": [{"role": "user", "content": "the teacher says hello"}]},
    {"id": "cat", "messages": [{"role": "system", "content": "be brief"},
                               {"role": "user", "content": "a cat"}]},
)  # fmt: skip

Builder = Callable[[Path], object]


def default_cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("kiln-registry")) / "demo"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _model_files(model: Path) -> dict[str, dict[str, Any]]:
    names = sorted(p.name for p in model.iterdir())
    if len(names) > MAX_MODEL_FILES:
        raise InputError(f"{model} holds more than {MAX_MODEL_FILES} files", rule="demo.model")
    files = {}
    for name in names:
        path = model / name
        if path.is_symlink() or not path.is_file():
            raise InputError(f"{path} is not a regular file", rule="demo.model")
        files[name] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    return files


def model_is_complete(root: Path) -> bool:
    """True when ``root/complete.json`` matches every file of ``root/model`` exactly."""
    try:
        record = json.loads((root / COMPLETE_NAME).read_text(encoding="utf-8"))
        return bool(
            record.get("schema") == COMPLETE_SCHEMA
            and record.get("files") == _model_files(root / "model")
        )
    except (OSError, ValueError, AttributeError, InputError):
        return False


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (deepest first), then ``root``."""
    for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        _fsync(path)
    _fsync(root)


def _default_builder(dest: Path) -> object:
    from kiln_registry.testing.tiny_models import build_tiny_llama

    model = build_tiny_llama(dest)
    config_path = dest / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return model


def _install(staging: Path, root: Path) -> None:
    """Rename ``staging`` to ``root``, replacing an incomplete entry; a complete one wins."""
    if root.exists() and not model_is_complete(root):
        stale = Path(tempfile.mkdtemp(prefix=f".stale-{MODEL_DIR_NAME}-", dir=root.parent))
        os.rename(root, stale / "old")
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(staging, root)
    except OSError:
        if not model_is_complete(root):  # else another demo installed a good copy first
            raise
    _fsync(root.parent)


def ensure_demo_model(cache_dir: Path, *, build: Builder = _default_builder) -> tuple[Path, bool]:
    """The demo model directory and whether it was reused from the cache.

    A missing or incomplete cache entry is rebuilt in a temporary directory
    beside it, recorded in ``complete.json``, fsynced and renamed into place.
    """
    root = cache_dir / MODEL_DIR_NAME
    if model_is_complete(root):
        return root / "model", True
    staging: Path | None = None
    try:
        cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIR_NAME}-", dir=cache_dir))
        build(staging / "model")
        record = {"schema": COMPLETE_SCHEMA, "files": _model_files(staging / "model")}
        (staging / COMPLETE_NAME).write_text(json.dumps(record, indent=2) + "\n", "utf-8")
        _fsync_tree(staging)
        _install(staging, root)
    except OSError as exc:
        raise LauncherError(
            f"could not build the demo model under {cache_dir} ({type(exc).__name__}: {exc})",
            rule="demo.model_cache",
            hint="check the cache directory, or pass --cache-dir",
        ) from exc
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return root / "model", False


def require_reference_extra() -> None:
    modules = ("torch", "transformers", "safetensors")
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise InputError(
            f"kiln demo needs {', '.join(missing)} (the 'reference' extra)",
            rule="demo.extra",
            hint="pip install -e '.[reference]'",
        )


def _startup_line(child: Child) -> dict[str, Any] | None:
    try:
        text = child.stdout.read_bytes()[:65536].decode("utf-8", errors="replace")
    except OSError:
        return None
    if "\n" not in text:
        return None
    try:
        line = json.loads(text.split("\n", 1)[0])
    except ValueError:
        raise child.failed("printed an unexpected first line") from None
    if not isinstance(line, dict) or not isinstance(line.get("url"), str):
        raise child.failed("printed a startup line without a url")
    return line


def _healthy(url: str) -> bool | None:
    """True once the teacher answers ``GET /health`` with 200; None while it cannot yet.

    The client's transport seam (``client.core.translate_errors``) turns httpx's
    failures into ``RegistryClientError``, as for the registry itself.
    """
    try:
        with translate_errors(url), httpx.Client(trust_env=False, timeout=2.0) as http:
            return True if http.get(f"{url}/health").status_code == 200 else None
    except RegistryClientError:
        return None


def spawn_teacher(run: DemoRun, model: Path) -> Child:
    """``kiln reference-teacher`` on a free loopback port (it prints its URL when listening)."""
    return run.spawn(
        "reference teacher",
        ["reference-teacher", "--model-path", str(model), "--served-model-id", SERVED_MODEL_ID,
         "--max-top-k", str(MAX_TOP_K), "--max-model-len", str(MAX_MODEL_LEN),
         "--host", "127.0.0.1", "--port", "0"],
    )  # fmt: skip


def wait_teacher(child: Child) -> dict[str, Any]:
    """The teacher's startup line, once its /health answers."""
    deadline = time.monotonic() + TEACHER_START_S
    line: dict[str, Any] = wait_for(child, deadline, "listen", lambda: _startup_line(child))
    wait_for(child, deadline, "answer /health", lambda: _healthy(line["url"]))
    return line


def _toml_string(value: str) -> str:
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise InputError("a demo path contains a control character", rule="demo.path")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_config(work_dir: Path, model: Path, port: int) -> Path:
    path = work_dir / "kiln.toml"
    path.write_text(
        "# Generated by `kiln demo`; removed when the demo ends.\n"
        f'[server]\nhost = "127.0.0.1"\nport = {port}\n'
        f"database = {_toml_string(str(work_dir / 'registry.db'))}\n\n"
        f"[student]\nmodel_path = {_toml_string(str(model))}\n",
        encoding="utf-8",
    )
    return path


def _registry_up(client: RegistryClient) -> bool | None:
    try:
        client.health()
    except RegistryClientError:
        return None
    return True


def start_registry(run: DemoRun, model: Path) -> tuple[Child, str]:
    """``kiln serve`` on a free loopback port (retried when another process took the port)."""
    for attempt in range(1, REGISTRY_ATTEMPTS + 1):
        port = free_port()
        config = write_config(run.work_dir, model, port)
        child = run.spawn("registry", ["serve", "--config", str(config)])
        url = f"http://127.0.0.1:{port}"
        with RegistryClient(url, timeout=2.0) as client:
            try:
                up = functools.partial(_registry_up, client)
                wait_for(child, time.monotonic() + REGISTRY_START_S, "answer /health", up)
            except LauncherError:
                if attempt < REGISTRY_ATTEMPTS and "address already in use" in child.tail().lower():
                    continue
                raise
        return child, url
    raise AssertionError("unreachable")  # pragma: no cover


def _register(registry_url: str, teacher_url: str) -> dict[str, Any]:
    with RegistryClient(registry_url, timeout=60.0) as client:
        entry = client.register_teacher(
            alias=ALIAS,
            kind="remote",
            provider="vllm",
            model_id=SERVED_MODEL_ID,
            url=teacher_url,
            notes="registered by `kiln demo`: eager Transformers reference teacher on CPU",
        )
        listed = [e.spec.alias for e in client.list_teachers()]
    if entry.off_policy_manifest is None or ALIAS not in listed:
        raise LauncherError("the registry did not publish the demo teacher", rule="demo.register")
    return entry.model_dump(mode="json", by_alias=True)


def _quiet(text: str) -> None:
    del text


def write_example_prompts(work_dir: Path) -> Path:
    """``prompts.jsonl`` in the work dir: two prompts for ``kiln jobs submit --prompts``."""
    path = work_dir / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in EXAMPLE_PROMPTS), encoding="utf-8")
    return path


def hold(run: DemoRun) -> None:
    """Keep the children running until Ctrl-C / SIGTERM (KeyboardInterrupt) or one dies."""
    while True:
        for child in run.children:
            if child.process.poll() is not None:
                raise child.failed("stopped while the demo was kept running")
        time.sleep(KEPT_POLL_S)


def run_demo(
    cache_dir: Path | None = None,
    *,
    progress: Callable[[str], None] = _quiet,
    build: Builder = _default_builder,
    on_kept: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Build or reuse the model, start both servers, register, stop everything.

    Returns the result document (``kiln.demo-result.v1``) after every child
    has been stopped and the work directory removed.  With ``on_kept`` (``kiln
    demo --keep``) the result goes to ``on_kept`` once registered, and both
    servers keep running until Ctrl-C or SIGTERM (``KeyboardInterrupt``, raised
    after the same cleanup) or until one of them dies (a ``LauncherError``).
    """
    require_reference_extra()
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    progress(f"tiny model: {cache / MODEL_DIR_NAME}")
    model, reused = ensure_demo_model(cache, build=build)
    progress("tiny model reused from the cache" if reused else "tiny model built")
    run = DemoRun(Path(tempfile.mkdtemp(prefix="kiln-demo-")))
    result: dict[str, Any] = {"schema": RESULT_SCHEMA, "work_dir": str(run.work_dir)}
    with cleaned_up(run):
        progress(f"work dir {run.work_dir}; starting the reference teacher and the registry")
        teacher = spawn_teacher(run, model)
        progress(f"reference teacher pid {teacher.process.pid} is loading the model")
        registry, registry_url = start_registry(run, model)
        progress(f"registry pid {registry.process.pid} at {registry_url}")
        line = wait_teacher(teacher)
        progress(f"reference teacher at {line['url']}")
        progress(f"registering {ALIAS}")
        entry = _register(registry_url, line["url"])
        result.update(
            model_path=str(model),
            model_reused=reused,
            teacher={"url": line["url"], "pid": teacher.process.pid,
                     "served_model_id": SERVED_MODEL_ID, "fingerprint": line.get("fingerprint")},
            registry={"url": registry_url, "pid": registry.process.pid},
            entry=entry,
            off_policy_manifest=entry["off_policy_manifest"],
            example_prompts=str(write_example_prompts(run.work_dir)),
        )  # fmt: skip
        if on_kept is not None:
            on_kept(result)
            hold(run)
        progress("registered; stopping the registry and the teacher")
    result["stopped"] = all(c.process.poll() is not None for c in run.children)
    result["work_dir_removed"] = not run.work_dir.exists()
    return result
