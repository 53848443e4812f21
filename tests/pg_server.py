"""A real PostgreSQL server the test suite starts itself, and the test backend switch.

``PostgresServer.start()`` finds Debian's PostgreSQL (``/usr/lib/postgresql/<ver>/bin``,
highest version; Debian does not put ``initdb`` on PATH), runs ``initdb`` into a new
temporary directory as an unprivileged user (postgres refuses to run as root: as root
this is the system user ``kilntest``, created with ``useradd --system`` when absent, or
``nobody``), and starts ``postgres`` on 127.0.0.1 on a free port with fsync on.  Every
connection authenticates with SCRAM-SHA-256: the bootstrap superuser ``postgres`` (the
helper's own) and the role ``kiln`` (what the registry connects as; it owns each database
``new_database`` creates) share one random password, which the session puts in
``KILN_TEST_PG_PASSWORD`` so configs can name it as ``database_password_env``.
``stop()`` asks for a fast shutdown (SIGINT), waits, and removes the directory.

``KILN_TEST_BACKEND`` (``sqlite``, the default, or ``postgres``) is read here only, once,
when this module is imported.  ``database_settings(directory)`` gives the ``[server]``
keys of a registry whose SQLite file would be ``directory / "registry.db"``: that path
under ``sqlite``; under ``postgres`` a fresh database of the current test (the same one
for the same path within a test, dropped after it), ``database_password_env`` and
``state_dir = directory``.  The fixtures live in ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from tests.helpers import free_port

BACKEND_ENV = "KILN_TEST_BACKEND"
BACKENDS = ("sqlite", "postgres")
PASSWORD_ENV = "KILN_TEST_PG_PASSWORD"
INSTALL_HINT = "run scripts/install-test-deps.sh as root (it installs Debian's postgresql)"
PG_ROOT = Path("/usr/lib/postgresql")
OS_USER = "kilntest"
SUPERUSER = "postgres"
APP_ROLE = "kiln"
HOST = "127.0.0.1"
START_DEADLINE_S = 30.0
STOP_DEADLINE_S = 30.0
PORT_ATTEMPTS = 3
MAX_NAME_HINT = 24
SERVER_OPTIONS = ("-c", "fsync=on", "-c", "max_connections=200", "-c", "log_min_messages=warning")
_PR_SET_PDEATHSIG = 1
_BACKEND_AT_IMPORT = os.environ.get(BACKEND_ENV, "sqlite")


class PostgresUnavailable(RuntimeError):
    """PostgreSQL cannot be found or started here (the message says what to do)."""


def selected_backend() -> str:
    """``KILN_TEST_BACKEND`` as it was when the session started; unknown values refused."""
    if _BACKEND_AT_IMPORT not in BACKENDS:
        raise ValueError(
            f"{BACKEND_ENV}={_BACKEND_AT_IMPORT!r} is not a test backend: use one of "
            f"{', '.join(BACKENDS)} (or leave it unset for sqlite)"
        )
    return _BACKEND_AT_IMPORT


def find_bin_dir(root: Path = PG_ROOT) -> Path:
    """The ``bin`` folder of the highest installed PostgreSQL major version."""
    found: list[tuple[int, Path]] = []
    if root.is_dir():
        for child in root.iterdir():
            bin_dir = child / "bin"
            if child.name.isdigit() and (bin_dir / "initdb").is_file():
                found.append((int(child.name), bin_dir))
    if not found:
        raise PostgresUnavailable(f"no PostgreSQL under {root}/<version>/bin: {INSTALL_HINT}")
    return max(found)[1]


def _run_as() -> pwd.struct_passwd:
    """The OS user postgres runs as: ourselves unless root, else ``kilntest`` (or nobody)."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(OS_USER)
    useradd = shutil.which("useradd")
    if useradd is not None:
        argv = [useradd, "--system", "--user-group", "--no-create-home",
                "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", OS_USER]  # fmt: skip
        subprocess.run(argv, check=False, capture_output=True, timeout=30)
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(OS_USER)  # created now, or by a concurrent session
    return pwd.getpwnam("nobody")


