"""Generation with DeepSeek's multi-head latent attention (transformers' own DeepSeek-V2 and -V3
classes, tiny random configs, every layer dense): the step derived from the exported forward
caches each token's compressed latent and shared rotary key, not expanded keys and values, and
generates as transformers' KV-cached `generate` does (greedy tokens one for one up to a top-2
tie, every decode step's logits within 1e-4, a batch giving each prompt its own tokens)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import runtime
from compiler.ir import parse_ir
from tests.generation.test_generate_matches_transformers import (
    assert_same_greedy,
    teacher_forced_logits,
    transformers_generate,
)
from tests.generation.tiny_lms import MAX_SEQ, compile_lm, prompt

transformers = pytest.importorskip("transformers")

NEW = 24
LAYERS, HEADS, KV_LORA_RANK, ROPE, NOPE, V_SIZE = 2, 4, 16, 8, 8, 12


def _deepseek(version: str) -> torch.nn.Module:
    config_class, model_class = {
        "v2": (transformers.DeepseekV2Config, transformers.DeepseekV2ForCausalLM),
        "v3": (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM)}[version]
    torch.manual_seed(0)
    config = config_class(vocab_size=256, hidden_size=64, intermediate_size=96,
                          num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                          num_key_value_heads=HEADS, q_lora_rank=None if version == "v2" else 24,
                          kv_lora_rank=KV_LORA_RANK, qk_nope_head_dim=NOPE,
                          qk_rope_head_dim=ROPE, v_head_dim=V_SIZE, first_k_dense_replace=LAYERS,
                          max_position_embeddings=MAX_SEQ, attn_implementation="sdpa")
    model = model_class(config).eval()
    model.generation_config.eos_token_id = None  # NEW tokens every time, on both sides
    return model


@pytest.fixture(scope="module", params=["v2", "v3"])
def lm(request, tmp_path_factory):
    hf = _deepseek(request.param)
    path = compile_lm(hf, tmp_path_factory.mktemp(request.param) / "lm.dz")
    return hf, runtime.load(path)


def test_the_cache_holds_the_latent_and_rotary_key_per_token(lm):
    _, model = lm
    ops = [n.op for n in parse_ir((model.path / "graph.dzir").read_text()).nodes]
    assert ops.count("paged_latent_attention") == LAYERS and "paged_attention" not in ops
    assert model.manifest["generation"]["layers"] == [[1, KV_LORA_RANK, ROPE, None, "latent"]] \
        * LAYERS
    layout = model.runner.layout
    assert layout.token_bytes == (KV_LORA_RANK + ROPE) * LAYERS * 4       # 192 B
    expanded = HEADS * (NOPE + ROPE + V_SIZE) * LAYERS * 4                # 896 B
    assert layout.token_bytes * 4 < expanded
    assert model.runner.cache_bytes == model.runner.allocator.num_blocks * layout.block_bytes
    assert model.runner.allocator.num_blocks == (4 << 20) // layout.block_bytes


@pytest.mark.parametrize("length", [1, 7])
def test_greedy_tokens_and_step_logits_match_transformers(lm, length):
    hf, model = lm
    ids = prompt(length, seed=length)
    want, want_logits = transformers_generate(hf, ids, NEW)
    forced = teacher_forced_logits(model, want, length)
    assert len(forced) == NEW
    for step, (a, b) in enumerate(zip(forced, want_logits)):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0, err_msg=f"decode step {step}")
    got = model.generate(ids.numpy(), max_new_tokens=NEW, eos_token_id=[])
    assert got.shape == (1, length + NEW)
    assert_same_greedy(got[0], want, want_logits, length)


def test_a_batch_gives_each_prompt_its_own_tokens(lm):
    hf, model = lm
    prompts = [prompt(n, seed=n)[0].numpy() for n in (3, 11)]
    batch = model.generate(prompts, max_new_tokens=NEW, eos_token_id=[])
    assert batch.shape == (2, 11 + NEW)
    for row, ids in enumerate(prompts):
        want, logits = transformers_generate(hf, torch.as_tensor(ids)[None], NEW)
        assert_same_greedy(batch[row, 11 - len(ids):], want, logits, len(ids))


def test_the_artifact_is_still_its_prefill_forward(lm):
    hf, model = lm
    ids = prompt(9, seed=3)
    with torch.no_grad():
        eager = hf(ids, use_cache=False).logits.numpy()
    (logits,) = model(ids.numpy())
    np.testing.assert_allclose(logits, eager, atol=1e-4, rtol=0)



def test_align_checks_a_prefill_and_a_decode_step(lm, capsys):
    from compiler.cli import main

    _, model = lm
    assert main(["align", str(model.path)]) == 0
    out = capsys.readouterr().out
    assert "== decode step (1 token after 8 cached)" in out
    assert out.count("OK: every compared value is within its threshold") == 2
