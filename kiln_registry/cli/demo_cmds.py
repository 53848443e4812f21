"""``kiln demo``: the README's first command (see ``kiln_registry.demo.run``).

Owns the command's flags and its output: progress lines on stderr, then on
stdout either a human summary (the registered entry and the off-policy
manifest) or, with ``--json``, one JSON object (``kiln.demo-result.v1``).
Ctrl-C or SIGTERM stops the children, removes the work directory and exits
130.  Imports: standard library and kiln_registry (``demo`` and the teachers
command's renderer) inside the command; no torch at import time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SubParsers = Any  # argparse's _SubParsersAction is private


def _progress(text: str) -> None:
    sys.stderr.write(f"kiln demo: {text}\n")
    sys.stderr.flush()


def render_result(result: dict[str, Any]) -> str:
    from kiln_registry.cli.teachers_cmds import printable, render_entry
    from kiln_registry.wire.teachers import TeacherEntry

    entry = TeacherEntry.model_validate(result["entry"])
    manifest = json.loads(result["off_policy_manifest"])
    teacher, registry = result["teacher"], result["registry"]
    cached = "reused from the cache" if result["model_reused"] else "built and cached"
    return "\n".join(
        [
            "kiln demo: a reference teacher, probed and registered through the registry",
            "",
            f"tiny model  {printable(result['model_path'])} ({cached})",
            f"teacher     {printable(teacher['url'])} (pid {teacher['pid']}, eager Transformers,"
            " CPU, float32)",
            f"registry    {printable(registry['url'])} (pid {registry['pid']})",
            "",
            "registered entry:",
            render_entry(entry.model_copy(update={"off_policy_manifest": None})),
            "",
            "off-policy manifest (write this exact line first in an off-policy OPD corpus):",
            printable(result["off_policy_manifest"]),
            "",
            "the same manifest, indented for reading:",
            json.dumps(manifest, indent=2, ensure_ascii=False),
            "",
            "stopped the registry and the teacher; removed the work directory"
            if result["stopped"] and result["work_dir_removed"]
            else "WARNING: cleanup was incomplete (see above)",
        ]
    )


def _cmd_demo(args: argparse.Namespace) -> int:
    from kiln_registry.demo.run import run_demo

    try:
        result = run_demo(args.cache_dir, progress=_progress)
    except KeyboardInterrupt:
        _progress("interrupted: stopped the registry and the teacher, removed the work directory")
        return 130
    if args.json:
        sys.stdout.write(json.dumps(result, ensure_ascii=False) + "\n")
    else:
        print(render_result(result))
    return 0 if result["stopped"] and result["work_dir_removed"] else 2


def register(sub: SubParsers) -> None:
    parser = sub.add_parser(
        "demo",
        help="build a tiny model, start a reference teacher and the registry, register it",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where the tiny model is cached (default: the user cache dir, kiln-registry/demo)",
    )
    parser.set_defaults(func=_cmd_demo)
