"""The pure vLLM argv builder, readiness target and staged identity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.launcher.launch import (
    AdapterLaunch,
    base_model_name,
    health_target,
    redact_argv,
    vllm_server_argv,
)
from kiln_registry.launcher.policy import classify_vllm_options
from kiln_registry.launcher.teacher_input import measure_model, staged_model_part
from kiln_registry.testing.tiny_models import TinyModel

PY = "/usr/bin/python3"
FP = "kiln-teacher-v1.e30.abc"
BASE = "0123456789abcdef" + "f" * 48
OWNED = [
    "--served-model-name=teacher",
    "--max-model-len=4096",
    "--max-logprobs=32",
    "--logprobs-mode=raw_logprobs",
    "--generation-config=vllm",
    "--load-format=safetensors",
    "--fingerprint-mode=custom",
    f"--fingerprint-value={FP}",
]


def _argv(adapter: AdapterLaunch | None = None, cpu: bool = False) -> list[str]:
    return vllm_server_argv(
        python=PY,
        model_path="/s/ready-1-aa/model",
        served_model_id="teacher",
        max_model_len=4096,
        max_top_k=32,
        fingerprint=FP,
        adapter=adapter,
        extras=("--port=8001", "--api-key=k", "--dtype=float32"),
        cpu_build=cpu,
    )


def test_base_argv_exactly() -> None:
    assert _argv() == [
        PY, "-m", "vllm.entrypoints.cli.main", "serve", "/s/ready-1-aa/model",
        *OWNED, "--port=8001", "--api-key=k", "--dtype=float32",
    ]  # fmt: skip


def test_adapter_argv_exactly() -> None:
    adapter = AdapterLaunch("/s/ready-1-aa/adapter", 16, BASE)
    module = (
        '{"name":"teacher","path":"/s/ready-1-aa/adapter",'
        '"base_model_name":"kiln-base-0123456789abcdef"}'
    )
    owned = ["--served-model-name=kiln-base-0123456789abcdef", *OWNED[1:]]
    assert _argv(adapter) == [
        PY, "-m", "vllm.entrypoints.cli.main", "serve", "/s/ready-1-aa/model", *owned,
        "--enable-lora", "--max-loras=1", "--max-cpu-loras=1", "--max-lora-rank=16",
        f"--lora-modules={module}", "--port=8001", "--api-key=k", "--dtype=float32",
    ]  # fmt: skip
    assert json.loads(module)["base_model_name"] == base_model_name(BASE)


def test_vllm_cpu_argv_exactly() -> None:
    assert _argv(cpu=True) == [
        PY, "-m", "vllm.entrypoints.openai.api_server", "--model=/s/ready-1-aa/model",
        *OWNED, "--port=8001", "--api-key=k", "--dtype=float32",
    ]  # fmt: skip


def test_redaction() -> None:
    assert redact_argv(_argv()).count("--api-key=<redacted>") == 1
    assert "--api-key=k" not in redact_argv(_argv())


@pytest.mark.parametrize(
    ("tokens", "url"),
    [
        ((), "http://127.0.0.1:8000"),
        (("--host=0.0.0.0", "--port=9001"), "http://127.0.0.1:9001"),
        (("--host=127.0.0.2",), "http://127.0.0.2:8000"),
        (("--host=::",), "http://[::1]:8000"),
        (("--uds=/run/k.sock",), "http+unix:///run/k.sock"),
    ],
)
def test_health_target(tokens: tuple[str, ...], url: str) -> None:
    assert health_target(classify_vllm_options(tokens)).url == url


def test_staged_identity_from_manifest_equals_a_full_hash(
    tmp_path: Path, tiny_model: TinyModel, tiny_adapter: Path
) -> None:
    staging = pytest.importorskip("kiln_registry.launcher.staging")
    limiter = ReadRateLimiter(None)
    root = tmp_path / "snapshots"
    root.mkdir(mode=0o700)
    staged = staging.stage_snapshot(tiny_model.path, tiny_adapter, root, limiter=limiter)
    try:
        from_manifest = staged_model_part(staged, limiter=limiter)
        full = measure_model(str(staged.model_path), str(staged.adapter_path), limiter=limiter)
        assert from_manifest == full
        source = measure_model(str(tiny_model.path), str(tiny_adapter), limiter=limiter)
        assert source == full  # the dry-run identity equals the launch identity
    finally:
        staging.remove_snapshot(staged)


# -- the whole launch path, with a stand-in `vllm` distribution ------------------------
#
# vLLM is not installed in the test environment, and PYTHONPATH is refused by
# the launcher's own policy, so the test builds a real virtual environment that
# sees the project's packages (through a .pth file) plus a small installed
# distribution named `vllm` whose `vllm.entrypoints.cli.main` records how it was
# started and then runs tests/launcher/fake_server.py.  Everything else (staging,
# runtime hashing, the accelerator probe, the recheck child, spawn, signals and
# cleanup) is the real launcher.

FAKE_MAIN = """
import json, os, runpy, sys
listen = [a for a in sys.argv if a.startswith(("--port=", "--uds="))]
with open(os.environ["FAKE_VLLM_RECORD"], "w") as out:
    json.dump({"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ)}, out)
record = os.environ["FAKE_VLLM_RECORD"]
sys.argv = ["fake_server", "--port=1", *listen, "--pid-file=" + record + ".pids",
            "--record=" + record + ".requests"]
runpy.run_path(os.environ["FAKE_VLLM_SERVER"], run_name="__main__")
"""


def _check_gateway(port: int, vllm_argv: list[str]) -> None:
    """Through the launcher's gateway: the key is required, the base alias is refused."""
    import http.client

    module = json.loads(next(t for t in vllm_argv if t.startswith("--lora-modules="))[15:])

    def post(model: str, key: str | None) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = {"content-type": "application/json"}
        headers |= {"authorization": f"Bearer {key}"} if key else {}
        body = json.dumps({"model": model, "prompt": [1, 2], "max_tokens": 1})
        try:
            conn.request("POST", "/v1/completions", body=body, headers=headers)
            return conn.getresponse().status
        finally:
            conn.close()

    assert post("adapter", None) == 401
    assert post(module["base_model_name"], "launch-secret") == 404
    assert post("adapter", "launch-secret") == 200


def _fake_vllm_venv(root: Path) -> Path:
    import site
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    packages = next((root / "lib").glob("python3*/site-packages"))
    (packages / "kiln-project.pth").write_text(
        f"import site; site.addsitedir({site.getsitepackages()[0]!r})\n"
    )
    files = {
        "vllm/__init__.py": "",
        "vllm/entrypoints/__init__.py": "",
        "vllm/entrypoints/cli/__init__.py": "",
        "vllm/entrypoints/cli/main.py": FAKE_MAIN,
        "vllm-0.25.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: vllm\nVersion: 0.25.0\n",
        "vllm-0.25.0.dist-info/INSTALLER": "test\n",
    }
    for name, text in files.items():
        (packages / name).parent.mkdir(parents=True, exist_ok=True)
        (packages / name).write_text(text)
    record = "".join(f"{name},,\n" for name in files) + "vllm-0.25.0.dist-info/RECORD,,\n"
    (packages / "vllm-0.25.0.dist-info/RECORD").write_text(record)
    return root / "bin" / "python"


@pytest.mark.slow
def test_real_launch_path_with_a_stand_in_vllm(
    tmp_path: Path, tiny_model: TinyModel, tiny_adapter: Path
) -> None:
    import signal
    import subprocess
    import time

    from tests.helpers import free_port
    from tests.launcher.fake_server import __file__ as fake_server

    pytest.importorskip("kiln_registry.launcher.staging")
    python = _fake_vllm_venv(tmp_path / "venv")
    snapshots, caches = tmp_path / "snapshots", tmp_path / "caches"
    port = free_port()
    record = tmp_path / "record.json"
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "FAKE_VLLM_RECORD": str(record),
        "FAKE_VLLM_SERVER": fake_server,
        "KILN_TEACHER_STOP_GRACE_SECONDS": "5",
    }
    flags = [f"--model-path={tiny_model.path}", f"--adapter-path={tiny_adapter}",
             "--served-model-id=adapter", "--max-top-k=8", "--max-model-len=64",
             "--timings"]  # fmt: skip
    extras = ["--", f"--port={port}", "--host=127.0.0.1", "--api-key=launch-secret"]
    launcher = subprocess.Popen(
        [str(python), "-m", "kiln_registry.launcher", *flags, f"--snapshot-root={snapshots}",
         f"--cache-root={caches}", *extras],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert launcher.stdout is not None
        announced = json.loads(launcher.stdout.readline())
        assert announced["fingerprint"].startswith("kiln-teacher-v1.")
        snapshot = Path(announced["snapshot_path"])
        assert snapshot.parent == snapshots and snapshot.name.startswith("ready-")
        deadline = time.monotonic() + 60
        while not (caches / "attempts.jsonl").exists():
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        started = json.loads(record.read_text())
        assert started["cwd"] == "/"
        assert started["argv"][1:3] == ["serve", str(snapshot / "model")]
        assert f"--fingerprint-value={announced['fingerprint']}" in started["argv"]
        # The gateway is on by default: vLLM gets the private socket, no address, no key.
        assert not any(t.startswith(("--api-key", "--port", "--host")) for t in started["argv"])
        uds = next(t[6:] for t in started["argv"] if t.startswith("--uds="))
        assert Path(uds).parent.name.startswith("kiln-") and Path(uds).name == "vllm.sock"
        assert announced["url"] == f"http://127.0.0.1:{port}"
        assert announced["boundary"]["mode"] == "gateway"
        _check_gateway(port, started["argv"])
        timings = json.loads(launcher.stdout.readline())["timings"]  # --timings, once ready
        assert {"stage", "recheck", "vllm_ready", "gateway"} <= set(timings["phases"])
        cache = Path(started["env"]["VLLM_CACHE_ROOT"])
        assert cache.parent == caches and cache.name.startswith("cache-")
        assert started["env"]["PYTHONDONTWRITEBYTECODE"] == "1"
        assert not any(k.startswith("KILN_") for k in started["env"])
        server = json.loads(Path(f"{record}.pids").read_text())["server"]
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signal.SIGTERM, err
    assert "launch-secret" not in err + (caches / "attempts.jsonl").read_text()
    # Each attempt line carries the launch's phase timings (issue 31).
    attempt = json.loads((caches / "attempts.jsonl").read_text().splitlines()[0])
    phases = attempt["timings"]["phases"]
    assert {"resolve", "stage", "runtime_digest", "accelerator_probe", "tokenizer_identity",
            "recheck", "verify", "vllm_ready", "gateway"} <= set(phases)  # fmt: skip
    assert all(isinstance(v, float) and v >= 0 for v in phases.values())
    assert not Path(uds).parent.exists()  # the private runtime directory is removed
    seen = [json.loads(line) for line in Path(f"{record}.requests").read_text().splitlines()]
    assert {(s["method"], s["path"]) for s in seen} == {("GET", "/health"),
                                                       ("POST", "/v1/completions")}  # fmt: skip
    assert all("authorization" not in s["headers"] for s in seen)
    assert not any(p.name.startswith(("ready-", ".building-")) for p in snapshots.iterdir())
    assert not any(p.name.startswith("cache-") for p in caches.iterdir())
    assert not Path(started["env"]["TMPDIR"]).exists()
    # Zombies may linger until this sandbox's init reaps them; none may be alive.
    from kiln_registry.launcher.supervisor import group_members

    assert group_members(server) == []
