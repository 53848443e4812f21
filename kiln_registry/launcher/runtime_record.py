"""The RECORD entries of an installed distribution, read cheaply (runtime content).

Owns ``record_names``: exactly ``[str(f) for f in dist.files]`` (the names
``importlib.metadata`` gives), without a ``PackagePath`` object per entry:
the runtime-content inventory (``launcher.runtime``) reads RECORD files of
tens of thousands of rows twice per measurement, and building the path
objects was a large share of its cost.

Imports: standard library only.
"""

from __future__ import annotations

import csv
import importlib.metadata
from pathlib import PurePosixPath


def record_names(dist: importlib.metadata.Distribution) -> list[str] | None:
    """``[str(f) for f in dist.files]``, without building a ``PackagePath`` per entry.

    ``Distribution.files`` reads RECORD with ``csv`` (one to three fields a
    row, an integer size) and normalises each name as a ``PurePosixPath``; a
    name that normalisation would change, a row it would refuse (it then
    raises the same error) or a distribution without RECORD takes that path.
    """
    text = dist.read_text("RECORD")
    if not text:
        return _package_paths(dist)
    names = []
    for row in csv.reader(text.splitlines()):
        if not 1 <= len(row) <= 3 or not _size_field(row):
            return _package_paths(dist)
        name = row[0]
        names.append(name if _plain_posix(name) else str(PurePosixPath(name)))
    return names


def _package_paths(dist: importlib.metadata.Distribution) -> list[str] | None:
    entries = dist.files
    return None if entries is None else [str(entry) for entry in entries]


def _size_field(row: list[str]) -> bool:
    if len(row) < 3 or not row[2]:
        return True
    try:
        int(row[2])
    except ValueError:
        return False
    return True


def _plain_posix(name: str) -> bool:
    """Whether ``str(PurePosixPath(name)) == name`` (no empty or ``.`` parts, no end slash)."""
    if not name or name.endswith("/") or "//" in name:
        return False
    return "." not in name.split("/") if "." in name else True
