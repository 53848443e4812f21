"""Building a claimed generation job's pipeline once phases (a) to (c) passed.

Imports: standard library, ``kiln_registry.probe`` types and ``jobs``.
"""

from __future__ import annotations

import asyncio

from kiln_registry.jobs.generation import GenerationPipeline
from kiln_registry.jobs.generation_sources import GenerationSettings, student_tokenizer
from kiln_registry.jobs.generation_wire import GenerationTarget
from kiln_registry.jobs.state import ClaimedJob
from kiln_registry.probe.client import SecretSource
from kiln_registry.probe.wire import TeacherWire


async def generation_pipeline(
    claimed: ClaimedJob, wire: TeacherWire, secret: SecretSource | None
) -> GenerationPipeline:
    job = claimed.job
    assert job.generation_json is not None, "generation jobs record their settings"
    settings = GenerationSettings.from_json(job.generation_json)
    model_dir = claimed.env.config.student.model_path
    tokenizer = await asyncio.to_thread(student_tokenizer, model_dir)
    target = GenerationTarget(
        wire=wire, model_id=job.teacher_model_id, secret=secret,
        identity=claimed.identity, settings=settings,
    )  # fmt: skip
    return GenerationPipeline(claimed, target, tokenizer)
