"""Run every benchmark, check the machine is quiet, and record the figures.

One command for all of ``bench/``:

    .venv/bin/python bench/run_all.py [--only NAME ... | --changed [REV]] [--allow-load] [--dry-run]

``--changed [REV]`` runs only the benchmarks whose code differs from ``REV``
(default ``HEAD``; a branch is checked with ``--changed main``): the files
``git diff --name-only`` lists against the merge base of ``REV`` and ``HEAD``
(commits since ``REV``, or since the branch left it, and uncommitted
changes) and untracked ones, mapped to benchmarks by the explicit table in
``bench/touches.py``.  A change is done only after this rerun (see
``docs/development.md``).

For each benchmark it waits (up to ``--wait`` seconds) for the 1-minute load
average to fall to ``--max-load`` (default 1.0) and refuses to run it above
that unless ``--allow-load`` is given (the figure is then marked as taken on
a loaded machine).  Each benchmark runs in its own process and prints one JSON
report; every figure is the median of its per-round paired ratios (each
round measures the baseline and the measured arm back to back).  The run is
recorded with its machine facts (CPU model, cores, kernel, Python, package
versions, load average before and after) in ``bench/history.json``, which
keeps the last ``KEPT_RUNS`` runs of each benchmark; the table between the
markers at the top of ``bench/RESULTS.md`` is then rewritten from that
history, so stale figures are replaced rather than appended.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from touches import touched

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
HISTORY = BENCH / "history.json"
RESULTS = BENCH / "RESULTS.md"
BEGIN, END = "<!-- run_all:begin -->", "<!-- run_all:end -->"
KEPT_RUNS = 3
PACKAGES = ("numpy", "orjson", "fastapi", "starlette", "uvicorn", "pydantic", "h11", "httpx",
            "sqlalchemy", "tokenizers", "transformers", "torch")  # fmt: skip

Report = dict[str, Any]


@dataclass(frozen=True)
class Figure:
    """One recorded figure: per-round values reduced to their median, and its target."""

    name: str
    rounds: Callable[[Report], list[float]]
    target: float
    higher_is_better: bool
    unit: str = "x"

    def met(self, value: float) -> bool:
        return value >= self.target if self.higher_is_better else value <= self.target

    def target_text(self) -> str:
        return f"{'>=' if self.higher_is_better else '<='} {self.target:g}{self.unit}"


@dataclass(frozen=True)
class Benchmark:
    name: str
    argv: tuple[str, ...]
    figures: tuple[Figure, ...]
    what: str
    keep: tuple[str, ...] = ()  # report keys recorded in history beside the figures


def _pairs(report: Report, a: str, b: str) -> list[float]:
    """Per-round ratios ``a[i] / b[i]`` of two equally long lists in ``report``."""
    return [x / y for x, y in zip(report[a], report[b], strict=True)]


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("identity", ("bench_identity.py", "--mib", "2048", "--repeat", "5"), (
        Figure("speedup vs one SHA-256 pass", lambda r: _pairs(r["full"], "baseline_s", "kiln_s"),
               1.6, True),
    ), "`kiln identity`, 2 GiB in 4 shards, vs one single-threaded SHA-256 pass"),
    Benchmark("probe", ("bench_probe.py", "--repeat", "5", "--json"), (
        Figure("validation CPU / orjson.loads CPU",
               lambda r: _pairs(r, "kiln_cpu_s", "orjson_cpu_s"), 0.5, False),
        Figure("peak memory above the body", lambda r: [r["peak_mb_above_body"]], 64, False, " MB"),
    ), "probe validation of a 1,000,000-candidate vLLM body vs `orjson.loads`"),
    Benchmark("registry", ("bench_registry.py", "--requests", "4000", "--repeat", "5"), (
        Figure("GET /v1/teachers/{alias} / bare route",
               lambda r: [x["registry_rps"] / x["bare_rps"] for x in r["rounds"]], 0.8, True),
    ), "`GET /v1/teachers/{alias}` vs a bare FastAPI constant route"),
    Benchmark("staging", ("bench_staging.py", "--mib", "2048", "--repeat", "5"), (
        Figure("copy path / durable copy + hash",
               lambda r: _pairs(r["copy_path"], "kiln_s", "baseline_s"), 1.3, False),
        Figure("reflink path / one hash pass",
               lambda r: _pairs(r["reflink_path"], "kiln_s", "baseline_s"), 3.0, False),
    ), "launcher staging of 2 GiB (ext4 copy path; loop-mounted XFS reflink path)"),
    Benchmark("runtime", ("bench_runtime.py", "--repeat", "5"), (
        Figure("runtime-content digest speedup", lambda r: _pairs(r, "baseline_s", "kiln_s"),
               1.6, True),
    ), "runtime-content digest of torch + transformers + tokenizers vs one read-and-hash"),
    Benchmark("jobs", ("bench_jobs.py", "--rounds", "5"), (
        Figure("cold job / teacher capacity",
               lambda r: [x["cold_vs_capacity"] for x in r["rounds"]], 0.9, True),
        Figure("cached re-run speedup", lambda r: [x["cached_speedup"] for x in r["rounds"]],
               50, True),
        Figure("registry CPU per 1,000 scored tokens (cold job)",
               lambda r: [x["registry_cpu_s_per_1k_tokens"] * 1000 for x in r["rounds"]],
               140, False, " ms"),
    ), "OPD scoring job against the reference teacher; cached re-run vs cold"),
    Benchmark("gateway", ("bench_gateway.py", "--rounds", "5"), (
        Figure("gateway / vLLM socket directly", lambda r: [x["ratio"] for x in r["rounds"]],
               0.95, True),
    ), "scoring throughput through the teacher gateway vs the upstream's socket (20 ms upstream)"),
    Benchmark("generation", ("bench_generation.py", "--rounds", "3"), (
        Figure("generation job / teacher's own throughput",
               lambda r: [x["job_vs_teacher"] for x in r["rounds"]], 0.9, True),
    ), "off-policy generation job (200 prompts, 16 tokens, top-K 4) vs the reference teacher"),
    Benchmark("scaleout", ("bench_scaleout.py", "all", "--repeat", "5", "--rounds", "3"), (
        Figure("PostgreSQL lookup / SQLite lookup",
               lambda r: [x["postgres_rps"] / x["sqlite_rps"] for x in r["lookup"]["rounds"]],
               0.5, True),
        Figure("2 replicas + 2 workers / 1 + 1",
               lambda r: [x["two_by_two_seq_s"] / x["one_by_one_seq_s"]
                          for x in r["jobs"]["rounds"]], 1.8, True),
    ), "registry lookups on PostgreSQL vs SQLite; a corpus job over 2 teacher replicas and "
       "2 `kiln worker`s vs 1 and 1 (100 ms teacher service time)"),
    Benchmark("endpoint", ("bench_endpoint.py", "--rounds", "4"), (
        Figure("endpoint / teacher directly (throughput)",
               lambda r: [x["ratio"] for x in r["rounds"]], 0.95, True),
        Figure("added median latency", lambda r: [x["added_median_ms"] for x in r["rounds"]],
               100, False, " ms"),
        Figure("endpoint CPU per 1,000 scored tokens",
               lambda r: [x["endpoint_cpu_s_per_1k_tokens"] * 1000 for x in r["rounds"]],
               20, False, " ms"),
    ), "`kiln teacher-endpoint`: TRL-shaped scoring (8 x 511 tokens, prompt_logprobs 20) vs "
       "the same stand-in teacher directly (500 ms service time)"),
    Benchmark("flood", ("bench_flood.py", "--requests", "8000", "--repeat", "5"), (
        Figure("lookups in a registration flood / quiet",
               lambda r: _pairs({"a": [x["register_flood_rps"] for x in r["rounds"]],
                                 "b": [x["quiet_rps"] for x in r["rounds"]]}, "a", "b"),
               0.5, True),
        Figure("lookups in a job flood / quiet",
               lambda r: _pairs({"a": [x["jobs_flood_rps"] for x in r["rounds"]],
                                 "b": [x["quiet_rps"] for x in r["rounds"]]}, "a", "b"),
               0.5, True),
    ), "`GET /v1/teachers/{alias}` with auth on, quiet vs during a registration flood and a "
       "job flood by one token (8 concurrent loops)"),
    Benchmark("launch", ("bench_launch.py", "--rounds", "5"), (
        Figure("kiln-teacher / bare vLLM (start to /health 200)",
               lambda r: _pairs(r, "kiln_s", "bare_s"), 1.15, False),
        Figure("kiln-teacher / bare vLLM with an empty cache, as kiln's policy",
               lambda r: _pairs(r, "kiln_s", "bare_empty_cache_s"), 1.15, False),
        Figure("kiln-teacher before vLLM's spawn", lambda r: r["pre_spawn_s"], 5, False, " s"),
    ), "`kiln-teacher` vs bare vLLM (`api_server`, same flags) on the tiny float32 Llama, "
       "gateway on; the phase table is the report's `phase_median_s`",
       ("phase_median_s", "bare_s", "bare_empty_cache_s", "kiln_s")),
)  # fmt: skip


def machine_facts() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version(), "packages": versions}  # fmt: skip


def wait_quiet(max_load: float, wait_s: float) -> float:
    """The 1-minute load average once it is <= ``max_load``, or the last value seen."""
    deadline = time.monotonic() + wait_s
    load = os.getloadavg()[0]
    while load > max_load and time.monotonic() < deadline:
        time.sleep(5)
        load = os.getloadavg()[0]
    return load


def parse_report(stdout: str) -> Report:
    """The benchmark's JSON report: the last top-level JSON object on stdout."""
    start = stdout.rfind("\n{")
    text = stdout[start + 1 :] if start >= 0 else stdout
    report = json.loads(text)
    if not isinstance(report, dict):
        raise ValueError("the benchmark's report is not a JSON object")
    return report


