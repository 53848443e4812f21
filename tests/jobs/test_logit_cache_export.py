"""A real scoring job on the reference teacher, exported as Kiln's logit cache v3.

The job runs over HTTP against the eager reference teacher; its signed corpus is
exported with ``kiln corpus export --format kiln-logit-cache-v3`` into a cache
root and into ``.tar.gz`` archives.  Every entry is read back with Kiln's rules
(``tests/kiln_conformance/logit_cache_rules.py``), and every row an OPD run over
the scored sequences would ask for (``target_token_positions_to_logits_rows`` of
its action tokens, at any ``top_k`` up to the job's K) is a hit.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from kiln_registry.cli.main import run
from kiln_registry.domain.errors import InputError
from kiln_registry.jobs.scoring import logit_cache as lc
from kiln_registry.jobs.scoring.logit_cache_store import put_entry
from kiln_registry.testing.tiny_models import TinyModel
from tests.jobs.conftest import REFERENCE_MODEL_ID, ReferenceTeacher
from tests.jobs.harness import make_config, running_registry
from tests.kiln_conformance import logit_cache_rules as kiln

# The first and last share their first five tokens, so the rows after each of those
# prefixes are the same cache entries.  Both are six tokens long: CPU kernels choose
# their blocking by sequence length, so only forwards of one shape give the shared rows
# bit for bit (a 4-token prefix of a 6-token sequence differed in the last bits on one
# machine, and Kiln's merge refuses any difference).
SEQUENCES = [[5, 9, 11, 40, 41, 7], [7, 3], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [5, 9, 11, 40, 41, 2]]
SHARED = 5
K = 4
PROMPT_TOKENS = 2  # an OPD run's action tokens: everything after the first two tokens


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _scored_corpus(tmp_path: Path, tiny_model: TinyModel, teacher: ReferenceTeacher) -> Path:
    config = make_config(tmp_path, tiny_model.path)
    with running_registry(config) as reg:
        reg.register("ref@tiny", teacher.url, REFERENCE_MODEL_ID)
        submitted = reg.submit("ref@tiny", K, sequences=SEQUENCES)
        assert submitted.status_code == 201, submitted.text
        job = reg.wait(submitted.json()["id"])
        assert job["status"] == "succeeded", job
        corpus = tmp_path / "scores.jsonl"
        corpus.write_bytes(reg.http.get(f"/v1/jobs/{job['id']}/result").content)
        (tmp_path / "keys.json").write_text(json.dumps(reg.http.get("/v1/keys").json()))
    return corpus


def _export(corpus: Path, to: Path, keys: Path, capsys: pytest.CaptureFixture[str]) -> str:
    argv = ["corpus", "export", str(corpus), "--format", "kiln-logit-cache-v3", "--to", str(to),
            "--public-key", str(keys)]  # fmt: skip
    assert run(argv) == 0
    return capsys.readouterr().out


def test_a_scoring_job_exports_as_kiln_logit_cache_v3(
    tmp_path: Path,
    tiny_model: TinyModel,
    reference_teacher: ReferenceTeacher,
    capsys: pytest.CaptureFixture[str],
) -> None:
    corpus = _scored_corpus(tmp_path, tiny_model, reference_teacher)
    keys, root = tmp_path / "keys.json", tmp_path / "cache"
    out = _export(corpus, root, keys, capsys)
    total = sum(len(s) for s in SEQUENCES)
    # The rows after [5], [5, 9], ... [5, 9, 11, 40, 41] are the same entries in both.
    written = f"({total - SHARED} written, {SHARED} kept"
    assert f"{len(SEQUENCES)} sequences, {total} entries {written}" in out

    ident_json = reference_teacher.identity.canonical_bytes().decode()
    rows = [json.loads(line) for line in corpus.read_text().splitlines()[1:-1]]
    files = {p for p in root.rglob("*") if p.is_file()}
    # Every entry passes Kiln's validation and sits at the path its contents derive.
    for path in files:
        entry = kiln.parse_canonical(path.read_bytes(), ident_json)
        assert path.parent.parent.name == f"v3-{kiln.content_revision(ident_json)}"
        assert path.parent.name == entry["prefix_sha256"]
        assert path.name == f"{entry['position']}.json"
    # Every row an OPD run over these sequences requests is a hit at K (and any k <= K).
    hits = 0
    for row in rows:
        tokens = row["token_ids"]
        targets = list(range(PROMPT_TOKENS, len(tokens))) or [len(tokens) - 1]
        requested = [r for r in kiln.target_rows(len(tokens), [t for t in targets if t > 0])]
        for position in [*requested, len(tokens) - 1]:  # the final row: Kiln's causal probe
            hit = kiln.kiln_get(root, ident_json, tokens, position)
            assert hit is not None and hit["top_k"] >= K
            assert hit["indices"] == row["topk_ids"][position]
            assert hit["logprobs"] == row["topk_logprobs"][position]
            hits += 1
    assert hits >= len(files) - len(SEQUENCES) * PROMPT_TOKENS
    assert len(files) == total - SHARED

    # Exporting again merges without change.
    before = _snapshot(root)
    assert f"({total} kept" in _export(corpus, root, keys, capsys).replace("0 written, ", "")
    assert _snapshot(root) == before

    # A row that differs from the stored one by a flipped logprob is refused; nothing changes.
    path = sorted(files)[0]
    stored = lc.parse_entry(path.read_bytes())
    flipped = list(stored.row.logprobs)
    flipped[-1] = lc.to_f32(flipped[-1] - 0.5)
    row = lc.CacheRow(stored.row.indices, tuple(flipped), stored.row.produced_at)
    candidate = lc.StoredEntry(stored.identity, stored.prefix, stored.position, row)
    with pytest.raises(InputError) as caught:
        put_entry(root, candidate)
    assert caught.value.rule == "logit_cache.conflict"
    assert _snapshot(root) == before

    # The archive: deterministic, Kiln's member layout, the same entries as the root.
    first, second = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    _export(corpus, first, keys, capsys)
    _export(corpus, second, keys, capsys)
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(first.read_bytes()))) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert members == {f"logit-cache/{name}": data for name, data in before.items()}
    assert not list(tmp_path.glob(".*staging*")) and not list(tmp_path.glob(".*partial"))


def test_a_job_with_output_kiln_logit_cache_v3_publishes_into_the_cache_root(
    tmp_path: Path, tiny_model: TinyModel, reference_teacher: ReferenceTeacher
) -> None:
    root = tmp_path / "kiln-cache"
    root.mkdir()
    config = make_config(tmp_path, tiny_model.path, logit_cache_root=str(root))
    ident_json = reference_teacher.identity.canonical_bytes().decode()
    sequences = SEQUENCES[:2]
    with running_registry(config) as reg:
        reg.register("ref@tiny", reference_teacher.url, REFERENCE_MODEL_ID)
        bad = reg.submit("ref@tiny", K, sequences=sequences, output="kiln-logit-cache-v2")
        assert bad.status_code == 400, bad.text
        submitted = reg.submit("ref@tiny", K, sequences=sequences, output="kiln-logit-cache-v3")
        assert submitted.status_code == 201, submitted.text
        assert submitted.json()["output"] == "kiln-logit-cache-v3"
        job = reg.wait(submitted.json()["id"])
        assert job["status"] == "succeeded", job["error"]
        rows = [json.loads(line) for line in
                reg.http.get(f"/v1/jobs/{job['id']}/result").text.splitlines()[1:-1]]  # fmt: skip
        for row in rows:
            tokens = row["token_ids"]
            for position in range(len(tokens)):
                hit = kiln.kiln_get(root, ident_json, tokens, position)
                assert hit is not None and hit["indices"] == row["topk_ids"][position]
                assert hit["produced_at"].endswith("+00:00")
        before = _snapshot(root)
        assert len(before) == sum(len(s) for s in sequences)

        # A stored entry that disagrees with the teacher: the next job fails closed, the
        # conflicting file stays as it was and the job leaves no corpus.
        path = root / sorted(before)[0]
        stored = lc.parse_entry(path.read_bytes())
        flipped = (*stored.row.logprobs[:-1], lc.to_f32(stored.row.logprobs[-1] - 0.5))
        changed = lc.CacheRow(stored.row.indices, flipped, stored.row.produced_at)
        path.write_bytes(lc.StoredEntry(stored.identity, stored.prefix, stored.position,
                                        changed).encode())  # fmt: skip
        tampered = _snapshot(root)
        again = reg.submit("ref@tiny", K, sequences=sequences, output="kiln-logit-cache-v3")
        failed = reg.wait(again.json()["id"])
        assert failed["status"] == "failed", failed
        assert failed["error"]["rule"] == "logit_cache.conflict", failed
        assert _snapshot(root) == tampered
        assert not (tmp_path / "results" / f"{failed['id']}.jsonl").exists()
