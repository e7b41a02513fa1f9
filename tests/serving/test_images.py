"""`dayzero serve` on an image-text artifact (the tiny LLaVA of tests/generation/tiny_llava.py):
chat messages with `image_url` parts (base64 data URLs, PNG and JPEG) through the official
openai client against a real server on 127.0.0.1, answered as `generate_text` answers the same
messages in this process; text-only requests beside them; bad images are 400s naming the part."""

from __future__ import annotations

import base64
import concurrent.futures

import pytest

from tests.generation.tiny_llava import compile_folder, image_bytes
from tests.serving.servers import KV_CACHE, Server


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return compile_folder(tmp_path_factory.mktemp("serve-llava"))[0]


@pytest.fixture(scope="module")
def reference(artifact):
    import runtime

    return runtime.load(artifact, kv_cache_memory=KV_CACHE)


@pytest.fixture(scope="module")
def server(artifact, tmp_path_factory):
    srv = Server(artifact, tmp_path_factory.mktemp("log") / "server.log")
    yield srv
    assert srv.stop() == 0, srv.log.read_text()


def _url(data: bytes, kind: str) -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def _messages(url: str, text: str = "the cat sat") -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


@pytest.mark.parametrize("fmt,kind", [("PNG", "png"), ("JPEG", "jpeg")])
def test_an_image_chat_says_what_generate_text_says(server, reference, fmt, kind):
    messages = _messages(_url(image_bytes(fmt, seed=11), kind))
    want = reference.generate_text(messages, max_new_tokens=10)
    other = reference.generate_text(_messages(_url(image_bytes(fmt, seed=12), kind)),
                                    max_new_tokens=10)
    assert want != other  # the image decides the text
    client = server.client()
    response = client.chat.completions.create(model="llava.dz", messages=messages,
                                              max_tokens=10, temperature=0)
    assert response.choices[0].message.content == want
    assert response.usage.prompt_tokens > 16  # the image's tokens are prompt tokens
    stream = client.chat.completions.create(model="llava.dz", messages=messages,
                                            max_tokens=10, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want


def test_image_and_text_requests_together(server, reference):
    image = _messages(_url(image_bytes("PNG", seed=13), "png"))
    text = [{"role": "user", "content": "the cat sat"}]
    want = [reference.generate_text(m, max_new_tokens=12) for m in (image, text)] * 3
    client = server.client()

    def ask(messages):
        return client.chat.completions.create(model="llava.dz", messages=messages,
                                              max_tokens=12, temperature=0
                                              ).choices[0].message.content

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        assert list(pool.map(ask, [image, text] * 3)) == want


@pytest.mark.parametrize("url,field,message", [
    (_url(b"\x89PNG\r\n\x1a\n not really", "png"), "messages[0].content[1].image_url",
     "cannot be decoded"),
    (_url(image_bytes("GIF"), "png"), "messages[0].content[1].image_url", "PNG or JPEG"),
    ("data:image/png;base64,@@@@", "messages[0].content[1].image_url.url", "base64"),
    ("https://example.com/cat.png", "messages[0].content[1].image_url.url", "data URL"),
])
def test_a_bad_image_is_a_400_naming_the_part(server, url, field, message):
    status, answer = server.post("/v1/chat/completions", {
        "model": "llava.dz", "messages": _messages(url), "max_tokens": 4})
    assert status == 400, answer
    assert answer["error"]["param"] == field, answer
    assert message in answer["error"]["message"]


def test_too_many_image_tokens_for_the_context_is_a_400_before_encoding(server):
    # 8 images x 16 tokens exceed the 128 positions the artifact was compiled for: refused
    # before the (undecodable) images are decoded
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}] * 8
    status, answer = server.post("/v1/chat/completions", {
        "model": "llava.dz", "messages": [{"role": "user", "content": parts}],
        "max_tokens": 4})
    assert status == 400, answer
    assert answer["error"]["param"] == "messages" and "context" in answer["error"]["message"]
