"""Imported first by a `dayzero serve` subprocess of the tests (Server(..., prelude=...)): the
artifact's tokenizer holds any text with a word `SLOW<tag>` (a prompt, or chat messages before
their template is rendered). It touches `$DAYZERO_TEST_GATES/entered-SLOW<tag>`, then spins in
pure Python (the GIL held but for the interpreter's switches, as a heavy template's loops hold
it) until `$DAYZERO_TEST_GATES/open-SLOW<tag>` exists, for at most 120 s."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from runtime.generation.tokenizer import ArtifactTokenizer

_MARK = re.compile(r"SLOW\w*")


def _hold(text: str) -> None:
    gates = Path(os.environ["DAYZERO_TEST_GATES"])
    for tag in _MARK.findall(text):
        (gates / f"entered-{tag}").touch()
        deadline = time.monotonic() + 120
        while not (gates / f"open-{tag}").exists() and time.monotonic() < deadline:
            sum(range(50000))


_encode = ArtifactTokenizer.encode
_chat_ids = ArtifactTokenizer.chat_ids


def _slow_encode(self, text):
    _hold(text)
    return _encode(self, text)


def _slow_chat_ids(self, messages):
    _hold(json.dumps(messages))
    return _chat_ids(self, messages)


ArtifactTokenizer.encode = _slow_encode
ArtifactTokenizer.chat_ids = _slow_chat_ids
