"""Kiln's off-policy preparation, reproduced: the token sequence and action positions it trains.

Kiln (ericflo/kiln) prepares an off-policy example by appending
``teacher_response`` to ``messages`` as an assistant turn and tokenizing the
conversation for training (``crates/kiln-train/src/opd.rs``,
``prepare_off_policy_distillation_dataset_with_identity``, through
``crates/kiln-train/src/trainer/sft_data.rs``, ``tokenize_for_training``):

- render the student's chat template with minijinja
  (``crates/kiln-core/src/tokenizer.rs``): ``messages`` as ``{role, content}``,
  ``tools`` and ``tool_choice`` none, ``bos_token`` and ``eos_token`` the empty
  string, no generation prompt for a training render, no ``trim_blocks`` or
  ``lstrip_blocks``; a ``raise_exception`` function;
- tokenize the whole text once without added special tokens (the same
  setting as ``KilnTokenizer::encode``, which its prefix fallback compares
  lengths against), keeping each token's offsets;
- the action mask: ChatML first, each ``<|im_start|>assistant\\n`` ... up to
  and including ``<|im_end|>`` and one following ``\\n``, every token whose
  offsets overlap that span (only when exactly one span per assistant
  message is found); otherwise, per assistant message, the text between the
  render of the messages before it and the render including it, when the
  full render starts with that prefix; otherwise token counts of those two
  renders; tokens with empty offsets are never marked;
- at least two tokens and an action token after position 0; each action
  position ``q`` is scored by the teacher's logits row ``q - 1``
  (``crates/kiln-train/src/logit_source.rs``,
  ``target_token_positions_to_logits_rows``: a position 0 is refused).

``teacher_tokens`` then hold, per action position in order, the token id
there and the teacher's top-K over logits row ``q - 1``: one
``prompt_logprobs`` pass over the sequence, as a scoring job does.

Refusals (``JobInvalid``, rule ``generation.kiln_*``, naming the prompt):
a template Kiln renders through its own ``{% generation %}`` span path (not
reproduced here), a template error, no action token, an action at position
0, and (``jobs.generation.pipeline``) a sequence the pinned teacher cannot score in
one request.  A response whose sampled ids do not decode to whole
characters holds U+FFFD: Kiln trains on that text, so it is tokenized and
scored as Kiln will (``metadata.completion_token_ids`` keeps the sampled ids).

Imports: standard library, jinja2, ``kiln_registry.domain``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kiln_registry.domain.errors import JobInvalid

CHATML_START: Final = "<|im_start|>assistant\n"
CHATML_END: Final = "<|im_end|>"
_GENERATION_TAG: Final = re.compile(r"\{%-?\s*generation\b")


def _refuse(where: str, rule: str, message: str, hint: str) -> NoReturn:
    raise JobInvalid(f"{where}: {message}", rule=f"generation.kiln_{rule}", hint=hint)


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


@dataclass(frozen=True, slots=True)
class KilnSequence:
    """What Kiln trains on: the tokenized conversation and its action positions (all >= 1)."""

    token_ids: list[int]
    positions: list[int]


Encoded = tuple[list[int], list[tuple[int, int]]]


class KilnRenderer:
    """The student's chat template and tokenizer, rendering and masking as Kiln does."""

    def __init__(self, template: str, encode: Callable[[str], Encoded]) -> None:
        self.encode = encode
        self.uses_generation_tag = bool(_GENERATION_TAG.search(template))
        env = ImmutableSandboxedEnvironment(trim_blocks=False, lstrip_blocks=False)
        env.globals["raise_exception"] = _raise_exception
        self.template: Template | None = None
        self.broken: str | None = None
        if not self.uses_generation_tag:
            try:
                self.template = env.from_string(template)
            except TemplateError as exc:
                self.broken = f"{type(exc).__name__}: {str(exc)[:200]}"

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> KilnRenderer:
        """From a Transformers fast tokenizer (its template string and backend tokenizer)."""
        template = tokenizer.chat_template
        if not isinstance(template, str):
            raise JobInvalid(
                "the student's chat template is not one template string, so Kiln's rendering"
                " of it cannot be reproduced",
                rule="generation.kiln_template",
                hint="use a student whose tokenizer_config.json has one chat_template string",
            )
        backend = tokenizer.backend_tokenizer

        def encode(text: str) -> Encoded:
            found = backend.encode(text, add_special_tokens=False)
            return [int(t) for t in found.ids], [(int(a), int(b)) for a, b in found.offsets]

        return cls(template, encode)

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        """Kiln's training render (no generation prompt, empty BOS/EOS strings)."""
        assert self.template is not None
        plain = [{"role": m["role"], "content": m["content"]} for m in messages]
        context = {"messages": plain, "tools": None, "tool_choice": None,
                   "add_generation_prompt": False, "bos_token": "", "eos_token": ""}  # fmt: skip
        return str(self.template.render(**context))

    def sequence(
        self, messages: Sequence[dict[str, str]], response: str, where: str
    ) -> KilnSequence:
        """The example's tokens and action positions, or a ``generation.kiln_*`` refusal."""
        if self.uses_generation_tag:
            _refuse(where, "template", "the student's chat template marks assistant spans with"
                    " {% generation %}, which Kiln renders through a path not reproduced here",
                    "use a student chat template without {% generation %} blocks")  # fmt: skip
        if self.broken is not None:
            _refuse(where, "template", f"the student's chat template does not compile"
                    f" ({self.broken})", "fix the student's chat template")  # fmt: skip
        full = [*messages, {"role": "assistant", "content": response}]
        try:
            text = self.render(full)
            ids, offsets = self.encode(text)
            mask = self._mask(full, text, ids, offsets)
        except Exception as exc:  # a template error on this conversation: its own message
            _refuse(where, "template", f"the chat template refused the conversation"
                    f" ({type(exc).__name__}: {str(exc)[:200]})",
                    "fix the student's chat template")  # fmt: skip
        positions = [i for i, active in enumerate(mask) if active]
        if len(ids) < 2 or not any(mask[1:]):
            _refuse(where, "no_action", "Kiln's tokenization of the conversation has no"
                    " assistant action token after the first position",
                    "check the student's chat template renders assistant turns")  # fmt: skip
        if positions[0] == 0:
            _refuse(where, "position_zero", "Kiln's action mask starts at token 0, which no"
                    " logits row predicts, so Kiln refuses the example",
                    "use a chat template that renders text before the assistant turn")  # fmt: skip
        return KilnSequence(ids, positions)

    def _mask(
        self, full: list[dict[str, str]], text: str, ids: list[int],
        offsets: list[tuple[int, int]],
    ) -> list[bool]:  # fmt: skip
        """Kiln's action mask; offsets and spans compared in UTF-8 bytes as Kiln does."""
        table = _byte_table(text)
        spans = [(table[a], table[b]) for a, b in offsets]
        assistants = sum(1 for m in full if m["role"] == "assistant")
        mask = _chatml_mask(text, table, spans, assistants)
        if mask is not None and any(mask):
            return mask
        mask = [False] * len(ids)
        size = len(text.encode("utf-8"))
        for index, message in enumerate(full):
            if message["role"] != "assistant":
                continue
            before = self.render(full[:index]).encode("utf-8") if index else b""
            prefix = self.render(full[: index + 1])
            if not text.startswith(prefix) or len(before) > len(prefix.encode("utf-8")):
                return self._mask_by_counts(full, len(ids))
            _mark(mask, spans, len(before), min(len(prefix.encode("utf-8")), size))
        return mask

    def _mask_by_counts(self, full: list[dict[str, str]], size: int) -> list[bool]:
        mask = [False] * size
        for index, message in enumerate(full):
            if message["role"] != "assistant":
                continue
            end = min(len(self.encode(self.render(full[: index + 1]))[0]), size)
            start = len(self.encode(self.render(full[:index]))[0]) if index else 0
            for i in range(start, end):
                mask[i] = True
        return mask


def _byte_table(text: str) -> list[int]:
    """The UTF-8 byte offset of every character index of ``text`` (and of its end)."""
    table = [0]
    for ch in text:
        table.append(table[-1] + len(ch.encode("utf-8", "surrogatepass")))
    return table


def _mark(mask: list[bool], spans: list[tuple[int, int]], start: int, end: int) -> None:
    """Mark every token with non-empty offsets overlapping ``[start, end)``."""
    for index, (a, b) in enumerate(spans[: len(mask)]):
        if a != b and a < end and b > start:
            mask[index] = True


def _chatml_mask(
    text: str, table: list[int], spans: list[tuple[int, int]], expected: int
) -> list[bool] | None:
    """The ChatML spans' mask, or None unless exactly ``expected`` spans were found."""
    mask = [False] * len(spans)
    if expected == 0:
        return mask
    found, at = 0, 0
    while (start := text.find(CHATML_START, at)) != -1:
        content = start + len(CHATML_START)
        close = text.find(CHATML_END, content)
        if close == -1:
            break
        end = close + len(CHATML_END)
        if text.startswith("\n", end):
            end += 1
        _mark(mask, spans, table[content], table[end])
        found += 1
        at = end
    return mask if found == expected else None
