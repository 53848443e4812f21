"""Access control: API tokens and scopes, the auth middleware, audit log, reserved aliases.

``tokens`` (generation, digests, ``TokenIdentity``), ``scopes`` (route -> scope
table, audit actions), ``cache`` (the in-memory token table), ``middleware``
(pure ASGI; puts the caller in ``scope["state"]["kiln_token"]``), ``models``
and ``repository`` (SQL), ``store`` (audit and last-used writes).
"""
