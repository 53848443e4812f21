"""Bounds shared by more than one layer, defined once.

* Teacher responses (the probe clients in ``probe/`` and the gateway in
  ``gateway/``, which must agree): a response body may hold at most
  ``response_body_limit`` bytes, between ``MIN_BODY_LIMIT`` and
  ``MAX_BODY_LIMIT``; an error body is read up to ``ERROR_BODY_READ_LIMIT``; the
  status line and headers fit in ``MAX_RESPONSE_HEAD_BYTES``.
* A teacher's vocabulary (the identity document, model shards, probe rows):
  at most ``MAX_VOCAB_SIZE`` token ids.
* Registration text fields (the API schemas and the legacy ``teachers.json``
  import): ``notes`` up to ``MAX_NOTES_CHARS``, every other text field up to
  ``MAX_TEXT_CHARS``.

Imports the standard library only.
"""

from __future__ import annotations

from typing import Final

MIN_BODY_LIMIT: Final = 1 << 20
MAX_BODY_LIMIT: Final = 256 << 20
ERROR_BODY_READ_LIMIT: Final = 64 * 1024
MAX_RESPONSE_HEAD_BYTES: Final = 64 * 1024

MAX_VOCAB_SIZE: Final = 16_777_216

MAX_NOTES_CHARS: Final = 4096
MAX_TEXT_CHARS: Final = 2048
# A replica-set alias (``urls``): at least two endpoints, at most this many.
MIN_REPLICA_URLS: Final = 2
MAX_REPLICA_URLS: Final = 16
