"""``python -m kiln_registry.gateway --host=... --port=... --upstream-uds=...``.

Runs one gateway until SIGTERM, SIGINT, SIGHUP or SIGQUIT, then drains it
(``--drain-seconds``) and exits 0.  Flag errors print one line and exit 2.
One line on stderr says where it listens, and one more warns when that is
beyond loopback (``config.exposure_warning``); requests are never logged.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Coroutine

from kiln_registry.domain.errors import KilnError
from kiln_registry.gateway.config import GatewayConfig, exposure_warning, parse_gateway_argv
from kiln_registry.gateway.server import Gateway

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


async def serve(config: GatewayConfig) -> None:
    gateway = Gateway(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    await gateway.start()
    sys.stderr.write(f"kiln-gateway: listening on {config.host}:{gateway.port}\n")
    warning = exposure_warning(config.host, keyed=config.api_key is not None)
    if warning is not None:
        sys.stderr.write(f"kiln-gateway: warning: {warning}\n")
    sys.stderr.flush()
    await stop.wait()
    await gateway.drain()


def main() -> None:
    try:
        config = parse_gateway_argv(sys.argv[1:], os.environ)
    except KilnError as exc:
        sys.stderr.write(f"kiln-gateway: error: {exc.one_line()}\n")
        raise SystemExit(2) from None
    try:
        _run(serve(config))
    except OSError as exc:
        sys.stderr.write(
            f"kiln-gateway: error: cannot listen on {config.host}:{config.port} ({exc.strerror})\n"
        )
        raise SystemExit(2) from None


def _run(main: Coroutine[None, None, None]) -> None:
    """Run on uvloop when it is installed (vLLM depends on it), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


if __name__ == "__main__":
    main()
