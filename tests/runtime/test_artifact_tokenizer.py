"""The artifact's tokenizer under hostile files and inputs (runtime/generation/tokenizer.py).

tokenizer.json is parsed in Rust and its regexes run there: a panic reaches Python as pyo3's
PanicException, a BaseException that escapes every `except Exception`. Every call into the
library must end in an InputError naming the file (not echoing the input), and the chat
template must render in its limited worker, its errors naming the file it came from.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from compiler.errors import ArtifactError, InputError
from runtime.generation import tokenizer as tokenizer_module
from runtime.generation.chat_template import ChatTemplateError
from runtime.generation.tokenizer import ArtifactTokenizer, load_tokenizer

HOSTILE = "a" * 28 + "!"  # `(a+)+$` backtracks past onig's retry limit: a panic
CHAT = ("{{ bos_token }} {% for m in messages %}{{ m['role'] }} : {{ m['content'] }} "
        "{% endfor %}{% if add_generation_prompt %}assistant :{% endif %}")


def tokenizer_json(pattern: str | None = None) -> bytes:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "!": 4, "user": 5, ":": 6, "hi": 7,
             "assistant": 8}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), "isolated") if pattern else \
        pre_tokenizers.WhitespaceSplit()
    return tok.to_str().encode()


def files(pattern: str | None = None, template: str | None = CHAT, **extra: bytes) -> dict:
    config = {"bos_token": "<s>", "eos_token": "</s>"}
    if template is not None:
        config["chat_template"] = template
    return {"tokenizer.json": tokenizer_json(pattern),
            "tokenizer_config.json": json.dumps(config).encode(), **extra}


@pytest.fixture
def load():
    made = []

    def factory(*args, **kwargs) -> ArtifactTokenizer:
        made.append(ArtifactTokenizer(files(*args, **kwargs), "art"))
        return made[-1]

    yield factory
    for tok in made:
        tok.close()


def test_the_library_really_panics_on_this_input():
    raw = Tokenizer.from_str(tokenizer_json("(a+)+$").decode())
    with pytest.raises(BaseException) as caught:
        raw.encode(HOSTILE)
    assert type(caught.value).__name__ == "PanicException"
    assert not isinstance(caught.value, Exception)


def test_a_panic_while_encoding_is_an_input_error_naming_the_file(load):
    tok = load("(a+)+$")
    with pytest.raises(InputError) as caught:
        tok.encode(HOSTILE)
    error = caught.value
    assert error.where == "art/tokenizer/tokenizer.json"
    assert "encoding a text of 29 characters" in error.what and "panicked" in error.what
    assert HOSTILE not in error.message()
    assert tok.encode("a") == [3]  # the tokenizer still works afterwards


def test_a_panic_while_encoding_rendered_chat_is_an_input_error(load):
    tok = load("(a+)+$")
    with pytest.raises(InputError, match="panicked"):
        tok.chat_ids([{"role": "user", "content": HOSTILE}])


@pytest.mark.parametrize("call", [
    lambda tok: tok.encode("\ud800"),
    lambda tok: tok.encode(b"bytes"),
    lambda tok: tok.decode([1, 10**12]),
    lambda tok: tok.decode([-1]),
])
def test_other_inputs_the_library_rejects_are_input_errors(load, call):
    with pytest.raises(InputError) as caught:
        call(load())
    assert caught.value.where == "art/tokenizer/tokenizer.json"


def test_a_chat_renders_through_the_worker_and_encodes(load):
    tok = load()
    messages = [{"role": "user", "content": "hi"}]
    assert tok.render_chat(messages) == "<s> user : hi assistant :"
    assert tok.chat_ids(messages) == [1, 5, 6, 7, 8, 6]


@pytest.mark.parametrize("where, name", [
    ("config", "art/tokenizer/tokenizer_config.json (chat_template)"),
    ("jinja", "art/tokenizer/chat_template.jinja"),
    ("json", "art/tokenizer/chat_template.json (chat_template)"),
])
def test_a_hostile_template_is_a_chat_template_error_naming_its_file(load, where, name):
    hostile = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    extra = {"jinja": {"chat_template.jinja": hostile.encode()},
             "json": {"chat_template.json": json.dumps({"chat_template": hostile}).encode()},
             "config": {}}[where]
    tok = load(template=hostile if where == "config" else "unused", **extra)
    with pytest.raises(ChatTemplateError) as caught:
        tok.chat_ids([{"role": "user", "content": "hi"}])
    assert caught.value.what == f"the chat template {name} used more than 1 s of CPU"
    assert isinstance(caught.value, InputError)


def test_close_stops_the_template_worker(load):
    tok = load()
    tok.render_chat([{"role": "user", "content": "hi"}])
    tok.close()
    with pytest.raises(ChatTemplateError, match="closed"):
        tok.render_chat([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("name, data", [
    ("tokenizer.json", b"{not json"),
    ("tokenizer.json", b"\xff\xfe"),
    ("tokenizer_config.json", b"[" * 100000),
    ("chat_template.json", b"{"),
    ("chat_template.jinja", b"\xff"),
])
def test_malformed_tokenizer_files_are_artifact_errors(name, data):
    with pytest.raises(ArtifactError, match="tokenizer does not load"):
        ArtifactTokenizer({**files(), name: data}, "art")


def test_an_oversized_tokenizer_json_is_refused_before_it_is_read(tmp_path, monkeypatch):
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    with open(folder / "tokenizer.json", "wb") as f:
        f.truncate((64 << 20) + 1)  # sparse: reading it would take 64 MiB, stat takes nothing
    model = SimpleNamespace(path=tmp_path, manifest={"generation": {"tokenizer": [
        "tokenizer/tokenizer.json"]}}, artifact=SimpleNamespace(
        file=lambda rel, what: tmp_path / rel))
    read = []
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self))
    with pytest.raises(ArtifactError, match="more than the 64 MiB") as caught:
        load_tokenizer(model)
    assert read == [] and caught.value.where.endswith("tokenizer/tokenizer.json")


def test_an_oversized_file_given_as_bytes_is_refused(monkeypatch):
    monkeypatch.setattr(tokenizer_module, "MAX_OTHER", 100)
    with pytest.raises(ArtifactError, match="tokenizer_config.json is 200 bytes"):
        ArtifactTokenizer({**files(), "tokenizer_config.json": b" " * 200}, "art")


def test_encoding_a_long_text_lets_other_threads_run(load):
    """A server tokenizes on worker threads: a long prompt must not stop the others (the
    library's `encode` holds the GIL for the whole call; `encode_batch` releases it). Counted
    by progress, not timed: the main thread's turns while the encode runs."""
    import threading
    import time

    tok = load()
    text = " ".join(["hi", "a", "user", ":"] * 100_000)
    result: list[list[int]] = []
    worker = threading.Thread(target=lambda: result.append(tok.encode(text)))
    turns = 0
    worker.start()
    while worker.is_alive():
        turns += 1
        time.sleep(0.001)
    worker.join()
    assert result[0] == Tokenizer.from_str(tokenizer_json().decode()).encode(text).ids
    assert turns > 20, f"the main thread ran {turns} times while a long text was encoded"
