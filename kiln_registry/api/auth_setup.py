"""Installs the auth middleware (``kiln_registry.auth``) on the application.

With ``[server] auth`` resolved to required the middleware checks tokens
against a ``TokenTable`` on the registry's database; with auth off it only
records the audit log and marks every request's caller as ``None``.  The
token table's connection is closed when the registry context closes.
Imports the ``auth`` package, ``config.access`` and the API context.
"""

from __future__ import annotations

from fastapi import FastAPI

from kiln_registry.api.context import RegistryContext
from kiln_registry.auth.cache import TokenTable
from kiln_registry.auth.middleware import AuthMiddleware
from kiln_registry.auth.store import AuthStore, audit_bounds
from kiln_registry.config.access import auth_required
from kiln_registry.db.data_version import open_version_reader


def install_auth(app: FastAPI, ctx: RegistryContext) -> None:
    server = ctx.config.server
    table = TokenTable(open_version_reader(ctx.engine)) if auth_required(server) else None
    app.state.token_table = table
    app.add_middleware(
        AuthMiddleware,
        table=table,
        store=AuthStore(ctx.writing, audit_bounds(server), reading=ctx.reading),
        metrics_public=server.metrics_public,
        public_docs=server.public_docs,
        secret_names=ctx.config.secret_env_names(),
    )


def close_auth(app: FastAPI) -> None:
    table = getattr(app.state, "token_table", None)
    if isinstance(table, TokenTable):
        table.close()
