"""The reviewed-option policy for extra ``vllm serve`` arguments (pure).

Owns ``classify_vllm_options``: the tokens after the launcher's ``--`` are
split into transport options (excluded from the identity) and reviewed
inference options (identity-bound), and everything else is refused.  vLLM's
argparse accepts one option in many spellings (``--name=value``, ``--name
value``, underscores for dashes, unambiguous prefixes, dotted JSON keys,
``--no-`` negations, short aliases such as ``-O3`` or ``-tp``), so an owned
option is refused in every one of them, and the accepted forms are narrow:
one ``--name=value`` token, or one bare token for a reviewed switch.

The allowlists are versioned by ``VLLM_OPTION_POLICY_VERSION``; changing what
is accepted or how a value is validated needs a new version.  Decisions that
the allowlists encode (each one is tested):

* ``--cuda-graph-sizes`` / ``--cudagraph-capture-sizes`` are refused: vLLM
  takes them as a multi-token list, which the one-token rule cannot express.
* ``--max-seq-len-to-capture`` is refused: vLLM removed it before 0.20.1.
* ``--enable-log-requests`` / ``--disable-log-requests`` are refused: request
  logging is off by default in every supported vLLM and logs prompts.
* ``--response-role`` is refused as not reviewed (it shapes chat responses).
* ``--rope-scaling`` takes a flat JSON object that must already be in
  canonical compact form with sorted keys, so one setting has one identity.
* v2 (Kiln conformance): ``--disable-log-stats`` is an inference switch,
  hashed into the identity as Kiln's launcher hashes it, and
  ``--enable-offline-docs`` is accepted as transport, as in Kiln.
* Numbers are canonical decimals: no sign, exponent, leading zero or trailing
  fractional zero (``0.9``, not ``0.90``), so one value has one identity.

Messages name the option, never its value (an API key may be the value).
Imports: standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from kiln_registry.domain.errors import PolicyError
from kiln_registry.vllm_options.tables import (
    INFERENCE_SWITCHES,
    INFERENCE_VALUE_OPTIONS,
    KNOWN_OTHER_OPTIONS,
    MAX_OPTION_NAME_CHARS,
    MAX_TRANSPORT_VALUE_BYTES,
    MAX_VALUE_BYTES,
    MAX_VLLM_TOKENS,
    NEGATABLE_SWITCHES,
    PATH_VALUED_OPTIONS,
    TRANSPORT_SWITCHES,
    TRANSPORT_VALUE_OPTIONS,
    ValueRule,
    is_owned,
    is_path_valued,
    owned_prefix_targets,
)

VLLM_OPTION_POLICY_VERSION = "kiln.vllm-option-policy.v2"
API_KEY_OPTION = "api-key"
REDACTED = "<redacted>"

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]*")
_ECHO_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_FORBIDDEN_CHARS = ("\x00", "\r", "\n")
_ACCEPTED: frozenset[str] = frozenset(
    (*TRANSPORT_VALUE_OPTIONS, *TRANSPORT_SWITCHES, *INFERENCE_VALUE_OPTIONS, *INFERENCE_SWITCHES)
)


@dataclass(frozen=True, slots=True)
class VllmOptions:
    """Accepted extra vLLM options, split by whether they enter the identity.

    ``transport`` may hold the API key, so it is left out of ``repr``; use
    ``redacted()`` for anything that is printed or logged.
    """

    transport: tuple[str, ...] = field(default=(), repr=False)
    inference: tuple[str, ...] = ()
    api_key_present: bool = False
    host: str | None = None
    port: int | None = None
    seed: int | None = None
    enforce_eager: bool = False

    def redacted(self) -> tuple[str, ...]:
        """Transport then inference tokens, with the API key value replaced."""
        prefix = f"--{API_KEY_OPTION}="
        shown = tuple(
            f"{prefix}{REDACTED}" if token.startswith(prefix) else token for token in self.transport
        )
        return shown + self.inference


@dataclass(frozen=True, slots=True)
class _Token:
    index: int
    raw_name: str
    value: str | None

    @property
    def label(self) -> str:
        """How a message refers to this token without echoing a value."""
        if _ECHO_RE.fullmatch(self.raw_name):
            return f"--{self.raw_name}"
        return f"extra vLLM option #{self.index + 1}"


def classify_vllm_options(tokens: Sequence[str]) -> VllmOptions:
    """Validate the extra vLLM tokens and split them into transport and inference."""
    if len(tokens) > MAX_VLLM_TOKENS:
        raise PolicyError(
            f"{len(tokens)} extra vLLM options given; at most {MAX_VLLM_TOKENS} are accepted",
            rule="policy.too_many",
        )
    transport: list[str] = []
    inference: list[str] = []
    seen: dict[str, str] = {}
    for index, text in enumerate(tokens):
        token = _split_token(index, text)
        name = _classify_name(token)
        _refuse_duplicate(token, name, seen)
        if name in TRANSPORT_VALUE_OPTIONS or name in TRANSPORT_SWITCHES:
            transport.append(text)
        else:
            inference.append(text)
    return _summarise(tuple(transport), tuple(inference))


def _split_token(index: int, text: str) -> _Token:
    anonymous = _Token(index, "", None)
    if any(char in text for char in _FORBIDDEN_CHARS):
        name = text.split("=", 1)[0][2:] if text.startswith("--") else ""
        label = _Token(index, name, None).label if name else anonymous.label
        raise PolicyError(f"{label} contains a NUL, CR or LF character", rule="policy.control")
    if text == "--":
        raise PolicyError(
            f"{anonymous.label} is a second '--'; exactly one delimiter is accepted",
            rule="policy.delimiter",
        )
    if not text.startswith("--"):
        what = "a single-dash option" if text.startswith("-") else "a positional argument"
        raise PolicyError(
            f"{anonymous.label} is {what}; only one --name=value token per option is accepted "
            "(short aliases such as -O3 or -tp and positional values are refused)",
            rule="policy.form",
        )
    name, sep, value = text[2:].partition("=")
    if len(name) > MAX_OPTION_NAME_CHARS:
        raise PolicyError(f"{anonymous.label} has an over-long option name", rule="policy.form")
    return _Token(index, name, value if sep else None)


def _classify_name(token: _Token) -> str:
    """Return the accepted canonical name of ``token`` or raise the refusal."""
    canonical = token.raw_name.replace("_", "-")
    base = canonical.split(".", 1)[0]
    if not base:
        raise PolicyError(f"{token.label} has no option name", rule="policy.form")
    accepted = base in _ACCEPTED
    _refuse_launcher_owned(token, base, accepted=accepted)
    if base != token.raw_name:
        how = "dotted JSON keys" if "." in canonical else "underscores for dashes"
        raise PolicyError(
            f"{token.label} uses {how}; write one lowercase dashed --name=value token",
            rule="policy.form",
        )
    if not _NAME_RE.fullmatch(base):
        raise PolicyError(
            f"{token.label} is not a lowercase dashed option name", rule="policy.form"
        )
    if not accepted:
        _refuse_unreviewed(token, base)
    if base in TRANSPORT_SWITCHES or base in INFERENCE_SWITCHES:
        if token.value is not None:
            raise PolicyError(
                f"{token.label} is a valueless switch; give it without '='", rule="policy.form"
            )
    else:
        _check_value(token, base)
    return base


def _refuse_launcher_owned(token: _Token, base: str, *, accepted: bool) -> None:
    rule = _launcher_rule(base, accepted=accepted)
    if rule == "policy.owned":
        raise PolicyError(
            f"{token.label} is owned by the launcher; it cannot be passed after '--'",
            rule=rule,
            hint="the launcher sets the model, tokenizer, logprob, fingerprint and adapter options",
        )
    if rule == "policy.path_valued":
        raise PolicyError(
            f"{token.label} is owned by the launcher: it names a file, directory, template, "
            "config, plugin, class or module, and hashing a path string would not bind its "
            "content",
            rule=rule,
        )


def _launcher_rule(base: str, *, accepted: bool) -> str | None:
    """Which launcher refusal applies to ``base`` (exact or abbreviated), if any."""
    if is_owned(base):
        return "policy.owned"
    if accepted:
        # An exact reviewed name wins over a prefix match, as it does in argparse.
        return None
    if is_path_valued(base):
        return "policy.path_valued"
    if any(target.startswith(base) for target in owned_prefix_targets()):
        return "policy.owned"
    if any(target.startswith(base) for target in PATH_VALUED_OPTIONS):
        return "policy.path_valued"
    return None


def _refuse_unreviewed(token: _Token, base: str) -> None:
    if any(name != base and name.startswith(base) for name in _ACCEPTED | KNOWN_OTHER_OPTIONS):
        raise PolicyError(
            f"{token.label} is an abbreviation; abbreviated option names are never accepted",
            rule="policy.abbreviation",
        )
    raise PolicyError(
        f"{token.label} is not identity-reviewed; unknown vLLM options fail closed "
        f"({VLLM_OPTION_POLICY_VERSION})",
        rule="policy.not_reviewed",
    )


def _check_value(token: _Token, name: str) -> None:
    if token.value is None:
        raise PolicyError(
            f"{token.label} needs its value in the same token: --{name}=VALUE "
            "(the two-token form is refused)",
            rule="policy.form",
        )
    transport = name in TRANSPORT_VALUE_OPTIONS
    limit = MAX_TRANSPORT_VALUE_BYTES if transport else MAX_VALUE_BYTES
    if not token.value or len(token.value.encode("utf-8", "surrogatepass")) > limit:
        raise PolicyError(
            f"{token.label} needs a non-empty value of at most {limit} bytes", rule="policy.value"
        )
    rule: ValueRule = TRANSPORT_VALUE_OPTIONS[name] if transport else INFERENCE_VALUE_OPTIONS[name]
    problem = rule(token.value)
    if problem is not None:
        # A transport value can be a secret, so only the rule is described.
        raise PolicyError(f"{token.label} has an invalid value: {problem}", rule="policy.value")


def _refuse_duplicate(token: _Token, name: str, seen: dict[str, str]) -> None:
    key = name.removeprefix("no-") if name in NEGATABLE_SWITCHES else name
    previous = seen.get(key)
    if previous is not None:
        raise PolicyError(
            f"{token.label} repeats --{previous}; each option may appear once "
            "(a switch and its --no- form count as the same option)",
            rule="policy.duplicate",
        )
    seen[key] = name


def _value_of(tokens: tuple[str, ...], name: str) -> str | None:
    prefix = f"--{name}="
    return next((t[len(prefix) :] for t in tokens if t.startswith(prefix)), None)


def _summarise(transport: tuple[str, ...], inference: tuple[str, ...]) -> VllmOptions:
    port = _value_of(transport, "port")
    seed = _value_of(inference, "seed")
    return VllmOptions(
        transport=transport,
        inference=inference,
        api_key_present=_value_of(transport, API_KEY_OPTION) is not None,
        host=_value_of(transport, "host"),
        port=int(port) if port is not None else None,
        seed=int(seed) if seed is not None else None,
        enforce_eager="--enforce-eager" in inference,
    )
