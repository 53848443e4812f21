"""The installed package's version: ``kiln --version`` and the OpenAPI ``info.version``.

Read from the distribution's metadata (``pyproject.toml``'s ``version`` once
installed, editable installs included), so there is one place to change it.
Imports the standard library only.
"""

from __future__ import annotations

from functools import cache
from importlib import metadata

DISTRIBUTION = "kiln-registry"


@cache
def package_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"
