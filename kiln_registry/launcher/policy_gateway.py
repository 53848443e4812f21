"""Which launch options go with the teacher gateway (pure).

By default (``--gateway=on``) vLLM listens only on a private Unix socket
that the launcher chooses, and the gateway (``kiln_registry.gateway``)
listens on ``--host``/``--port``.  So, with the gateway:

* ``--uds`` is refused after ``--``: the socket is the launcher's;
* the key (``--api-key-env=NAME``, or ``--api-key=...`` after ``--`` as in
  direct mode) is checked by the gateway and given to it through its
  environment; vLLM gets none.  Giving both is refused.  ``--api-key-env``
  keeps the key out of every argv, the launcher's included;
* options the gateway does not implement are refused rather than silently
  applying to a socket nobody else reaches: TLS (``--ssl-*``), CORS
  (``--allowed-*``, ``--allow-credentials``), ``--root-path`` and
  ``--enable-request-id-headers``.  Use ``--gateway=off`` for them.

``--api-key-env`` names a ``KILN_*`` variable: the launcher consumes those and
never passes them to vLLM, so the key can reach neither vLLM's environment
nor the identity's inference config.  With ``--gateway=off`` it is refused:
vLLM's own ``--api-key`` after ``--`` is today's direct mode.

Imports: standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from kiln_registry.domain.errors import PolicyError

GATEWAY_FLAG = "gateway"
API_KEY_ENV_FLAG = "api-key-env"
GATEWAY_ON = "on"
GATEWAY_OFF = "off"
API_KEY_ENV_RE = re.compile(r"KILN_[A-Z0-9_]{1,120}")
LAUNCHER_OWNED_WITH_GATEWAY = ("uds",)
UNSUPPORTED_WITH_GATEWAY = (
    "ssl-keyfile",
    "ssl-certfile",
    "ssl-ca-certs",
    "ssl-cert-reqs",
    "ssl-ciphers",
    "allowed-origins",
    "allowed-methods",
    "allowed-headers",
    "allow-credentials",
    "root-path",
    "enable-request-id-headers",
)


def check_api_key_env(value: str) -> str | None:
    """The ``--api-key-env`` value rule (a problem description, or None)."""
    if not API_KEY_ENV_RE.fullmatch(value):
        return "expected the name of a KILN_* environment variable (e.g. KILN_TEACHER_API_KEY)"
    return None


def check_gateway_options(flags: Mapping[str, str], transport: tuple[str, ...]) -> None:
    """Refuse the transport options that conflict with the chosen boundary."""
    gateway = flags.get(GATEWAY_FLAG, GATEWAY_ON) == GATEWAY_ON
    if not gateway:
        if API_KEY_ENV_FLAG in flags:
            raise PolicyError(
                "--api-key-env needs the gateway; with --gateway=off pass vLLM's own "
                "--api-key=... after '--'",
                rule="launcher.gateway_off_key",
            )
        return
    names = {token[2:].split("=", 1)[0] for token in transport}
    if "api-key" in names and API_KEY_ENV_FLAG in flags:
        raise PolicyError(
            "give the key once: --api-key-env=NAME or --api-key=... after '--', not both",
            rule="launcher.api_key_twice",
        )
    for name in LAUNCHER_OWNED_WITH_GATEWAY:
        if name in names:
            raise PolicyError(
                f"--{name} is owned by the launcher when the gateway is on",
                rule="policy.gateway_owned",
                hint="the launcher puts vLLM's socket in the launch's private directory; "
                "use --gateway=off to choose it yourself",
            )
    for name in UNSUPPORTED_WITH_GATEWAY:
        if name in names:
            raise PolicyError(
                f"--{name} is not implemented by the teacher gateway",
                rule="policy.gateway_unsupported",
                hint="terminate TLS or CORS in front of the gateway, or use --gateway=off",
            )
