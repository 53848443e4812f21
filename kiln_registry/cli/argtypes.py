"""Argument types shared by the ``kiln`` command groups.

Owns the argparse ``type=`` converters more than one command group uses; a
bad value raises ``argparse.ArgumentTypeError`` naming the text and the rule,
which ``kiln`` turns into its one-line usage error.

Imports: standard library only.
"""

from __future__ import annotations

import argparse


def integer(text: str) -> int:
    """A base-10 integer."""
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def positive_int(text: str) -> int:
    """A base-10 integer of at least 1."""
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value
