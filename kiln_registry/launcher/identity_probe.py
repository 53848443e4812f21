"""The identity probe: accelerator and Transformers tokenizer view, in one child.

Torch and Transformers are never imported into the launcher (or a registry
server that drives it): the accelerator (``launcher.accelerator``) and the
tokenizer digests through Transformers (``model.tokenizer.tokenizer_digests``
with ``use_transformers=True``, the view vLLM uses, cross-checked against the
``tokenizers`` view) are measured by one child,
``python -m kiln_registry.launcher.identity_probe``, started exactly like
vLLM under the exact child environment.  It starts before the snapshot is
staged, so its imports overlap the staging and the runtime digest:

1. it measures the accelerator (importing torch) and prints it as one line
   of canonical JSON;
2. it imports Transformers, then reads one JSON request from stdin,
   ``{"model_dir": DIR, "model_width": N}`` (the staged model), and prints
   ``{"config_sha256", "vocab_sha256"}`` as a second line.  An empty stdin
   ends it with status 0 (the launch failed before it needed the tokenizer).

Errors: the child prints one line on stderr and exits 2; the parent raises
``LauncherError`` (``launcher.child``) or, for output of the wrong shape,
``launcher.probe_output``.  The values are the ones the launcher computed
in-process before (same functions, same inputs).

Imports: standard library, ``kiln_registry.domain.errors``,
``kiln_registry.identity``, ``kiln_registry.model.tokenizer`` and the
launcher's ``accelerator`` / ``children``; torch and Transformers only in the
child's ``main``.  Nothing happens at import time.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Mapping

from kiln_registry.domain.errors import KilnError, LauncherError
from kiln_registry.identity.canonical import canonical_json, strict_json_loads
from kiln_registry.identity.input_manifest import MAX_INPUT_BYTES, Accelerator, parse_accelerator
from kiln_registry.launcher.accelerator import accelerator_identity
from kiln_registry.launcher.children import HelperChild
from kiln_registry.model.tokenizer import TokenizerDigests, tokenizer_digests

PROBE_MODULE = "kiln_registry.launcher.identity_probe"
PROBE_TIMEOUT_SECONDS = 300.0
_HEX64 = frozenset("0123456789abcdef")


class IdentityProbe:
    """The running probe child (parent side); ``close()`` always."""

    def __init__(self, env: Mapping[str, str], *, python: str) -> None:
        self.child = HelperChild(
            [python, "-m", PROBE_MODULE], env, what="identity probe", stdin=True
        )
        self.accelerator_s: float | None = None
        self._accelerator: Accelerator | None = None
        self.tokenizer_s: float | None = None

    def accelerator(self) -> Accelerator:
        """The first line: the accelerator identity (read once, then kept)."""
        if self._accelerator is None:
            line = self.child.read_line(self.child.started + PROBE_TIMEOUT_SECONDS)
            self.accelerator_s = time.monotonic() - self.child.started
            value = strict_json_loads(
                line, what="accelerator probe output", max_bytes=MAX_INPUT_BYTES
            )
            self._accelerator = parse_accelerator(value, "accelerator probe output")
        return self._accelerator

    def tokenizer(self, model_dir: str, model_width: int) -> TokenizerDigests:
        """Ask for the tokenizer digests of ``model_dir``; the second line answers."""
        request = {"model_dir": model_dir, "model_width": model_width}
        self.child.send(json.dumps(request).encode() + b"\n")
        self.accelerator()
        deadline = time.monotonic() + PROBE_TIMEOUT_SECONDS
        value = strict_json_loads(
            self.child.finish(deadline), what="tokenizer probe output", max_bytes=MAX_INPUT_BYTES
        )
        self.tokenizer_s = time.monotonic() - self.child.started
        return _digests(value)

    def close(self) -> None:
        self.child.close()


def _malformed(what: str) -> LauncherError:
    return LauncherError(f"the tokenizer probe printed {what}", rule="launcher.probe_output")


def _digests(value: object) -> TokenizerDigests:
    keys = ("config_sha256", "entries", "vocab_sha256")
    if not isinstance(value, dict) or sorted(value) != list(keys):
        raise _malformed("an unexpected document")
    vocab, config, entries = value["vocab_sha256"], value["config_sha256"], value["entries"]
    for digest in (vocab, config):
        if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX64:
            raise _malformed("a malformed digest")
    if not isinstance(entries, int) or isinstance(entries, bool) or entries < 0:
        raise _malformed("a malformed count")
    return TokenizerDigests(vocab_sha256=vocab, config_sha256=config, entries=entries)


def _request(line: bytes) -> tuple[str, int]:
    value = strict_json_loads(line, what="identity probe request", max_bytes=MAX_INPUT_BYTES)
    if not isinstance(value, dict) or sorted(value) != ["model_dir", "model_width"]:
        raise LauncherError("malformed identity probe request", rule="launcher.probe_request")
    model_dir, width = value["model_dir"], value["model_width"]
    if not isinstance(model_dir, str) or not isinstance(width, int) or isinstance(width, bool):
        raise LauncherError("malformed identity probe request", rule="launcher.probe_request")
    return model_dir, width


def _preload_transformers() -> None:
    """Import Transformers' tokenizer classes now, while the parent stages the snapshot."""
    # A missing or broken install is reported by tokenizer_digests, with its hint.
    with contextlib.suppress(Exception):
        from transformers import AutoTokenizer  # noqa: F401


def main() -> int:
    """The child: accelerator line, then (on request) the tokenizer line."""
    try:
        found = accelerator_identity()
        sys.stdout.buffer.write(canonical_json(found.to_dict()) + b"\n")
        sys.stdout.buffer.flush()
        _preload_transformers()
        line = sys.stdin.buffer.readline(MAX_INPUT_BYTES + 1)
        if not line.strip():
            return 0
        model_dir, width = _request(line)
        digests = tokenizer_digests(model_dir, width, use_transformers=True)
    except KilnError as exc:
        sys.stderr.write(f"kiln-teacher identity probe: error: {exc.one_line()}\n")
        return 2
    document = {
        "config_sha256": digests.config_sha256,
        "entries": digests.entries,
        "vocab_sha256": digests.vocab_sha256,
    }
    sys.stdout.buffer.write(canonical_json(document) + b"\n")
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
