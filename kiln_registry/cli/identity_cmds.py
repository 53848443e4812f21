"""``kiln identity`` and ``kiln digest {snapshot,vocab,runtime}``.

Owns the argument parsing and JSON output of the identity inspection
commands; the work is done by ``kiln_registry.model`` and
``kiln_registry.launcher.runtime``.  Output is JSON on stdout with stable
keys; nothing is written to disk.  While hashing, a progress bar (bytes,
rate, time left) is drawn on stderr when it is a terminal, never otherwise.
Bad input raises ``KilnError`` (``kiln`` prints one line and exits 2).

Imports: standard library and kiln_registry; transformers only lazily
(through ``model.tokenizer``); never torch or vllm.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from kiln_registry.cli.argtypes import positive_int
from kiln_registry.domain.errors import IdentityError, InputError
from kiln_registry.identity.digests import tokenizer_vocab_sha256
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.identity.snapshot_manifest import snapshot_content_sha256
from kiln_registry.model.files import read_json_object
from kiln_registry.model.shards import MAX_VOCAB_SIZE, model_width
from kiln_registry.observability.progress import ProgressBar, tree_bytes

SubParsers = Any  # argparse's _SubParsersAction is private


def _emit(document: dict[str, object]) -> int:
    sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    return 0


def _limiter(args: argparse.Namespace) -> ReadRateLimiter:
    return ReadRateLimiter(args.max_read_mib_per_second)


def _add_read_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-read-mib-per-second",
        type=int,
        default=None,
        metavar="N",
        help="cap on bytes read for hashing, 1..=16384 MiB/s (default: unlimited)",
    )
    parser.add_argument(
        "--workers", type=positive_int, default=None, metavar="N", help="hashing threads"
    )


def _cmd_identity(args: argparse.Namespace) -> int:
    from kiln_registry.model.inspect import inspect_model

    total = tree_bytes(args.model_dir, args.adapter_path)
    with ProgressBar("kiln identity: hashing", total) as bar, bar.counting(_limiter(args)) as lim:
        result = inspect_model(
            args.model_dir,
            args.adapter_path,
            limiter=lim,
            workers=args.workers,
            use_transformers=args.tokenizer_view == "transformers",
        )
    document = result.to_json()
    document["tokenizer_view"] = args.tokenizer_view
    return _emit(document)


def _cmd_snapshot(args: argparse.Namespace) -> int:
    from kiln_registry.model.inspect import hash_trees

    total = tree_bytes(args.model_path, args.adapter_path)
    with ProgressBar("kiln digest: hashing", total) as bar, bar.counting(_limiter(args)) as lim:
        hashed = hash_trees(args.model_path, args.adapter_path, limiter=lim, workers=args.workers)
    manifest = hashed.manifest
    records = hashed.model_records + hashed.adapter_records
    directories = len(hashed.model.directories) + 1
    if hashed.adapter is not None:
        directories += len(hashed.adapter.directories) + 1
    return _emit(
        {
            "snapshot_content_sha256": snapshot_content_sha256(manifest),
            "has_adapter": hashed.adapter is not None,
            "files": len(records),
            "directories": directories,
            "bytes": sum(r.length for r in records),
            "manifest_bytes": len(manifest),
        }
    )


def _width_for(path: str, explicit: int | None, entries: int) -> tuple[int, str]:
    if explicit is not None:
        if explicit > MAX_VOCAB_SIZE:
            raise InputError(
                f"--model-width {explicit} is over {MAX_VOCAB_SIZE}", rule="model.vocab_size"
            )
        return explicit, "--model-width"
    config = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    if os.path.lexists(config):
        _, value = read_json_object(config, rule="model.config")
        return model_width(value, source=config), config
    return entries, "entry count"


def _cmd_vocab(args: argparse.Namespace) -> int:
    from kiln_registry.model.tokenizer import backend_config_sha256, load_tokenizer_json

    view = load_tokenizer_json(args.tokenizer_json, limiter=ReadRateLimiter(None))
    width, source = _width_for(args.tokenizer_json, args.model_width, len(view.vocab))
    return _emit(
        {
            "tokenizer_vocab_sha256": tokenizer_vocab_sha256(
                view.vocab, vocab_size_with_added=view.size_with_added, model_width=width
            ),
            "tokenizer_config_sha256": backend_config_sha256(view),
            "entries": len(view.vocab),
            "model_width": width,
            "model_width_source": source,
            "tokenizer_view": "tokenizers",
        }
    )


def _cmd_runtime(args: argparse.Namespace) -> int:
    from kiln_registry.launcher.runtime import RUNTIME_PACKAGES, runtime_content

    packages = tuple(args.packages) if args.packages else RUNTIME_PACKAGES
    if len(set(packages)) != len(packages):
        raise IdentityError("--packages lists a package twice", rule="runtime_content.packages")
    with ProgressBar("kiln digest: runtime") as bar, bar.counting(_limiter(args)) as lim:
        content = runtime_content(limiter=lim, workers=args.workers, packages=packages)
    return _emit(
        {
            "runtime_content_sha256": content.sha256,
            "runtime_versions": content.versions,
            "packages": list(packages),
            "files": content.files,
            "directories": content.directories,
            "bytes": content.bytes,
        }
    )


def _register_digest(sub: SubParsers) -> None:
    digest = sub.add_parser("digest", help="compute one identity digest")
    kinds = digest.add_subparsers(dest="digest_kind", required=True, parser_class=type(digest))
    snap = kinds.add_parser("snapshot", help="snapshot_content_sha256 of a model (+ adapter)")
    snap.add_argument("--model-path", required=True, metavar="DIR")
    snap.add_argument("--adapter-path", default=None, metavar="DIR")
    _add_read_options(snap)
    snap.set_defaults(func=_cmd_snapshot)
    vocab = kinds.add_parser("vocab", help="tokenizer digests of one tokenizer.json")
    vocab.add_argument("tokenizer_json", metavar="TOKENIZER_JSON")
    vocab.add_argument(
        "--model-width",
        type=positive_int,
        default=None,
        metavar="N",
        help="model vocabulary width (default: config.json beside the file, else entry count)",
    )
    vocab.set_defaults(func=_cmd_vocab)
    runtime = kinds.add_parser("runtime", help="runtime_content_sha256 of this Python")
    runtime.add_argument("--packages", nargs="+", default=None, metavar="PKG")
    _add_read_options(runtime)
    runtime.set_defaults(func=_cmd_runtime)


def register(sub: SubParsers) -> None:
    ident = sub.add_parser("identity", help="static identity inputs of a model directory")
    ident.add_argument("model_dir", metavar="MODEL_DIR")
    ident.add_argument("--adapter-path", default=None, metavar="DIR")
    ident.add_argument(
        "--tokenizer-view",
        choices=("transformers", "tokenizers"),
        default="transformers",
        help="transformers (vLLM's view, cross-checked; needs kiln-registry[launcher])"
        " or tokenizers only",
    )
    _add_read_options(ident)
    ident.set_defaults(func=_cmd_identity)
    _register_digest(sub)
