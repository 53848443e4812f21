"""The reviewed ``vllm serve`` option policy: tables (``tables``) and classifier (``options``).

A leaf below both ``config`` (a local profile's ``vllm_args`` are checked when
kiln.toml is loaded) and ``launcher`` (``kiln-teacher``'s options after
``--``), so that ``config`` needs nothing of the launcher.  Pure: imports the
standard library and ``kiln_registry.domain.errors`` only.
"""
