"""Sliding-window and softcapped attention from transformers' decoders, end to end.

Mistral (sdpa) builds `kv > q - sliding_window and kv <= q` as a bool mask; Gemma 2 (eager: its
sdpa path is refused by transformers because sdpa has no softcapping) alternates sliding and
full layers and softcaps its logits, `tanh(scores / 50) * 50`, as matmul/softmax ops. Phi-3
(sdpa) concatenates its rotated heads with an empty pass-through part. After the onnxruntime
pipeline every attention is one multi_head_attention with is_causal=true, the window and softcap
as attributes and no mask left in the graph; compiled artifacts match transformers.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (no CUDA here)

import pytest  # noqa: E402
import torch  # noqa: E402

import compiler  # noqa: E402
import runtime  # noqa: E402
from backends import get as get_backend  # noqa: E402
from passes import PassManager  # noqa: E402

transformers = pytest.importorskip("transformers")

SIZES = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=256)
# model -> (config, attention implementation, (window, softcap) of each layer)
MODELS = {
    "mistral": (lambda: transformers.MistralConfig(**SIZES, sliding_window=4), "sdpa",
                [(4, None), (4, None)]),
    "gemma2": (lambda: transformers.Gemma2Config(**SIZES, head_dim=16, sliding_window=4,
                                                 attn_logit_softcapping=50.0,
                                                 final_logit_softcapping=30.0), "eager",
               [(4, 50.0), (None, 50.0)]),
    "phi3": (lambda: transformers.Phi3Config(**SIZES, pad_token_id=0), "sdpa",
             [(None, None), (None, None)]),
}
CLASSES = {"mistral": "MistralForCausalLM", "gemma2": "Gemma2ForCausalLM",
           "phi3": "Phi3ForCausalLM"}


class _Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def _model(name: str) -> torch.nn.Module:
    make_config, implementation, _ = MODELS[name]
    config = make_config()
    config._attn_implementation = implementation
    torch.manual_seed(0)
    return _Logits(getattr(transformers, CLASSES[name])(config).eval())


IDS = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))


def _dynamic():
    return ({1: torch.export.Dim("seq", min=2, max=64)},)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_attention_is_one_causal_multi_head_attention_without_a_mask(name):
    model = _model(name)
    graph = PassManager(get_backend("onnxruntime").default_pipeline).run(
        compiler.export(model, (IDS,), _dynamic()))
    attention = [n for n in graph.nodes if n.op == "multi_head_attention"]
    assert [(n.attrs["window"], n.attrs["softcap"]) for n in attention] == MODELS[name][2]
    assert all(n.attrs["is_causal"] and n.inputs[5] is None for n in attention)
    assert not [n for n in graph.nodes if n.op in ("scaled_dot_product_attention", "softmax",
                                                   "tanh") and n.outputs[0].type.rank == 4]
    seq = graph.inputs[0].shape[1]
    squares = [n for n in graph.nodes for v in n.outputs
               if v.type.rank >= 2 and v.shape[-2:] == (seq, seq)]
    assert squares == []  # no [.., S, S] mask (or score) tensor is left


@pytest.mark.parametrize("name, backend", [(name, backend) for name in ("gemma2", "mistral", "phi3")
                                           for backend in ("onnxruntime", "reference")]
                         + [("mistral", "triton")])  # the flash kernel's window, interpreted
def test_compiled_artifact_matches_transformers(name, backend, tmp_path):
    """At 3 tokens (inside the window) and 11 (past it)."""
    model = _model(name)
    path = compiler.compile(model, (IDS,), tmp_path / f"{name}.dz", backend=backend,
                            dynamic_shapes=_dynamic())
    if backend == "onnxruntime":
        lowering = json.loads((path / "backend" / "lowering.json").read_text())
        windowed = any(w is not None or c is not None for w, c in MODELS[name][2])
        # CausalAttention has neither window nor softcap: GroupQueryAttention takes them
        kernel = "GroupQueryAttention" if windowed else "CausalAttention"
        assert any(kernel in v for v in lowering["variants"]), lowering["variants"]
    loaded = runtime.load(path)
    for length in (3, 11):
        x = torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            want = model(x).numpy()
        got = loaded(x.numpy())[0]
        assert abs(got - want).max() <= 1e-4 * max(1.0, abs(want).max())
