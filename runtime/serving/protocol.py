"""Request bodies of the OpenAI completions and chat completions APIs, read and checked.

Everything a client can get wrong is a `ProtocolError`: HTTP 400 with a message naming the field
(`param` in OpenAI's error shape), raised before the request reaches the engine, so nothing a
client sends fails later on the engine thread. Fields the server does not act on (`user`,
`frequency_penalty`, ...) are accepted and ignored, as OpenAI-compatible servers do; fields whose
meaning it cannot honour (`n` > 1, `echo`, `logprobs`, an image for a text-only model) are
refused.

The checks run cheapest first, and every field is checked before any work is done: the body's
strings and nesting (bounds.py), the model, the options (sampling, stop, stream, max_tokens'
type), the prompt's length in characters or token ids against the context, and only then the
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

from ..sampling import SamplingParams
from ..sampling import is_greedy_temperature as greedy_temperature
from .bounds import check_chars, check_text, prompt_char_limit
from .chat import chat_ids, image_rows
from .errors import ProtocolError, guarded

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


@dataclass
class _Options:
    """The request's fields besides the prompt, checked before the prompt is read."""
    max_tokens_field: str
    max_tokens: int | None  # None: the default (OpenAI's 16 for completions, the room for chat)
    sampling: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


def read_request(raw: bytes, chat: bool, model_name: str, model,
                 max_chars: int | None = None) -> GenerationRequest:
    """The raw body of /v1/chat/completions (`chat`) or /v1/completions, decoded and checked."""
    return parse_request(decode_body(raw), chat, model_name, model, max_chars)


def decode_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ProtocolError("body", f"the request body is not valid JSON: "
                            f"{str(exc)[:120]}") from None


def parse_request(body: Any, chat: bool, model_name: str, model,
                  max_chars: int | None = None) -> GenerationRequest:
    """`body` (decoded JSON) checked against the served `model` (a GenerationModel).
    `max_chars`: the most characters a prompt may hold (bounds.prompt_char_limit, computed
    here when not given)."""
    if not isinstance(body, dict):
        raise ProtocolError("body", "the request body must be a JSON object")
    check_text(body)
    _check_model(body.get("model"), model_name)
    _refuse_unsupported(body)
    tokenizer = model.tokenizer
    limit = prompt_char_limit(model) if max_chars is None else max_chars
    options = _options(body, chat, tokenizer, limit)
    spec = model.spec
    prompt_field = "messages" if chat else "prompt"
    vision = getattr(model, "vision", None)
    images: list[tuple[bytes, str]] = []
    if chat:
        ids = chat_ids(body.get("messages"), tokenizer, vision, images, limit,
                       spec.max_positions)
    else:
        ids = _prompt_ids(body.get("prompt"), tokenizer, limit, spec.max_positions)
    max_tokens = _fit(ids, prompt_field, options, chat, spec, model.runner.allocator)
    rows = image_rows(vision, ids, images, prompt_field)  # after the cheap checks
    return GenerationRequest(chat, ids, max_tokens, options.sampling, options.stop,
                             options.stream, options.include_usage, rows)


def _check_model(name: Any, model_name: str) -> None:
    if not isinstance(name, str):
        raise ProtocolError("model", "model must be a string naming the served model "
                            f"('{model_name}')")
    if name != model_name:
        raise ProtocolError("model", f"model {_show(name)} is not served here; this server "
                            f"serves '{model_name}'")


def _options(body: dict, chat: bool, tokenizer, max_chars: int) -> _Options:
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
    return _Options(field, max_tokens, _sampling(body), stop, stream, include_usage)


def _fit(ids: list[int], prompt_field: str, options: _Options, chat: bool, spec,
         allocator) -> int:
    """The prompt's ids in the vocabulary, it and the tokens to generate within the context
    and the KV cache; the number of tokens to generate."""
    bad = next((t for t in ids if not 0 <= t < spec.vocab_size), None)
    if bad is not None:
        raise ProtocolError(prompt_field, f"token id {bad} is outside the vocabulary "
                            f"[0, {spec.vocab_size})")
    if len(ids) >= spec.max_positions:
        raise ProtocolError(prompt_field, f"the prompt has {len(ids)} tokens; the model's "
                            f"context is {spec.max_positions} positions, and at least one must "
                            "stay for a new token")
    cache_tokens = allocator.num_blocks * allocator.block_size
    if len(ids) >= cache_tokens:
        raise ProtocolError(prompt_field, f"the prompt has {len(ids)} tokens; the KV cache holds "
                            f"{cache_tokens}")
    room = min(spec.max_positions, cache_tokens) - len(ids)
    field, max_tokens = options.max_tokens_field, options.max_tokens
    if max_tokens is None:
        max_tokens = room if chat else min(COMPLETION_DEFAULT_MAX_TOKENS, room)
    if len(ids) + max_tokens > spec.max_positions:
        raise ProtocolError(field, f"a prompt of {len(ids)} tokens plus {max_tokens} new ones "
                            f"exceeds the model's context of {spec.max_positions} positions")
    if allocator.blocks_needed(len(ids) + max_tokens) > allocator.num_blocks:
        raise ProtocolError(field, f"{len(ids) + max_tokens} tokens do not fit the KV cache "
                            f"({cache_tokens} tokens)")
    return max_tokens


def _refuse_unsupported(body: dict) -> None:
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise ProtocolError("n", f"n={_show(n)}: this server returns one choice per request "
                            "(n=1); send several requests instead")
    best_of = body.get("best_of")
    if best_of is not None and (not _is_int(best_of) or best_of != 1):
        raise ProtocolError("best_of", "best_of must be 1 or null")
    if body.get("echo") not in (None, False):
        raise ProtocolError("echo", "echo is not supported")
    if body.get("logprobs") not in (None, False):
        raise ProtocolError("logprobs", "logprobs are not supported")


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
    seed = body.get("seed")
    if temperature < 0 or temperature > 2:
        raise ProtocolError("temperature", f"temperature={temperature} is not in [0, 2]")
    if not 0 < top_p <= 1:
        raise ProtocolError("top_p", f"top_p={top_p} is not in (0, 1]")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
        raise ProtocolError("seed", f"seed={_show(seed)} is not an integer in [0, 2**63)")
    if greedy_temperature(temperature):
        return SamplingParams(seed=seed)
    return SamplingParams(do_sample=True, temperature=temperature,
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
