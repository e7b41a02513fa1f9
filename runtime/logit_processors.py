"""The generation config's logit processors, applied to each step's logits as transformers'
`generate` applies them, token for token.

A checkpoint's generation_config.json may ban repeats (`repetition_penalty`,
`no_repeat_ngram_size`), words (`bad_words_ids`, `sequence_bias`) or tokens (`suppress_tokens`,
`begin_suppress_tokens`), hold the end back (`min_length`, `min_new_tokens`) or force the first
or last token (`forced_bos_token_id`, `forced_eos_token_id`: Marian, mBART and Pegasus end every
sequence that reaches its length with EOS). Ignoring them changes the tokens. `FIELDS` is the
table of what is honoured: one row per field, in the order transformers' `_get_logits_processor`
builds its processors (the order matters: forced EOS overwrites a row that suppressed tokens
are then taken out of), each with its check and the processor it builds. The processors come
before temperature, top-k and top-p (runtime/sampling.py), for greedy decoding too.

A call (`generate(**kwargs)`, an HTTP request) may also ask for what OpenAI's and vLLM's APIs
have and transformers has not: `logit_bias` ({token id: bias}, OpenAI's shape) and the
`frequency_penalty` / `presence_penalty` pair (over the generated tokens only). They are not
generation-config fields (a generation_config.json's are not read), so they sit around
transformers' table in vLLM's order (`CALL_FIELDS`): vLLM adds the bias to the raw logits
before its penalties, and applies the repetition penalty, then the frequency, then the
presence penalty.

Numbers as transformers has them: the scores are float32 (transformers casts the model's
logits to float32 first), a repetition penalty divides or multiplies in float32 by the float32
penalty (what torch does with a Python scalar: bit for bit), a bias is summed in float32 before
it is added. Each sequence is its own: lengths are its own prompt's (in a batch transformers
counts the padded width), its prompt's padding is none of its n-grams.

Per step the work is O(the rows): the tokens a repetition penalty looks at and the n-grams are
tables per sequence (`History`) extended by the tokens added since the last step, never rebuilt.
An n-gram table keys a prefix by its hash and first position, so its memory is O(length)
whatever n. A row with NaN or +inf, or -inf everywhere, is left as it is (forced EOS would
otherwise hide a NaN): the model's non-finite logits stay an error, never a token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.errors import DayzeroError, InputError

from .logit_processor_ops import (
    Ban,
    Force,
    History,
    NoRepeatNGram,
    OccurrencePenalty,
    RepetitionPenalty,
    SequenceBias,
)
from .sampling import bad_rows

MAX_IDS = 1 << 20  # token ids in one field's lists: a config or a request does bounded work
MAX_COUNT = 1 << 24  # the largest n-gram size or minimum length taken (past any sequence)
MAX_OCCURRENCE_PENALTY = 2.0  # OpenAI's range for frequency and presence penalties: [-2, 2]
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a logit bias: [-100, 100]


class _Want(ValueError):
    """A field's value is not what it must be: `want` says what."""

    def __init__(self, want: str):
        super().__init__(want)
        self.want = want


# -- checks: each returns the value normalized, or raises _Want --------------------------------
def _integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _penalty(value: Any, vocab: int) -> float:
    if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool) \
            or not math.isfinite(value) or value <= 0:
        raise _Want("a finite number > 0 (1.0 is no penalty)")
    return float(value)


def _count(value: Any, vocab: int) -> int:
    if not _integer(value) or not 0 <= value <= MAX_COUNT:
        raise _Want(f"an integer in [0, {MAX_COUNT}] (0 is off)")
    return int(value)


def _token(value: Any, vocab: int) -> int:
    if not _integer(value) or not 0 <= value < vocab:
        raise _Want(f"a token id in [0, {vocab - 1}] (the model's vocabulary)")
    return int(value)


def _tokens(value: Any, vocab: int) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or len(value) > MAX_IDS:
        raise _Want(f"a list of at most {MAX_IDS} token ids in [0, {vocab - 1}]")
    return tuple(_token(t, vocab) for t in value)


