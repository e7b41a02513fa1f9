"""A request's generated text as it grows: decoded incrementally, cut at the first stop string.

Each token re-decodes the generated ids (tokenizers merge pieces across tokens, so decoding one
token alone can differ) and hands out only what is new and final: text ending in an unfinished
multi-byte character (U+FFFD) waits for its next token, and a tail that could be the start of a
stop string is held back until it is known not to be one. A stop string ends the sequence; the
text stops before it, as OpenAI's `stop` does. Before `min_tokens` tokens (vLLM's `min_tokens`)
no stop string is looked for, as vLLM's stop checker skips them; the text is handed out as it
comes.
"""

from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stop: tuple[str, ...] = (), min_tokens: int = 0):
        self.tokenizer = tokenizer  # None: an artifact without one (token ids only, no text)
        self.stop = stop
        self.min_tokens = min_tokens
        self.tokens: list[int] = []
        self.sent = 0  # characters of the text already handed out
        self.stopped = False

    def push(self, token: int) -> str:
        """The new text after `token` (may be empty); sets `stopped` at a stop string."""
        self.tokens.append(token)
        if self.tokenizer is None or self.stopped:
            return ""
        text = self.tokenizer.decode(self.tokens)
        if len(self.tokens) < self.min_tokens:  # no stop string yet
            return "" if text.endswith("\ufffd") else self._take(text, len(text))
        # text handed out was searched when it was new: a stop string can only end after it
        cut = min((i for i in (text.find(s, max(0, self.sent - len(s) + 1)) for s in self.stop)
                   if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return self._take(text, cut)
        if text.endswith("\ufffd"):
            return ""
        return self._take(text, len(text) - self._held(text))

    def flush(self) -> str:
        """What was held back, once the sequence has ended without a stop string."""
        if self.tokenizer is None or self.stopped:
            return ""
        text = self.tokenizer.decode(self.tokens)
        return self._take(text, len(text))

    def _held(self, text: str) -> int:
        """Length of the longest tail of `text` that begins some stop string (shorter than
        it). Only the tails starting with the stop string's first character are tried, longest
        first, so the cost is about the stop string's length, not its square."""
        held = 0
        for stop in self.stop:
            end = len(text) - held  # a tail starting at or after it is no longer
            i = text.find(stop[0], max(0, len(text) - len(stop) + 1), end)
            while i >= 0 and not stop.startswith(text[i:]):
                i = text.find(stop[0], i + 1, end)
            if i >= 0:
                held = len(text) - i
        return held

    def _take(self, text: str, end: int) -> str:
        if end <= self.sent:
            return ""
        new, self.sent = text[self.sent:end], end
        return new