def changed_files(rev: str, repo: Path = REPO) -> list[str]:
    """Paths that differ from ``rev``: committed since, uncommitted, and untracked."""

    def git(*argv: str) -> list[str]:
        done = subprocess.run(["git", *argv], cwd=repo, capture_output=True, text=True,
                              check=False)  # fmt: skip
        if done.returncode != 0:
            why = done.stderr.strip()[:300]
            raise SystemExit(f"run_all: git {' '.join(argv)} failed: {why} (give --changed a"
                             " revision git knows, e.g. main or HEAD~1)")  # fmt: skip
        return [line for line in done.stdout.splitlines() if line]

    base = git("merge-base", rev, "HEAD")[0]  # a branch: where it left ``rev``, not rev's tip
    return sorted({*git("diff", "--name-only", base, "--"),
                   *git("ls-files", "--others", "--exclude-standard")})  # fmt: skip


def select_changed(rev: str, repo: Path = REPO) -> list[str]:
    """The benchmarks that exercise a file changed since ``rev``, each with why."""
    changed = changed_files(rev, repo)
    names = []
    for bench in BENCHMARKS:
        paths = touched(bench.name, bench.argv[0], changed)
        if paths:
            more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
            print(f"--changed {rev}: {bench.name} exercises {', '.join(paths[:3])}{more}")
            names.append(bench.name)
    if not names:
        print(f"--changed {rev}: no benchmark exercises the {len(changed)} changed file(s)")
    return names