def _parent_death_signal() -> None:
    """In the child (after the uid change): die with SIGQUIT if pytest dies without stopping us."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGQUIT, 0, 0, 0)


def safe_name_hint(hint: str) -> str:
    """``hint`` reduced to lowercase letters, digits and '_' (at most MAX_NAME_HINT)."""
    cleaned = re.sub(r"[^a-z0-9_]+", "_", hint.lower()).strip("_")
    return cleaned[:MAX_NAME_HINT] or "db"


@dataclass
class PostgresServer:
    """A running (after ``start``) throw-away PostgreSQL cluster on 127.0.0.1."""

    bin_dir: Path
    root: Path
    os_user: str
    password: str
    port: int = 0
    host: str = HOST
    superuser: str = SUPERUSER
    user: str = APP_ROLE
    password_env: str = PASSWORD_ENV
    process: subprocess.Popen[bytes] | None = None
    _uid: int = 0
    _gid: int = 0
    _counter: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _scopes: list[tuple[str, dict[Path, str]]] = field(default_factory=list)
    _unscoped: dict[Path, str] = field(default_factory=dict)

    @classmethod
    def start(cls) -> PostgresServer:
        """initdb into a new temporary directory and start the server; raises when it cannot."""
        bin_dir = find_bin_dir()
        account = _run_as()
        root = Path(tempfile.mkdtemp(prefix="kiln-pg-"))
        server = cls(bin_dir, root, account.pw_name, secrets.token_urlsafe(24))
        server._uid, server._gid = account.pw_uid, account.pw_gid
        try:
            os.chmod(root, 0o700)
            os.chown(root, server._uid, server._gid)
            server._initdb()
            server._launch()
            server._create_app_role()
        except BaseException:
            server.stop()
            raise
        return server

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / "postgres.log"

    def _as_user(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=120, env=self._env(), **self._ids()
        )

    def _ids(self) -> dict[str, Any]:
        """Popen's user/group arguments when we are root (postgres refuses to run as root)."""
        if os.geteuid() != 0:
            return {}
        return {"user": self._uid, "group": self._gid, "extra_groups": []}

    def _env(self) -> dict[str, str]:
        return {"PATH": f"{self.bin_dir}:/usr/bin:/bin", "LC_ALL": "C", "LANG": "C",
                "TZ": "UTC", "HOME": str(self.root)}  # fmt: skip

    def _initdb(self) -> None:
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n", encoding="utf-8")
        os.chmod(pwfile, 0o600)
        os.chown(pwfile, self._uid, self._gid)
        argv = [str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", self.superuser,
                f"--pwfile={pwfile}", "--auth=scram-sha-256", "--encoding=UTF8",
                "--no-locale", "--no-sync", "--no-instructions"]  # fmt: skip
        try:
            done = self._as_user(argv)
        finally:
            pwfile.unlink(missing_ok=True)
        if done.returncode != 0:
            raise PostgresUnavailable(f"initdb failed ({done.returncode}): {done.stderr[-2000:]}")

    def _launch(self, port: int | None = None) -> None:
        for _ in range(PORT_ATTEMPTS):
            self.port = port or free_port()
            argv = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                    "-k", str(self.root), "-c", f"listen_addresses={self.host}",
                    *SERVER_OPTIONS]  # fmt: skip
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=self._env(), preexec_fn=_parent_death_signal, **self._ids(),
                )  # fmt: skip
            if self._wait_ready():
                return
            self._reap()
        raise PostgresUnavailable(f"postgres did not start; its log:\n{self._log_tail()}")

    def _wait_ready(self) -> bool:
        """True once a connection succeeds; False if the server exited (e.g. port taken)."""
        assert self.process is not None
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                with self.admin():
                    return True
            except psycopg.OperationalError:
                time.sleep(0.05)
        raise PostgresUnavailable(f"postgres not ready in {START_DEADLINE_S:.0f}s:\n"
                                  f"{self._log_tail()}")  # fmt: skip

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-4000:]
        return "(no log)"

    def _create_app_role(self) -> None:
        with self.admin() as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(self.user), sql.Literal(self.password)
                )
            )

    def admin(self, dbname: str = "postgres") -> psycopg.Connection[TupleRow]:
        """A new autocommit connection as the superuser (close it, or use ``with``)."""
        return psycopg.connect(host=self.host, port=self.port, user=self.superuser,
                               password=self.password, dbname=dbname, autocommit=True,
                               connect_timeout=10)  # fmt: skip

    def url(self, dbname: str) -> str:
        """The SQLAlchemy URL of ``dbname`` as the ``kiln`` role, without the password."""
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{dbname}"

    def new_database(self, name_hint: str = "db") -> str:
        """Create a fresh empty database owned by ``kiln``; return its URL (no password)."""
        with self._lock:
            self._counter += 1
            counter = self._counter
        name = f"kiln_{safe_name_hint(name_hint)}_{counter}_{secrets.token_hex(4)}"
        with self.admin() as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {} TEMPLATE template0").format(
                    sql.Identifier(name), sql.Identifier(self.user)
                )
            )
        return self.url(name)

    def drop_database(self, url_or_name: str) -> None:
        """Terminate every connection to the database, then drop it (absent is fine)."""
        name = url_or_name.rsplit("/", 1)[-1]
        with self.admin() as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    @contextlib.contextmanager
    def test_scope(self, name_hint: str = "test") -> Iterator[None]:
        """Databases that ``database_for`` hands out inside are dropped when it ends."""
        scope: tuple[str, dict[Path, str]] = (name_hint, {})
        self._scopes.append(scope)
        try:
            yield
        finally:
            self._scopes.remove(scope)
            for url in scope[1].values():
                self.drop_database(url)

    def database_for(self, sqlite_path: Path) -> str:
        """The database standing in for ``sqlite_path`` in the current test (created once)."""
        # Outside a test (a module-scoped fixture): one per path, living until stop(), and
        # the same one when a test later names that path.
        if sqlite_path in self._unscoped or not self._scopes:
            hint, scope = sqlite_path.stem, self._unscoped
        else:
            hint, scope = self._scopes[-1]
        if sqlite_path not in scope:
            scope[sqlite_path] = self.new_database(hint)
        return scope[sqlite_path]

    def _reap(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)  # fast shutdown: roll back sessions, checkpoint
        try:
            process.wait(STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_DEADLINE_S)

    def restart(self, down_s: float = 0.0) -> None:
        """``pg_ctl restart``'s effect: fast shutdown (sessions ended, transactions rolled
        back), ``down_s`` seconds with nothing listening, then the same cluster on the
        same port."""
        self._reap()
        time.sleep(down_s)
        self._launch(port=self.port)

    def stop(self) -> None:
        """Fast shutdown, wait for it, remove the cluster's directory."""
        self._reap()
        shutil.rmtree(self.root, ignore_errors=True)


_active: PostgresServer | None = None


def active_server() -> PostgresServer | None:
    """The session's server once the ``postgres_server`` fixture started it."""
    return _active


def set_active_server(server: PostgresServer | None) -> None:
    global _active
    _active = server


def database_settings(directory: Path, filename: str = "registry.db") -> dict[str, str]:
    """The ``[server]`` keys for a registry whose SQLite file would be ``directory/filename``."""
    sqlite_path = directory / filename
    if selected_backend() == "sqlite":
        return {"database": str(sqlite_path)}
    server = active_server()
    if server is None:
        raise RuntimeError(
            f"{BACKEND_ENV}=postgres but no PostgreSQL server is running: database_settings "
            "needs the autouse backend fixture of tests/conftest.py (call it from a test)"
        )
    # kiln creates a new SQLite file's folder, never state_dir: an operator makes it.
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return {"database": server.database_for(sqlite_path),
            "database_password_env": server.password_env,
            "state_dir": str(directory)}  # fmt: skip
