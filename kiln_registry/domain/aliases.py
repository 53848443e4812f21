"""The teacher alias rule, shared by the API, the client, the CLI and the legacy import.

Kiln accepts any alias that is not blank after trimming white space
(``crates/kiln-server/src/api/teachers.rs``, ``validate_teacher_spec_static``),
so names such as ``qwen/qwen3-8b@vllm`` are valid.  This project accepts the
same aliases with three deliberate limits:

* at most ``MAX_ALIAS_CHARS`` characters (Kiln has no bound);
* no control character (U+0000-U+001F, U+007F-U+009F, NUL included) and no
  lone surrogate (Kiln's JSON parser refuses those as well);
* an alias containing ``/`` whose last ``/``-separated segment is one of the
  suffix route words (``probe``, ``receipts``, ``launch``) is refused, so
  ``/v1/teachers/{alias}/probe`` can never be read two ways: the suffix routes
  match only the last path segment.

``alias_problem`` returns the reason an alias is refused (``None`` when it is
valid); ``ALIAS_JSON_PATTERN`` is the same rule as an ECMA-262 regular
expression for the OpenAPI document.  ``alias_path_segment`` percent-encodes
an alias as one URL path segment.  Imports the standard library only.
"""

from __future__ import annotations

import re
import unicodedata
import urllib.parse
from typing import Final

MAX_ALIAS_CHARS: Final = 256
RESERVED_SUFFIXES: Final = ("probe", "receipts", "launch")
_FORBIDDEN: Final = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
ALIAS_JSON_PATTERN: Final = (
    r"^(?!\s*$)(?![\s\S]*/(?:probe|receipts|launch)$)[^\x00-\x1f\x7f-\x9f]{1,256}$"
)
ALIAS_RULE_TEXT: Final = (
    f"1..{MAX_ALIAS_CHARS} characters, not blank, no control characters, and (when it"
    " contains '/') a last segment other than probe, receipts or launch"
)


def alias_problem(alias: object) -> str | None:
    """Why ``alias`` cannot be a teacher alias, or ``None`` when it can."""
    if not isinstance(alias, str):
        return "alias must be a string"
    if len(alias) > MAX_ALIAS_CHARS:
        return f"alias is longer than {MAX_ALIAS_CHARS} characters"
    if not alias.strip():
        return "alias must not be empty or blank"
    found = _FORBIDDEN.search(alias)
    if found is not None:
        return f"alias contains the control character U+{ord(found.group()):04X}"
    _, slash, last = alias.rpartition("/")
    if slash and last in RESERVED_SUFFIXES:
        return (
            f"an alias containing '/' may not end in '/{last}' (reserved for the"
            f" /v1/teachers/{{alias}}/{last} route)"
        )
    return None


def alias_path_segment(alias: str) -> str:
    """``alias`` as one percent-encoded path segment (``/`` is ``%2F``).

    A segment of only dots is written with ``%2E`` so that no client or proxy
    removes it as a ``.``/``..`` path step.
    """
    segment = urllib.parse.quote(alias, safe="@")
    if segment in (".", ".."):
        segment = segment.replace(".", "%2E")
    return segment


def alias_fold(alias: str) -> str:
    """The NFKC case-fold of ``alias``: two aliases with the same fold may not coexist.

    ``Qwen/X`` and ``qwen/x``, or ``ｑwen`` (fullwidth) and ``qwen``, fold alike;
    registration refuses the second as ``teacher_alias_exists`` (a stricter rule
    than Kiln's, which compares aliases byte for byte).
    """
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", alias).casefold())
