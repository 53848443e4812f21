"""The probe report: what a teacher probe sent, saw and decided.

Owns ``ProbeAttempt`` (one HTTP exchange) and ``ProbeReport`` (the dual probe
plus the cap probe) and their ``to_dict()`` receipt form.  A report never
holds a secret, an Authorization header or a response body: only the URL,
model id, K values, prompt length, status codes, fingerprint, identity digest,
row widths, candidate counts, timings and the failure rule/message (messages
are built by the probe modules, which never put secrets in them).

Imports: standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln_registry.domain.errors import KilnError

REPORT_ATTRIBUTE = "probe_report"


@dataclass(frozen=True, slots=True)
class ProbeAttempt:
    """One probe request: K, what came back, and how long it took."""

    purpose: str  # "discover", "max_top_k", "cap" or "score"
    k: int
    prompt_len: int
    status_code: int | None = None
    elapsed_ms: float = 0.0
    bytes_read: int = 0
    fingerprint: str | None = None
    identity_digest: str | None = None
    min_row_width: int | None = None
    max_row_width: int | None = None
    candidate_count: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "purpose": self.purpose,
            "k": self.k,
            "prompt_len": self.prompt_len,
            "status_code": self.status_code,
            "elapsed_ms": round(self.elapsed_ms, 3),
            "bytes_read": self.bytes_read,
            "fingerprint": self.fingerprint,
            "identity_digest": self.identity_digest,
            "row_widths": (
                None
                if self.min_row_width is None
                else {"min": self.min_row_width, "max": self.max_row_width}
            ),
            "candidate_count": self.candidate_count,
        }


@dataclass(frozen=True, slots=True)
class ProbeReport:
    """The outcome of ``probe_teacher``: ``"passed"`` or ``"failed"`` and why."""

    url: str
    model_id: str
    authenticated: bool
    attempts: tuple[ProbeAttempt, ...] = field(default_factory=tuple)
    outcome: str = "failed"
    fingerprint: str | None = None
    identity_digest: str | None = None
    failure_code: str | None = None
    failure_rule: str | None = None
    failure_message: str | None = None
    elapsed_ms: float = 0.0

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"

    @property
    def k_values(self) -> tuple[int, ...]:
        return tuple(a.k for a in self.attempts)

    def to_dict(self) -> dict[str, object]:
        return {
            "url": self.url,
            "model_id": self.model_id,
            "authenticated": self.authenticated,
            "k_values": list(self.k_values),
            "attempts": [a.to_dict() for a in self.attempts],
            "outcome": self.outcome,
            "fingerprint": self.fingerprint,
            "identity_digest": self.identity_digest,
            "failure": (
                None
                if self.failure_rule is None and self.failure_message is None
                else {
                    "code": self.failure_code,
                    "rule": self.failure_rule,
                    "message": self.failure_message,
                }
            ),
            "elapsed_ms": round(self.elapsed_ms, 3),
        }


def attach_report(error: KilnError, report: ProbeReport) -> None:
    """Record the failed probe's report on the error it raised."""
    setattr(error, REPORT_ATTRIBUTE, report)


def attached_report(error: BaseException) -> ProbeReport | None:
    """The ``ProbeReport`` that ``probe_teacher`` attached to a failure, if any."""
    report = getattr(error, REPORT_ATTRIBUTE, None)
    return report if isinstance(report, ProbeReport) else None
