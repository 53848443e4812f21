"""The single error tree of kiln-registry.

Every failure the project reports on purpose is a ``KilnError``.  Each class
carries the HTTP ``status``, a stable snake_case ``code`` (Kiln clients parse
it), a ``hint`` that says what to do, and, where a named rule failed, the
``rule`` (for example ``fingerprint.prefix``).  The API renders any of them
as ``{"error": {"code", "message", "hint"}}`` (``hint`` always a string, plus
``rule`` where one failed); the CLI prints one line and exits 2.  Codes and
statuses follow Kiln's ``crates/kiln-server/src/error.rs`` where Kiln has the
same failure.

    KilnError
    ├── InputError                 bad operator input (CLI flags, files)       400
    │   ├── IdentityError          an identity rule failed (``rule`` names it)  400
    │   │   └── FingerprintError   a fingerprint verification rule failed      400
    │   ├── ConfigError            kiln.toml or the environment is invalid     400
    │   └── PolicyError            a launcher option/env policy refusal        400
    ├── LauncherError              staging, runtime or supervision failed      500
    ├── CredentialError            a credential could not be resolved          400
    │                              (code teacher_registration_invalid, as Kiln)
    ├── RegistrationInvalid        teacher_registration_invalid                400
    │   └── InvalidAdapterName     invalid_adapter_name (Kiln's adapters.rs)    400
    ├── ProbeFailed                teacher_identity_probe_failed               502
    ├── ProbeBusy                  teacher_identity_probe_busy                 503
    ├── IdentityMismatch           teacher_identity_mismatch                   409
    ├── AliasExists                teacher_alias_exists                        409
    ├── IdentityRequired           teacher_identity_required                   409
    ├── TeacherNotFound            teacher_not_found                           404
    │                              (a job's: teacher_not_registered, 400)
    ├── LocalTeacherBusy           teacher_launch_conflict                     409
    ├── JobInvalid                 job_invalid                                 400
    ├── JobNotFound                job_not_found                               404
    ├── JobConflict                job_conflict                                409
    ├── JobQueueFull               job_queue_full (Retry-After)                429
    └── DatabaseUnavailable        database_unavailable                        503

Messages never contain secrets: callers pass names of variables, never their
values.  This module imports only the standard library.
"""

from __future__ import annotations

# Issue 15: a deleted alias is reserved; every "delete and register again" hint says so.
RELEASE_NOTE = "(a deleted alias stays reserved until an admin runs `kiln teachers release ALIAS`)"


