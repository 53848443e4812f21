"""Teacher bodies as Kiln's JSON parser reads them, and any 2xx status accepted.

ericflo/kiln ``crates/kiln-train/src/remote_teacher.rs`` (commit 0751a8c6):
``parse_vllm_json_response`` reads the whole body into a ``serde_json::Value``
(``StrictJsonValue``), so serde_json's own rules hold in *every* field, the
ignored ones included: a lone surrogate escape is refused (strings and keys),
nesting stops at 127 levels (its recursion limit is 128), a number outside
the float64 range is refused, and an integer ``-0`` is the float ``-0.0``, so
``choices[0].index`` (``as_u64() == Some(0)``) refuses it.  ``post_vllm_json``
refuses a status only when ``!status.is_success()``: any 2xx with a valid body
is read.  Every body goes through both parsers (strict and fast path), which
must agree, then ``verify_completion``.
"""

from __future__ import annotations

import asyncio
import struct

import httpx
import numpy as np
import pytest

from kiln_registry.jobs.scoring.cache import ScoredSequence
from kiln_registry.jobs.scoring.target import ScoringTarget, score_sequence
from kiln_registry.probe.client import ProbeLimiter, probe_teacher
from kiln_registry.probe.wire import TeacherWire
from tests.kiln_conformance.test_probe_bodies import check, refused, serde, valid_response
from tests.probe.teacher_server import Reply, Request, TeacherServer, good_teacher, make_identity

BASE = serde(valid_response())


def with_field(text: bytes) -> bytes:
    """The valid body plus one top-level member Kiln ignores."""
    return BASE[:-1] + b',"ignored":' + text + b"}"


def in_token(text: bytes) -> bytes:
    """The valid body with the first candidate's ignored ``decoded_token`` replaced."""
    return BASE.replace(b'"unused"', text, 1)


def nested(depth: int) -> bytes:
    """A member that takes the body (an object: level 1) to ``depth`` levels."""
    return with_field(b"[" * (depth - 1) + b"]" * (depth - 1))


REFUSED = [
    ("lone high in decoded_token", in_token(b'"\\ud800"'), "probe.json_surrogate"),
    ("lone low in decoded_token", in_token(b'"a\\uDC00b"'), "probe.json_surrogate"),
    ("high then non-low", in_token(b'"\\ud83d\\u0041"'), "probe.json_surrogate"),
    ("lone high in an ignored field", with_field(b'"\\udbff"'), "probe.json_surrogate"),
    ("lone high in a key", BASE[:-1] + b',"k\\ud800":1}', "probe.json_surrogate"),
    ("nesting 128", nested(128), "probe.json_depth"),
    ("nesting 200", nested(200), "probe.json_depth"),
    ("objects nesting 128", with_field(b'{"a":' * 127 + b"1" + b"}" * 127), "probe.json_depth"),
    ("1e400 in an ignored field", with_field(b"1e400"), "probe.json_number_range"),
    ("-1E+309 in an ignored field", with_field(b"-1E+309"), "probe.json_number_range"),
    ("400-digit integer", with_field(b"9" * 400), "probe.json_number_range"),
    ("index -0", BASE.replace(b'"index":0', b'"index":-0'), "probe.shape"),
    ("index 0.0", BASE.replace(b'"index":0', b'"index":0.0'), "probe.shape"),
]

ACCEPTED = [
    ("surrogate pair", in_token(b'"\\ud83d\\ude00"')),
    ("escaped backslash before u", in_token(b'"\\\\ud800"')),
    ("hangul escape (not a surrogate)", in_token(b'"\\ud55c"')),
    ("nesting 127", nested(127)),
    ("brackets inside a string", with_field(b'"' + b"[" * 300 + b'"')),
    ("brackets after an escaped quote", with_field(b'"\\"' + b"{" * 300 + b'\\\\"')),
    ("largest float64", with_field(b"-1.7976931348623157e308")),
    ("underflow to zero", with_field(b"1e-400")),
    ("308-digit integer (1e307)", with_field(b"1" + b"0" * 307)),
    ("-0 in an ignored field", with_field(b"-0")),
]


@pytest.mark.parametrize(("name", "raw", "rule"), REFUSED, ids=[r[0] for r in REFUSED])
def test_bodies_serde_json_refuses_are_refused(name: str, raw: bytes, rule: str) -> None:
    refused(rule, None, raw=raw)


@pytest.mark.parametrize(("name", "raw"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_bodies_serde_json_accepts_are_accepted(name: str, raw: bytes) -> None:
    assert check(None, raw=raw).topk_ids.tolist() == [[20, 5], [6, 7]]


def test_an_integer_minus_zero_logprob_is_negative_zero() -> None:
    """serde_json: ``-0`` is ``F64(-0.0)``; ``logprob_f64 as f32`` keeps the sign."""
    body = valid_response()
    body["choices"][0]["prompt_logprobs"][1] = {
        "20": {"logprob": -1234.5, "rank": 1, "decoded_token": "x"},
        "5": {"logprob": -20.0, "rank": 2, "decoded_token": "y"},
    }
    got = check(None, raw=serde(body).replace(b"-1234.5", b"-0", 1))
    value = got.topk_logprobs[0, 0]
    assert value == np.float32(0.0) and struct.pack(">f", value)[0] == 0x80


IDENTITY = make_identity()


def answering(status: int) -> object:
    """A vLLM-like teacher that answers every accepted request with ``status``."""
    inner = good_teacher(IDENTITY)

    def handle(request: Request, index: int) -> Reply:
        reply = inner(request, index)
        return Reply(status=status, body=reply.body) if reply.status == 200 else reply

    return handle


@pytest.mark.parametrize("status", [201, 203, 299])
def test_a_probe_answered_with_any_2xx_passes(status: int) -> None:
    async def main(url: str) -> object:
        async with httpx.AsyncClient(trust_env=False) as http:
            return await probe_teacher(
                http, completions_url=url, model_id="teacher-tiny", student=None,
                pinned=None, secret=None, limiter=ProbeLimiter(),
            )  # fmt: skip

    with TeacherServer(answering(status)) as server:  # type: ignore[arg-type]
        report = asyncio.run(main(server.url))
    assert getattr(report, "outcome", None) == "passed"


def test_the_job_scoring_wire_accepts_any_2xx() -> None:
    async def main(url: str) -> object:
        async with TeacherWire(url, tls=None, max_idle=1) as wire:
            target = ScoringTarget(
                wire=wire, model_id="teacher-tiny", secret=None, identity=IDENTITY, k=4
            )
            return await score_sequence(target, np.array([3, 1, 4, 1], dtype=np.int64))

    with TeacherServer(answering(203)) as server:  # type: ignore[arg-type]
        scored = asyncio.run(main(server.url))
    assert isinstance(scored, ScoredSequence) and scored.topk_ids.shape == (4, 4)
