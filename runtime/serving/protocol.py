"""Request bodies of the OpenAI completions and chat completions APIs, read and checked.

Everything a client can get wrong is a `ProtocolError`: HTTP 400 with a message naming the field
(`param` in OpenAI's error shape), raised before the request reaches the engine, so nothing a
client sends fails later on the engine thread. Fields the server does not act on (`user`,
`frequency_penalty`, ...) are accepted and ignored, as OpenAI-compatible servers do; fields whose
meaning it cannot honour (`n` > 1, `echo`, `logprobs`, an image for a text-only model) are
refused. Chat messages of an image-text model may hold `image_url` parts (base64 data URLs of
PNG or JPEG images: the server fetches nothing); each image is decoded and run through the
vision encoder here, after the expanded prompt's length was checked against the context and
the KV cache, so the engine receives the features with the request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from compiler.errors import DayzeroError

from ..sampling import SamplingParams

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class ProtocolError(Exception):
    """A request the server refuses: `status` (400 unless said), the `field` at fault, why."""

    def __init__(self, field: str | None, message: str, status: int = 400,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.field, self.message, self.status, self.kind = field, message, status, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.field,
                          "code": None}}


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


def parse_request(body: Any, chat: bool, model_name: str, model) -> GenerationRequest:
    """`body` (decoded JSON) of /v1/chat/completions (`chat`) or /v1/completions, checked
    against the served `model` (a GenerationModel)."""
    if not isinstance(body, dict):
        raise ProtocolError("body", "the request body must be a JSON object")
    name = body.get("model")
    if not isinstance(name, str):
        raise ProtocolError("model", "model must be a string naming the served model "
                            f"('{model_name}')")
    if name != model_name:
        raise ProtocolError("model", f"model '{name[:100]}' is not served here; this server "
                            f"serves '{model_name}'")
    _refuse_unsupported(body)
    tokenizer = model.tokenizer
    prompt_field = "messages" if chat else "prompt"
    vision = getattr(model, "vision", None)
    images: list[tuple[bytes, str]] = []
    ids = _chat_ids(body.get("messages"), tokenizer, vision, images) if chat \
        else _prompt_ids(body.get("prompt"), tokenizer)
    spec = model.spec
    bad = [t for t in ids if not 0 <= t < spec.vocab_size]
    if bad:
        raise ProtocolError(prompt_field, f"token id {bad[0]} is outside the vocabulary "
                            f"[0, {spec.vocab_size})")
    if len(ids) >= spec.max_positions:
        raise ProtocolError(prompt_field, f"the prompt has {len(ids)} tokens; the model's "
                            f"context is {spec.max_positions} positions, and at least one must "
                            "stay for a new token")
    allocator = model.runner.allocator
    cache_tokens = allocator.num_blocks * allocator.block_size
    if len(ids) >= cache_tokens:
        raise ProtocolError(prompt_field, f"the prompt has {len(ids)} tokens; the KV cache holds "
                            f"{cache_tokens}")
    room = min(spec.max_positions, cache_tokens) - len(ids)
    field, max_tokens = _max_tokens(body, chat, room)
    if len(ids) + max_tokens > spec.max_positions:
        raise ProtocolError(field, f"a prompt of {len(ids)} tokens plus {max_tokens} new ones "
                            f"exceeds the model's context of {spec.max_positions} positions")
    if allocator.blocks_needed(len(ids) + max_tokens) > allocator.num_blocks:
        raise ProtocolError(field, f"{len(ids) + max_tokens} tokens do not fit the KV cache "
                            f"({cache_tokens} tokens)")
    rows = _image_rows(vision, ids, images, prompt_field)  # after the cheap checks
    stop = _stop(body.get("stop"))
    if stop and tokenizer is None:
        raise ProtocolError("stop", "stop strings need the artifact's tokenizer, and this "
                            "artifact carries none")
    stream = _optional(body, "stream", bool, False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ProtocolError("stream_options", "stream_options must be an object or null")
    include_usage = _optional(options or {}, "include_usage", bool, False, "stream_options.")
    return GenerationRequest(chat, ids, max_tokens, _sampling(body), stop, stream,
                             include_usage, rows)


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


def _prompt_ids(prompt: Any, tokenizer) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ProtocolError("prompt", "this artifact carries no tokenizer: send the prompt "
                                "as a list of token ids")
        if not prompt:
            raise ProtocolError("prompt", "the prompt is empty")
        ids = tokenizer.encode(prompt)
        if not ids:
            raise ProtocolError("prompt", "the prompt encodes to no tokens")
        return ids
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return [int(t) for t in prompt]
    if isinstance(prompt, list) and len(prompt) > 1:
        raise ProtocolError("prompt", "one prompt per request: a list of prompts is not "
                            "supported")
    raise ProtocolError("prompt", "prompt must be a non-empty string or a non-empty list of "
                        "integer token ids")


def _chat_ids(messages: Any, tokenizer, vision, images: list[tuple[bytes, str]]) -> list[int]:
    """The rendered prompt (image tokens expanded for an image-text model); each image's bytes
    and field go to `images`."""
    if tokenizer is None:
        raise ProtocolError("messages", "this artifact carries no tokenizer, so no chat "
                            "template: use /v1/completions with token ids")
    if not tokenizer.chat_template:
        raise ProtocolError("messages", "the artifact's tokenizer has no chat template: use "
                            "/v1/completions, or compile from a checkpoint whose "
                            "tokenizer_config.json has a chat_template")
    if not isinstance(messages, list) or not messages:
        raise ProtocolError("messages", "messages must be a non-empty list of "
                            "{'role': ..., 'content': ...}")
    plain = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ProtocolError(where, f"{where} must be an object with role and content")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ProtocolError(f"{where}.role", f"{where}.role must be a non-empty string")
        plain.append({"role": role, "content": _content(message.get("content"),
                                                        f"{where}.content", vision, images)})
    try:
        ids = tokenizer.chat_ids(plain)
    except DayzeroError as exc:  # the template refused the messages (raise_exception)
        raise ProtocolError("messages", exc.what) from None
    if not ids:
        raise ProtocolError("messages", "the messages render to no tokens")
    return vision.expand(ids) if vision is not None else ids


def _content(content: Any, where: str, vision, images: list[tuple[bytes, str]]) -> Any:
    """A message's content for the chat template: a string, or (with images) the parts as
    templates see them, {'type': 'text', 'text': ...} and {'type': 'image'}."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ProtocolError(where, f"{where} must be a string or a list of content parts")
    parts = []
    for j, part in enumerate(content):
        field = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url" and vision is None:
            raise ProtocolError(field, f"{field} is an image, and this model is text-only: "
                                "send text parts only")
        elif kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else None
            images.append((_data_url(url, f"{field}.image_url.url"), f"{field}.image_url"))
            parts.append({"type": "image"})
        else:
            raise ProtocolError(field, f"{field} is not a text part ({{'type': 'text', 'text': "
                                f"...}})" + (" or an image_url part" if vision else ""))
    if any(p["type"] == "image" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def _data_url(url: Any, field: str) -> bytes:
    from ..generation.vision import decode_data_url

    try:
        return decode_data_url(url, field)
    except DayzeroError as exc:
        raise ProtocolError(field, exc.what) from None


def _image_rows(vision, ids: list[int], images: list[tuple[bytes, str]], prompt_field: str):
    """The features of the request's images at its image tokens (vision encoder once per
    image); an image that does not decode is a 400 naming its part."""
    if vision is None:
        return None
    features = []
    for data, field in images:
        try:
            features.extend(vision.features([data], field))
        except DayzeroError as exc:
            raise ProtocolError(field, exc.what) from None
    try:
        return vision.place([ids], features, prompt_field)[0]
    except DayzeroError as exc:
        raise ProtocolError(prompt_field, exc.what) from None


def _max_tokens(body: dict, chat: bool, room: int) -> tuple[str, int]:
    """The field that says how many tokens to generate (chat's newer name first) and its
    value; without one, OpenAI's 16 for completions, all the room left for chat."""
    field = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None \
        else "max_tokens"
    value = body.get(field)
    if value is None:
        return field, min(COMPLETION_DEFAULT_MAX_TOKENS, room) if not chat else room
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
    if temperature == 0:  # OpenAI's greedy
        return SamplingParams(seed=seed)
    return SamplingParams(do_sample=True, temperature=temperature,
                          top_p=top_p if top_p < 1 else None, seed=seed)


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 \
            or not all(isinstance(s, str) and s for s in stops):
        raise ProtocolError("stop", "stop must be a non-empty string or a list of at most 4 "
                            "non-empty strings")
    return tuple(stops)


def _number(body: dict, field: str, default: float) -> float:
    value = body.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not -1e300 < value < 1e300 or not math.isfinite(value):
        raise ProtocolError(field, f"{field}={_show(value)} is not a number")
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
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
