"""Live status: what can have changed since an alias was registered, checked at read time.

Kiln's entry builder (``crates/kiln-server/src/api/teachers.rs``,
``teacher_entry``) re-validates every spec whenever it is read: the
credential is still configured for the URL's origin, its variable is still
set, the loaded student still matches the identity (vocabulary digest, model
width and tokenizer size), a local teacher's adapter directory still exists.
A failure makes the entry ``unavailable`` (``usable: false``) with a
``status_message`` saying what changed and what to do; nothing is rewritten.

Which checks apply is the kind's (``TeacherKindStrategy.live_checks``: a remote
alias checks its credential and the student, a local one the student and, in
Kiln's shape, its adapter directory); this module holds the checks.  Split for
the cached ``GET`` path (``api.entry_cache``):

* ``fixed_problem`` covers what cannot change while this process runs (the
  configuration is frozen and the student is loaded once): credential id and
  origin, the loopback rules, the student match.  It is computed when an
  entry is rendered, i.e. once per cache fill.
* ``ReadChecks`` holds what can change underneath a running process: the
  credential's environment variable (one dictionary lookup and a regex) and a
  Kiln-shape local alias's adapter directory (one ``stat``).  It is stored
  beside the cached body and run at every read.

Imports the configuration, credential and probe layers, ``local.student``
(pure) and the row type; never FastAPI, a session or a socket.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from kiln_registry.config.settings import KilnConfig
from kiln_registry.credentials.resolve import resolve_teacher_endpoint
from kiln_registry.credentials.secrets import secret_problem
from kiln_registry.db.models import TeacherRow
from kiln_registry.domain.errors import RELEASE_NOTE, KilnError
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.local.student import adapter_problem
from kiln_registry.probe.verify import StudentView, check_student

CHANGED = "changed since registration"
_CREDENTIAL_TODO = (
    "restore [teachers.credentials] in kiln.toml and restart the registry, or delete the alias"
    f" and register it again {RELEASE_NOTE}"
)
_STUDENT_TODO = (
    "serve the student this alias was registered against, or delete the alias and register a"
    f" teacher that matches the loaded student {RELEASE_NOTE}"
)
_ENV_TODO = "export it in the registry server's environment and restart the registry"


@dataclass(frozen=True, slots=True)
class ReadChecks:
    """The checks run at every read of an entry (cheap; see the module docstring)."""

    credential_id: str | None = None
    env_name: str | None = None
    adapter: str | None = None

    def problem(self, config: KilnConfig, environ: Mapping[str, str] | None = None) -> str | None:
        """What makes the entry unavailable right now, or None."""
        if self.env_name is not None:
            env = os.environ if environ is None else environ
            found = secret_problem(env.get(self.env_name))
            if found is not None:
                return (
                    f"credential {self.credential_id!r} {CHANGED}: environment variable"
                    f" {self.env_name} {found[1]}; {_ENV_TODO}"
                )
        if self.adapter is not None:
            return adapter_problem(config, self.adapter)
        return None


NO_CHECKS = ReadChecks()


def credential_problem(config: KilnConfig, row: TeacherRow) -> tuple[str | None, ReadChecks]:
    """A remote alias's credential and origin rules (fixed) and its variable (per read)."""
    if row.url is None:
        return None, NO_CHECKS
    try:
        resolve_teacher_endpoint(
            row.url,
            row.credential_id,
            credentials=config.teachers.credentials,
            server_host=config.server.host,
        )
    except KilnError as exc:
        # The variable's own state is a per-read check; the rest is fixed for the process.
        if not (exc.rule or "").startswith("secret."):
            return f"{CHANGED}: {exc.message}; {_CREDENTIAL_TODO}", NO_CHECKS
    if row.credential_id is None:
        return None, NO_CHECKS
    credential = config.teachers.credentials[row.credential_id]
    return None, ReadChecks(credential_id=row.credential_id, env_name=credential.api_key_env)


def student_problem(identity: TeacherIdentity, student: StudentView) -> str | None:
    """The loaded student no longer matching ``identity`` (fixed while the process runs)."""
    try:
        check_student(identity, student)
    except KilnError as exc:
        return f"the loaded student {CHANGED}: {exc.message}; {_STUDENT_TODO}"
    return None


def adapter_checks(row: TeacherRow) -> ReadChecks:
    """Kiln's shape of a local alias (no launch profile) re-checks its adapter directory."""
    if row.launch_profile is None and row.adapter is not None:
        return ReadChecks(adapter=row.adapter)
    return NO_CHECKS