def _token_or_tokens(value: Any, vocab: int) -> tuple[int, ...]:
    return (_token(value, vocab),) if _integer(value) else _tokens(value, vocab)


def _sequences(value: Any, vocab: int) -> tuple[tuple[int, ...], ...]:
    want = f"a list of non-empty lists of token ids in [0, {vocab - 1}]"
    if not isinstance(value, (list, tuple)) or sum(
            len(s) if isinstance(s, (list, tuple)) else 1 for s in value) > MAX_IDS:
        raise _Want(f"{want}, {MAX_IDS} ids at most")
    if not all(isinstance(s, (list, tuple)) and s for s in value):
        raise _Want(want)
    return tuple(_tokens(s, vocab) for s in value)


def _biases(value: Any, vocab: int) -> tuple[tuple[tuple[int, ...], float], ...]:
    want = "a list of [[token ids], bias] pairs (the bias a finite number or -inf)"
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        raise _Want(want)
    ids = _sequences([p[0] for p in value], vocab)
    biases = [p[1] for p in value]
    if not all(isinstance(b, (int, float)) and not isinstance(b, bool)
               and not math.isnan(b) and b != math.inf for b in biases):
        raise _Want(want)
    return tuple(zip(ids, map(float, biases)))


def _occurrence(value: Any, vocab: int) -> float:
    top = MAX_OCCURRENCE_PENALTY
    if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool) \
            or not -top <= value <= top:
        raise _Want(f"a number in [-{top:g}, {top:g}] (0 is no penalty)")
    return float(value)


def _logit_bias(value: Any, vocab: int) -> tuple[tuple[int, float], ...]:
    """{token id: bias}: OpenAI's shape (ids as decimal strings), or integer ids."""
    top = MAX_LOGIT_BIAS
    want = (f"an object mapping token ids in [0, {vocab - 1}] (decimal strings) to biases in "
            f"[-{top:g}, {top:g}]")
    if not isinstance(value, Mapping) or len(value) > min(vocab, MAX_IDS):
        raise _Want(want)
    pairs = []
    for key, bias in value.items():
        token = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() \
            and len(key) < 12 else key
        if not _integer(token) or not 0 <= token < vocab or isinstance(bias, bool) \
                or not isinstance(bias, (int, float, np.integer, np.floating)) \
                or not -top <= bias <= top:
            raise _Want(want)
        pairs.append((int(token), float(bias)))
    return tuple(pairs)


# -- the table --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Field:
    """A generation-config field: its check, and the processor it builds (None: it is off),
    from its value, the config's other settings and the EOS ids."""
    name: str
    check: Callable[[Any, int], Any]
    build: Callable[[Any, Mapping[str, Any], tuple[int, ...]], Any]


def _bad_words(words, settings, eos):
    # transformers drops a one-token bad word that is an EOS id
    kept = [w for w in words if not (len(w) == 1 and w[0] in eos)]
    return SequenceBias((w, -math.inf) for w in kept) if kept else None


def _begin(tokens, settings, eos):
    # transformers' begin index: the prompt's end, one later after a forced BOS on a
    # one-token prompt
    forced = settings.get("forced_bos_token_id") is not None
    return Ban(tokens, lambda h: h.generated == (1 if forced and h.prompt_len == 1 else 0)) \
        if tokens else None


FIELDS: tuple[Field, ...] = (
    Field("sequence_bias", _biases, lambda v, s, eos: SequenceBias(v) if v else None),
    Field("repetition_penalty", _penalty,
          lambda v, s, eos: RepetitionPenalty(v) if v != 1.0 else None),
    Field("no_repeat_ngram_size", _count, lambda v, s, eos: NoRepeatNGram(v) if v else None),
    Field("bad_words_ids", _sequences, _bad_words),
    Field("min_length", _count, lambda v, s, eos: Ban(eos, lambda h: len(h.tokens) < v)
          if v and eos else None),
    Field("min_new_tokens", _count, lambda v, s, eos: Ban(eos, lambda h: h.generated < v)
          if v and eos else None),
    Field("forced_bos_token_id", _token,
          lambda v, s, eos: Force((v,), lambda h: len(h.tokens) == 1)),
    Field("forced_eos_token_id", _token_or_tokens, lambda v, s, eos: Force(
        v, lambda h: h.generated == h.max_new_tokens - 1) if v else None),
    Field("suppress_tokens", _tokens, lambda v, s, eos: Ban(v, lambda h: True) if v else None),
    Field("begin_suppress_tokens", _tokens, _begin),
)


