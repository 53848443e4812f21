"""Which fields of two teacher identities differ, and what an operator can do about it.

``mismatch_detail(expected, found)`` names the differing identity fields (in
the document's normative order, never their values: a probed identity's text
fields came from the teacher) and, for the kind of change they show, the way
out.  Used where a probed identity is compared with a pinned one.  Pure:
imports ``identity.document`` only.
"""

from __future__ import annotations

from kiln_registry.identity.document import TeacherIdentity

# What a change in each group of fields means, in the order they are checked.
_CAUSES: tuple[tuple[frozenset[str], str], ...] = (
    (
        frozenset({"base_model_sha256", "served_model_id", "adapter"}),
        "a different model or adapter is served",
    ),
    (
        frozenset({"tokenizer_vocab_sha256", "tokenizer_config_sha256", "vocab_size"}),
        "the tokenizer changed",
    ),
    (
        frozenset({"implementation", "inference_config_sha256"}),
        "the vLLM version or its inference options changed",
    ),
    (
        frozenset({"max_top_k", "max_model_len", "max_prompt_logprob_candidates"}),
        "the launch bounds (max_top_k, max_model_len, candidates) changed",
    ),
)
REMEDY = (
    "restart the teacher with the model, tokenizer, vLLM version and options it was registered"
    " with, or register the new identity under a new alias (an alias's identity never changes)"
)


def differing_fields(expected: TeacherIdentity, found: TeacherIdentity) -> list[str]:
    a, b = expected.to_dict(), found.to_dict()
    return [name for name in a if a[name] != b[name]]


def mismatch_detail(expected: TeacherIdentity, found: TeacherIdentity) -> str:
    """``"fields that differ: a, b (cause); do this"`` for two identities."""
    fields = differing_fields(expected, found)
    causes = [cause for group, cause in _CAUSES if group.intersection(fields)]
    why = f" ({'; '.join(causes)})" if causes else ""
    return f"identity fields that differ: {', '.join(fields) or 'none'}{why}; to fix: {REMEDY}"
