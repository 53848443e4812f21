"""Argument types shared by the ``kiln`` command groups.

Owns the argparse ``type=`` converters more than one command group uses; a
bad value raises ``argparse.ArgumentTypeError`` naming the text and the rule,
which ``kiln`` turns into its one-line usage error.  ``env_name`` (every
flag that names an environment variable) is the exception: its error never
quotes the text, which may be the secret itself, pasted by mistake.

Imports: standard library and ``kiln_registry.credentials.secrets`` (the name rule).
"""

from __future__ import annotations

import argparse

from kiln_registry.credentials.secrets import (
    ENV_NAME_PATTERN,
    MAX_ENV_NAME_LENGTH,
    is_valid_env_name,
)


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


def env_name(text: str) -> str:
    """The NAME of an environment variable; a bad value is refused without being echoed."""
    if not is_valid_env_name(text):
        raise argparse.ArgumentTypeError(
            f"expected the NAME of an environment variable ({ENV_NAME_PATTERN}, at most "
            f"{MAX_ENV_NAME_LENGTH} characters), never a secret; the value is not shown"
        )
    return text
