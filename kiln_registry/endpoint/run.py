"""``kiln teacher-endpoint``'s process: prove, bind, announce, serve, follow the registry.

``run_endpoint`` checks the listening rules, opens the registry client and
the outbound teacher client, builds the state (``startup.build_state``:
read, refuse, prove), keeps freed buffers in the heap (``heap``), binds the
port, prints the base URL to give the trainer (``announce``), and serves with
uvicorn until SIGINT/SIGTERM while ``EndpointState.follow`` re-reads the alias
every ``recheck_s``.

Imports uvicorn, the registry client and the endpoint's modules.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import uvicorn

from kiln_registry.endpoint.app import EndpointApp
from kiln_registry.endpoint.heap import keep_freed_memory
from kiln_registry.endpoint.startup import (
    EndpointOptions,
    bind,
    build_state,
    check_listen,
    outbound_client,
    tls_context,
    wait_for,
)
from kiln_registry.endpoint.state import EndpointState, Registry

log = logging.getLogger("kiln_registry.endpoint")
RegistryFactory = Callable[[], AbstractAsyncContextManager[Registry]]


def announcement(state: EndpointState, base_url: str) -> str:
    """What the endpoint prints once it serves: the base URL and model to give the trainer."""
    return (
        f"teacher endpoint for {state.alias}: {len(state.pool.replicas)} of"
        f" {state.listed_replicas} replica(s)"
        f" proved against {state.revision}\n"
        f"base_url: {base_url}\n"
        f"model: {state.pin.served_model_id}\n"
    )


async def run_endpoint(
    options: EndpointOptions, registry: RegistryFactory, announce: Callable[[str], None]
) -> None:
    """Serve until a signal; a refusal before the port is bound raises ``KilnError``."""
    listen = options.listen
    check_listen(listen)
    tls_context(listen)  # a bad TLS file fails here, before the port is bound
    async with registry() as client, outbound_client(options.config) as http:
        state = await build_state(options, client, http)
        keep_freed_memory()  # before the first request: its buffers are reused (endpoint.heap)
        sock = bind(listen.host, listen.port)
        port = sock.getsockname()[1]
        host = f"[{listen.host}]" if ":" in listen.host else listen.host
        app = EndpointApp(state, http, api_key_env=listen.api_key_env)
        server = uvicorn.Server(uvicorn.Config(app, **_uvicorn_options(options)))
        follow = asyncio.get_running_loop().create_task(state.follow(options.recheck_s))
        announce(announcement(state, f"{listen.scheme}://{host}:{port}"))
        try:
            await server.serve(sockets=[sock])
        finally:
            await wait_for(follow)
            await state.drain()
            sock.close()


def _uvicorn_options(options: EndpointOptions) -> dict[str, Any]:
    listen = options.listen
    extra: dict[str, Any] = {}
    if listen.tls_cert_file is not None and listen.tls_key_file is not None:
        extra = {"ssl_certfile": str(listen.tls_cert_file), "ssl_keyfile": str(listen.tls_key_file)}
    return {
        "log_config": None,
        "access_log": False,  # the app writes its own access records
        "server_header": False,
        "lifespan": "off",
        "timeout_graceful_shutdown": 10,
        "timeout_keep_alive": 30,
        **extra,
    }
