"""The ASGI types, written once for every pure-ASGI layer of the project.

The registry's outer layers (host guard, limits, fast lookup, auth, access log)
and the reference teacher are plain ASGI callables rather than Starlette
middleware, so they share these aliases.  Imports the standard library only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
