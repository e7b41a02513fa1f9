"""Request bodies of the OpenAI completions and chat completions APIs, read and checked.

Everything a client can get wrong is a `ProtocolError`: HTTP 400 with a message naming the field
(`param` in OpenAI's error shape), raised before the request reaches the engine, so nothing a
client sends fails later on the engine thread. No field is silently ignored (fields.py): each is
acted on, a documented no-op (`user`, `metadata`, ...), or refused (`n` > 1, `echo`,
`logprobs`, `response_format` other than text, `tools`, an unknown field).

The sampling fields become the request's own logit processors here, at parse time, so a bad
value is a 400 naming it: `logit_bias`, `frequency_penalty` and `presence_penalty` (OpenAI's),
`repetition_penalty` (transformers'), `min_tokens` (vLLM's: the end held back until that many
tokens were generated), all over the artifact's generation config
(`LogitProcessors.for_call`); `stop_token_ids` (vLLM's) end the sequence as its EOS ids do;
`top_k` (vLLM's; -1 or 0 is off) and `seed` go to the sampler.

The checks run cheapest first, and every field is checked before any work is done: the body's
strings and nesting (bounds.py), the model, the fields known (fields.py), the options
(sampling, stop, stream, max_tokens' type), the prompt's length in characters or token ids
against the context (`--max-model-len`, at most the artifact's positions), and only then the
tokenizer or the chat template (chat.py), whose failures are 400s too. `read_request` does it
all from the raw bytes; the server runs it on a worker thread, never on the event loop. Chat
messages of an image-text model may hold `image_url` parts; each image is run through the
vision encoder after the expanded prompt's length was checked against the context and the KV
cache, so the engine receives the features with the request.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from compiler.errors import InputError

from ..logit_processors import MAX_COUNT, LogitProcessors
from ..sampling import SamplingParams
from ..sampling import is_greedy_temperature as greedy_temperature
from .bounds import check_chars, check_text, prompt_char_limit
from .chat import chat_ids, image_rows
from .errors import ProtocolError, guarded
from .fields import check_fields

__all__ = ["GenerationRequest", "ProtocolError", "greedy_temperature", "parse_request",
           "read_request"]

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_STOPS = 4


@dataclass
class GenerationRequest:
    """One checked request: the prompt as token ids and how to generate after it."""
    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    images: Any = None  # runtime.generation.vision.ImageRows of the prompt's image tokens
    # the request's logit processors and EOS ids (stop_token_ids included); None: the model's
    processors: LogitProcessors | None = None
    min_tokens: int = 0  # stop strings are not looked for before this many tokens


@dataclass
class _Options:
    """The request's fields besides the prompt, checked before the prompt is read."""
    max_tokens_field: str
    max_tokens: int | None  # None: the default (OpenAI's 16 for completions, the room for chat)
    sampling: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    processors: LogitProcessors | None
    min_tokens: int


def read_request(raw: bytes, chat: bool, model_name: str, model,
                 max_chars: int | None = None,
                 max_model_len: int | None = None) -> GenerationRequest:
    """The raw body of /v1/chat/completions (`chat`) or /v1/completions, decoded and checked."""
    return parse_request(decode_body(raw), chat, model_name, model, max_chars, max_model_len)


def decode_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ProtocolError("body", f"the request body is not valid JSON: "
                            f"{str(exc)[:120]}") from None


def parse_request(body: Any, chat: bool, model_name: str, model,
                  max_chars: int | None = None,
                  max_model_len: int | None = None) -> GenerationRequest:
    """`body` (decoded JSON) checked against the served `model` (a GenerationModel).
    `max_chars`: the most characters a prompt may hold (bounds.prompt_char_limit, computed
    here when not given); `max_model_len`: the context served (prompt and new tokens; None:
    the artifact's positions)."""
    if not isinstance(body, dict):
        raise ProtocolError("body", "the request body must be a JSON object")
    check_text(body)
    _check_model(body.get("model"), model_name)
    check_fields(body, chat)
    tokenizer = model.tokenizer
    limit = prompt_char_limit(model) if max_chars is None else max_chars
    options = _options(body, chat, tokenizer, limit, model)
    spec = model.spec
    positions = min(spec.max_positions, max_model_len or spec.max_positions)
    prompt_field = "messages" if chat else "prompt"
    vision = getattr(model, "vision", None)
    images: list[tuple[bytes, str]] = []
    if chat:
        ids = chat_ids(body.get("messages"), tokenizer, vision, images, limit, positions)
    else:
        ids = _prompt_ids(body.get("prompt"), tokenizer, limit, positions)
    max_tokens = _fit(ids, prompt_field, options, chat, spec, model.runner.allocator,
                      positions)
    if options.min_tokens > max_tokens:
        raise ProtocolError("min_tokens", f"min_tokens={options.min_tokens} is more than the "
                            f"{max_tokens} tokens to generate ({options.max_tokens_field})")
    rows = image_rows(vision, ids, images, prompt_field)  # after the cheap checks
    return GenerationRequest(chat, ids, max_tokens, options.sampling, options.stop,
                             options.stream, options.include_usage, rows,
                             options.processors, options.min_tokens)


