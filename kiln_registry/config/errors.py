"""Turning pydantic validation errors on kiln.toml into one ``ConfigError``.

Owns the key-path spelling (``teachers.local.a.port``, quoted odd keys), the
per-error line (unknown keys name their table) and the cap on how many
errors one message lists (``domain.text.render_errors``); an unknown key gets
"did you mean `port`?" from ``config.suggest`` when the model is given.  Imports:
standard library, pydantic, ``config.suggest`` and ``kiln_registry.domain`` (errors,
text) only.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from kiln_registry.config.suggest import suggestion
from kiln_registry.domain.errors import ConfigError
from kiln_registry.domain.text import error_message, quoted, render_errors

MAX_REPORTED_ERRORS = 50
_SHOWN_KEY_CHARS = 80
_PLAIN_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")


def _key_path(loc: Sequence[int | str]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
            continue
        text = item if _PLAIN_KEY_RE.fullmatch(item) else json.dumps(item[:_SHOWN_KEY_CHARS])
        parts.append(text if item == "[key]" or not parts else f".{text}")
    return "".join(parts) or "(top level)"


def _error_line(error: Mapping[str, Any], model: type[BaseModel] | None = None) -> str:
    loc: tuple[int | str, ...] = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        section = _key_path(loc[:-1])
        where = "the top level" if not loc[:-1] else f"[{section}]"
        near = None if model is None else suggestion(model, loc)
        return (
            f"{_key_path(loc)}: unknown key {quoted(loc[-1], _SHOWN_KEY_CHARS)} in {where}"
            " (neither Kiln nor kiln-registry has it)"
            + ("" if near is None else f"; did you mean `{near}`?")
        )
    if kind == "missing":
        if loc == ("student",):
            return "student: no student model; set [student] model_path or Kiln's [model] path"
        return f"{_key_path(loc)}: required key is missing"
    return f"{_key_path(loc)}: {error_message(error)}"


def validation_error(
    path: Path, exc: ValidationError, model: type[BaseModel] | None = None
) -> ConfigError:
    """One error for the file; ``model`` (the validated class) adds "did you mean" to a typo."""
    errors = exc.errors(include_url=False, include_input=False, include_context=True)
    lines = render_errors(errors, MAX_REPORTED_ERRORS, functools.partial(_error_line, model=model))
    return ConfigError(f"{path}: " + "; ".join(lines), rule="config.invalid")