def run_one(bench: Benchmark, args: argparse.Namespace) -> dict[str, Any]:
    load = wait_quiet(args.max_load, args.wait)
    if load > args.max_load and not args.allow_load:
        raise SystemExit(
            f"run_all: load average {load:.2f} > {args.max_load} before '{bench.name}';"
            " nothing recorded. Wait for a quiet machine or pass --allow-load."
        )
    before = [round(x, 2) for x in os.getloadavg()]
    argv = [sys.executable, str(BENCH / bench.argv[0]), *bench.argv[1:]]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"run_all: {bench.name} exited with {done.returncode}")
    report = parse_report(done.stdout)
    figures = []
    for fig in bench.figures:
        rounds = [round(v, 4) for v in fig.rounds(report)]
        median = statistics.median(rounds)
        figures.append({"name": fig.name, "rounds": rounds, "median": round(median, 3),
                        "target": fig.target_text(), "met": fig.met(median),
                        "unit": fig.unit})  # fmt: skip
    return {
        "time": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([".venv/bin/python", f"bench/{bench.argv[0]}", *bench.argv[1:]]),
        "seconds": round(time.monotonic() - started, 1),
        "load_before": before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "quiet": load <= args.max_load,
        "figures": figures,
        **({"report": {key: report[key] for key in bench.keep if key in report}}
           if bench.keep else {}),
    }  # fmt: skip


