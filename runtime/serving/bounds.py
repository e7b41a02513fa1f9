"""Checks a request body passes before any work is done on it: every string is text the
tokenizer and the JSON encoder can take, the nesting is shallow, and a prompt is not longer in
characters than the context could ever hold in tokens.

A JSON string may carry a lone UTF-16 surrogate (`"\\ud800"`): Python decodes it into a `str`
that no UTF-8 encoder takes, so it would fail deep inside the tokenizer or when the error that
quotes it is written. Every string of the body (object keys too) is checked once, up front, and
the first bad one is named by its path (`messages[0].content[1].text`).

The character bound lets a prompt be refused before it is tokenized: a tokenizer's token stands
for at most as many characters as its longest vocabulary entry (a byte-level piece is one
character per byte, and a character is at least one byte), so a text of more than
`max_positions x chars_per_token` characters cannot fit the context. The bound is generous
(at least `MIN_CHARS_PER_TOKEN` a token), so it never refuses a prompt that fits; its point is
that tokenizing a prompt costs time bounded by the model's context, not by the body's size.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import ProtocolError

MAX_DEPTH = 64  # OpenAI bodies nest about 6 deep (tools' JSON schemas a little more)
MIN_CHARS_PER_TOKEN = 64
_SURROGATE = re.compile("[\ud800-\udfff]")
_KEY_SHOWN = 40  # characters of an object key quoted in a field path


def check_text(body: Any) -> None:
    """Refuse (400 naming the field) a body with a lone surrogate in any string or key, or
    nested deeper than MAX_DEPTH. Iterative: a body as deep as the JSON decoder allows is read
    without recursion."""
    stack: list[tuple[Any, str, int]] = [(body, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            _check_string(value, path or "body")
            continue
        if depth >= MAX_DEPTH:
            raise ProtocolError(path or "body", f"{path or 'the body'} is nested more than "
                                f"{MAX_DEPTH} levels deep; no field of the API nests so deep")
        if isinstance(value, dict):
            for key, item in value.items():
                child = _child(path, key)
                _check_string(key, child)
                if isinstance(item, (str, dict, list)):
                    stack.append((item, child, depth + 1))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, (str, dict, list)):
                    stack.append((item, f"{path}[{i}]", depth + 1))


def _check_string(text: str, field: str) -> None:
    if text.isascii():
        return
    bad = _SURROGATE.search(text)
    if bad is not None:
        raise ProtocolError(field, f"{field} is not valid Unicode text: character "
                            f"{bad.start()} is a lone UTF-16 surrogate "
                            f"({ascii(bad.group())}); send the text as UTF-8, with surrogate "
                            "pairs joined")


def _child(path: str, key: str) -> str:
    shown = key if len(key) <= _KEY_SHOWN else key[:_KEY_SHOWN] + "..."
    return f"{path}.{shown}" if path else shown


def chars_per_token(tokenizer) -> int:
    """The most characters one token can stand for, at least MIN_CHARS_PER_TOKEN: the length of
    the tokenizer's longest vocabulary entry (added tokens included)."""
    inner = getattr(tokenizer, "tokenizer", None)
    vocab = getattr(inner, "get_vocab", None)
    try:
        longest = max(map(len, vocab(with_added_tokens=True)), default=0) if vocab else 0
    except Exception:  # a tokenizer without a readable vocabulary: the floor alone
        longest = 0
    return max(MIN_CHARS_PER_TOKEN, longest)


def prompt_char_limit(model) -> int:
    """More characters than this cannot fit `model`'s context as tokens."""
    tokenizer = model.tokenizer
    per_token = chars_per_token(tokenizer) if tokenizer is not None else MIN_CHARS_PER_TOKEN
    return model.spec.max_positions * per_token


def check_chars(count: int, limit: int, field: str, positions: int) -> None:
    """Refuse a prompt of `count` characters over `limit`, before tokenizing it."""
    if count > limit:
        raise ProtocolError(field, f"{field} holds {count} characters; the model's context of "
                            f"{positions} tokens cannot hold more than {limit} characters, so "
                            "the prompt cannot fit: shorten it")
