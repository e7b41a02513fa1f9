"""The server answers with the artifact's generation config as `generate` does: its logit
processors (repetition penalty, suppressed tokens, forced eos ...) and its eos ids act on every
request, greedy answers equal `generate`'s."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.cli import main
from tests.generation.tiny_lms import checkpoint_folder
from tests.serving.inprocess import InProcessServer

CONFIG = {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2, "suppress_tokens": [11, 12],
          "forced_eos_token_id": 2}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import runtime

    root = tmp_path_factory.mktemp("served-config")
    hf = checkpoint_folder(root / "ckpt")
    for key, value in CONFIG.items():
        setattr(hf.generation_config, key, value)
    hf.generation_config.save_pretrained(root / "ckpt")
    assert main(["compile", str(root / "ckpt"), "-o", str(root / "lm.dz"), "--seq-len",
                 "2:64", "-q"]) == 0
    model = runtime.load(root / "lm.dz", kv_cache_memory="4MiB")
    assert model.logit_processors.active
    server = InProcessServer(model)
    yield model, server
    server.close()


@pytest.mark.parametrize("prompt", [[1, 7, 8, 9, 10], [1, 20, 30, 40, 50, 60, 70, 80, 90]])
def test_a_greedy_answer_is_what_generate_gives_with_the_config(served, prompt):
    model, server = served
    want = model.generate(np.array([prompt]), max_new_tokens=6)[0, len(prompt):].tolist()
    want = [t for t in want if t != -1]
    status, answer = server.request("POST", "/v1/completions",
                                    {"model": "lm.dz", "prompt": prompt, "max_tokens": 6,
                                     "temperature": 0})
    assert status == 200, answer
    assert answer["choices"][0]["token_ids"] == want
    assert want[-1] == 2 or len(want) < 6  # forced eos at the length, as generate
