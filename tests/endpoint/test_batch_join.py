"""``endpoint.batch.join``: each choice of the joined answer carries the rows the teacher
gave that choice, whatever order the teacher listed its choices in.

Compact vLLM-layout answers (the byte scan takes them) to a batch of two prompts with
``n`` 2, each answer listing its choices out of index order, every choice with its own
rows; the joined answer is compared choice by choice with what the teachers said.
"""

from __future__ import annotations

import json
from typing import Any

from kiln_registry.endpoint.admission import Limits, Pin, admit
from kiln_registry.endpoint.answer_scan import Scanned
from kiln_registry.endpoint.answers import check_answer
from kiln_registry.endpoint.batch import join, split

PIN = Pin("teacher-tiny", 512, 20, 64, 10_000)
FINGERPRINT = "fp-pinned"
PROMPTS = [[1, 2, 3], [4, 5]]


def rows(prompt: int, choice: int, length: int) -> str:
    """Rows unique to (prompt, choice): the ids and logprobs say whose they are."""
    cells = [
        f'{{"{100 * prompt + 10 * choice + row}":{{"logprob":-{row + 1}.5,"rank":1,'
        f'"decoded_token":"p{prompt}c{choice}\\"r{row}"}}}}'
        for row in range(length - 1)
    ]
    return "[null," + ",".join(cells) + "]"


def answer(prompt: int, order: list[int]) -> bytes:
    length = len(PROMPTS[prompt])
    choices = ",".join(
        f'{{"index":{i},"text":"x","logprobs":null,"finish_reason":"length",'
        f'"prompt_logprobs":{rows(prompt, i, length)}}}'
        for i in order
    )
    envelope = {
        "id": f"cmpl-{prompt}",
        "object": "text_completion",
        "created": 1,
        "model": "teacher-tiny",
        "choices": "CHOICES",
        "system_fingerprint": FINGERPRINT,
        "usage": {"prompt_tokens": length, "total_tokens": length + 2, "completion_tokens": 2},
    }
    return json.dumps(envelope, separators=(",", ":")).replace('"CHOICES"', f"[{choices}]").encode()


def test_each_choice_keeps_its_own_rows_when_the_teacher_lists_them_out_of_order() -> None:
    body = {"model": "teacher-tiny", "prompt": PROMPTS, "max_tokens": 1, "n": 2,
            "prompt_logprobs": 1}  # fmt: skip
    parts = split(admit(json.dumps(body).encode(), PIN, Limits()), PIN)
    answers = [answer(0, [1, 0]), answer(1, [0, 1])]
    checked: list[tuple[bytes, Scanned | None]] = []
    for text, part in zip(answers, parts, strict=True):
        scanned = check_answer(text, part, PIN, FINGERPRINT)
        assert scanned is not None  # the byte scan took it: its rows are spliced in
        checked.append((text, scanned))
    joined: Any = json.loads(join(checked, 2))
    said = {
        (prompt, choice["index"]): choice["prompt_logprobs"]
        for prompt, text in enumerate(answers)
        for choice in json.loads(text)["choices"]
    }
    assert [c["index"] for c in joined["choices"]] == [0, 1, 2, 3]
    for choice in joined["choices"]:
        prompt, own = divmod(choice["index"], 2)
        assert choice["prompt_logprobs"] == said[(prompt, own)], choice["index"]
    assert joined["usage"] == {"prompt_tokens": 5, "total_tokens": 9, "completion_tokens": 4}
