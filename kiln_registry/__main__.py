"""``python -m kiln_registry``: the ``kiln`` command."""

from kiln_registry.cli.main import main

if __name__ == "__main__":
    main()
