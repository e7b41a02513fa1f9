"""The checkpoint's generation config, as a generation artifact carries it
(tokenizer/generation_config.json, copied from the checkpoint folder at compile), read at load.

Its logit processors (runtime/logit_processors.py) and EOS ids are the defaults of `generate`,
`stream` and `generate_text`, as transformers' `model.generation_config` is `generate`'s; a
call's arguments override them. (The compiler takes the manifest's EOS ids from the model's
config, which a checkpoint's generation_config.json may contradict: transformers stops at the
file's.) The file is untrusted: its size is capped before it is read, it is parsed with
bounded work (runtime/bounded_json.py), and every field the processors take is checked, a bad
one refused at load naming the file and the field.
"""

from __future__ import annotations

import warnings
from typing import Any

from compiler.errors import ArtifactError

from .. import bounded_json
from ..logit_processors import LogitProcessors, not_applied
from .spec import GenerationSpec
from .tokenizer import DIR, check_size

NAME = "generation_config.json"
FILE = f"{DIR}{NAME}"
_MAX_DEPTH = 16  # a generation config nests lists of token ids a few levels deep
_MAX_INT_DIGITS = 24


def read_generation_config(model: Any, spec: GenerationSpec) -> LogitProcessors:
    """The processors of the artifact's generation config (none when the artifact carries
    no config), for the config's `eos_token_id` (what transformers' `generate` stops at, and
    `eos_token_ids` of the result) or else the manifest's. ArtifactError when the file or one
    of its fields is bad; a warning naming the fields transformers acts on that are not
    applied (beams, guidance)."""
    names = model.manifest["generation"].get("tokenizer") or []
    if not isinstance(names, list) or FILE not in names:
        return LogitProcessors({}, spec.vocab_size, spec.eos_token_ids)
    path = model.artifact.file(FILE, "tokenizer file")
    where = f"{model.path}/{FILE}"
    check_size(NAME, path.stat().st_size, str(model.path))
    try:
        config = bounded_json.loads(path.read_bytes(), max_depth=_MAX_DEPTH,
                                    max_int_digits=_MAX_INT_DIGITS)
    except ValueError as exc:
        raise ArtifactError(f"{where} is not a generation config: {str(exc)[:200]}", where,
                            "recompile from a checkpoint whose generation_config.json "
                            "transformers loads") from None
    if not isinstance(config, dict):
        raise ArtifactError(f"{where} holds a {type(config).__name__}, not an object", where,
                            "recompile from a checkpoint whose generation_config.json "
                            "transformers loads")
    ignored = not_applied(config)
    if ignored:
        warnings.warn(f"{where} sets {', '.join(ignored)}, which dayzero's generate does not "
                      "apply: its tokens will differ from transformers' generate",
                      UserWarning, stacklevel=3)
    return LogitProcessors.from_config(config, spec.vocab_size, spec.eos_token_ids,
                                       source=where, error=ArtifactError)
