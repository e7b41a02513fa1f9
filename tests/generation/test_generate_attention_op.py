"""Generation for causal LMs whose attention block the fusion does not recognise whole.

GPT-NeoX (rotary on a quarter of each head, QKV split by view + transpose), StableLM and Phi
(partial rotary) and GLM-4 (interleaved partial rotary) reach the step as a bare
`scaled_dot_product_attention`: the KV cache is derived at that op
(passes/derive_generation_step/step_attention.py), with the token-by-token proof of its
token_rows module. Each is a tiny random checkpoint folder saved by transformers and
compiled with `dayzero compile FOLDER`; a batch of two prompts of different lengths must give
transformers' greedy tokens, and seeded sampling must reproduce.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import runtime
from compiler.cli import main
from tests.generation.test_generate_matches_transformers import assert_same_greedy
from tests.generation.tiny_lms import word_tokenizer

NEW = 12
_COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=128, max_position_embeddings=64, tie_word_embeddings=False,
               bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _neox(t):
    return t.GPTNeoXForCausalLM(t.GPTNeoXConfig(**_COMMON, rotary_pct=0.25))


def _stablelm(t):
    return t.StableLmForCausalLM(t.StableLmConfig(**_COMMON, num_key_value_heads=2,
                                                  partial_rotary_factor=0.25))


def _phi(t):
    return t.PhiForCausalLM(t.PhiConfig(**_COMMON, partial_rotary_factor=0.5))


def _glm4(t):
    return t.Glm4ForCausalLM(t.Glm4Config(**_COMMON, num_key_value_heads=2, head_dim=16))


FACTORIES = {"gpt_neox": _neox, "stablelm": _stablelm, "phi": _phi, "glm4": _glm4}


@pytest.fixture(scope="module", params=sorted(FACTORIES))
def lm(request, tmp_path_factory):
    import transformers

    torch.manual_seed(0)
    hf = FACTORIES[request.param](transformers).eval()
    root = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(root / "ckpt")
    word_tokenizer().save_pretrained(root / "ckpt")
    out = root / "lm.dz"
    assert main(["compile", str(root / "ckpt"), "-o", str(out), "--seq-len", "2:64", "-q"]) == 0
    return hf, runtime.load(out)


def _transformers_greedy(hf, ids: np.ndarray):
    tensor = torch.as_tensor(ids)[None]
    with torch.no_grad():
        out = hf.generate(tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=NEW,
                          do_sample=False, output_logits=True, return_dict_in_generate=True,
                          pad_token_id=0, eos_token_id=None)
    return out.sequences[0].numpy(), [x[0].numpy() for x in out.logits]


def _prompts() -> list[np.ndarray]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(3, 256, (n,), generator=g).numpy() for n in (5, 13)]


def test_each_attention_op_gets_its_own_cache(lm):
    hf, model = lm
    config = hf.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    size = getattr(config, "head_dim", None) or config.hidden_size // heads
    # one pool per layer, of the key and value heads as they enter the attention
    assert [list(layer)[:3] for layer in model.manifest["generation"]["layers"]] == \
        [[kv_heads, size, size]] * config.num_hidden_layers


def test_a_batch_of_two_prompts_gets_transformers_greedy_tokens(lm):
    hf, model = lm
    prompts = _prompts()
    batch = model.generate(prompts, max_new_tokens=NEW, eos_token_id=[])
    assert batch.shape == (2, 13 + NEW)
    for row, ids in enumerate(prompts):
        want, logits = _transformers_greedy(hf, ids)
        assert_same_greedy(batch[row, 13 - len(ids):], want, logits, len(ids))


def test_seeded_sampling_reproduces(lm):
    _, model = lm
    prompts = _prompts()
    first = model.generate(prompts, max_new_tokens=NEW, do_sample=True, seed=7, eos_token_id=[])
    again = model.generate(prompts, max_new_tokens=NEW, do_sample=True, seed=7, eos_token_id=[])
    other = model.generate(prompts, max_new_tokens=NEW, do_sample=True, seed=8, eos_token_id=[])
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