def _occurrence_penalty(settings: Mapping[str, Any]) -> OccurrencePenalty | None:
    frequency = settings.get("frequency_penalty") or 0.0
    presence = settings.get("presence_penalty") or 0.0
    return OccurrencePenalty(frequency, presence) if frequency or presence else None


# a call's arguments that are not generation-config fields, and where they go: the bias on the
# raw logits first, the two penalties (one processor, built by the first set) after the rest
LOGIT_BIAS = Field("logit_bias", _logit_bias, lambda v, s, eos: SequenceBias(
    ((t,), b) for t, b in v) if v else None)
CALL_FIELDS: tuple[Field, ...] = (
    Field("frequency_penalty", _occurrence, lambda v, s, eos: _occurrence_penalty(s)),
    Field("presence_penalty", _occurrence, lambda v, s, eos: None
          if s.get("frequency_penalty") is not None else _occurrence_penalty(s)),
)
ORDER: tuple[Field, ...] = (LOGIT_BIAS, *FIELDS, *CALL_FIELDS)
NAMES = tuple(f.name for f in ORDER)
# the EOS ids the processors hold back or force, and generation stops at: a config's own
# (transformers' generation_config.eos_token_id) over the artifact's
EOS = Field("eos_token_id", _token_or_tokens, lambda v, s, eos: None)

# fields transformers acts on that are not applied here (beams, guidance, the sampling-only
# warpers): a config that sets one gets different tokens from transformers, so it is named
NOT_APPLIED: dict[str, Callable[[Any], bool]] = {
    "num_beams": lambda v: v not in (None, 1),
    "guidance_scale": lambda v: v not in (None, 1),
    "exponential_decay_length_penalty": lambda v: v is not None,
    "remove_invalid_values": lambda v: v is True,
    "watermarking_config": lambda v: v is not None,
    "min_p": lambda v: v is not None,
    "typical_p": lambda v: v not in (None, 1),
    "epsilon_cutoff": lambda v: v not in (None, 0),
    "eta_cutoff": lambda v: v not in (None, 0),
    "top_h": lambda v: v is not None,
}


