"""Every request field the server knows, per endpoint, and what it does with each: a field is
acted on, accepted as a documented no-op, or refused (400 naming it) unless it holds the value
that asks for nothing; a field the server does not know at all is refused too, as OpenAI's own
API refuses it ("Unrecognized request argument"). Nothing a client sends is silently ignored:
a vLLM user's `min_p` or an OpenAI user's `response_format` would otherwise change nothing
while the client believes it did.

The lists follow OpenAI's request schemas of /v1/completions and /v1/chat/completions, plus
the vLLM extensions the server acts on (`top_k`, `min_tokens`, `repetition_penalty`,
`stop_token_ids`). docs/serving.md shows the same table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ProtocolError

__all__ = ["ACTED_ON", "NO_OPS", "REFUSED", "check_fields"]


def _absent(value: Any) -> bool:
    return value is None


def _false(value: Any) -> bool:
    return value is None or value is False


def _one(value: Any) -> bool:
    """n / best_of of 1 (or unset); a wrong type is the field's own 400 all the same."""
    return value is None or (isinstance(value, int) and not isinstance(value, bool)
                             and value == 1)


@dataclass(frozen=True)
class Refusal:
    """A field refused unless `harmless(value)`: the value that asks for nothing."""
    harmless: Callable[[Any], bool]
    why: str


# fields whose meaning the server implements (protocol.py reads and checks each)
ACTED_ON_BOTH = ("model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                 "stop_token_ids", "stream", "stream_options", "frequency_penalty",
                 "presence_penalty", "repetition_penalty", "logit_bias", "min_tokens")
ACTED_ON = {False: ACTED_ON_BOTH + ("prompt",),
            True: ACTED_ON_BOTH + ("messages", "max_completion_tokens")}

# documented no-ops: what they ask for needs no action here (an end user's id for abuse
# monitoring, tags kept with a stored completion, a routing or caching hint)
NO_OPS = {"user": "an end user's id for OpenAI's abuse monitoring",
          "safety_identifier": "an end user's id for OpenAI's abuse monitoring",
          "metadata": "tags for a stored completion (nothing is stored: `store` must be false)",
          "prompt_cache_key": "a caching hint (the server's prefix cache needs none)",
          "service_tier": "OpenAI's processing tier (one tier here)"}

_ONE_CHOICE = "this server returns one choice per request; send several requests instead"
REFUSED_BOTH = {
    "n": Refusal(_one, f"n must be 1: {_ONE_CHOICE}"),
    "logprobs": Refusal(_false, "logprobs are not supported"),
    "response_format": Refusal(
        lambda v: v is None or v == {"type": "text"},
        "structured output (json_object, json_schema) is not supported: only "
        "{\"type\": \"text\"}, the default"),
}
REFUSED = {
    False: {**REFUSED_BOTH,
            "best_of": Refusal(_one, f"best_of must be 1: {_ONE_CHOICE}"),
            "echo": Refusal(_false, "echo is not supported"),
            "suffix": Refusal(lambda v: v is None or v == "", "suffix (insertion) is not "
                              "supported")},
    True: {**REFUSED_BOTH,
           "top_logprobs": Refusal(_absent, "top_logprobs are not supported"),
           "tools": Refusal(lambda v: v is None or v == [], "tool calling is not supported"),
           "tool_choice": Refusal(lambda v: v is None or v == "none",
                                  "tool calling is not supported"),
           "parallel_tool_calls": Refusal(_absent, "tool calling is not supported"),
           "functions": Refusal(lambda v: v is None or v == [],
                                "function calling is not supported"),
           "function_call": Refusal(lambda v: v is None or v == "none",
                                    "function calling is not supported"),
           "audio": Refusal(_absent, "audio output is not supported"),
           "modalities": Refusal(lambda v: v is None or v == ["text"],
                                 "only the text modality is supported"),
           "prediction": Refusal(_absent, "predicted outputs are not supported"),
           "reasoning_effort": Refusal(_absent, "reasoning effort is not supported"),
           "verbosity": Refusal(_absent, "verbosity is not supported"),
           "web_search_options": Refusal(_absent, "web search is not supported"),
           "store": Refusal(_false, "stored completions are not supported")},
}
_SERVICE_TIERS = (None, "auto", "default")


def check_fields(body: dict, chat: bool) -> None:
    """400 naming the first field of `body` the server does not act on and would otherwise
    ignore: refused, or unknown."""
    refused = REFUSED[chat]
    acted_on = ACTED_ON[chat]
    for name, value in body.items():
        rule = refused.get(name)
        if rule is not None:
            if not rule.harmless(value):
                raise ProtocolError(name, f"{name}: {rule.why}")
        elif name == "service_tier" and value not in _SERVICE_TIERS:
            raise ProtocolError(name, "service_tier must be 'auto', 'default' or null: the "
                                "server has one tier")
        elif name not in acted_on and name not in NO_OPS:
            endpoint = "/v1/chat/completions" if chat else "/v1/completions"
            shown = name if len(name) <= 40 else name[:40] + "..."
            raise ProtocolError(shown, f"unrecognized request argument {shown!r} for "
                                f"{endpoint}: the server does not implement it, so it refuses "
                                "it rather than ignore it (docs/serving.md lists the fields)")
