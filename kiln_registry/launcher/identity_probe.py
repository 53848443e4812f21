"""The identity probe: accelerator and Transformers tokenizer view, in two children.

Torch and Transformers are never imported into the launcher (or a registry
server that drives it).  ``IdentityProbe`` starts two children, both exactly
like vLLM (the given interpreter, the exact child environment), before the
snapshot is staged, so their imports overlap each other, the staging and the
runtime digest:

1. the accelerator child, ``python -m kiln_registry.launcher.accelerator``
   (it imports torch), prints the accelerator identity as one line of
   canonical JSON;
2. the tokenizer child, ``python -m kiln_registry.launcher.identity_probe``,
   imports Transformers' tokenizer classes with torch hidden (see below),
   then reads one JSON request from stdin, ``{"model_dir": DIR,
   "model_width": N}`` (the staged model), and prints ``{"config_sha256",
   "entries", "vocab_sha256"}`` (``model.tokenizer.tokenizer_digests`` with
   ``use_transformers=True``, the view vLLM uses, cross-checked against the
   ``tokenizers`` view).  An empty stdin ends it with status 0 (the launch
   failed before it needed the tokenizer).

**Torch hidden in the tokenizer child.**  Transformers imports torch (and
much of torch's compiler stack) whenever torch is installed, though its
tokenizer classes never use it: about 3.5 of the 5 CPU-seconds the child
took on the 2-core machines (issue 31).  The child marks ``torch`` as absent
(``sys.modules["torch"] = None``, which ``importlib.util.find_spec`` reports
as not installed) before it imports Transformers, and drops Transformers'
one advisory line about it.  The environment is untouched.  The view is
still the one vLLM gets with torch present: the recheck child re-measures
the whole contract, the tokenizer through Transformers *with* torch, and the
launch serves nothing until the two agree byte for byte (a tokenizer whose
view depended on torch fails the launch with ``launcher.recheck_mismatch``).

Errors: a child prints one line on stderr and exits 2; the parent raises
``LauncherError`` (``launcher.child``) or, for output of the wrong shape,
``launcher.probe_output``.

Imports: standard library, ``kiln_registry.domain.errors``,
``kiln_registry.identity``, ``kiln_registry.model.tokenizer`` and the
launcher's ``accelerator`` / ``children``; Transformers only in the
tokenizer child's ``main``.  Nothing happens at import time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Mapping

from kiln_registry.domain.errors import KilnError, LauncherError
from kiln_registry.identity.canonical import canonical_json, strict_json_loads
from kiln_registry.identity.input_manifest import MAX_INPUT_BYTES, Accelerator, parse_accelerator
from kiln_registry.launcher import accelerator as accelerator_module
from kiln_registry.launcher.children import HelperChild
from kiln_registry.model.tokenizer import TokenizerDigests, tokenizer_digests

PROBE_MODULE = "kiln_registry.launcher.identity_probe"
PROBE_TIMEOUT_SECONDS = 300.0
TORCH_ABSENT_NOTE = "PyTorch was not found."
_HEX64 = frozenset("0123456789abcdef")


class IdentityProbe:
    """The two running probe children (parent side); ``close()`` always."""

    def __init__(self, env: Mapping[str, str], *, python: str) -> None:
        self.accelerator_child = HelperChild(
            [python, "-m", accelerator_module.__name__], env, what="accelerator probe"
        )
        try:
            self.child = HelperChild(
                [python, "-m", PROBE_MODULE], env, what="tokenizer probe", stdin=True
            )
        except BaseException:
            self.accelerator_child.close()
            raise
        self.accelerator_s: float | None = None
        self._accelerator: Accelerator | None = None
        self.tokenizer_s: float | None = None

    def accelerator(self) -> Accelerator:
        """The accelerator child's line (read once, then kept)."""
        if self._accelerator is None:
            child = self.accelerator_child
            line = child.finish(child.started + PROBE_TIMEOUT_SECONDS)
            self.accelerator_s = time.monotonic() - child.started
            value = strict_json_loads(
                line, what="accelerator probe output", max_bytes=MAX_INPUT_BYTES
            )
            self._accelerator = parse_accelerator(value, "accelerator probe output")
        return self._accelerator

    def tokenizer(self, model_dir: str, model_width: int) -> TokenizerDigests:
        """Ask the tokenizer child for the digests of ``model_dir``; its line answers."""
        request = {"model_dir": model_dir, "model_width": model_width}
        self.child.send(json.dumps(request).encode() + b"\n")
        deadline = time.monotonic() + PROBE_TIMEOUT_SECONDS
        value = strict_json_loads(
            self.child.finish(deadline), what="tokenizer probe output", max_bytes=MAX_INPUT_BYTES
        )
        self.tokenizer_s = time.monotonic() - self.child.started
        return _digests(value)

    def close(self) -> None:
        try:
            self.child.close()
        finally:
            self.accelerator_child.close()


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


class _TorchAbsentNote(logging.Filter):
    """Drops Transformers' advisory that torch is absent (the child hid it on purpose)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(TORCH_ABSENT_NOTE)


def _hide_torch() -> None:
    """Make Transformers see no torch in this child (see the module docstring)."""
    sys.modules["torch"] = None  # type: ignore[assignment]  # find_spec: not installed
    logging.getLogger("transformers").addFilter(_TorchAbsentNote())


def _preload_transformers() -> None:
    """Import Transformers' tokenizer classes now, while the parent stages the snapshot."""
    # A missing or broken install is reported by tokenizer_digests, with its hint.
    with contextlib.suppress(Exception):
        from transformers import AutoTokenizer  # noqa: F401


def main() -> int:
    """The tokenizer child: on request, the tokenizer digests line."""
    try:
        _hide_torch()
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
