"""``kiln jobs``, ``kiln cache`` and ``kiln corpus verify`` against a real registry on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiln_registry.cli.main import run
from kiln_registry.testing.tiny_models import TinyModel
from tests.jobs.harness import Controlled, make_config, running_registry, student_identity
from tests.pg_server import database_settings
from tests.probe.teacher_server import TeacherServer


def _toml(tmp_path: Path, student: Path) -> Path:
    path = tmp_path / "kiln.toml"
    server = "".join(f'{k} = "{v}"\n' for k, v in database_settings(tmp_path / "db").items())
    path.write_text(
        f"[server]\n{server}"  # make_config's database, on either backend
        f'[student]\nmodel_path = "{student}"\n'
        f'[jobs]\ncorpus_root = "{tmp_path / "corpora"}"\nresult_root = "{tmp_path / "results"}"\n',
        encoding="utf-8",
    )
    return path


def test_the_job_commands_end_to_end(
    tmp_path: Path,
    tiny_model: TinyModel,
    student_vocab_sha256: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pinned = student_identity(student_vocab_sha256)
    other = student_identity(student_vocab_sha256, inference="9" * 64)
    config = make_config(tmp_path, tiny_model.path)
    with (
        TeacherServer(Controlled(pinned)) as first,
        TeacherServer(Controlled(other)) as second,
        running_registry(config) as reg,
    ):
        reg.register("t", f"http://127.0.0.1:{first.port}", "teacher-tiny")
        server = ["--server", reg.url]
        seqs = tmp_path / "seqs.json"
        seqs.write_text(json.dumps([[1, 2, 3], [4, 5]]))
        assert run(["jobs", "submit", "--teacher", "t", "--top-k", "3", "--sequences", str(seqs),
                    *server]) == 0  # fmt: skip
        job_id = capsys.readouterr().out.strip()
        assert run(["jobs", "show", job_id, "--follow", "--interval", "0.05", *server]) == 0
        out = capsys.readouterr().out
        # stdout is not a terminal here: no bar (tests/observability/test_progress.py draws
        # one on a pty), only the finished job.
        assert "succeeded" in out and "identity" in out and "\r" not in out
        assert run(["jobs", "list", *server]) == 0 and job_id in capsys.readouterr().out
        corpus = tmp_path / "out.jsonl"
        assert run(["jobs", "result", job_id, "--output", str(corpus), *server]) == 0
        assert (
            corpus.read_text().splitlines()[0]
            == reg.http.get("/v1/teachers/t").json()["off_policy_manifest"]
        )
        assert run(["corpus", "verify", str(corpus), *server]) == 0
        out = capsys.readouterr().out
        assert "still registered as t" in out and "signed by registry key" in out
        keyfile = tmp_path / "keys.json"
        assert run(["keys", "show", *server, "--json"]) == 0
        keyfile.write_text(capsys.readouterr().out)
        offline = ["corpus", "verify", str(corpus), "--public-key", str(keyfile)]
        assert run([*offline, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert (report["ok"], report["registered"], report["sequences"]) == (True, None, 2)
        assert report["key_id"] == json.loads(keyfile.read_text())["keys"][0]["key_id"]
        assert run([*offline, *server]) == 2
        assert "either --public-key or --server" in capsys.readouterr().err

        assert run(["jobs", "cancel", job_id, *server]) == 2
        assert "job_conflict" in capsys.readouterr().err

        toml = _toml(tmp_path, tiny_model.path)
        assert run(["cache", "stats", "--config", str(toml), "--json"]) == 0
        stats = json.loads(capsys.readouterr().out)
        assert stats == [{"identity_digest": pinned.digest(), "top_k": 3, "rows": 2,
                          "bytes": stats[0]["bytes"]}]  # fmt: skip
        assert run(["cache", "prune", "--config", str(toml), "--identity", pinned.revision()]) == 0
        assert "removed 2 cached rows" in capsys.readouterr().out

        # The alias now names another identity: the corpus is no longer the registered one.
        assert reg.http.delete("/v1/teachers/t").status_code == 200
        # A deleted alias stays reserved until an admin releases it (issue 15).
        assert reg.http.post("/v1/admin/aliases/t/release").status_code == 200
        reg.register("t", f"http://127.0.0.1:{second.port}", "teacher-tiny")
        assert run(["corpus", "verify", str(corpus), *server]) == 2
        assert "corpus.identity_not_registered" in capsys.readouterr().err

    original = corpus.read_text().splitlines()
    assert run(offline) == 0 and "offline" in capsys.readouterr().out
    # A well-formed edit of one score: only the signature can tell.
    row = json.loads(original[1])
    row["topk_logprobs"][0][-1] -= 1.0
    edits = {
        "corpus.sha256": [original[0], json.dumps(row, separators=(",", ":")), *original[2:]],
        "line 2: every topk_ids row": [
            original[0],
            original[1].replace('"top_k":3', '"top_k":2'),
            *original[2:],
        ],
        "corpus.unsigned": original[:-1],
    }
    for rule, lines in edits.items():
        corpus.write_text("\n".join(lines) + "\n")
        assert run(offline) == 2
        assert rule in capsys.readouterr().err
    assert run(["corpus", "verify", str(corpus), "--server", "http://127.0.0.1:9"]) == 2
    assert "client.connect" in capsys.readouterr().err
    assert run(["jobs", "show", "not-a-job", "--server", "http://127.0.0.1:9"]) == 2
