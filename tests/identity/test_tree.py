"""Bounded tree inventory on real directories."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.tree import TreeLimits, inventory_tree


def make_tree(root: Path) -> Path:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "b.txt").write_bytes(b"bb")
    (root / "a.txt").write_bytes(b"a")
    (root / "é.txt").write_bytes(b"e")
    (root / "Z.txt").write_bytes(b"")
    (root / "sub" / "deeper" / "x.bin").write_bytes(b"xyz")
    return root


def refused(root: Path, rule: str, limits: TreeLimits | None = None) -> IdentityError:
    with pytest.raises(IdentityError) as err:
        inventory_tree(root, limits=limits or TreeLimits())
    assert err.value.rule == rule
    return err.value


def test_inventory_is_relative_posix_and_sorted_by_utf8(tmp_path: Path) -> None:
    inv = inventory_tree(make_tree(tmp_path / "m"))
    assert inv.root == str(tmp_path / "m")
    assert inv.directories == ("empty", "sub", "sub/deeper")
    assert [f.relpath for f in inv.files] == [
        "Z.txt",
        "a.txt",
        "b.txt",
        "sub/deeper/x.bin",
        "é.txt",
    ]
    assert [f.size for f in inv.files] == [0, 1, 2, 3, 1]
    assert inv.total_bytes == 7
    assert inv.file("a.txt") is not None and inv.file("nope") is None
    entry = inv.files[3]
    assert inv.path_of(entry) == str(tmp_path / "m" / "sub" / "deeper" / "x.bin")


def test_inventory_is_stable_and_independent_of_location(tmp_path: Path) -> None:
    one = inventory_tree(make_tree(tmp_path / "one"))
    assert inventory_tree(tmp_path / "one") == one
    os.rename(tmp_path / "one", tmp_path / "two")
    moved = inventory_tree(tmp_path / "two")
    assert moved.files == one.files and moved.directories == one.directories


def test_symlinked_file_is_refused_with_materialize_hint(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    (root / "sub" / "link.safetensors").symlink_to(root / "a.txt")
    err = refused(root, "tree.symlink")
    assert "link.safetensors" in err.message
    assert "cp -rL" in err.hint and "--local-dir" in err.hint


def test_symlinked_directory_and_dangling_link_are_refused(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    (root / "dirlink").symlink_to(root / "sub")
    refused(root, "tree.symlink")
    (root / "dirlink").unlink()
    (root / "dangling").symlink_to(root / "nowhere")
    refused(root, "tree.symlink")


def test_root_must_be_a_real_directory(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    (tmp_path / "alias").symlink_to(root)
    refused(tmp_path / "alias", "tree.symlink")
    refused(root / "a.txt", "tree.root_not_directory")
    refused(tmp_path / "absent", "tree.root_missing")


def test_fifo_is_refused(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    os.mkfifo(root / "sub" / "pipe")
    err = refused(root, "tree.special_file")
    assert "pipe" in err.message


def test_socket_is_refused(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    path = root / "s"
    if len(os.fsencode(path)) > 100:
        pytest.skip("tmp path too long for an AF_UNIX socket")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(os.fspath(path))
        refused(root, "tree.special_file")


def test_two_paths_to_one_inode_are_refused(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    os.link(root / "a.txt", root / "sub" / "again.txt")
    err = refused(root, "tree.hardlink")
    assert "again.txt" in err.message and "a.txt" in err.message


def test_hard_link_to_a_file_outside_the_tree_is_allowed(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    os.link(root / "a.txt", tmp_path / "outside.txt")
    assert len(inventory_tree(root).files) == 5


def test_non_utf8_name_is_refused(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    fd = os.open(os.fsencode(root) + b"/bad\xff.json", os.O_CREAT | os.O_WRONLY, 0o600)
    os.close(fd)
    refused(root, "tree.name_utf8")


def test_control_character_name_is_refused(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    (root / "new\nline").write_bytes(b"")
    refused(root, "tree.name_control")


def test_entry_limit_is_checked_before_appending(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    assert len(inventory_tree(root, limits=TreeLimits(max_entries=8)).files) == 5
    refused(root, "tree.too_many_entries", TreeLimits(max_entries=7))


def test_byte_limit(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    inventory_tree(root, limits=TreeLimits(max_bytes=7))
    refused(root, "tree.too_many_bytes", TreeLimits(max_bytes=6))


def test_depth_limit(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    inventory_tree(root, limits=TreeLimits(max_depth=2))
    refused(root, "tree.too_deep", TreeLimits(max_depth=1))


def test_path_length_limits(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    inventory_tree(root, limits=TreeLimits(max_path_bytes=len("sub/deeper/x.bin")))
    refused(root, "tree.path_too_long", TreeLimits(max_path_bytes=len("sub/deeper/x.bin") - 1))
    total = sum(len(p.encode()) for p in ("sub", "empty", "sub/deeper", "sub/deeper/x.bin"))
    total += sum(len(n.encode()) for n in ("a.txt", "b.txt", "é.txt", "Z.txt"))
    inventory_tree(root, limits=TreeLimits(max_total_path_bytes=total))
    refused(root, "tree.too_many_path_bytes", TreeLimits(max_total_path_bytes=total - 1))


def test_unreadable_directory_is_refused(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    (root / "sub").chmod(0)
    try:
        if os.geteuid() != 0:
            refused(root, "tree.unreadable")
            return
        # Root bypasses permission bits; drop the two DAC-override capabilities
        # from the bounding set so a real child process hits the real EACCES.
        script = (
            "import sys\n"
            "from kiln_registry.domain.errors import KilnError\n"
            "from kiln_registry.identity.tree import inventory_tree\n"
            "try:\n"
            "    inventory_tree(sys.argv[1])\n"
            "except KilnError as exc:\n"
            "    print(exc.rule)\n"
        )
        result = subprocess.run(
            [
                "setpriv",
                "--bounding-set=-dac_override,-dac_read_search",
                sys.executable,
                "-c",
                script,
                str(root),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert result.stdout.strip() == "tree.unreadable", result.stderr
    finally:
        (root / "sub").chmod(0o755)
