"""``kiln.toml``: the settings models (``settings``), their loader (``loader``) and parts.

Kiln-shaped sections (``kiln``), ``[server] database`` (``database``), access
rules, guards, local replica placement and error rendering.  A leaf: imports
``domain``, ``identity``, ``credentials`` and ``vllm_options`` of the project
(a contract in pyproject.toml), never the launcher or the database layer.
"""
