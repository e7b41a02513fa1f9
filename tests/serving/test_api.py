"""The OpenAI API of `dayzero serve`, through the official `openai` client: completions and chat
completions, whole and streamed, say what `runtime.load(artifact).generate` says for the same
prompt, alone and among concurrent requests; models, health and metrics answer."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

PROMPT = "hello world the model runs"
MESSAGES = [{"role": "user", "content": "a cat sat ?"}]


def _expected(reference, ids: list[int], new: int) -> tuple[list[int], str]:
    out = reference.generate([ids], max_new_tokens=new)
    tokens = out[0, len(ids):].tolist()
    return tokens, reference.tokenizer.decode(tokens)


def test_completion_says_what_generate_says(server, reference):
    ids = reference.tokenizer.encode(PROMPT)
    tokens, text = _expected(reference, ids, 12)
    response = server.client().completions.create(model="lm.dz", prompt=PROMPT, max_tokens=12,
                                                   temperature=0)
    choice = response.choices[0]
    assert choice.text == text and choice.finish_reason == "length"
    assert choice.model_extra["token_ids"] == tokens
    assert (response.usage.prompt_tokens, response.usage.completion_tokens,
            response.usage.total_tokens) == (len(ids), 12, len(ids) + 12)
    by_ids = server.client().completions.create(model="lm.dz", prompt=ids, max_tokens=12,
                                                temperature=0)
    assert by_ids.choices[0].text == text


def test_streamed_completion_says_the_same(server, reference):
    ids = reference.tokenizer.encode(PROMPT)
    _, text = _expected(reference, ids, 12)
    chunks = list(server.client().completions.create(model="lm.dz", prompt=PROMPT,
                                                      max_tokens=12, temperature=0,
                                                      stream=True))
    assert "".join(c.choices[0].text for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_chat_completion_whole_and_streamed(server, reference):
    ids = reference.tokenizer.chat_ids(MESSAGES)
    _, text = _expected(reference, ids, 10)
    client = server.client()
    response = client.chat.completions.create(model="lm.dz", messages=MESSAGES, max_tokens=10,
                                              temperature=0)
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == text
    assert response.usage.prompt_tokens == len(ids)
    stream = client.chat.completions.create(model="lm.dz", messages=MESSAGES, max_tokens=10,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == 10 and not chunks[-1].choices


def test_the_same_request_alone_or_among_others_gives_the_same_text(server, reference):
    words = ["hello", "world", "the", "model", "runs", "on", "day", "zero", "a", "cat"]
    prompts = [" ".join(words[i:] + words[:i]) for i in range(6)]
    alone = [_expected(reference, reference.tokenizer.encode(p), 16)[1] for p in prompts]
    client = server.client()

    def ask(prompt: str) -> str:
        return client.completions.create(model="lm.dz", prompt=prompt, max_tokens=16,
                                         temperature=0).choices[0].text

    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(ask, prompts))
    assert together == alone


def test_a_stop_string_cuts_the_text_and_ends_the_sequence(server, reference):
    ids = reference.tokenizer.encode(PROMPT)
    tokens, text = _expected(reference, ids, 20)
    words = text.split()
    stop = words[len(words) // 2]
    want = text[:text.index(stop)]
    client = server.client()
    response = client.completions.create(model="lm.dz", prompt=PROMPT, max_tokens=20,
                                         temperature=0, stop=[stop, "never there"])
    assert response.choices[0].text == want and response.choices[0].finish_reason == "stop"
    assert response.usage.completion_tokens < 20
    streamed = client.completions.create(model="lm.dz", prompt=PROMPT, max_tokens=20,
                                         temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == want


def test_a_seed_reproduces_sampling(server, reference):
    ids = reference.tokenizer.encode(PROMPT)
    want = reference.generate([ids], max_new_tokens=8, do_sample=True, temperature=0.8,
                              top_p=0.9, seed=7)[0, len(ids):].tolist()
    response = server.client().completions.create(model="lm.dz", prompt=PROMPT, max_tokens=8,
                                                   temperature=0.8, top_p=0.9, seed=7)
    assert response.choices[0].model_extra["token_ids"] == want


def test_models_and_health(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["lm.dz"]
    assert server.get("/health")[0] == 200


def test_metrics_count_requests_and_tokens(server):
    names = ["dayzero_requests_total", "dayzero_time_to_first_token_seconds",
             "dayzero_time_per_output_token_seconds", "dayzero_queue_depth",
             "dayzero_running_sequences", "dayzero_kv_blocks_used", "dayzero_kv_blocks_free",
             "dayzero_preemptions_total", "dayzero_prompt_tokens_total",
             "dayzero_generation_tokens_total"]
    ok = 'dayzero_requests_total{endpoint="/v1/completions",status="200"}'
    # samples absent before this worker's first request read as 0: the test runs alone too
    before = {n: server.metric(n) for n in (ok, "dayzero_generation_tokens_total",
                                            "dayzero_prompt_tokens_total",
                                            "dayzero_time_to_first_token_seconds_count")}
    server.client().completions.create(model="lm.dz", prompt=[5, 6, 7], max_tokens=4,
                                       temperature=0)
    text = server.get("/metrics")[1]
    assert all(f"\n{n}" in text for n in names), text
    after = {n: server.metric(n) for n in before}
    assert after[ok] == before[ok] + 1
    assert after["dayzero_generation_tokens_total"] == \
        before["dayzero_generation_tokens_total"] + 4
    assert after["dayzero_prompt_tokens_total"] == before["dayzero_prompt_tokens_total"] + 3
    assert after["dayzero_time_to_first_token_seconds_count"] == \
        before["dayzero_time_to_first_token_seconds_count"] + 1
    assert server.metric("dayzero_kv_blocks_used") == 0
    assert server.metric("dayzero_kv_blocks_free") > 0


def test_a_client_gone_mid_stream_gets_its_sequence_cancelled_and_blocks_freed(server):
    cancelled = 'dayzero_sequences_finished_total{reason="cancelled"}'
    before = server.metric(cancelled)
    stream = server.client().completions.create(model="lm.dz", prompt=[5, 6, 7],
                                                max_tokens=250, temperature=0, stream=True)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()  # the connection goes
    _wait(lambda: server.metric(cancelled) == before + 1)
    assert server.metric("dayzero_kv_blocks_used") == 0
    assert server.metric("dayzero_running_sequences") == 0


def test_a_client_gone_before_a_whole_answer_gets_its_sequence_cancelled(server):
    cancelled = 'dayzero_sequences_finished_total{reason="cancelled"}'
    before = server.metric(cancelled)
    body = json.dumps({"model": "lm.dz", "prompt": [5, 6, 7], "max_tokens": 250,
                       "temperature": 0}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as connection:
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                           b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                           % (len(body), body))
        _wait(lambda: server.metric("dayzero_running_sequences") == 1)
    _wait(lambda: server.metric(cancelled) == before + 1)
    assert server.metric("dayzero_kv_blocks_used") == 0


def _wait(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("condition not met in time")
        time.sleep(0.05)


def _ids_of(choice) -> list[int]:
    return list(getattr(choice, "token_ids", None) or choice.model_extra["token_ids"])


def test_a_stream_carries_every_token_id_even_while_text_is_held(server, reference):
    """A two-word stop string holds the first word's text back (it may begin the stop): the
    stream must still carry that step's token id, as the whole answer does."""
    ids = reference.tokenizer.encode(PROMPT)
    _, text = _expected(reference, ids, 20)
    words = text.split()
    stop = " " + " ".join(words[len(words) // 2:len(words) // 2 + 2])
    client = server.client()
    whole = client.completions.create(model="lm.dz", prompt=PROMPT, max_tokens=20,
                                      temperature=0, stop=stop)
    streamed = client.completions.create(model="lm.dz", prompt=PROMPT, max_tokens=20,
                                         temperature=0, stop=stop, stream=True)
    got = [i for chunk in streamed for i in _ids_of(chunk.choices[0])]
    assert got == _ids_of(whole.choices[0])
    assert len(got) == whole.usage.completion_tokens
