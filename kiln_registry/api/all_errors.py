"""Report every problem of a request body at once: field errors and cross-field rules.

pydantic stops before a model's own (cross-field) validators when a field is
invalid, and a validator that raises stops at its first problem; a caller
then fixes one thing per round trip.  ``validate_all(title, data, handler,
problems)`` runs the field validation (``handler``, a wrap validator's) and
raises one ``ValidationError`` that holds every field error *and* every rule
problem in ``problems`` (computed from the raw body beforehand), so the 400
names them all together.  ``skip`` drops pydantic's ``extra_forbidden`` for
field names a rule already reports with a better message.  Imports pydantic.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

MAX_PROBLEMS = 64


def validate_all(
    title: str,
    data: Any,
    handler: Callable[[Any], Any],
    problems: Sequence[str],
    skip: Collection[str] = (),
) -> Any:
    errors: list[InitErrorDetails] = []
    try:
        model = handler(data)
    except ValidationError as exc:
        for err in exc.errors(include_url=False)[:MAX_PROBLEMS]:
            if err["type"] == "extra_forbidden" and err["loc"][-1:] and err["loc"][-1] in skip:
                continue
            detail = InitErrorDetails(type=err["type"], loc=err["loc"], input=err["input"])
            if "ctx" in err:
                detail["ctx"] = err["ctx"]
            errors.append(detail)
    for problem in problems[:MAX_PROBLEMS]:
        custom = PydanticCustomError("value_error", "{problem}", {"problem": problem})
        errors.append(InitErrorDetails(type=custom, loc=(), input=data))
    if errors:
        raise ValidationError.from_exception_data(title, errors)
    return model
