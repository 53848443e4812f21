"""Replicas of one prepared launch (``launcher.replica_launch``; issue 17, item 4).

The whole path runs in the stand-in ``vllm`` virtual environment of
tests/launcher/test_launch.py (real staging, runtime hashing, accelerator
probe, recheck child, process groups, gateways and cleanup; only the vLLM
server is tests/launcher/fake_server.py): one prepare, two replicas on two
ports, each with its own socket directory and cache folder and the same
fingerprint; stopping them and closing the launch leaves nothing behind.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kiln_registry.domain.errors import LauncherError
from kiln_registry.identity.input_manifest import Accelerator, AcceleratorDevice
from kiln_registry.launcher.replica_launch import check_replica_device, swap_option
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import free_port
from tests.launcher.test_launch import _fake_vllm_venv

H200 = ("NVIDIA H200", "sm_90", 150_000_000_000)


def _gpus(*kinds: tuple[str, str, int]) -> Accelerator:
    devices = tuple(AcceleratorDevice(i, *kind) for i, kind in enumerate(kinds))
    return Accelerator(type="cuda", driver="12.4", devices=devices)


def test_swap_option_replaces_exactly_one_token() -> None:
    argv = ("serve", "--uds=/tmp/a/vllm.sock", "--seed=0")
    assert swap_option(argv, "--uds=", "/tmp/b/vllm.sock", "vLLM command")[1] == (
        "--uds=/tmp/b/vllm.sock"
    )
    for tokens in (("serve",), ("--port=1", "--port=2")):
        with pytest.raises(LauncherError) as caught:
            swap_option(tokens, "--port=", "3", "vLLM command")
        assert caught.value.rule == "launcher.replica"


def test_replica_devices_must_be_identical_gpus_of_the_launch() -> None:
    check_replica_device(_gpus(H200, H200), {"CUDA_VISIBLE_DEVICES": "1"})
    check_replica_device(Accelerator("cpu", "none", ()), {})  # no device: nothing to check
    refused = [
        (Accelerator("cpu", "none", (AcceleratorDevice(0, "cpu", "x86_64", 0),)), "0"),
        (_gpus(H200, H200), "2"),  # not on this host
        (_gpus(H200, ("NVIDIA A100", "sm_80", 80_000_000_000)), "0"),  # mixed models
        (_gpus(H200), "0,1"),
    ]
    for accelerator, value in refused:
        with pytest.raises(LauncherError) as caught:
            check_replica_device(accelerator, {"CUDA_VISIBLE_DEVICES": value})
        assert caught.value.rule == "launcher.replica_device", value


SCRIPT = """
import json, sys, time, urllib.request
from kiln_registry.launcher.launch import prepare_launch
from kiln_registry.launcher.policy import request_from_flags
from kiln_registry.local.launch_spec import LibraryPrepared
model, snapshots, caches, record, p0, p1 = sys.argv[1:]
flags = {"model-path": model, "snapshot-root": snapshots, "cache-root": caches,
         "served-model-id": "tiny", "max-top-k": "8", "max-model-len": "64"}
request = request_from_flags(flags, ["--host=127.0.0.1", "--port=" + p0], {})
import os
prepared = LibraryPrepared(prepare_launch(request, dict(os.environ)))
handles = []
try:
    for idx, port in enumerate((int(p0), int(p1))):
        handles.append(prepared.spawn_replica(idx, port, {"FAKE_VLLM_RECORD": f"{record}.{idx}"}))
    for handle in handles:
        handle.wait_ready(time.monotonic() + 120)
    health = [urllib.request.urlopen(h.url + "/health", timeout=30).status for h in handles]
    print(json.dumps({"urls": [h.url for h in handles], "health": health,
                      "fingerprints": [h.fingerprint for h in handles],
                      "prepared": prepared.fingerprint}), flush=True)
finally:
    for handle in handles:
        handle.stop()
    prepared.close()
"""


@pytest.mark.slow
def test_two_replicas_of_one_prepared_launch(tmp_path: Path, tiny_model: TinyModel) -> None:
    python = _fake_vllm_venv(tmp_path / "venv")
    from tests.launcher.fake_server import __file__ as fake_server

    snapshots, caches = tmp_path / "snapshots", tmp_path / "caches"
    ports = [free_port(), free_port()]
    record = tmp_path / "record.json"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "FAKE_VLLM_SERVER": fake_server}
    argv = [str(python), "-c", SCRIPT, str(tiny_model.path), str(snapshots), str(caches)]
    done = subprocess.run(
        [*argv, str(record), *map(str, ports)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["urls"] == [f"http://127.0.0.1:{port}" for port in ports]
    assert seen["health"] == [200, 200]
    assert seen["fingerprints"] == [seen["prepared"]] * 2  # one identity, composed once
    started = [json.loads(Path(f"{record}.{idx}").read_text()) for idx in range(2)]
    socks = [next(t[6:] for t in s["argv"] if t.startswith("--uds=")) for s in started]
    assert len(set(socks)) == 2 and all(Path(sock).name == "vllm.sock" for sock in socks)
    cache_dirs = [Path(s["env"]["VLLM_CACHE_ROOT"]) for s in started]
    assert [c.name for c in cache_dirs] == ["replica-0", "replica-1"]
    assert cache_dirs[0].parent == cache_dirs[1].parent  # inside the launch's private cache
    assert started[0]["env"]["TMPDIR"] != started[1]["env"]["TMPDIR"]
    # Everything is gone: the snapshot, the private cache, every socket directory.
    assert not any(p.name.startswith(("ready-", ".building-")) for p in snapshots.iterdir())
    assert not any(p.name.startswith("cache-") for p in caches.iterdir())
    assert not any(Path(sock).parent.exists() for sock in socks)
