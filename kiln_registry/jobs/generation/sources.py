"""Off-policy generation inputs: settings, chat messages and their rendering to token ids.

A generation job's prompts are Kiln ``ChatMessage`` lists (``{"role",
"content"}``, roles ``system``/``user``/``assistant``), given inline or as a
corpus file of ``{"id", "messages"}`` lines under ``[jobs] corpus_root``
(the same confinement and size bounds as scoring corpora).  Each prompt is
rendered to token ids with the loaded student's chat template (Transformers,
local files only, ``add_generation_prompt``); a student without a template is
refused.  The ids are what the teacher is sent and what the cache is keyed
by, so what the teacher saw is exact.  ``GenerationSettings`` holds the
sampling settings; only deterministic ones (greedy, or a fixed seed) are
cached.  Every prompt is checked against the pinned identity before anything
is stored: ``prompt + max_tokens <= max_model_len``, ids in vocabulary.

Imports: standard library, ``transformers`` (inside the loader),
``kiln_registry.domain.errors``/``identity`` and ``jobs.scoring.sources``.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kiln_registry.domain.errors import JobInvalid
from kiln_registry.domain.text import quoted
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.strict_read import loads_strict
from kiln_registry.jobs.scoring.sources import (
    MAX_CORPUS_BYTES,
    MAX_LINE_BYTES,
    MAX_SEQ_ID_CHARS,
    JobSequence,
    _open_confined,
    confined_corpus_path,
)

ROLES: Final = ("system", "user", "assistant")
MAX_PROMPTS: Final = 100_000
MAX_MESSAGES: Final = 256
MAX_CONTENT_CHARS: Final = 1 << 20
MAX_GENERATION_TOKENS: Final = 32_768
MAX_SEED: Final = 2**63 - 1


def _invalid(where: str, rule: str, message: str) -> JobInvalid:
    return JobInvalid(f"{where}: {message}", rule=f"job.{rule}")


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    """Sampling settings of one job; ``temperature == 0`` is greedy."""

    max_tokens: int
    top_k: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def deterministic(self) -> bool:
        return self.temperature == 0.0 or self.seed is not None

    def canonical_json(self) -> str:
        values = {"max_tokens": self.max_tokens, "seed": self.seed,
                  "temperature": float(self.temperature), "top_k": self.top_k,
                  "top_p": float(self.top_p)}  # fmt: skip
        return json.dumps(values, sort_keys=True, separators=(",", ":"), allow_nan=False)

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode("ascii")).hexdigest()

    @classmethod
    def from_json(cls, text: str) -> GenerationSettings:
        v = json.loads(text)
        return cls(v["max_tokens"], v["top_k"], v["temperature"], v["top_p"], v["seed"])

    def check(self, identity: TeacherIdentity) -> None:
        """Refuse settings the pinned teacher cannot serve."""
        if not 0 <= self.top_k <= identity.max_top_k:
            raise _invalid("top_k", "top_k", f"{self.top_k} is outside 0..={identity.max_top_k}"
                           " (0 = text only; the teacher's max_top_k)")  # fmt: skip
        limit = min(MAX_GENERATION_TOKENS, identity.max_model_len - 1)
        if not 1 <= self.max_tokens <= limit:
            raise _invalid("max_tokens", "max_tokens", f"{self.max_tokens} is outside"
                           f" 1..={limit} (the teacher's max_model_len"
                           f" {identity.max_model_len} less one prompt token)")  # fmt: skip
        if not 0.0 <= self.temperature <= 2.0:
            raise _invalid("temperature", "temperature", "must be in 0..=2 (0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise _invalid("top_p", "top_p", "must be in (0, 1]")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise _invalid("seed", "seed", f"must be in 0..={MAX_SEED}")


@functools.lru_cache(maxsize=4)
def _tokenizer(model_dir: str, stamp: float) -> Any:
    from transformers import AutoTokenizer

    del stamp  # part of the cache key only: a changed tokenizer_config.json reloads
    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


def student_tokenizer(model_dir: Path) -> Any:
    """The student's Transformers tokenizer (local files only), refused without a template."""
    config = model_dir / "tokenizer_config.json"
    stamp = config.stat().st_mtime if config.is_file() else 0.0
    tokenizer = _tokenizer(str(model_dir), stamp)
    if not getattr(tokenizer, "chat_template", None):
        raise JobInvalid(
            "the student tokenizer has no chat template, so messages cannot be rendered to the"
            " token ids the teacher is sent",
            rule="job.chat_template",
            hint="use a student model whose tokenizer_config.json has a chat_template",
        )
    return tokenizer


def check_messages(value: object, where: str) -> list[dict[str, str]]:
    """Kiln's ``ChatMessage`` list: non-empty, exactly ``role``/``content`` strings."""
    if not isinstance(value, list) or not value:
        raise _invalid(where, "messages_empty", "messages must be a non-empty array")
    if len(value) > MAX_MESSAGES:
        raise _invalid(where, "messages_count", f"at most {MAX_MESSAGES} messages")
    out: list[dict[str, str]] = []
    total = 0
    for index, message in enumerate(value):
        at = f"{where}[{index}]"
        if not isinstance(message, dict) or sorted(message) != ["content", "role"]:
            raise _invalid(at, "message_keys", 'a message is exactly {"role", "content"}')
        role, content = message["role"], message["content"]
        if role not in ROLES:
            raise _invalid(at, "message_role", f"role {quoted(role, 40)} is not one of"
                           f" {', '.join(ROLES)}")  # fmt: skip
        if not isinstance(content, str):
            raise _invalid(at, "message_content", "content must be a string")
        total += len(content)
        if total > MAX_CONTENT_CHARS:
            raise _invalid(where, "messages_size", f"at most {MAX_CONTENT_CHARS} characters")
        out.append({"role": role, "content": content})
    return out


