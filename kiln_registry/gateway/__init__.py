"""The teacher gateway: the only public door to a launched vLLM.

vLLM listens on a private Unix socket inside the launch's runtime directory;
the gateway listens on the user's host and port and forwards exactly three
routes (``POST /v1/completions``, ``GET /v1/models``, ``GET /health``).
Modules: ``config`` (settings and the entry point's flags), ``refusals``
(vLLM-shaped error bodies), ``http1`` (the strict request-head parser and
response framing), ``admission`` (routes, credentials and request limits),
``response`` (the upstream's answer head and failures), ``upstream`` (the
keep-alive client protocol over the Unix socket),
``forward`` (one request's relay), ``server`` (the asyncio server, client
connections and drain).  ``python -m kiln_registry.gateway``
runs one; the launcher starts it (``launcher.launch``).

Imports: standard library, ``kiln_registry.domain.errors`` and orjson (``admission``'s
fast path); uvloop when installed (``__main__``); never vLLM, h11,
FastAPI, httpx or numpy (the gateway process starts lean).
"""
