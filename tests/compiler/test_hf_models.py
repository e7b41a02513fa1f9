"""Hugging Face models as `from_pretrained` returns them: a SPEC returns the PreTrainedModel and
its inputs (a tuple, or a dict by the forward's names) and dayzero wraps it itself; a SPEC file
imports the modules next to it."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch

import runtime
from compiler.cli import main
from compiler.errors import DayzeroError
from compiler.spec import load_spec
from tests.numerics import assert_fp32_close

SPEC = '''
import torch
from torch.export import Dim
from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

from sizes import SEQ  # a module next to this file


def llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, vocab_size=100)
    ids = torch.randint(0, 100, (1, SEQ))
    return LlamaForCausalLM(cfg), {"input_ids": ids}, {"input_ids": {1: Dim("seq", max=32)}}


def bert():
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                     intermediate_size=64, vocab_size=100)
    ids = torch.randint(0, 100, (1, SEQ))
    return BertModel(cfg), (ids, torch.ones(1, SEQ, dtype=torch.long))


def misnamed():
    model, inputs, _ = llama()
    return model, {"ids": inputs["input_ids"]}
'''


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf_spec")
    (folder / "sizes.py").write_text("SEQ = 6\n")
    (folder / "models.py").write_text(textwrap.dedent(SPEC))
    return folder / "models.py"


def test_a_causal_lm_as_it_is_compiles_with_its_names_and_dims(spec_file, tmp_path):
    out = tmp_path / "llama.dz"
    assert main(["compile", f"{spec_file}:llama", "-o", str(out)]) == 0
    model = runtime.load(out)
    assert [str(s) for s in model.input_specs] == ["input_ids: i64[1, s0]"]
    spec = load_spec(f"{spec_file}:llama")
    hf = spec.module.model
    for seq in (3, 6, 17):
        ids = torch.randint(0, 100, (1, seq), generator=torch.Generator().manual_seed(seq))
        with torch.no_grad():
            want = hf(input_ids=ids, use_cache=False).logits
        assert_fp32_close(model(ids)[0], want, what=f"logits at seq {seq}")


def test_an_encoder_as_it_is_returns_its_last_hidden_state(spec_file, tmp_path):
    out = tmp_path / "bert.dz"
    assert main(["compile", f"{spec_file}:bert", "-o", str(out)]) == 0
    model = runtime.load(out)
    assert [s.name for s in model.input_specs] == ["input_ids", "attention_mask"]
    spec = load_spec(f"{spec_file}:bert")
    ids, mask = spec.example_inputs
    with torch.no_grad():
        want = spec.module.model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert_fp32_close(model(ids, mask)[0], want)
    assert np.shape(model(ids, mask)[0]) == (1, 6, 32)


def test_inputs_the_forward_does_not_take_are_named(spec_file):
    with pytest.raises(DayzeroError, match=r"forward takes no input\(s\) \['ids'\]"):
        load_spec(f"{spec_file}:misnamed")
