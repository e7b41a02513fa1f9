"""Prefix caching in the server (issue 39, item 1): a prompt whose prefix a finished request
left in the cache reuses its blocks, `usage.prompt_tokens_details.cached_tokens` says how many
tokens, the metrics count queries and hits, and the answer is the same; `--no-prefix-cache`
(model.prefix_cache = False) turns it off."""

from __future__ import annotations

import pytest

from tests.serving.inprocess import InProcessServer
from tests.serving.servers import KV_CACHE

PROMPT = [1] + list(range(3, 40))  # 38 tokens: two full blocks of 16 and a partial one


@pytest.fixture(params=[True, False], ids=["cache", "no-cache"])
def served(artifact, request):
    import runtime

    model = runtime.load(artifact, kv_cache_memory=KV_CACHE)
    model.prefix_cache = request.param
    server = InProcessServer(model)
    yield request.param, server
    server.close()


def _ask(server, prompt):
    status, answer = server.request("POST", "/v1/completions", {
        "model": "lm.dz", "prompt": prompt, "max_tokens": 4, "temperature": 0})
    assert status == 200, answer
    return answer


def test_a_repeated_prefix_is_reused_and_reported(served):
    on, server = served
    first = _ask(server, PROMPT)
    second = _ask(server, PROMPT)
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]
    assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": 32 if on else 0}
    _, text = server.request("GET", "/metrics")
    text = text if isinstance(text, str) else text.decode()
    assert f"dayzero_prefix_cache_hits_total {32.0 if on else 0.0}" in text, text
    assert f"dayzero_prefix_cache_queries_total {2.0 * len(PROMPT) if on else 0.0}" in text
