"""Mixture-of-experts models end to end: transformers' own classes with tiny configs (hidden 64,
2 layers, 4 experts, top-2), compiled with a dynamic sequence length on onnxruntime and reference
and compared with eager at two lengths (Mixtral on triton too, with onnxruntime for the ops
Triton lacks). On onnxruntime the MoE blocks that the `moe` rule
recognises run as com.microsoft.MoE (only the chosen experts are computed); GPT-OSS's clamped,
interleaved SwiGLU is not a form `moe` expresses, so it runs as the primitive ops."""

from __future__ import annotations

import onnx
import pytest
import torch
from torch.export import Dim
from transformers import AutoConfig, AutoModelForCausalLM

import backends.triton  # noqa: F401  (turns on Triton's interpreter before any export)
import compiler
import runtime
from compiler.hf_models import wrap_pretrained
from tests.numerics import assert_fp32_close
from tests.sweeps import sweep

TINY = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128)
EXPERTS = dict(num_local_experts=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
               shared_expert_intermediate_size=64)

# model type -> MoE blocks fused into `moe` (one per layer), or 0 where the form is not one
MODELS = {"mixtral": 2, "qwen2_moe": 2, "qwen3_moe": 2, "olmoe": 2, "granitemoe": 2,
          "gpt_oss": 0}


def tiny_moe(model_type: str) -> torch.nn.Module:
    config = AutoConfig.for_model(model_type, **TINY)
    for key, value in EXPERTS.items():
        if hasattr(config, key):
            setattr(config, key, value)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def compile_tiny(model_type: str, backend: str, out):
    hf = tiny_moe(model_type)
    module, inputs = wrap_pretrained(hf, {"input_ids": torch.randint(0, 128, (1, 8))}, model_type)
    compiler.compile(module, inputs, out, backend=backend,
                     fallback="onnxruntime" if backend == "triton" else None,
                     dynamic_shapes=({1: Dim("seq", max=64)},))
    return hf, runtime.load(out)


def assert_matches_eager(hf, model, seqs=(5, 13)) -> None:
    for seq in seqs:
        ids = torch.randint(0, 128, (1, seq), generator=torch.Generator().manual_seed(seq))
        with torch.no_grad():
            want = hf(input_ids=ids, use_cache=False).logits
        assert_fp32_close(model(ids)[0], want, what=f"logits at seq {seq}")


# Each case exports a 2-layer model (about 15 s of CPU): CI runs these and a fixed sample of the
# rest, `pytest --sweep` all of them; triton (its interpreter, about a minute) only then.
ALWAYS = {"onnxruntime-mixtral", "onnxruntime-gpt_oss", "reference-mixtral"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" in metafunc.fixturenames:
        cases = [f"{backend}-{name}" for backend in ("onnxruntime", "reference")
                 for name in sorted(MODELS)]
        cases = sweep(metafunc.config, cases, str, always=ALWAYS)
        if metafunc.config.getoption("sweep"):
            cases.append("triton-mixtral")
        metafunc.parametrize("case", cases)


def test_moe_model_matches_eager(case, tmp_path):
    backend, model_type = case.split("-", 1)
    hf, model = compile_tiny(model_type, backend, tmp_path / "m.dz")
    assert_matches_eager(hf, model)
    if backend == "onnxruntime":
        onnx_model = onnx.load(str(tmp_path / "m.dz" / "backend" / "model.onnx"),
                               load_external_data=False)
        kernels = [(n.domain, n.op_type) for n in onnx_model.graph.node]
        assert kernels.count(("com.microsoft", "MoE")) == MODELS[model_type]
