"""Identity bars of the launch path: known answers pinned before issue 31's rework.

The values below were computed by the launcher as it was BEFORE the launch-time
work of issue 31 (commit c6d09ff: tokenizer digests through Transformers in the
launcher process, the runtime digest and the recheck run one after another).
The rework moves work into children and threads; the same inputs must still
give the same digests, identity and fingerprint byte for byte.

The runtime half (versions, runtime content, accelerator) depends on the host,
so it is fixed here; its digest has its own spec-level test
(tests/launcher/test_runtime.py).  The tiny models are built deterministically
(seed 0) by kiln_registry.testing; a new torch or tokenizers release that
changed their bytes would change these values too, and then the test says so.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.identity.input_manifest import Accelerator, AcceleratorDevice
from kiln_registry.launcher.identity_probe import IdentityProbe
from kiln_registry.launcher.policy import parse_launcher_argv
from kiln_registry.launcher.staging import remove_snapshot, stage_snapshot
from kiln_registry.launcher.teacher_input import RuntimePart, staged_model_part, teacher_input
from kiln_registry.launcher.vllm_command import compose_launch_identity
from kiln_registry.testing.tiny_models import TinyModel

RUNTIME = RuntimePart(
    versions={
        "python": "3.11.7",
        "python_implementation": "CPython",
        "vllm": "0.32.0",
        "torch": "2.13.0+cpu",
        "transformers": "5.19.0",
        "tokenizers": "0.23.3",
    },
    content_sha256="5" * 64,
    accelerator=Accelerator("cpu", "Linux:6.1.0", (AcceleratorDevice(0, "AMD EPYC", "x86_64", 0),)),
)
ENV = {"PATH": "/usr/bin:/bin", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONDONTWRITEBYTECODE": "1"}

BASE = "5894bb3dd851c9cd3d44148a1c49b511d91deb8d0d45f9757f1db4815f50f287"
CONFIG = "ad4b474cccd4e6945ab9d556e9d2acd722327450fc6b86625c58d84da7d8f4a4"
VOCAB = "255ab54fd46bbe8a475b2ff850eea3181874c5e8474b0749011c71f2ed1b5df0"
TOKENIZER_CONFIG = "90ddc929c175d777b1167e1f243e04310c4f6dd36278fb0a0bc781b2597cd7c2"
PINNED: dict[str, dict[str, object]] = {
    "model": {
        "model_part": {
            "base_model_sha256": BASE,
            "snapshot_content_sha256": (
                "5bfba147d4d4829ca22044a90f293e48b8c37736182093793c17d33ef73e06f5"
            ),
            "model_config_sha256": CONFIG,
            "tokenizer_vocab_sha256": VOCAB,
            "tokenizer_config_sha256": TOKENIZER_CONFIG,
            "vocab_size": 512,
            "adapter_weights_sha256": None,
            "adapter_config_sha256": None,
            "adapter_rank_cap": None,
        },
        "identity_sha256": "28a55db4fa40ada116ebd1f68eba16a8d494b9628af09e7fba8709b1f74e9972",
        "fingerprint_sha256": "ab9b938bc8ff8df4a470b5ac906b187bc72ac7fd58cbb822392a34f447f01e76",
        "inference_config_sha256": (
            "b98ae9729476626958247c1b5f36e7bfccda4aca210882b25ddceeebe84f1280"
        ),
    },
    "adapter": {
        "model_part": {
            "base_model_sha256": BASE,
            "snapshot_content_sha256": (
                "274191a85b9367fc9f76414861d66590434bbec2810c5f1a78b4f5768d896025"
            ),
            "model_config_sha256": CONFIG,
            "tokenizer_vocab_sha256": VOCAB,
            "tokenizer_config_sha256": TOKENIZER_CONFIG,
            "vocab_size": 512,
            "adapter_weights_sha256": (
                "af1304114c797f29e373034ee2fd4890415d906f38b4f6d51c15ff92a5c1b416"
            ),
            "adapter_config_sha256": (
                "84fc7a617c4d62ca8c5c9ba7d3e4bb083ba9d07af7d5e31cb20ab3270113ea89"
            ),
            "adapter_rank_cap": 8,
        },
        "identity_sha256": "fb94089febcf283e226a7c9266a5bb3139998075dbee7c50a4728fd3af6416f2",
        "fingerprint_sha256": "ec387d353961b88480df9ab5250b0f6bcbbc350c8d92ad419afa620edc963eb7",
        "inference_config_sha256": (
            "d66d7675e88668318d7b00e178cedd698e02c469d12a07baca10ee01b533d552"
        ),
    },
}


def _launch_identity(tmp_path: Path, model: Path, adapter: Path | None) -> dict[str, object]:
    flags = [f"--model-path={model}", "--served-model-id=pinned", "--max-top-k=8",
             "--max-model-len=256", f"--snapshot-root={tmp_path}/s", f"--cache-root={tmp_path}/c",
             "--", "--dtype=float32", "--enforce-eager"]  # fmt: skip
    if adapter is not None:
        flags.insert(1, f"--adapter-path={adapter}")
    request = parse_launcher_argv(flags, {"HOME": str(tmp_path)})
    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    limiter = ReadRateLimiter(None)
    staged = stage_snapshot(model, adapter, root, limiter=limiter)
    probe = IdentityProbe(dict(ENV), python=sys.executable)
    try:
        part = staged_model_part(staged, limiter=limiter)
        # The launch asks the identity-probe child (Transformers out of this process).
        assert staged_model_part(staged, limiter=limiter, tokenizer=probe.tokenizer) == part
        assert probe.accelerator().devices  # read before the tokenizer line
    finally:
        probe.close()
        remove_snapshot(staged)
    composed = compose_launch_identity(
        request, teacher_input(part, RUNTIME, served_model_id="pinned"), ENV
    )
    return {
        "model_part": {k: getattr(part, k) for k in part.__dataclass_fields__},
        "identity_sha256": composed.identity.digest(),
        "fingerprint_sha256": hashlib.sha256(composed.identity.fingerprint().encode()).hexdigest(),
        "inference_config_sha256": composed.identity.inference_config_sha256,
    }


@pytest.mark.parametrize("with_adapter", [False, True], ids=["model", "adapter"])
def test_launch_identity_is_pinned(
    tmp_path: Path, tiny_model: TinyModel, tiny_adapter: Path, with_adapter: bool
) -> None:
    found = _launch_identity(tmp_path, tiny_model.path, tiny_adapter if with_adapter else None)
    assert found == PINNED["adapter" if with_adapter else "model"]
