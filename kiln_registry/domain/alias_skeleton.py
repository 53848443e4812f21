"""Look-alike aliases: one skeleton for every comparison, and what a new alias may not hold.

Two aliases are look-alikes when their ``alias_skeleton`` is equal.  The
skeleton is the alias's NFKC case-fold (``domain.aliases.alias_fold``) with
every character replaced by the representative of its confusable class.
The classes come from Unicode's confusables table as shipped by the
maintained ``confusable-homoglyphs`` package (its ``confusables.json``,
read as package data, never fetched): every single-character pair the table
lists as confusable, and every character with its own case-fold, is joined
into one class, and the class is represented by its lowest code point.  This
is deliberately stricter than UTS #39's skeleton (the classes are closed
under both relations), so ``victim-x``, ``VICTIM-X``, ``vіctіm-х``
(Cyrillic) and ``victim‐x`` (U+2010) share one skeleton, and so do ``l``,
``I`` and ``1``.  Multi-character confusables (``rn`` for ``m``) are not
joined.

``alias_hazard`` names what a *new* alias may not contain: white space at
either end, white space other than U+0020, and invisible or direction-changing
characters (format characters such as U+200B zero width space and the bidi
controls U+202A-U+202E and U+2066-U+2069, private-use and surrogate code
points, line and paragraph separators, and the default-ignorable fillers and
variation selectors).  Aliases registered before this rule stay addressable.

Imports the standard library and ``domain.aliases`` only; the table is read
on first use and kept (about 10,000 entries), and the skeletons of the last
131,072 aliases seen are cached (registered and reserved aliases are compared
on every registration).
"""

from __future__ import annotations

import functools
import json
import unicodedata
from importlib import resources
from typing import Final

from kiln_registry.domain.aliases import alias_fold

_TABLE_PACKAGE: Final = "confusable_homoglyphs"
_TABLE_FILE: Final = "confusables.json"
_MARKS: Final = str.maketrans("", "", "\u200e\u200f")  # the table wraps RTL entries in these
_HAZARD_CATEGORIES: Final = frozenset({"Cf", "Co", "Cs", "Zl", "Zp"})
_IGNORABLE_RANGES: Final = (
    (0x034F, 0x034F),  # combining grapheme joiner
    (0x115F, 0x1160),  # Hangul choseong / jungseong fillers
    (0x17B4, 0x17B5),  # Khmer inherent vowels
    (0x180B, 0x180F),  # Mongolian variation selectors and vowel separator
    (0x2800, 0x2800),  # Braille pattern blank
    (0x3164, 0x3164),  # Hangul filler
    (0xFE00, 0xFE0F),  # variation selectors
    (0xFFA0, 0xFFA0),  # halfwidth Hangul filler
    (0xE0100, 0xE01EF),  # variation selectors supplement
)


def _ignorable(ch: str) -> bool:
    code = ord(ch)
    return any(low <= code <= high for low, high in _IGNORABLE_RANGES)


def alias_hazard(alias: str) -> str | None:
    """Why ``alias`` may not be registered as a new alias (see the module docstring)."""
    if alias != alias.strip():
        return "alias starts or ends with white space"
    for ch in alias:
        category = unicodedata.category(ch)
        if category in _HAZARD_CATEGORIES or _ignorable(ch) or (category == "Zs" and ch != " "):
            name = unicodedata.name(ch, "unnamed")
            return (
                f"alias contains U+{ord(ch):04X} ({name}), an invisible, white-space or"
                " direction-changing character"
            )
    return None


def _pairs() -> list[tuple[str, str]]:
    """The table's single-character confusable pairs, ASCII-only pairs first, sorted."""
    raw = resources.files(_TABLE_PACKAGE).joinpath(_TABLE_FILE).read_text(encoding="utf-8")
    table: dict[str, list[dict[str, str]]] = json.loads(raw)
    pairs = set()
    for key, entries in table.items():
        source = key.translate(_MARKS)
        for entry in entries:
            other = entry["c"].translate(_MARKS)
            if len(source) == 1 and len(other) == 1 and source != other:
                pairs.add((min(source, other), max(source, other)))
    return sorted(pairs, key=lambda pair: (not (pair[0] + pair[1]).isascii(), pair))


@functools.cache
def _translation() -> dict[int, str]:
    """Each character of the table -> the lowest code point of its confusable class.

    Pairs join classes, except that two classes which each hold a different
    ASCII character are never joined through a non-ASCII pair: the table's
    chains (``v`` ~ ``ν`` ~ ... ~ ``n``) would otherwise merge distinct letters.
    """
    parent: dict[str, str] = {}

    def find(ch: str) -> str:
        while parent.get(ch, ch) != ch:
            ch = parent[ch]
        return ch

    for a, b in _pairs():
        low, high = sorted((find(a), find(b)))
        if low == high or (low.isascii() and high.isascii() and not (a + b).isascii()):
            continue  # the lowest member of a class is its ASCII character, if it has one
        parent[high] = low
    return {ord(ch): find(ch) for ch in parent}


@functools.lru_cache(maxsize=1 << 17)
def alias_skeleton(alias: str) -> str:
    """The look-alike key of ``alias``: equal skeletons may not belong to two aliases."""
    if alias.isascii():  # NFKC and case-fold of ASCII are its lower case
        return alias.lower().translate(_translation())
    decomposed = unicodedata.normalize("NFD", alias_fold(alias))
    bare = "".join(
        ch for ch in decomposed if unicodedata.category(ch) != "Mn" and not _ignorable(ch)
    )
    return bare.translate(_translation())
