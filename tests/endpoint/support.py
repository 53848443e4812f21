"""Helpers for the teacher-endpoint tests: the real ``kiln teacher-endpoint`` process, a
switchable wrapper server, and a registry registration.

``EndpointProcess`` runs ``python -m kiln_registry.cli.main teacher-endpoint`` as a
subprocess (real signals, real sockets on 127.0.0.1) and reads the base URL it prints.
``Switch`` is an ASGI app that forwards to one real reference-teacher app until
``flip()``, then to another (a teacher of another identity), as a teacher swapped behind
a URL would; ``stop()`` makes it refuse connections-level service by answering nothing
(closing), which stands for a killed replica.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.api.support import REPO

START_DEADLINE_S = 60.0


class EndpointProcess:
    """``kiln teacher-endpoint ALIAS --server URL --listen 127.0.0.1:0 ...`` with its output."""

    def __init__(
        self,
        alias: str,
        server: str,
        log: Path,
        *extra: str,
        env: dict[str, str] | None = None,
        listen: str = "127.0.0.1:0",
    ) -> None:
        argv = [sys.executable, "-m", "kiln_registry.cli.main", "teacher-endpoint", alias]
        argv += ["--server", server, "--listen", listen, "--log-level", "info", *extra]
        self.log = log
        self._err = log.open("ab")
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
        )
        self.url = ""
        self.model = ""

    def wait_ready(self) -> EndpointProcess:
        """Read the announcement (base_url, model); fail with the log when it never comes."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline and not self.model:
            line = self.proc.stdout.readline()
            if not line:
                break
            key, _, value = line.strip().partition(": ")
            if key == "base_url":
                self.url = value
            elif key == "model":
                self.model = value
        if not self.model:
            self.kill()
            raise AssertionError(f"the endpoint did not start: {self.output()}")
        return self

    def wait_exit(self, timeout: float = START_DEADLINE_S) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        self._err.flush()
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(20)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(20)

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, trust_env=False, **kwargs)

    def __enter__(self) -> EndpointProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()


class Switch:
    """An ASGI app forwarding to ``first`` until ``flip()``, then to ``second``."""

    def __init__(self, first: Any, second: Any) -> None:
        self.apps = [first, second]
        self.current = 0

    def flip(self) -> None:
        self.current = 1

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.apps[self.current](scope, receive, send)


def tokens(count: int, start: int = 1) -> list[int]:
    """A deterministic token-id sequence below the tiny model's vocabulary."""
    return [(start + 7 * i) % 50 + 1 for i in range(count)]
