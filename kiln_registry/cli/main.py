"""The ``kiln`` command: one argparse tree, one error path.

Each command group lives in its own module under ``kiln_registry.cli`` and
exposes ``register(subparsers)``; a registered command sets ``func`` to a
callable taking the parsed namespace and returning an exit status.  A listed
module that cannot be imported is an error, not a missing command.  Any
``KilnError`` becomes one line on stderr and exit status 2.  ``kiln
--version`` prints the package version; ``kiln completion bash|zsh`` prints a
completion script generated from this very parser (``shtab``), so it never
drifts from the commands.  Optional heavy
dependencies (torch, transformers, psycopg) are imported inside the commands that
need them, never here; one that is not installed ends the command with one
line naming the extra to install (``cli.failures``), and a closed stdout
(``kiln ... | head``) ends it quietly with status 141.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from kiln_registry.cli.failures import missing_package_line, quiet_broken_pipe
from kiln_registry.domain.errors import KilnError
from kiln_registry.version import package_version

# Command-group modules, in the order their commands appear in --help.  Each
# must import: one that does not is an error (``cli.command_module``), never a
# command silently missing from the tree.
COMMAND_MODULES: tuple[str, ...] = (
    "kiln_registry.cli.identity_cmds",
    "kiln_registry.cli.fingerprint_cmds",
    "kiln_registry.cli.serve_cmds",
    "kiln_registry.cli.worker_cmds",
    "kiln_registry.cli.teachers_cmds",
    "kiln_registry.cli.reference_cmds",
    "kiln_registry.cli.demo_cmds",
    "kiln_registry.cli.registry_cmds",
    "kiln_registry.cli.db_cmds",
    "kiln_registry.cli.jobs_cmds",
    "kiln_registry.cli.corpus_cmds",
    "kiln_registry.cli.tokens_cmds",
    "kiln_registry.cli.audit_cmds",
    "kiln_registry.cli.endpoint_cmds",
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line with exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


COMPLETION_SHELLS = ("bash", "zsh")


def _completion(args: argparse.Namespace) -> int:
    import shtab

    script: str = shtab.complete(build_parser(), shell=args.shell)
    sys.stdout.write(script if script.endswith("\n") else script + "\n")
    return 0


def _register_completion(sub: Any) -> None:
    p = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script: `source <(kiln completion bash)` in ~/.bashrc,"
        " or `kiln completion zsh > ~/.zfunc/_kiln` with ~/.zfunc on $fpath.",
    )
    p.add_argument("shell", choices=COMPLETION_SHELLS)
    p.set_defaults(func=_completion)


def _command_module(name: str) -> ModuleType:
    """The command-group module ``name``; one that cannot be imported is a ``KilnError``."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise KilnError(
            f"the command module {name} cannot be imported ({type(exc).__name__}: {exc})",
            rule="cli.command_module",
            hint="the installation is incomplete: reinstall kiln-registry with its dependencies",
        ) from exc


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kiln", description="kiln-registry: trusted teachers for Kiln OPD.")
    parser.add_argument("--version", action="version", version=f"kiln {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMAND_MODULES:
        _command_module(name).register(sub)
    _register_completion(sub)
    return parser


def _failed(exc: KilnError) -> int:
    sys.stderr.write(f"kiln: error: {exc.one_line()}\n")
    return 2


def run(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        func: Callable[[argparse.Namespace], int] = args.func
        status = func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return status
    except KilnError as exc:
        return _failed(exc)
    except ModuleNotFoundError as exc:  # an optional extra that is not installed
        if (exc.name or "").split(".")[0] == "kiln_registry":
            raise  # a broken install of this package itself: the traceback is the report
        sys.stderr.write(f"kiln: error: {missing_package_line(exc)}\n")
        return 2
    except BrokenPipeError:  # `kiln ... | head`: the reader left; stop without a word
        return quiet_broken_pipe()
    except SystemExit:  # argparse's --help and usage errors: flush inside the guard
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            return quiet_broken_pipe()
        raise


def main() -> None:
    raise SystemExit(run())


if __name__ == "__main__":
    main()
