"""The tokenizer a generation artifact carries (tokenizer/), through the `tokenizers` library.

The runtime stays free of torch and transformers: `tokenizers` reads tokenizer.json (the same
file transformers' fast tokenizers read, so ids agree), and the chat template is rendered as
transformers renders it (Jinja with trim_blocks, lstrip_blocks and loop controls) but in Jinja's
immutable sandbox: the template comes from an artifact and is untrusted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from compiler.errors import ArtifactError, DayzeroError, InputError

DIR = "tokenizer/"


class ArtifactTokenizer:
    def __init__(self, files: Mapping[str, bytes], where: str):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise DayzeroError("reading the artifact's tokenizer needs the `tokenizers` package",
                               f"{where}/{DIR}", "pip install tokenizers (transformers brings "
                               "it), or call generate with token ids") from None

        self.where = where
        try:
            self.tokenizer = Tokenizer.from_str(files["tokenizer.json"].decode())
            config = json.loads(files.get("tokenizer_config.json", b"{}") or b"{}")
        except Exception as exc:  # the library's errors name no file
            raise ArtifactError(f"the artifact's tokenizer does not load: {exc}",
                                f"{where}/{DIR}", "recompile from a checkpoint whose "
                                "tokenizer.json transformers loads") from None
        self.config = config if isinstance(config, dict) else {}
        self.chat_template = _chat_template(self.config, files)
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` with the special tokens the tokenizer adds (a BOS, say)."""
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def chat_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Token ids of `messages` through the chat template, ready for the assistant's turn."""
        text = self.render_chat(messages)
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def render_chat(self, messages: Sequence[Mapping[str, Any]]) -> str:
        if not self.chat_template:
            raise InputError("the artifact's tokenizer has no chat template", self.where,
                             "pass a plain prompt string, or compile from a checkpoint whose "
                             "tokenizer_config.json has a chat_template")
        _check_messages(messages)
        try:
            from jinja2 import TemplateError
        except ImportError:
            raise DayzeroError("rendering the chat template needs the `jinja2` package",
                               f"{self.where}/{DIR}", "pip install jinja2, or pass a plain "
                               "prompt string") from None
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise InputError(f"the chat template refused the messages: {message}", "messages",
                             "follow the roles and order the model's template expects")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, indent=indent)
        env.globals["raise_exception"] = raise_exception
        try:
            return env.from_string(self.chat_template).render(
                messages=list(messages), add_generation_prompt=True,
                bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except TemplateError as exc:
            raise ArtifactError(f"the chat template fails: {exc}", f"{self.where}/{DIR}",
                                "recompile with a working chat template") from None


def _chat_template(config: Mapping[str, Any], files: Mapping[str, bytes]) -> str | None:
    if "chat_template.jinja" in files:
        return files["chat_template.jinja"].decode()
    if "chat_template.json" in files:
        data = json.loads(files["chat_template.json"])
        if isinstance(data, dict) and isinstance(data.get("chat_template"), str):
            return data["chat_template"]
    template = config.get("chat_template")
    return template if isinstance(template, str) else None


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
            files[rel[len(DIR):]] = model.artifact.file(rel, "tokenizer file").read_bytes()
    return ArtifactTokenizer(files, str(model.path))
