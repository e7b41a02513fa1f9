"""The tokenizer a generation artifact carries (tokenizer/), through the `tokenizers` library.

The runtime stays free of torch and transformers: `tokenizers` reads tokenizer.json (the same
file transformers' fast tokenizers read, so ids agree), and the chat template is rendered as
transformers renders it (Jinja's immutable sandbox with trim_blocks, lstrip_blocks and loop
controls), but in a worker process with hard limits (chat_template.py): the template comes
from an artifact and is untrusted.

tokenizer.json is untrusted too: `tokenizers` parses it in Rust (so its size is capped first),
and a pre-tokenizer regex can make the library panic on some texts. A Rust panic reaches Python
as pyo3's PanicException, a BaseException that every `except Exception` lets through; here
every call into the library turns it into an InputError.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from compiler.errors import ArtifactError, DayzeroError, InputError

from .chat_template import ChatTemplate

DIR = "tokenizer/"
# tokenizer.json of a 256k-token vocabulary is about 35 MB; the others hold a few KB of tokens
# and templates. The caps bound what the Rust parser and json.loads are given.
MAX_SIZE = {"tokenizer.json": 64 << 20}
MAX_OTHER = 16 << 20
# the runtime-only install names what text generation needs as one extra (packaging/runtime)
_GENERATE_EXTRA = ('install the runtime\'s generate extra: pip install "dayzero-runtime[generate]" '
                   '(from the repository: pip install "./packaging/runtime[generate]"; dayzero\'s '
                   'hf extra brings it too)')
_T = TypeVar("_T")


class ArtifactTokenizer:
    def __init__(self, files: Mapping[str, bytes], where: str):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise DayzeroError("reading the artifact's tokenizer needs the `tokenizers` package",
                               f"{where}/{DIR}",
                               _GENERATE_EXTRA + ", or call generate with token ids") from None

        self.where = where
        self.source = f"{where}/{DIR}tokenizer.json"
        for name, data in files.items():
            check_size(name, len(data), where)
        try:
            self.tokenizer = _panics_too(lambda: Tokenizer.from_str(
                files["tokenizer.json"].decode()))
            config = json.loads(files.get("tokenizer_config.json", b"{}") or b"{}")
            self.config = config if isinstance(config, dict) else {}
            template, name = _chat_template(self.config, files, where)
        except Exception as exc:  # the library's errors name no file
            raise ArtifactError(f"the artifact's tokenizer does not load: {_short(exc)}",
                                f"{where}/{DIR}", "recompile from a checkpoint whose "
                                "tokenizer.json transformers loads") from None
        self.chat_template = template
        self._template = ChatTemplate(template, name) if template else None
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` with the special tokens the tokenizer adds (a BOS, say)."""
        return self._encode(text, add_special_tokens=True)

    def decode(self, ids: Sequence[int]) -> str:
        ids = list(ids)
        return self._call(f"decoding {len(ids)} token ids", lambda: self.tokenizer.decode(
            ids, skip_special_tokens=True))

    def chat_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Token ids of `messages` through the chat template, ready for the assistant's turn."""
        return self._encode(self.render_chat(messages), add_special_tokens=False)

    def render_chat(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The chat template rendered for `messages` (in a limited worker process: a
        ChatTemplateError, an InputError naming the template, on any failure or overrun).
        Safe to call from several threads."""
        if self._template is None:
            raise InputError("the artifact's tokenizer has no chat template", self.where,
                             "pass a plain prompt string, or compile from a checkpoint whose "
                             "tokenizer_config.json has a chat_template")
        _check_messages(messages)
        if importlib.util.find_spec("jinja2") is None:
            raise DayzeroError("rendering the chat template needs the `jinja2` package",
                               f"{self.where}/{DIR}",
                               _GENERATE_EXTRA + ", or pass a plain prompt string")
        return self._template.render({
            "messages": list(messages), "add_generation_prompt": True,
            "bos_token": self.bos_token or "", "eos_token": self.eos_token or ""})

    def close(self) -> None:
        """Stop the chat template's worker processes; a render in progress in another thread
        ends with a ChatTemplateError (a server calls this when it stops)."""
        if self._template is not None:
            self._template.close()

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        size = f"{len(text)} characters" if isinstance(text, str) else \
            f"a {type(text).__name__}"
        # encode_batch, not encode: encode holds the GIL for the whole call (seconds for a long
        # prompt), so a server's other threads and its event loop would stop with it
        return self._call(f"encoding a text of {size}", lambda: self.tokenizer.encode_batch(
            [text], add_special_tokens=add_special_tokens)[0].ids)

    def _call(self, doing: str, call: Callable[[], _T]) -> _T:
        """`call` into the library; its errors and panics are about the input: InputError."""
        try:
            return _panics_too(call)
        except Exception as exc:  # the library's errors (TypeError, OverflowError, panics)
            raise InputError(f"the tokenizer failed {doing}: {_short(exc)}", self.source,
                             "check the input; if it is ordinary text, the artifact's "
                             "tokenizer.json cannot handle it") from None


class TokenizerPanic(Exception):
    """A Rust panic inside `tokenizers`, made an ordinary exception."""


def _panics_too(call: Callable[[], _T]) -> _T:
    """`call()`, with pyo3's PanicException (a BaseException, not importable by name) turned
    into TokenizerPanic; KeyboardInterrupt, SystemExit and the like pass untouched."""
    try:
        return call()
    except Exception:
        raise
    except BaseException as exc:
        if type(exc).__name__ == "PanicException":
            raise TokenizerPanic(f"the library panicked: {exc}") from None
        raise


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 300 else text[:300] + "..."


def tokenizer_file_limit(name: str) -> int:
    """The most bytes the tokenizer file `name` may have (compile refuses what load would)."""
    return MAX_SIZE.get(name, MAX_OTHER)


def check_size(name: str, size: int, where: str) -> None:
    """Refuse a tokenizer file larger than its cap, before anything parses it."""
    limit = tokenizer_file_limit(name)
    if size > limit:
        raise ArtifactError(f"the tokenizer file {name} is {size} bytes, more than the "
                            f"{limit >> 20} MiB a tokenizer file may have",
                            f"{where}/{DIR}{name}", "recompile from a checkpoint with a "
                            "usual tokenizer")


def _chat_template(config: Mapping[str, Any], files: Mapping[str, bytes],
                   where: str) -> tuple[str | None, str]:
    """The template and the name errors give it: the file (and key) it came from, as
    transformers chooses (chat_template.jinja, then chat_template.json, then the config)."""
    if "chat_template.jinja" in files:
        return files["chat_template.jinja"].decode(), f"{where}/{DIR}chat_template.jinja"
    if "chat_template.json" in files:
        data = json.loads(files["chat_template.json"])
        if isinstance(data, dict) and isinstance(data.get("chat_template"), str):
            return data["chat_template"], f"{where}/{DIR}chat_template.json (chat_template)"
    template = config.get("chat_template")
    return (template if isinstance(template, str) else None,
            f"{where}/{DIR}tokenizer_config.json (chat_template)")


def _token_text(token: Any) -> str | None:
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, (list, tuple)) or not messages or not all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str)
            and _content_ok(m.get("content")) for m in messages):
        raise InputError("messages must be a non-empty list of {'role': str, 'content': str "
                         "or a list of parts}", "messages",
                         "pass e.g. [{'role': 'user', 'content': 'Hello'}]")


def _content_ok(content: Any) -> bool:
    """A string, or content parts as chat templates see them ({'type': 'text', 'text': ...},
    {'type': 'image'})."""
    return isinstance(content, str) or isinstance(content, list) and all(
        isinstance(p, Mapping) and isinstance(p.get("type"), str) for p in content)


def load_tokenizer(model) -> ArtifactTokenizer | None:
    """The artifact's tokenizer, or None when it was compiled without one."""
    names = model.manifest["generation"].get("tokenizer") or []
    if not isinstance(names, list) or f"{DIR}tokenizer.json" not in names:
        return None
    files = {}
    for rel in names:
        if isinstance(rel, str) and rel.startswith(DIR):
            path = model.artifact.file(rel, "tokenizer file")
            check_size(rel[len(DIR):], path.stat().st_size, str(model.path))
            files[rel[len(DIR):]] = path.read_bytes()
    return ArtifactTokenizer(files, str(model.path))
