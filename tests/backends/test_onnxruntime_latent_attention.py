"""DeepSeek-V2/V3 multi-head latent attention (transformers' own classes, tiny random configs,
every layer dense so attention is what is tested): each layer's attention fuses into one
`latent_attention` (V2's complex rotary and V3's interleaved one before it alike), and the model
compiled for onnxruntime with a dynamic sequence matches eager at two lengths."""

from __future__ import annotations

import pytest
import torch

import backends
import compiler
import runtime
from compiler.config import load_config
from compiler.driver import lower_and_write
from compiler.ir import parse_ir
from compiler.log import SILENT

transformers = pytest.importorskip("transformers")

LAYERS = 1


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def _model(version: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config_class, model_class = {
        "v2": (transformers.DeepseekV2Config, transformers.DeepseekV2ForCausalLM),
        "v3": (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM)}[version]
    config = config_class(vocab_size=128, hidden_size=64, intermediate_size=96,
                          num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=4,
                          q_lora_rank=None if version == "v2" else 24, kv_lora_rank=16,
                          qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12,
                          first_k_dense_replace=LAYERS, max_position_embeddings=128)
    return _Logits(model_class(config).eval())


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_mla_fuses_and_matches_eager_on_onnxruntime(version, tmp_path):
    model = _model(version)
    ids = torch.randint(0, 128, (1, 8))
    seq = torch.export.Dim("seq", min=2, max=64)
    graph = compiler.export(model, (ids,), ({1: seq},))
    path = lower_and_write(graph, tmp_path / f"{version}.dz", backends.get("onnxruntime"),
                           load_config(None), passes=None, dump_ir=None, force=False, log=SILENT)
    ops = [n.op for n in parse_ir((path / "graph.dzir").read_text()).nodes]  # as compiled
    assert ops.count("latent_attention") == LAYERS, ops
    assert "scaled_dot_product_attention" not in ops and "multi_head_attention" not in ops
    loaded = runtime.load(path)
    for length in (5, 19):
        x = torch.randint(0, 128, (1, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            want = model(x).numpy()
        got = loaded(x.numpy())[0]
        assert got.shape == want.shape
        assert abs(got - want).max() <= 1e-5 * max(1.0, abs(want).max())
