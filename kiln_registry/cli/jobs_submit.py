"""``kiln jobs submit``: a teacher-scoring or an off-policy generation job from the command line.

Owns the submit flags (``--kind teacher-scoring|off-policy-generation`` and the
API's options of each kind), the input files (``--sequences`` JSON arrays of
token ids, ``--prompts`` a JSON array or JSONL of ``{"id", "messages"}``) and
the request body; refusals of a flag that belongs to the other kind name it.
Imports: standard library and ``cli.server_options``, ``client``, ``domain``
(``cli.jobs_cmds`` registers it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kiln_registry.cli.server_options import number, registry_client
from kiln_registry.domain.errors import InputError
from kiln_registry.domain.vocabulary import JobKind

SubParsers = Any  # argparse's _SubParsersAction is private
MAX_INPUT_FILE = 64 << 20


def _prompts_file(path: Path) -> list[object]:
    """A JSON array of ``{"id", "messages"}`` prompts, or one such object per line (JSONL)."""
    if not path.is_file() or path.stat().st_size > MAX_INPUT_FILE:
        raise InputError(f"{path}: not a readable file of at most 64 MiB", rule="client.prompts")
    try:
        text = path.read_bytes().decode("utf-8")
        if text.lstrip().startswith("["):
            value = json.loads(text)
        else:
            value = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not JSON or JSONL ({exc})", rule="client.prompts") from None
    if not isinstance(value, list) or not value:
        raise InputError(
            f"{path}: must hold prompts: a JSON array or JSONL lines of"
            ' {"id": ..., "messages": [{"role": "user", "content": ...}]}',
            rule="client.prompts",
        )
    return value


def _sequences_file(path: Path) -> list[object]:
    if not path.is_file() or path.stat().st_size > MAX_INPUT_FILE:
        raise InputError(f"{path}: not a readable file of at most 64 MiB", rule="client.sequences")
    try:
        value = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not JSON ({exc})", rule="client.sequences") from None
    if not isinstance(value, list):
        raise InputError(f"{path}: must hold a JSON array of arrays", rule="client.sequences")
    return value


def _generation_body(args: argparse.Namespace) -> dict[str, object]:
    if args.sequences is not None or args.output is not None:
        raise InputError(
            "--sequences and --output belong to teacher-scoring jobs",
            rule="client.job_kind",
            hint="give a generation job --prompts FILE or --corpus PATH",
        )
    if args.max_tokens is None:
        raise InputError("--max-tokens N is required for a generation job", rule="client.job_kind")
    body: dict[str, object] = {"kind": JobKind.off_policy_generation.value,
                               "teacher": args.teacher, "max_tokens": args.max_tokens,
                               "top_k": args.top_k or 0, "temperature": args.temperature,
                               "top_p": args.top_p}  # fmt: skip
    if args.seed is not None:
        body["seed"] = args.seed
    if args.prompts is not None:
        body["prompts"] = _prompts_file(args.prompts)
    return body


def _scoring_body(args: argparse.Namespace) -> dict[str, object]:
    generation_only = (args.prompts, args.max_tokens, args.seed)
    if any(x is not None for x in generation_only) or (args.temperature, args.top_p) != (0, 1):
        raise InputError(
            "--prompts, --max-tokens, --temperature, --top-p and --seed belong to"
            " off-policy generation jobs",
            rule="client.job_kind",
            hint="add --kind off-policy-generation",
        )
    if args.top_k is None:
        raise InputError("--top-k K is required for a teacher-scoring job", rule="client.job_kind")
    body: dict[str, object] = {"kind": JobKind.teacher_scoring.value, "teacher": args.teacher,
                               "top_k": args.top_k}  # fmt: skip
    if args.sequences is not None:
        body["sequences"] = _sequences_file(args.sequences)
    if args.output is not None:
        body["output"] = args.output
    return body


def _submit(args: argparse.Namespace) -> int:
    generation = args.kind == "off-policy-generation"
    body = _generation_body(args) if generation else _scoring_body(args)
    if args.corpus is not None:
        body["corpus"] = {"path": args.corpus}
    with registry_client(args) as client:
        job = client.submit(body)
    if args.json:
        sys.stdout.write(job.model_dump_json(indent=2) + "\n")
    else:
        print(job.id)
    return 0


def _top_k(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65_536:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer in 0..65536")
    return int(text)


def _max_tokens(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 32_768:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer in 1..32768")
    return int(text)


def _seed(text: str) -> int:
    if not text.isdigit() or int(text) > 2**63 - 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer in 0..2^63-1")
    return int(text)


def register_submit(group: SubParsers, common: argparse.ArgumentParser) -> None:
    p = group.add_parser(
        "submit",
        help="queue a teacher-scoring or an off-policy generation job",
        parents=[common],
        description="teacher-scoring: --top-k K and --corpus or --sequences; off-policy"
        " generation (--kind off-policy-generation): --max-tokens N and --prompts or --corpus,"
        " the API's options (--top-k 0..max_top_k, --temperature, --top-p, --seed)",
    )
    p.add_argument(
        "--kind",
        choices=["teacher-scoring", "off-policy-generation"],
        default="teacher-scoring",
        help="the job kind (default: teacher-scoring)",
    )
    p.add_argument("--teacher", required=True, help="registered teacher alias")
    p.add_argument(
        "--top-k",
        type=_top_k,
        metavar="K",
        help="scoring: required, 1..1000; generation: teacher_tokens top-K (default 0)",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", metavar="PATH", help="JSONL under the server's corpus_root")
    source.add_argument("--sequences", type=Path, metavar="FILE", help="scoring: JSON [[ids], ...]")
    source.add_argument(
        "--prompts",
        type=Path,
        metavar="FILE",
        help='generation: JSON array or JSONL of {"id", "messages"}',
    )
    p.add_argument(
        "--max-tokens", type=_max_tokens, metavar="N", help="generation: tokens per prompt"
    )
    p.add_argument("--temperature", type=number, default=0.0, help="generation: 0 = greedy")
    p.add_argument("--top-p", type=number, default=1.0, help="generation: nucleus mass (0, 1]")
    p.add_argument("--seed", type=_seed, metavar="S", help="generation: sampling seed")
    p.add_argument(
        "--output",
        choices=["kiln-logit-cache-v3"],
        help="also publish the rows into the server's [jobs] logit_cache_root (Kiln's cache)",
    )  # fmt: skip
    p.set_defaults(func=_submit)
