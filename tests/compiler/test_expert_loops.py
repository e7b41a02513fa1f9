"""Expert modules that loop over the experts a batch hit (`nonzero`, then `int(item())`) trace
as one grouped computation (compiler/frontend/expert_loops.py).

Checked on transformers' LongCat-Flash with a tiny config (identity "zero experts" included, and
routed to by the test's tokens), and on modules written here in the layouts the contract allows
(transposed stacks, interleaved gate/up, a module on the meta device); a module that follows the
contract's signature but computes something else keeps its own forward and is reported by
torch.export as before.
"""

from __future__ import annotations

import functools
import io
import json

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import compiler
import runtime
from compiler.errors import DayzeroError
from compiler.frontend.expert_loops import traceable_experts
from compiler.hf_models import wrap_pretrained
from compiler.log import StageLog
from tests.numerics import assert_fp32_close

EXPERTS, IDENTITY, HIDDEN, INNER, TOP_K = 4, 2, 16, 8, 2


class LoopExperts(torch.nn.Module):
    """The loop form of remote-code MoE models, in one of the contract's weight layouts."""

    def __init__(self, transposed=False, interleaved=False, identity=0, scale_input=False):
        super().__init__()
        self.transposed, self.interleaved, self.identity = transposed, interleaved, identity
        self.scale_input = scale_input  # computes something the contract does not say
        up = (EXPERTS + identity, 2 * INNER, HIDDEN)
        down = (EXPERTS, HIDDEN, INNER)
        if transposed:
            up, down = (up[0], up[2], up[1]), (down[0], down[2], down[1])
        self.gate_up_proj = torch.nn.Parameter(torch.randn(up) / 4)
        self.down_proj = torch.nn.Parameter(torch.randn(down) / 4)
        self.act_fn = torch.nn.SiLU()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        mask = F.one_hot(top_k_index, EXPERTS + self.identity).permute(2, 1, 0)
        for hit in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
            expert = int(hit.item())
            slot, token = torch.where(mask[expert])
            x = hidden_states[token] * (2 if self.scale_input else 1)
            if expert >= EXPERTS:
                y = x
            else:
                y = self._expert(x, expert)
            out.index_add_(0, token, y * top_k_weights[token, slot, None])
        return out

    def _expert(self, x, expert):
        up, down = self.gate_up_proj[expert], self.down_proj[expert]
        if not self.transposed:
            up, down = up.t(), down.t()
        gate_up = x @ up
        if self.interleaved:
            gate, up_part = gate_up[..., ::2], gate_up[..., 1::2]
        else:
            gate, up_part = gate_up.chunk(2, dim=-1)
        return (self.act_fn(gate) * up_part) @ down


class Block(torch.nn.Module):
    """A router in front of the experts, so the whole block exports from hidden states."""

    def __init__(self, experts: LoopExperts):
        super().__init__()
        self.router = torch.nn.Linear(HIDDEN, EXPERTS + experts.identity, bias=False)
        self.experts = experts

    def forward(self, x):
        weights, ids = self.router(x).softmax(-1).topk(TOP_K, dim=-1)
        return self.experts(x, ids, weights)


@pytest.mark.parametrize("layout", [dict(), dict(transposed=True), dict(interleaved=True),
                                    dict(identity=IDENTITY)])
def test_an_expert_loop_compiles_and_matches_eager(layout, tmp_path):
    torch.manual_seed(0)
    model = Block(LoopExperts(**layout)).eval()
    stream = io.StringIO()
    path = compiler.compile(model, (torch.randn(12, HIDDEN),), tmp_path / "m.dz",
                            dynamic_shapes=({0: Dim("tokens", min=2, max=64)},),
                            log=StageLog(stream))
    assert "1 expert loop(s) traced as transformers' grouped experts" in stream.getvalue()
    assert "grouped_matmul" in (path / "graph.dzir").read_text()
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["export_grouped_experts"] == ["experts"]  # the user is told of the swap
    loaded = runtime.load(path)
    for tokens in (2, 7, 33):
        x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(tokens))
        if tokens == 7:
            x[3, 0] = float("nan")  # stays in its own token's row, as in eager
        with torch.no_grad():
            want = model(x)
        assert_fp32_close(loaded(x.numpy())[0], want, what=f"{layout} at {tokens} tokens")


def test_a_module_the_contract_does_not_describe_keeps_its_forward(tmp_path):
    model = Block(LoopExperts(scale_input=True)).eval()
    with traceable_experts(model) as swapped:
        assert swapped == []
    with pytest.raises(DayzeroError, match="data-dependent|GuardOnDataDependent"):
        compiler.compile(model, (torch.randn(12, HIDDEN),), tmp_path / "m.dz",
                         dynamic_shapes=({0: Dim("tokens", min=2, max=64)},))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_swap_is_checked_on_meta_weights_and_undone_after_tracing(dtype):
    with torch.device("meta"):
        model = Block(LoopExperts(transposed=True, identity=IDENTITY)).to(dtype)
    with traceable_experts(model) as swapped:
        assert swapped == ["experts"]
        assert "forward" in vars(model.experts)
    assert "forward" not in vars(model.experts)
    assert all(p.device.type == "meta" and p.dtype == dtype for p in model.parameters())


def test_a_forward_the_instance_held_is_restored():
    """A hook library's wrapper set on the instance (accelerate does so) comes back."""
    model = Block(LoopExperts())
    own = model.experts.forward

    @functools.wraps(own)
    def hooked(*args, **kwargs):
        return own(*args, **kwargs)

    model.experts.forward = hooked
    with traceable_experts(model) as swapped:
        assert swapped == ["experts"] and model.experts.forward is not hooked
    assert model.experts.forward is hooked


def test_a_bfloat16_expert_loop_in_memory_is_swapped():
    torch.manual_seed(0)
    model = Block(LoopExperts(interleaved=True, identity=IDENTITY)).to(torch.bfloat16)
    with traceable_experts(model) as swapped:
        assert swapped == ["experts"]


def test_longcat_flash_with_identity_experts_compiles_and_matches_eager(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "longcat_flash", hidden_size=64, num_layers=2, num_attention_heads=4,
        num_key_value_heads=4, ffn_hidden_size=64, expert_ffn_hidden_size=32,
        n_routed_experts=EXPERTS, zero_expert_num=IDENTITY, moe_topk=TOP_K, q_lora_rank=32,
        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        head_dim=8, vocab_size=128)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config).eval()
    routed = []
    for layer in hf.model.layers:
        layer.mlp.experts.register_forward_hook(
            lambda m, args, out: routed.append(args[1].max().item()))
    module, inputs = wrap_pretrained(hf, {"input_ids": torch.randint(0, 128, (1, 8))},
                                     "longcat_flash")
    path = compiler.compile(module, inputs, tmp_path / "m.dz",
                            dynamic_shapes=({1: Dim("seq", max=64)},))
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["export_grouped_experts"] == [f"model.model.layers.{i}.mlp.experts"
                                                  for i in range(2)]
    loaded = runtime.load(path)
    for length in (3, 13):
        ids = torch.randint(0, 128, (1, length), generator=torch.Generator().manual_seed(length))
        routed.clear()
        with torch.no_grad():
            want = hf(ids, use_cache=False).logits
        assert max(routed) >= EXPERTS, "the tokens should reach an identity expert"
        assert_fp32_close(loaded(ids.numpy())[0], want, what=f"logits at seq {length}")
