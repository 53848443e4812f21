"""``kiln demo``: the README's first command (see ``kiln_registry.demo.run``).

Owns the command's flags and its output: progress lines on stderr, then on
stdout either a human summary (the registered entry and the off-policy
manifest) or, with ``--json``, one JSON object (``kiln.demo-result.v1``).
Ctrl-C or SIGTERM stops the children, removes the work directory and exits
130.  ``--keep`` leaves both running once registered, prints the registry's
``/ui`` URL, the token when auth is on, and the next commands to try (or the
result as JSON with ``--json``); then Ctrl-C or SIGTERM stops both and exits 0.
Imports: standard library and kiln_registry (``demo`` and the teachers
command's renderer) inside the command; no torch at import time.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
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


def render_kept(result: dict[str, Any]) -> str:
    """What ``--keep`` prints once both servers run: where they are and what to try next."""
    from kiln_registry.demo.run import ALIAS, MAX_TOP_K

    url = result["registry"]["url"]
    token = result.get("token")
    prompts = shlex.quote(result["example_prompts"])
    lines = [
        "kiln demo: the registry and the reference teacher keep running; Ctrl-C stops both",
        "",
        f"registry    {url}   dashboard: {url}/ui",
        f"teacher     {ALIAS} at {result['teacher']['url']}",
        f"token       {token}" if token else "auth        off (loopback only): no token needed",
        "",
        "next, in another terminal:",
        f"  export KILN_SERVER={url}",
        f"  kiln teachers show {ALIAS}",
        f"  JOB=$(kiln jobs submit --kind off-policy-generation --teacher {ALIAS}"
        f" --prompts {prompts} --max-tokens 16 --top-k {MAX_TOP_K})",
        '  kiln jobs show "$JOB" --follow',
    ]
    return "\n".join(lines)


def _kept(args: argparse.Namespace) -> Callable[[dict[str, Any]], None] | None:
    if not args.keep:
        return None

    def show(result: dict[str, Any]) -> None:
        if args.json:
            sys.stdout.write(json.dumps(result, ensure_ascii=False) + "\n")
        else:
            print(render_kept(result))
        sys.stdout.flush()

    return show


def _cmd_demo(args: argparse.Namespace) -> int:
    from kiln_registry.demo.run import run_demo

    try:
        result = run_demo(args.cache_dir, progress=_progress, on_kept=_kept(args))
    except KeyboardInterrupt:
        if args.keep:  # the way a kept demo ends
            _progress("stopped the registry and the teacher, removed the work directory")
            return 0
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
        "--keep",
        action="store_true",
        help="leave the teacher and the registry running (prints the /ui URL and the next"
        " commands to try); Ctrl-C stops both",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where the tiny model is cached (default: the user cache dir, kiln-registry/demo)",
    )
    parser.set_defaults(func=_cmd_demo)
