"""The in-memory token table the auth middleware checks every request against.

Maps the SHA-256 digest of each token to its ``TokenIdentity`` and expiry, so
a request costs one hash and one dict lookup.  Coherent with the
``api_tokens`` table the same way ``api.entry_cache`` is with the teachers:
the ``db.data_version`` number moves whenever any connection (this server,
another replica, or ``kiln tokens revoke`` in another process) commits, and
any change reloads the table, so a revocation applies to the next
request.  Last-used times are kept here and handed out for a batched write at
most once a minute per token (``due_last_used``).  Imports the standard
library, ``db.data_version``, ``credentials.redaction`` (the token shape) and
``auth.tokens``/``auth.repository`` (for its one SELECT).
"""

from __future__ import annotations

import hmac
import threading
import time
from typing import Final

from kiln_registry.auth.repository import TOKENS_SNAPSHOT, parse_time
from kiln_registry.auth.tokens import TokenIdentity, token_digest
from kiln_registry.credentials.redaction import well_formed
from kiln_registry.db.data_version import VersionReader, VersionUnreadable

LAST_USED_INTERVAL_S: Final = 60.0
TIME_TEXT: Final = "%Y-%m-%dT%H:%M:%S.000000Z"


class TokenTable:
    """Digest -> (identity, expiry) for every stored token; reloaded on any commit."""

    def __init__(self, reader: VersionReader) -> None:
        self._reader = reader
        self._lock = threading.Lock()
        self._version: int | None = None
        self._tokens: dict[str, tuple[str, TokenIdentity, float | None]] = {}
        self._used: dict[str, float] = {}
        self._written: dict[str, float] = {}
        # True when some token's last-used time is due for its (batched) write.
        self.pending = False

    def _refresh(self) -> None:
        version = self._reader.read()
        if version is not None and version == self._version:
            return
        tokens: dict[str, tuple[str, TokenIdentity, float | None]] = {}
        for name, digest, scopes, expires_at in self._reader.rows(TOKENS_SNAPSHOT):
            expiry = None if expires_at is None else parse_time(expires_at).timestamp()
            identity = TokenIdentity(name=name, scopes=frozenset(scopes.split()))
            tokens[digest] = (digest, identity, expiry)
        self._tokens = tokens
        self._version = version

    def lookup(self, token: str) -> TokenIdentity | None:
        """The identity of a valid, unexpired token; None otherwise (any read error: None)."""
        if not well_formed(token):
            return None
        digest = token_digest(token)
        with self._lock:
            try:
                self._refresh()
            except (VersionUnreadable, ValueError):
                self._version = None
                return None
            found = self._tokens.get(digest)
        if found is None or not hmac.compare_digest(found[0], digest):
            return None
        expiry = found[2]
        now = time.time()
        if expiry is not None and now >= expiry:
            return None
        name = found[1].name
        self._used[name] = now
        if now - self._written.get(name, 0.0) >= LAST_USED_INTERVAL_S:
            self.pending = True
        return found[1]

    def due_last_used(self) -> dict[str, str]:
        """Last-used times not written for a minute (marked written; the caller writes them)."""
        now = time.time()
        due: dict[str, str] = {}
        with self._lock:
            self.pending = False
            for name, at in list(self._used.items()):
                if now - self._written.get(name, 0.0) >= LAST_USED_INTERVAL_S:
                    due[name] = time.strftime(TIME_TEXT, time.gmtime(at))
                    self._written[name] = now
                    del self._used[name]
        return due

    def close(self) -> None:
        with self._lock:
            self._reader.close()
            self._tokens = {}
