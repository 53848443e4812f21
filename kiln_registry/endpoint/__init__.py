"""The verified teacher endpoint: one registered alias served in vLLM's own protocol.

``kiln teacher-endpoint ALIAS`` runs beside a trainer (TRL, prime-rl,
ms-swift, NeMo-RL, Kiln) that expects a raw vLLM URL.  It reads the alias from
the registry, proves every replica against the pinned identity with the
registry's own probes (``teachers.probing``), then serves ``GET /health``,
``GET /v1/models`` and ``POST /v1/completions``, relaying each allowed request
to a proved replica and checking every answer before it is relayed.

Modules: ``errors`` (vLLM-shaped error bodies), ``admission`` (the request
allowlist and the bounds the pin implies), ``answers`` (the per-answer
checks), ``pool`` (replicas, least-outstanding choice, fencing), ``state``
(the pinned identity, the stop reason and the registry it follows),
``relay`` (one request's relay), ``metrics``, ``app`` (the ASGI app),
``startup`` (proof, listening rules, uvicorn).

Layering: above ``client`` (it talks to the registry API) and below ``cli``;
imports ``teachers.probing``, ``probe``, ``credentials``, ``config`` and
``observability``; never the database or the API's routes.
"""
