"""The registry's Python clients: ``RegistryClient`` (blocking) and ``AsyncRegistryClient``.

Import them from here; the modules beside this file are the implementation
(``sync``, ``asynchronous``, the shared ``core``/``base``/``ops``/``jobs``/``tls``).
"""

from kiln_registry.client.asynchronous import AsyncRegistryClient
from kiln_registry.client.base import RegistryClientError
from kiln_registry.client.sync import RegistryClient

__all__ = ["AsyncRegistryClient", "RegistryClient", "RegistryClientError"]