def render(tokenizer: Any, messages: list[dict[str, str]], where: str) -> list[int]:
    """The prompt's token ids: the chat template with the generation prompt appended."""
    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except Exception as exc:  # a template error on user content: the template's message
        raise _invalid(where, "chat_template", f"the chat template refused the messages"
                       f" ({type(exc).__name__}: {str(exc)[:200]})") from None  # fmt: skip
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # Transformers 5 may return an encoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]


@dataclass(frozen=True, slots=True)
class Prompts:
    """Validated, rendered prompts (``JobSequence`` rows) and their canonical messages."""

    items: list[tuple[JobSequence, str]]
    token_count: int
    corpus_path: str | None = None
    corpus_sha256: str | None = None


class _Collector:
    def __init__(self, tokenizer: Any, identity: TeacherIdentity, settings: GenerationSettings):
        self.tokenizer, self.identity, self.settings = tokenizer, identity, settings
        self.items: list[tuple[JobSequence, str]] = []
        self.ids: set[str] = set()
        self.tokens = 0

    def add(self, seq_id: object, messages: object, where: str) -> None:
        if len(self.items) >= MAX_PROMPTS:
            raise _invalid(where, "too_many_prompts", f"a job holds at most {MAX_PROMPTS}")
        if (
            not isinstance(seq_id, str)
            or not 1 <= len(seq_id) <= MAX_SEQ_ID_CHARS
            or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in seq_id)
        ):
            raise _invalid(where, "sequence_id", f"id must be 1..{MAX_SEQ_ID_CHARS} printable"
                           " characters")  # fmt: skip
        if seq_id in self.ids:
            raise _invalid(where, "duplicate_id", f"id {seq_id!r} repeats an earlier prompt")
        checked = check_messages(messages, f"{where}.messages")
        ids = render(self.tokenizer, checked, where)
        self._check_ids(ids, where)
        data = b"".join(t.to_bytes(4, "little") for t in ids)
        canonical = json.dumps(checked, ensure_ascii=False, separators=(",", ":"))
        self.items.append((JobSequence(seq_id, data, hashlib.sha256(data).hexdigest()), canonical))
        self.ids.add(seq_id)
        self.tokens += len(ids)

    def _check_ids(self, ids: Sequence[int], where: str) -> None:
        ident, room = self.identity, self.identity.max_model_len - self.settings.max_tokens
        if not ids or len(ids) > room:
            raise _invalid(where, "prompt_length", f"the rendered prompt has {len(ids)} tokens;"
                           f" with max_tokens {self.settings.max_tokens} at most {room} fit"
                           f" the teacher's max_model_len {ident.max_model_len}")  # fmt: skip
        if min(ids) < 0 or max(ids) >= ident.vocab_size:
            raise _invalid(where, "token_id", "the chat template produced an id outside the"
                           f" teacher's vocab_size {ident.vocab_size}")  # fmt: skip


def inline_prompts(
    prompts: Sequence[object], tokenizer: Any, identity: TeacherIdentity, s: GenerationSettings
) -> Prompts:
    """Inline ``[{"id"?, "messages"}]``; a prompt without an id gets ``str(index)``."""
    collector = _Collector(tokenizer, identity, s)
    for index, prompt in enumerate(prompts):
        where = f"prompts[{index}]"
        if not isinstance(prompt, dict) or not set(prompt) <= {"id", "messages"}:
            raise _invalid(where, "prompt_keys", 'a prompt is {"id"?, "messages"}')
        collector.add(prompt.get("id", str(index)), prompt.get("messages"), where)
    if not collector.items:
        raise _invalid("prompts", "empty", "a job needs at least one prompt")
    return Prompts(collector.items, collector.tokens)


def corpus_prompts(
    root: Path | None, given: str, tokenizer: Any, identity: TeacherIdentity,
    s: GenerationSettings,
) -> Prompts:  # fmt: skip
    """A corpus of ``{"id", "messages"}`` lines under ``root`` (no blank lines)."""
    path = confined_corpus_path(root, given)
    assert root is not None
    collector, digest, total = _Collector(tokenizer, identity, s), hashlib.sha256(), 0
    with _open_confined(path, root.resolve()) as handle:
        for number in range(1, MAX_PROMPTS + 2):
            raw = handle.readline(MAX_LINE_BYTES + 1)
            if not raw:
                break
            where, total = f"corpus line {number}", total + len(raw)
            if len(raw) > MAX_LINE_BYTES or total > MAX_CORPUS_BYTES:
                raise _invalid(where, "corpus_size", "the line or the corpus is too large")
            digest.update(raw)
            try:
                value = loads_strict(raw)
            except (UnicodeDecodeError, ValueError) as exc:
                raise _invalid(where, "corpus_json", f"not strict JSON ({exc})") from None
            if not isinstance(value, dict) or sorted(value) != ["id", "messages"]:
                raise _invalid(where, "corpus_keys", 'each line is exactly {"id", "messages"}')
            collector.add(value["id"], value["messages"], where)
    if not collector.items:
        raise _invalid("corpus.path", "empty", "the corpus holds no prompts")
    shown = str(path.relative_to(root.resolve()))
    return Prompts(collector.items, collector.tokens, shown, digest.hexdigest())
