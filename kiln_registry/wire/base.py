"""The base of every response model and the shared wire types.

One rule for every response model (``WireModel``): a field declared with a
default of ``None`` is *optional*: it is omitted from the body when it has no
value (pydantic ``exclude_if``), never sent as ``null``, and the OpenAPI
document lists it as optional and not nullable.  A field without a default is
always present (``null`` where its type allows it).  This is the shape of
Kiln's artifact schema (``scripts/generate_artifact_schema.py``: ``optional``
members are omitted, ``nullable`` members are required).  Models defined
anywhere inherit the rule by subclassing ``WireModel``.  Its ``repr`` leaves
absent fields out and cuts long text, so a response printed at a prompt reads
(the fields themselves are documented by their ``description``; ``help(Model)``
and ``Model.model_fields`` show them).  Imports pydantic only.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

Sha256Hex = Annotated[
    str, Field(pattern=r"^[0-9a-f]{64}$", description="Lowercase hex SHA-256 digest.")
]
Sha256Ref = Annotated[
    str,
    Field(pattern=r"^sha256:[0-9a-f]{64}$", description="`sha256:` + lowercase hex digest."),
]
Count = Annotated[int, Field(ge=0)]


def _optional_not_nullable(schema: dict[str, Any], cls: type) -> None:
    """OpenAPI: an optional (defaulted) property is omitted when absent, so never null."""
    required = set(schema.get("required", ()))
    for name, prop in schema.get("properties", {}).items():
        if name in required:
            continue
        prop.pop("default", None)
        variants = prop.get("anyOf")
        if variants and {"type": "null"} in variants:
            rest = [v for v in variants if v != {"type": "null"}]
            del prop["anyOf"]
            if len(rest) == 1:
                prop.update(rest[0])
            else:
                prop["anyOf"] = rest


def _absent(value: object) -> bool:
    return value is None


_REPR_CHARS = 72


class _Cut:
    """A long string in a ``repr``: its start and its length."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"{self.text[: _REPR_CHARS - 8]!r}...({len(self.text)} chars)"


class WireModel(BaseModel):
    """Base of every response model: optional fields without a value are omitted."""

    model_config = ConfigDict(frozen=True, json_schema_extra=_optional_not_nullable)

    def __repr_args__(self) -> Any:
        """A readable ``repr``: absent fields left out, long text cut (``_Cut``)."""
        for name, value in super().__repr_args__():
            if value is None:
                continue
            long = isinstance(value, str) and len(value) > _REPR_CHARS
            yield name, _Cut(value) if long else value

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        changed = False
        for info in cls.model_fields.values():
            if not info.is_required() and info.default is None and info.exclude_if is None:
                info.exclude_if = _absent
                changed = True
        if changed:
            cls.model_rebuild(force=True)