def _check_model(name: Any, model_name: str) -> None:
    if not isinstance(name, str):
        raise ProtocolError("model", "model must be a string naming the served model "
                            f"('{model_name}')")
    if name != model_name:
        raise ProtocolError("model", f"model {_show(name)} is not served here; this server "
                            f"serves '{model_name}'")


def _options(body: dict, chat: bool, tokenizer, max_chars: int, model) -> _Options:
    field, max_tokens = _max_tokens(body, chat)
    stop = _stop(body.get("stop"), max_chars)
    if stop and tokenizer is None:
        raise ProtocolError("stop", "stop strings need the artifact's tokenizer, and this "
                            "artifact carries none")
    stream = _optional(body, "stream", bool, False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ProtocolError("stream_options", "stream_options must be an object or null")
    include_usage = _optional(options or {}, "include_usage", bool, False, "stream_options.")
    min_tokens = body.get("min_tokens")
    if min_tokens is not None and (not _is_int(min_tokens) or not 0 <= min_tokens <= MAX_COUNT):
        raise ProtocolError("min_tokens", f"min_tokens={_show(min_tokens)} is not an integer "
                            f"in [0, {MAX_COUNT}]")
    return _Options(field, max_tokens, _sampling(body), stop, stream, include_usage,
                    _processors(body, model), min_tokens or 0)


# request fields that are logit processors' arguments (`LogitProcessors.for_call`'s names)
PROCESSOR_FIELDS = {"logit_bias": "logit_bias", "frequency_penalty": "frequency_penalty",
                    "presence_penalty": "presence_penalty",
                    "repetition_penalty": "repetition_penalty", "min_tokens": "min_new_tokens"}


def _processors(body: dict, model) -> LogitProcessors | None:
    """The request's logit processors over the artifact's (its generation config's), for its
    EOS ids and `stop_token_ids`; None when the request changes nothing (the model's own, shared
    by every such request, are used)."""
    spec = model.spec
    base = getattr(model, "logit_processors", None)
    stop_ids = _stop_token_ids(body.get("stop_token_ids"), spec.vocab_size)
    overrides = {arg: body[field] for field, arg in PROCESSOR_FIELDS.items()
                 if body.get(field) is not None}
    if not overrides and not stop_ids:
        return None
    if base is None:
        base = LogitProcessors({}, spec.vocab_size, spec.eos_token_ids)
    eos = tuple(dict.fromkeys((*base.eos_token_ids, *stop_ids)))
    try:
        return base.for_call(overrides, eos)
    except InputError as exc:
        arg = str(exc.where)
        field = next((f for f, a in PROCESSOR_FIELDS.items() if a == arg), arg)
        raise ProtocolError(field, exc.what.replace(arg, field, 1)) from None


def _stop_token_ids(value: Any, vocab: int) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > vocab \
            or not all(_is_int(t) and 0 <= t < vocab for t in value):
        raise ProtocolError("stop_token_ids", f"stop_token_ids must be a list of at most "
                            f"{vocab} token ids in [0, {vocab})")
    return tuple(int(t) for t in value)


def _fit(ids: list[int], prompt_field: str, options: _Options, chat: bool, spec,
         allocator, positions: int) -> int:
    """The prompt's ids in the vocabulary, it and the tokens to generate within the context
    served (`positions`) and the KV cache; the number of tokens to generate."""
    bad = next((t for t in ids if not 0 <= t < spec.vocab_size), None)
    if bad is not None:
        raise ProtocolError(prompt_field, f"token id {bad} is outside the vocabulary "
                            f"[0, {spec.vocab_size})")
    if len(ids) >= positions:
        raise ProtocolError(prompt_field, f"the prompt has {len(ids)} tokens; the model's "
                            f"context is {positions} positions, and at least one must "
                            "stay for a new token")
    cache_tokens = allocator.num_blocks * allocator.block_size
    if len(ids) >= cache_tokens:
        raise ProtocolError(prompt_field, f"the prompt has {len(ids)} tokens; the KV cache holds "
                            f"{cache_tokens}")
    room = min(positions, cache_tokens) - len(ids)
    field, max_tokens = options.max_tokens_field, options.max_tokens
    if max_tokens is None:
        max_tokens = room if chat else min(COMPLETION_DEFAULT_MAX_TOKENS, room)
    if len(ids) + max_tokens > positions:
        raise ProtocolError(field, f"a prompt of {len(ids)} tokens plus {max_tokens} new ones "
                            f"exceeds the model's context of {positions} positions")
    if allocator.blocks_needed(len(ids) + max_tokens) > allocator.num_blocks:
        raise ProtocolError(field, f"{len(ids) + max_tokens} tokens do not fit the KV cache "
                            f"({cache_tokens} tokens)")
    return max_tokens


def _prompt_ids(prompt: Any, tokenizer, limit: int, positions: int) -> list[int]:
    """The prompt's token ids: a string tokenized (after its length in characters was found
    to fit), or token ids (counted before they are read)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ProtocolError("prompt", "this artifact carries no tokenizer: send the prompt "
                                "as a list of token ids")
        if not prompt:
            raise ProtocolError("prompt", "the prompt is empty")
        check_chars(len(prompt), limit, "prompt", positions)
        ids = guarded(lambda: tokenizer.encode(prompt), "prompt", "the artifact's tokenizer")
        if not ids:
            raise ProtocolError("prompt", "the prompt encodes to no tokens")
        return ids
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt[:positions]):
        if len(prompt) >= positions:
            raise ProtocolError("prompt", f"the prompt has {len(prompt)} tokens; the model's "
                                f"context is {positions} positions, and at least one must "
                                "stay for a new token")
        return [int(t) for t in prompt]
    if isinstance(prompt, list) and len(prompt) > 1 and any(isinstance(p, (str, list))
                                                            for p in prompt[:2]):
        raise ProtocolError("prompt", "one prompt per request: a list of prompts is not "
                            "supported")
    raise ProtocolError("prompt", "prompt must be a non-empty string or a non-empty list of "
                        "integer token ids")


def _max_tokens(body: dict, chat: bool) -> tuple[str, int | None]:
    """The field that says how many tokens to generate (chat's newer name first) and its
    value (None: not given)."""
    field = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None \
        else "max_tokens"
    value = body.get(field)
    if value is None:
        return field, None
    if not _is_int(value) or value < 1:
        raise ProtocolError(field, f"{field}={_show(value)} is not a positive integer")
    return field, int(value)


def _sampling(body: dict) -> SamplingParams:
    temperature = _number(body, "temperature", 1.0)
    top_p = _number(body, "top_p", 1.0)
    top_k = body.get("top_k")
    seed = body.get("seed")
    if top_k is not None and (not _is_int(top_k) or top_k < -1):
        raise ProtocolError("top_k", f"top_k={_show(top_k)} is not an integer >= 1 (-1 or 0: "
                            "no top-k filter)")
    if temperature < 0 or temperature > 2:
        raise ProtocolError("temperature", f"temperature={temperature} is not in [0, 2]")
    if not 0 < top_p <= 1:
        raise ProtocolError("top_p", f"top_p={top_p} is not in (0, 1]")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
        raise ProtocolError("seed", f"seed={_show(seed)} is not an integer in [0, 2**63)")
    if greedy_temperature(temperature):
        return SamplingParams(seed=seed)
    return SamplingParams(do_sample=True, temperature=temperature,
                          top_k=top_k if top_k is not None and top_k >= 1 else None,
                          top_p=top_p if top_p < 1 else None, seed=seed)


def _stop(stop: Any, max_chars: int) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS \
            or not all(isinstance(s, str) and s for s in stops):
        raise ProtocolError("stop", f"stop must be a non-empty string or a list of at most "
                            f"{MAX_STOPS} non-empty strings")
    for i, s in enumerate(stops):
        if len(s) > max_chars:
            field = "stop" if isinstance(stop, str) else f"stop[{i}]"
            raise ProtocolError(field, f"{field} has {len(s)} characters, more than the model "
                                f"can generate ({max_chars}): it can never match")
    return tuple(stops)


def _number(body: dict, field: str, default: float) -> float:
    value = body.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not -1e300 < value < 1e300 or not math.isfinite(value):
        raise ProtocolError(field, f"{field}={_show(value)} is not a finite number")
    return float(value)


def _optional(body: dict, field: str, kind: type, default: Any, prefix: str = "") -> Any:
    value = body.get(field)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise ProtocolError(prefix + field, f"{prefix}{field} must be a {kind.__name__}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else ascii(value[:80])
    return text if len(text) <= 60 else text[:57] + "..."
