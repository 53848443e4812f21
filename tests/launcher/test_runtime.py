"""Runtime content (docs/identity.md section 8) over real installed trees.

Most tests build a small installed distribution (import tree, .dist-info,
RECORD) on a temporary ``sys.path`` entry so the whole walk runs in
milliseconds; one slow test hashes the real torch/transformers/tokenizers.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiln_registry.domain.errors import LauncherError
from kiln_registry.identity.digests import FileRecord, LabelledFile, runtime_content_sha256
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.launcher.runtime import runtime_content, runtime_versions

PKG = "kilnfakepkg"
DIST = f"{PKG}-1.2.3.dist-info"


def record_line(site: Path, rel: str) -> str:
    return f"{rel},sha256=x,{(site / rel).stat().st_size}"


def make_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, extra_record: str = "") -> Path:
    site = tmp_path / "site"
    (site / PKG / "sub").mkdir(parents=True)
    (site / PKG / "__init__.py").write_text("VALUE = 1\n")
    (site / PKG / "sub" / "mod.py").write_text("X = 2\n")
    (site / DIST).mkdir()
    (site / DIST / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PKG}\nVersion: 1.2.3\n")
    rels = [f"{PKG}/__init__.py", f"{PKG}/sub/mod.py", f"{DIST}/METADATA"]
    lines = [record_line(site, r) for r in rels] + [f"{DIST}/RECORD,,"]
    if extra_record:
        lines.append(extra_record)
    (site / DIST / "RECORD").write_text("\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    return site


def rec(path: Path) -> FileRecord:
    data = path.read_bytes()
    return FileRecord(hashlib.sha256(data).digest(), len(data))


def expected_digest(site: Path, extra: tuple[LabelledFile, ...] = ()) -> str:
    base = f"package/{PKG}"
    files = {
        "python/executable": Path(sys.executable).resolve(),
        f"{base}/import/__init__.py": site / PKG / "__init__.py",
        f"{base}/import/sub/mod.py": site / PKG / "sub" / "mod.py",
        f"{base}/metadata/METADATA": site / DIST / "METADATA",
        f"{base}/metadata/RECORD": site / DIST / "RECORD",
        f"{base}/distribution/{PKG}/__init__.py": site / PKG / "__init__.py",
        f"{base}/distribution/{PKG}/sub/mod.py": site / PKG / "sub" / "mod.py",
        f"{base}/distribution/{DIST}/METADATA": site / DIST / "METADATA",
        f"{base}/distribution/{DIST}/RECORD": site / DIST / "RECORD",
    }
    dirs = [f"{base}/import", f"{base}/import/sub", f"{base}/metadata"]
    labelled = [LabelledFile(k, rec(v)) for k, v in files.items()] + list(extra)
    return runtime_content_sha256(dirs, labelled)


def test_fake_distribution_digest_and_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = make_site(tmp_path, monkeypatch)
    limiter = ReadRateLimiter(None)
    content = runtime_content(limiter=limiter, packages=(PKG,))
    assert content.sha256 == expected_digest(site)
    assert (content.files, content.directories) == (9, 3)
    assert content.versions[PKG] == "1.2.3"
    assert set(content.versions) == {"python", "python_implementation", PKG}
    # Each resolved file is read once although two labels name it.
    unique = Path(sys.executable).resolve().stat().st_size + sum(
        p.stat().st_size for p in site.rglob("*") if p.is_file()
    )
    assert limiter.total_bytes == unique
    assert content.bytes > unique


def test_digest_is_stable_across_workers_and_changes_with_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = make_site(tmp_path, monkeypatch)
    one = runtime_content(limiter=ReadRateLimiter(None), packages=(PKG,), workers=1)
    four = runtime_content(limiter=ReadRateLimiter(None), packages=(PKG,), workers=4)
    assert one == four
    (site / PKG / "sub" / "mod.py").write_text("X = 3\n")
    assert runtime_content(limiter=ReadRateLimiter(None), packages=(PKG,)).sha256 != one.sha256


def test_missing_record_file_aborts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_site(tmp_path, monkeypatch, extra_record=f"{PKG}/gone.py,sha256=x,1")
    with pytest.raises(LauncherError) as err:
        runtime_content(limiter=ReadRateLimiter(None), packages=(PKG,))
    assert err.value.rule == "runtime_content.missing_file"
    assert "gone.py" in err.value.message


def test_special_file_in_import_tree_aborts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = make_site(tmp_path, monkeypatch)
    os.mkfifo(site / PKG / "pipe")
    with pytest.raises(LauncherError) as err:
        runtime_content(limiter=ReadRateLimiter(None), packages=(PKG,))
    assert err.value.rule == "runtime_content.special_file"


def test_symlinks_are_followed_and_a_shared_file_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = make_site(tmp_path, monkeypatch)
    before = runtime_content(limiter=ReadRateLimiter(None), packages=(PKG,))
    (site / PKG / "alias.py").symlink_to(site / PKG / "sub" / "mod.py")
    limiter = ReadRateLimiter(None)
    after = runtime_content(limiter=limiter, packages=(PKG,))
    assert after.files == before.files + 1 and after.sha256 != before.sha256
    unique = Path(sys.executable).resolve().stat().st_size + sum(
        p.stat().st_size for p in site.rglob("*") if p.is_file() and not p.is_symlink()
    )
    assert limiter.total_bytes == unique


def test_directory_cycle_aborts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = make_site(tmp_path, monkeypatch)
    (site / PKG / "sub" / "loop").symlink_to(site / PKG)
    with pytest.raises(LauncherError) as err:
        runtime_content(limiter=ReadRateLimiter(None), packages=(PKG,))
    assert err.value.rule == "runtime_content.cycle"


def test_single_module_origin_is_labelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    dist = site / "kilnfakemod-0.1.dist-info"
    dist.mkdir(parents=True)
    (site / "kilnfakemod.py").write_text("Y = 1\n")
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kilnfakemod\nVersion: 0.1\n")
    (dist / "RECORD").write_text("kilnfakemod.py,,\nkilnfakemod-0.1.dist-info/METADATA,,\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    content = runtime_content(limiter=ReadRateLimiter(None), packages=("kilnfakemod",))
    # executable, import-origin, metadata x2, distribution x2
    assert content.files == 6
    assert content.directories == 1


def test_two_namespace_roots_abort(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a", "b"):
        (tmp_path / name / "kilnfakens").mkdir(parents=True)
        (tmp_path / name / "kilnfakens" / "m.py").write_text("")
        monkeypatch.syspath_prepend(str(tmp_path / name))
    importlib.invalidate_caches()
    with pytest.raises(LauncherError) as err:
        runtime_content(limiter=ReadRateLimiter(None), packages=("kilnfakens",))
    assert err.value.rule == "runtime_content.namespace_roots"


def test_missing_package_names_the_install_extra() -> None:
    with pytest.raises(LauncherError) as err:
        runtime_content(limiter=ReadRateLimiter(None), packages=("kiln_no_such_package",))
    assert err.value.rule == "runtime_content.package_missing"
    assert "kiln_no_such_package" in err.value.message


def test_runtime_versions_without_vllm_names_the_extra(python_without_vllm: Path) -> None:
    script = (
        "from kiln_registry.domain.errors import LauncherError\n"
        "from kiln_registry.launcher.runtime import runtime_versions\n"
        "try:\n"
        "    runtime_versions()\n"
        "except LauncherError as exc:\n"
        "    print(exc.message)\n"
        "    print(exc.hint)\n"
    )
    done = subprocess.run(
        [str(python_without_vllm), "-c", script],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    message, hint = done.stdout.splitlines()[:2]
    assert "'vllm'" in message
    assert "kiln-registry[vllm" in hint


def test_runtime_versions_of_installed_packages() -> None:
    versions = runtime_versions(("torch", "transformers", "tokenizers"))
    assert list(versions) == [
        "python",
        "python_implementation",
        "torch",
        "transformers",
        "tokenizers",
    ]
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))


@pytest.mark.parametrize("name", ["", "a-b", "1x", "a..b", "../x"])
def test_invalid_package_names_are_refused(name: str) -> None:
    with pytest.raises(LauncherError) as err:
        runtime_content(limiter=ReadRateLimiter(None), packages=(name,))
    assert err.value.rule == "runtime_content.package_name"


def test_real_tokenizers_package_is_stable() -> None:
    one = runtime_content(limiter=ReadRateLimiter(None), packages=("tokenizers",))
    two = runtime_content(limiter=ReadRateLimiter(None), packages=("tokenizers",), workers=1)
    assert one == two
    assert one.files > 10


@pytest.mark.slow  # hashes about 1 GiB of installed torch and transformers
def test_real_heavy_runtime_is_stable() -> None:
    packages = ("torch", "transformers", "tokenizers")
    one = runtime_content(limiter=ReadRateLimiter(None), packages=packages)
    two = runtime_content(limiter=ReadRateLimiter(None), packages=packages)
    assert one == two


def test_record_entries_outside_the_site_and_through_linked_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Console scripts (``../bin/x``) and a RECORD folder reached through a link
    resolve to the real files; each label is hashed from its real file."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "kilnfake-tool").write_text("#!/bin/sh\n")
    (tmp_path / "real-data").mkdir()
    (tmp_path / "real-data" / "table.txt").write_text("1 2 3\n")
    site = make_site(
        tmp_path,
        monkeypatch,
        extra_record="../bin/kilnfake-tool,,\nkilnfake-data/table.txt,,",
    )
    (site / "kilnfake-data").symlink_to(tmp_path / "real-data")
    limiter = ReadRateLimiter(None)
    content = runtime_content(limiter=limiter, packages=(PKG,))
    base = f"package/{PKG}/distribution"
    extra = (
        LabelledFile(f"{base}/../bin/kilnfake-tool", rec(tmp_path / "bin" / "kilnfake-tool")),
        LabelledFile(f"{base}/kilnfake-data/table.txt", rec(tmp_path / "real-data" / "table.txt")),
    )
    assert content.sha256 == expected_digest(site, extra)
    assert content.files == 11
    (tmp_path / "real-data" / "table.txt").unlink()
    with pytest.raises(LauncherError) as err:
        runtime_content(limiter=ReadRateLimiter(None), packages=(PKG,))
    assert err.value.rule == "runtime_content.missing_file"
    assert "table.txt" in err.value.message