class KilnError(Exception):
    """Base of every deliberate kiln-registry failure."""

    status: int = 500
    code: str = "internal_error"
    default_hint: str = ""
    retry_after: int | None = None

    def __init__(
        self,
        message: str,
        *,
        rule: str | None = None,
        hint: str | None = None,
        code: str | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.rule = rule
        self.hint = hint if hint is not None else self.default_hint
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status

    def __str__(self) -> str:
        if self.rule:
            return f"{self.rule}: {self.message}"
        return self.message

    def one_line(self) -> str:
        """The CLI form: rule, message and hint on a single line."""
        text = str(self)
        if self.hint:
            text = f"{text} (hint: {self.hint})"
        return " ".join(text.split())


class InputError(KilnError):
    status = 400
    code = "invalid_input"


class IdentityError(InputError):
    code = "teacher_identity_invalid"


class FingerprintError(IdentityError):
    code = "teacher_fingerprint_invalid"


class ConfigError(InputError):
    code = "config_invalid"


class PolicyError(InputError):
    code = "launcher_policy_refused"


class LauncherError(KilnError):
    status = 500
    code = "launcher_failed"


class CredentialError(KilnError):
    status = 400
    code = "teacher_registration_invalid"
    default_hint = (
        "use a credential_id configured under [teachers.credentials] whose origin equals the"
        " URL's origin and whose variable is set where the server runs"
    )


class RegistrationInvalid(KilnError):
    status = 400
    code = "teacher_registration_invalid"
    default_hint = (
        "a remote registration takes alias, kind=remote, provider=vllm, model_id, url and"
        " optionally a configured credential_id; identity and capabilities come from the probes"
    )


class InvalidAdapterName(RegistrationInvalid):
    """An adapter name that is not one directory name (Kiln's ``validate_adapter_name``)."""

    code = "invalid_adapter_name"
    default_hint = (
        "Adapter names must be a single path segment: no '/', '\\', or '..', and not absolute."
    )


class ProbeFailed(KilnError):
    status = 502
    code = "teacher_identity_probe_failed"
    default_hint = (
        "launch the teacher with kiln-teacher (or scripts/vllm_teacher.py), check its URL and"
        " credential_id, then retry"
    )


class ProbeBusy(KilnError):
    status = 503
    code = "teacher_identity_probe_busy"
    retry_after = 5
    default_hint = "two probes are already in flight; retry in a few seconds"


class IdentityMismatch(KilnError):
    status = 409
    code = "teacher_identity_mismatch"
    default_hint = (
        "use a teacher whose tokenizer vocabulary and vocab_size equal the loaded student's"
        " (and, for a pinned alias, whose identity is unchanged)"
    )


class AliasExists(KilnError):
    status = 409
    code = "teacher_alias_exists"
    default_hint = f"aliases are immutable: delete the alias and register it again {RELEASE_NOTE}"


class TeacherLimitReached(KilnError):
    """The registry holds ``[server] max_teachers`` aliases (issue 15: bounded growth)."""

    status = 409
    code = "teacher_limit_reached"


class IdentityRequired(KilnError):
    status = 409
    code = "teacher_identity_required"
    default_hint = f"delete the alias and register it again so both probes can run {RELEASE_NOTE}"


class TeacherNotFound(KilnError):
    """The alias is not registered: one fact with two wire forms, as in Kiln.

    The teacher routes answer ``404 teacher_not_found``; a job that names the
    alias (at submission, or when its teacher was deleted before it ran) is
    ``400 teacher_not_registered`` (Kiln's job code): build that one with
    ``in_job``.
    """

    status = 404
    code = "teacher_not_found"
    default_hint = "list the registered aliases with GET /v1/teachers"
    JOB_STATUS = 400
    JOB_CODE = "teacher_not_registered"
    JOB_HINT = "register the teacher first (POST /v1/teachers); list aliases with GET /v1/teachers"

    @classmethod
    def in_job(
        cls, message: str, *, rule: str | None = None, hint: str | None = None
    ) -> TeacherNotFound:
        """The job form: ``400 teacher_not_registered``."""
        return cls(
            message,
            rule=rule,
            hint=cls.JOB_HINT if hint is None else hint,
            code=cls.JOB_CODE,
            status=cls.JOB_STATUS,
        )


class LocalTeacherBusy(KilnError):
    """A local launch, relaunch or delete collides with a launch in flight."""

    status = 409
    code = "teacher_launch_conflict"
    default_hint = "wait for the launch in flight to finish (GET the alias), then retry"


class JobInvalid(KilnError):
    status = 400
    code = "job_invalid"
    default_hint = "fix the named field and submit the job again"


class JobNotFound(KilnError):
    status = 404
    code = "job_not_found"
    default_hint = "list jobs with GET /v1/jobs"


class JobConflict(KilnError):
    status = 409
    code = "job_conflict"
    default_hint = "read the job's status with GET /v1/jobs/{id}"


class DatabaseUnavailable(KilnError):
    """The registry's database cannot be reached (restart, outage) or is busy past its timeout.

    Nothing was changed: the request's transaction was rolled back (or never began).
    """

    status = 503
    code = "database_unavailable"
    retry_after = 5
    default_hint = "the registry's database is restarting or busy; retry in a few seconds"


class JobQueueFull(KilnError):
    """A submission past ``[jobs] max_queued_*``: the queue (or the token's share) is full."""

    status = 429
    code = "job_queue_full"
    retry_after = 60
    default_hint = "wait for queued jobs to finish (or cancel some), then submit again"
