"""Chat messages to prompt token ids: checked, bounded, then rendered with the artifact's chat
template and tokenized.

Every message is checked (a role, a string or a list of parts) and the characters of all of
them counted before the template runs: more messages than the context has positions, or more
characters than it could hold as tokens (bounds.py), are refused without rendering. An image
part of an image-text model is decoded here (a base64 data URL: the server fetches nothing);
its features are computed later, after the rendered prompt's length was checked.
"""

from __future__ import annotations

from typing import Any

from .bounds import check_chars
from .errors import ProtocolError, guarded


def chat_ids(messages: Any, tokenizer, vision, images: list[tuple[bytes, str]], limit: int,
             positions: int) -> list[int]:
    """The rendered prompt (image tokens expanded for an image-text model); each image's bytes
    and field go to `images`. `limit`: the most characters the messages may hold."""
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
    if len(messages) > positions:
        raise ProtocolError("messages", f"{len(messages)} messages cannot fit the model's "
                            f"context of {positions} positions")
    plain, chars = [], 0
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ProtocolError(where, f"{where} must be an object with role and content")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ProtocolError(f"{where}.role", f"{where}.role must be a non-empty string")
        content = _content(message.get("content"), f"{where}.content", vision, images)
        chars += len(role) + _chars(content)
        plain.append({"role": role, "content": content})
    check_chars(chars, limit, "messages", positions)
    ids = guarded(lambda: tokenizer.chat_ids(plain), "messages",
                  "the artifact's chat template or tokenizer")
    if not ids:
        raise ProtocolError("messages", "the messages render to no tokens")
    if vision is None:
        return ids
    return guarded(lambda: vision.expand(ids), "messages", "expanding the image tokens")


def _chars(content: str | list[dict[str, str]]) -> int:
    if isinstance(content, str):
        return len(content)
    return sum(len(part.get("text", "")) for part in content)


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

    return guarded(lambda: decode_data_url(url, field), field, "decoding the image")


def image_rows(vision, ids: list[int], images: list[tuple[bytes, str]], prompt_field: str):
    """The features of the request's images at its image tokens (vision encoder once per
    image); an image that does not decode is a 400 naming its part."""
    if vision is None:
        return None
    features = []
    for data, field in images:
        features.extend(guarded(lambda: vision.features([data], field), field,  # noqa: B023
                                "the vision encoder"))
    return guarded(lambda: vision.place([ids], features, prompt_field)[0], prompt_field,
                   "placing the image features")
