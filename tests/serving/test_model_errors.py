"""A sequence the model fails (NaN or +inf logits: the scheduler's TokenEvent with `error`) ends
alone with finish_reason "error": a whole answer with tokens is a 200 carrying them and the
error, one without any token a 500 in OpenAI's shape, a stream ends with a chunk whose
finish_reason is "error" and the error object; the other requests of the batch go on."""

from __future__ import annotations

import json
import threading

import pytest

from runtime.generation.scheduler import TokenEvent
from tests.serving.inprocess import InProcessServer
from tests.serving.servers import KV_CACHE

FAIL_AFTER = {77: 2, 78: 0}  # a prompt starting with this id fails after that many tokens
WHY = "the logits for its next token contain NaN"


@pytest.fixture(scope="module")
def failing(artifact):
    """A server whose scheduler fails the sequences FAIL_AFTER names, as it does for a NaN
    logits row: the token is not kept, the sequence ends with "error" and frees its blocks."""
    import runtime

    model = runtime.load(artifact, kv_cache_memory=KV_CACHE)
    server = InProcessServer(model)
    scheduler = server.engine.scheduler
    step = scheduler.step

    def failing_step():
        events = []
        for event in step():
            seq = event.sequence
            after = FAIL_AFTER.get(seq.tokens[0])
            if after is not None and len(seq.generated) > after and not seq.finished:
                seq.tokens.pop()
                seq.finish_reason, seq.error = "error", WHY
                scheduler.cancel(seq)
                event = TokenEvent(seq, -1, WHY)
            events.append(event)
        return events

    scheduler.step = failing_step
    yield server
    server.close()


def _body(first: int, **extra) -> dict:
    return {"model": "lm.dz", "prompt": [first, 5, 6], "max_tokens": 8, "temperature": 0,
            **extra}


def test_a_whole_answer_keeps_its_tokens_and_says_why_it_ended(failing):
    status, answer = failing.request("POST", "/v1/completions", _body(77))
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "error" and len(choice["token_ids"]) == 2
    assert choice["error"]["message"] == WHY and choice["error"]["type"] == "server_error"
    assert answer["usage"]["completion_tokens"] == 2


def test_a_whole_answer_without_a_token_is_a_500(failing):
    status, answer = failing.request("POST", "/v1/completions", _body(78))
    assert status == 500, answer
    assert answer["error"] == {"message": WHY, "type": "server_error", "param": None,
                               "code": None}


def test_a_stream_ends_with_an_error_chunk_then_the_error(failing):
    status, text = failing.request("POST", "/v1/completions", _body(77, stream=True))
    assert status == 200
    events = [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1] == {"error": {"message": WHY, "type": "server_error", "param": None,
                                    "code": None}}
    assert chunks[-2]["choices"][0]["finish_reason"] == "error"
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks[:-1]) == 2


def test_the_other_requests_of_the_batch_go_on(failing, reference):
    want = reference.generate([[9, 5, 6]], max_new_tokens=8)[0, 3:].tolist()
    answers = {}

    def ask(first: int) -> None:
        answers[first] = failing.request("POST", "/v1/completions", _body(first))

    threads = [threading.Thread(target=ask, args=(first,)) for first in (77, 9, 78)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers[9][0] == 200 and answers[9][1]["choices"][0]["token_ids"] == want
    assert answers[77][1]["choices"][0]["finish_reason"] == "error"
    assert answers[78][0] == 500
    assert failing.engine.scheduler.allocator.used == 0