def write_atomic(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    with open(temp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


def load_history() -> dict[str, list[dict[str, Any]]]:
    if not HISTORY.exists():
        return {}
    data: dict[str, list[dict[str, Any]]] = json.loads(HISTORY.read_text(encoding="utf-8"))
    return data


def _cell(run: dict[str, Any], name: str) -> str | None:
    """One run's figure ``name``, or None for a run recorded before that figure existed."""
    fig = next((f for f in run["figures"] if f["name"] == name), None)
    if fig is None:
        return None
    value = f"{fig['median']:g}{fig['unit']}"
    flag = "" if fig["met"] else " (not met)"
    quiet = "" if run["quiet"] else ", loaded"
    return f"{value}{flag} ({run['time'][5:16]}, load {run['load_before'][0]:.2f}{quiet})"


def render_table(history: dict[str, list[dict[str, Any]]], facts: dict[str, Any]) -> str:
    lines = [BEGIN, "", "Written by `bench/run_all.py` from `bench/history.json` (last "
             f"{KEPT_RUNS} runs of each benchmark, newest first; each figure is the median of "
             "its per-round paired ratios; load is the 1-minute average before the run).", "",
             "| benchmark | figure | target | recorded runs |", "|---|---|---|---|"]  # fmt: skip
    for bench in BENCHMARKS:
        runs = history.get(bench.name, [])
        for fig in bench.figures:
            found = [cell for run in runs if (cell := _cell(run, fig.name)) is not None]
            cells = "; ".join(found) or "not run yet"
            lines.append(f"| `{bench.name}`: {bench.what} | {fig.name} | {fig.target_text()} "
                         f"| {cells} |")  # fmt: skip
    packages = ", ".join(f"{k} {v}" for k, v in facts["packages"].items() if v)
    lines += ["", f"Machine: {facts['cpu']}, {facts['cores']} cores, kernel {facts['kernel']}, "
              f"Python {facts['python']}; {packages}. Each run's commands, per-round values and "
              "load before/after are in `bench/history.json`.", "", END]  # fmt: skip
    return "\n".join(lines)


def write_results(table: str) -> None:
    text = RESULTS.read_text(encoding="utf-8")
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + table + rest.split(END, 1)[1]
    else:
        title, _, body = text.partition("\n")
        text = f"{title}\n\n{table}\n{body}"
    write_atomic(RESULTS, text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pick = parser.add_mutually_exclusive_group()
    pick.add_argument("--only", nargs="+", choices=[b.name for b in BENCHMARKS])
    pick.add_argument(
        "--changed",
        nargs="?",
        const="HEAD",
        metavar="REV",
        help="run the benchmarks whose code differs from REV (default HEAD)",
    )
    parser.add_argument("--max-load", type=float, default=1.0)
    parser.add_argument("--wait", type=float, default=180.0, help="seconds to wait for quiet")
    parser.add_argument("--allow-load", action="store_true", help="record on a loaded machine")
    parser.add_argument("--dry-run", action="store_true", help="print, record nothing")
    args = parser.parse_args()
    if args.changed is not None:
        args.only = select_changed(args.changed)
        if not args.only:
            return
    facts = machine_facts()
    history = load_history()
    for bench in BENCHMARKS:
        if args.only and bench.name not in args.only:
            continue
        run = {**run_one(bench, args), "machine": facts}
        for fig in run["figures"]:
            verdict = "met" if fig["met"] else "NOT met"
            print(f"{bench.name:9s} {fig['name']}: {fig['median']:g}{fig['unit']} "
                  f"({verdict}, target {fig['target']})", flush=True)  # fmt: skip
        if not args.dry_run:
            history[bench.name] = [run, *history.get(bench.name, [])][:KEPT_RUNS]
            write_atomic(HISTORY, json.dumps(history, indent=1) + "\n")
            write_results(render_table(history, facts))


if __name__ == "__main__":
    main()
