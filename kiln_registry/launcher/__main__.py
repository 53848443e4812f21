"""``python -m kiln_registry.launcher``: the same command as ``kiln-teacher``."""

from __future__ import annotations

from kiln_registry.launcher.cli import main

if __name__ == "__main__":
    main()
