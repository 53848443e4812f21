"""A batched request split into one upstream request per prompt, and the answers joined.

``kiln-teacher``'s gateway takes one prompt per request, so the endpoint sends each
prompt of a batched ``prompt`` list as its own request (``split``: the same fields,
``prompt`` one entry of the list, the bounds recomputed for that prompt).  The relay
sends them concurrently, each to the live replica with the fewest requests in flight,
and checks each answer as it checks any other.  ``join`` builds the answer vLLM gives
to the batch: the first answer's envelope (``id``, ``created``, ``model``,
``system_fingerprint``), the choices in prompt order with ``index`` = prompt * ``n`` +
the choice's own index, and ``usage`` summed field by field.  Rows that the byte scan
checked are relayed as the teacher's own bytes (spliced into the envelope); the rest of
the envelope is written from the checked values.

The endpoint splits every batch, whatever the teacher (docs/teacher-endpoint.md says
why: one path for vLLM and the gateway, a batch spread over the replicas, each answer
checked while the others still arrive; the cost is in ``bench/bench_endpoint.py``).

Imports orjson and the endpoint's admission, answer-scan and error types; pure.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Final

import orjson

from kiln_registry.endpoint.admission import Admitted, Pin, response_limit
from kiln_registry.endpoint.answer_scan import CUT_TEXT, Scanned
from kiln_registry.endpoint.errors import ANSWER_REFUSED, EndpointRefusal


def split(admitted: Admitted, pin: Pin) -> list[Admitted]:
    """One admitted request per prompt of a batch (a single prompt stays as it is)."""
    if len(admitted.prompts) == 1:
        return [admitted]
    batch = admitted.payload["prompt"]
    k = max(admitted.prompt_logprobs or 0, admitted.logprobs or 0)
    parts = []
    for index, prompt in enumerate(admitted.prompts):  # bounded by Limits.max_prompts
        payload = {**admitted.payload, "prompt": batch[index]}
        limit = response_limit((prompt,), admitted.n, admitted.max_tokens, k, pin)
        parts.append(replace(admitted, payload=payload, prompts=(prompt,), response_limit=limit))
    return parts


def join(answers: list[tuple[bytes, Scanned | None]], n: int) -> bytes:
    """vLLM's answer to the batch from each prompt's checked answer, in prompt order.

    ``answers``: each body and where the byte scan found its rows (None: checked another
    way, parsed whole here).  The envelope is written by orjson with a NUL byte (which
    orjson never writes: it escapes control characters) where each scanned rows array
    goes, and the arrays are spliced in from the teachers' bodies in one copy, in the
    order orjson wrote their slots (its ``default`` hook meets them in output order, so
    a teacher that lists its choices out of index order keeps each choice's rows).  An
    answer that cannot be written again (an integer past 64 bits) raises
    ``EndpointRefusal`` 502.
    """
    trees = [_tree(body, scanned) for body, scanned in answers]
    top = dict(trees[0])
    choices = []
    for number, tree in enumerate(trees):
        for choice in sorted(tree["choices"], key=lambda c: c["index"]):
            choices.append({**choice, "index": number * n + choice["index"]})
    top["choices"] = choices
    if "usage" in top:
        top["usage"] = _summed([tree.get("usage") for tree in trees])
    spliced: list[memoryview] = []  # in the order orjson writes the slots

    def slot(value: object) -> orjson.Fragment:
        if type(value) is not _Rows:
            raise TypeError
        spliced.append(value.view)
        return _SLOT_FRAGMENT

    try:
        envelope = orjson.dumps(top, default=slot)
    except orjson.JSONEncodeError:
        raise EndpointRefusal(
            502,
            "the teacher's answers to a batch could not be joined",
            kind=ANSWER_REFUSED,
            rule="endpoint.join",
        ) from None
    texts = envelope.split(_SLOT)
    pieces: list[bytes | memoryview] = [texts[0]]
    for array, text in zip(spliced, texts[1:], strict=True):  # one slot per array, in order
        pieces += [array, text]
    return b"".join(pieces)


_SLOT: Final = b"\x00"
_SLOT_FRAGMENT: Final = orjson.Fragment(_SLOT)


class _Rows:
    """A scanned rows array in the envelope: its bytes in the teacher's body.  (A plain
    class: orjson would write a dataclass out field by field.)"""

    __slots__ = ("view",)

    def __init__(self, view: memoryview) -> None:
        self.view = view


def _tree(body: bytes, scanned: Scanned | None) -> Any:
    """The checked answer as plain JSON values, each scanned rows array a ``_Rows``."""
    if scanned is None:
        return json.loads(body)
    spans = iter(scanned.spans)
    view = memoryview(body)

    def rows_or_float(text: str) -> object:
        if text != CUT_TEXT:
            return float(text)
        start, end = next(spans)
        return _Rows(view[start:end])

    return json.loads(scanned.envelope, parse_float=rows_or_float)


def _summed(values: list[Any]) -> Any:
    """Integers summed, objects summed key by key, anything else null unless all alike."""
    first = values[0]
    if all(type(v) is int for v in values):
        return sum(values)
    if all(type(v) is dict and v.keys() == first.keys() for v in values):
        return {key: _summed([v[key] for v in values]) for key in first}
    return first if all(v == first for v in values) else None
