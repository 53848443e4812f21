"""The ``[server]`` keys that bound slow and crowding clients at the server edge (issue 27).

``ServerEdgeKeys`` is mixed into ``ServerConfig``:

* ``body_grace_s``: seconds a request body may take before the minimum rate
  applies (default 10).
* ``body_min_bytes_per_s``: the slowest average rate a request body may
  arrive at once the grace is spent (default 65536): a body must have
  ``(elapsed - body_grace_s) * body_min_bytes_per_s`` bytes in by any time,
  else the request is answered ``408 request_timeout`` and the connection
  closed, which frees its share of the byte budget (``api.limits``).
* ``max_connections_per_client``: open connections one client address may
  hold (default 64).  A connection past it gets a short head deadline, is
  answered only on ``/health`` and ``/ready`` (``503 server_busy`` for
  anything else) and is closed after one response (``serve.guard``).

Imports pydantic only.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

BODY_GRACE_S = 10.0
BODY_MIN_BYTES_PER_S = 64 * 1024
MAX_CONNECTIONS_PER_CLIENT = 64


class ServerEdgeKeys(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    body_grace_s: Annotated[StrictFloat, Field(gt=0, le=600)] = BODY_GRACE_S
    body_min_bytes_per_s: Annotated[StrictInt, Field(ge=1, le=1 << 30)] = BODY_MIN_BYTES_PER_S
    max_connections_per_client: Annotated[StrictInt, Field(ge=1, le=65_536)] = (
        MAX_CONNECTIONS_PER_CLIENT
    )
