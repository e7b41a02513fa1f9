"""Expert loops over `split(counts.tolist())` (JetMoE's form) become one grouped_matmul.

torch.export traces the split with unbacked sizes no IR type can hold; the rewrite in
compiler/frontend/ragged_experts.py turns the split, the per-expert products and their cat into
`dayzero::grouped_mm`, which converts to `grouped_matmul`. Checked on a module written here (mm
and linear forms, a dynamic token count, empty experts) and on transformers' JetMoE with a tiny
config, against eager; a split whose parts are used another way is still reported.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.export import Dim

import compiler
import runtime
from compiler.errors import DayzeroError
from compiler.hf_models import wrap_pretrained
from tests.numerics import assert_fp32_close

EXPERTS, HIDDEN, OUT = 4, 16, 24


class SplitExperts(torch.nn.Module):
    """Tokens sorted by their expert, split by the counts, each block times its expert."""

    def __init__(self, form: str):
        super().__init__()
        self.form = form
        self.router = torch.nn.Linear(HIDDEN, EXPERTS)
        self.weight = torch.nn.Parameter(torch.randn(EXPERTS, OUT, HIDDEN) / 4)

    def forward(self, x):
        choice = self.router(x).argmax(-1)
        counts = torch.nn.functional.one_hot(choice, EXPERTS).sum(0)
        order = choice.argsort(stable=True)
        parts = x[order].split(counts.tolist(), dim=0)
        if self.form == "linear":
            outs = [torch.nn.functional.linear(parts[i], self.weight[i]) for i in range(EXPERTS)]
        elif self.form == "mm":
            outs = [parts[i] @ self.weight[i].t() for i in range(EXPERTS)]
        else:  # the parts summed: no product to group
            return torch.stack([p.sum(0) for p in parts])
        grouped = torch.cat(outs, dim=0)
        return torch.zeros(x.shape[0], OUT).index_add(0, order, grouped)


@pytest.mark.parametrize("form", ["linear", "mm"])
def test_a_split_by_counts_expert_loop_compiles_and_matches_eager(form, tmp_path):
    torch.manual_seed(0)
    model = SplitExperts(form).eval()
    x = torch.randn(12, HIDDEN)
    path = compiler.compile(model, (x,), tmp_path / "m.dz",
                            dynamic_shapes=({0: Dim("tokens", min=2, max=64)},))
    assert "grouped_matmul" in (path / "graph.dzir").read_text()
    loaded = runtime.load(path)
    for tokens in (2, 5, 12, 33):
        x = torch.randn(tokens, HIDDEN)
        x[0, 0] = float("nan") if tokens == 5 else x[0, 0]
        with torch.no_grad():
            want = model(x).numpy()
        if tokens == 2:  # two tokens: most experts get none (empty blocks)
            assert (np.bincount(model.router(x).argmax(-1).numpy(), minlength=4) == 0).any()
        assert_fp32_close(loaded(x.numpy())[0], want)


def test_a_split_used_another_way_is_reported_as_data_dependent(tmp_path):
    model = SplitExperts("sum").eval()
    with pytest.raises(DayzeroError, match="data-dependent|_local_scalar_dense"):
        compiler.compile(model, (torch.randn(12, HIDDEN),), tmp_path / "m.dz",
                         dynamic_shapes=({0: Dim("tokens", min=2, max=64)},))


def test_jetmoe_compiles_and_matches_eager(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("jetmoe", hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, kv_channels=16, intermediate_size=64,
                                  num_local_experts=4, num_experts_per_tok=2, vocab_size=128)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config).eval()
    module, inputs = wrap_pretrained(hf, {"input_ids": torch.randint(0, 128, (1, 8))}, "jetmoe")
    path = compiler.compile(module, inputs, tmp_path / "m.dz",
                            dynamic_shapes=({1: Dim("seq", max=64)},))
    loaded = runtime.load(path)
    for length in (3, 13):
        ids = torch.randint(0, 128, (1, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            want = hf(ids).logits.numpy()
        assert_fp32_close(loaded(ids.numpy())[0], want)