class LogitProcessors:
    """The processors of a generation config, built once, applied to batches of rows.

    `from_config` checks a config (generation_config.json's fields; the others are not this
    table's and are left alone); `for_call` merges a call's overrides and EOS ids. Each
    sequence gets a `history`; `apply` takes rows of logits and their histories."""

    def __init__(self, settings: Mapping[str, Any], vocab_size: int,
                 eos_token_ids: Iterable[int] = ()):
        self.settings = dict(settings)  # checked and normalized (from_config / for_call)
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        # an EOS id outside the logits bans nothing (torch.isin over the vocabulary)
        eos = tuple(t for t in self.eos_token_ids if 0 <= t < vocab_size)
        built = [(f.name, f.build(self.settings[f.name], self.settings, eos))
                 for f in ORDER if self.settings.get(f.name) is not None]
        self.processors = tuple(p for _, p in built if p is not None)
        self.names = tuple(name for name, p in built if p is not None)

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None, vocab_size: int,
                    eos_token_ids: Iterable[int] = (), source: str | None = None,
                    error: type[DayzeroError] = InputError) -> LogitProcessors:
        """The processors of `config` (None values are unset), for its `eos_token_id` if it
        has one, else `eos_token_ids`; `error` naming `source: field` (or the field alone)
        when a value is not what transformers takes."""
        config = config or {}
        settings = _checked(config, vocab_size, source, error)
        eos = _checked(config, vocab_size, source, error, (EOS,)).get(EOS.name, eos_token_ids)
        return cls(settings, vocab_size, eos)

    @property
    def active(self) -> bool:
        return bool(self.processors)

    def for_call(self, overrides: Mapping[str, Any] | None = None,
                 eos_token_ids: Iterable[int] | None = None) -> LogitProcessors:
        """These processors with a call's arguments over the config's (None: the config's;
        1.0, 0 or [] turns one off; `logit_bias` and the frequency / presence penalties are
        the call's alone), for its EOS ids; InputError naming a bad argument."""
        overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        unknown = sorted(set(overrides) - set(NAMES))
        if unknown:
            raise InputError(f"unknown generation argument {unknown[0]!r}", unknown[0],
                             f"the generation-config arguments are: {', '.join(NAMES)}")
        eos = self.eos_token_ids if eos_token_ids is None else _eos_ids(eos_token_ids)
        if not overrides and eos == self.eos_token_ids:
            return self
        merged = {**self.settings,
                  **_checked(overrides, self.vocab_size, None, InputError, ORDER)}
        return LogitProcessors(merged, self.vocab_size, eos)

    def history(self, tokens: list[int], prompt_len: int, max_new_tokens: int) -> History:
        return History(tokens, prompt_len, max_new_tokens)

    def apply(self, logits: np.ndarray, histories: Sequence[History]) -> np.ndarray:
        """The processed scores [rows, vocab] float32 (a new array) of `logits` [rows, vocab],
        row i for `histories[i]`'s next token. A row with no distribution (NaN, +inf, -inf
        everywhere) comes back as given."""
        logits = np.asarray(logits)
        if logits.ndim != 2 or len(logits) != len(histories) \
                or logits.shape[1] != self.vocab_size:
            raise InputError(f"logits of shape {list(logits.shape)} for {len(histories)} "
                             f"sequences, not [{len(histories)}, {self.vocab_size}]", "logits",
                             "pass one row of the model's logits per sequence")
        scores = logits.astype(np.float32)  # a copy, as transformers' float32 scores
        with np.errstate(invalid="ignore", over="ignore"):
            for processor in self.processors:
                processor.apply(scores, histories)
        bad = bad_rows(logits)
        if len(bad):
            scores[bad] = logits[bad]
        return scores

    def __repr__(self) -> str:
        return f"LogitProcessors({', '.join(self.names) or 'none'})"


def _checked(config: Mapping[str, Any], vocab: int, source: str | None,
             error: type[DayzeroError], fields: Iterable[Field] = FIELDS) -> dict[str, Any]:
    """The `fields` of `config`, checked and normalized (None ones left out)."""
    settings = {}
    for f in fields:
        value = config.get(f.name)
        if value is None:
            continue
        try:
            settings[f.name] = f.check(value, vocab)
        except _Want as bad:
            where = f"{source}: {f.name}" if source else f.name
            fix = (f"set {f.name} to {bad.want} in the checkpoint's generation_config.json "
                   "and recompile" if source else f"pass {f.name} as {bad.want}")
            raise error(f"{where} is {_short(value)}, not {bad.want}", where, fix) from None
    return settings


def _eos_ids(ids: Any) -> tuple[int, ...]:
    """A call's EOS ids: integers (one outside the vocabulary never comes, as in
    transformers)."""
    listed = list(ids) if isinstance(ids, Iterable) and not isinstance(ids, (str, bytes)) \
        else None
    if listed is None or len(listed) > MAX_IDS or not all(_integer(t) for t in listed):
        raise InputError(f"eos_token_id is {_short(ids)}, not token ids", "eos_token_id",
                         "pass an integer token id or a list of them")
    return tuple(int(t) for t in listed)


def not_applied(config: Mapping[str, Any]) -> list[str]:
    """The fields of `config` that transformers would act on and these processors do not."""
    return [name for name, acts in NOT_APPLIED.items() if acts(config.get(name))]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
