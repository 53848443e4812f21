"""The wire shapes the registry's server and its Python clients share.

A leaf: pydantic models of every request and response body the client sends
or parses (teachers and probe receipts, jobs, admin, the result corpus's
lines, the error envelope), built on ``wire.base.WireModel``.  Imports
pydantic and ``kiln_registry.domain`` only, so ``import kiln_registry.client``
loads no server code (no SQLAlchemy, FastAPI or Starlette); a contract in
pyproject.toml and ``tests/client/test_client_leaf.py`` keep it so.  A check
that needs the server's rules stays in ``api`` (``api.schemas``).
"""
