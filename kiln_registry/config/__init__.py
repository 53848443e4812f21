"""``kiln.toml``: the settings model (``settings``) and its parts.

Kiln-shaped sections (``kiln``), access rules, guards and error rendering.
"""
