"""Hugging Face models as `from_pretrained` returns them: a SPEC returns the PreTrainedModel and
its inputs (a tuple, or a dict by the forward's names) and dayzero wraps it itself; a SPEC file
imports the modules next to it."""

from __future__ import annotations

import textwrap
from pathlib import Path

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


def vit():
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                    intermediate_size=64, image_size=32, patch_size=8, num_labels=5)
    pixels = torch.randn(1, 3, 32, 32)
    return ViTForImageClassification(cfg).eval(), {"pixel_values": pixels}


def llava():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(EXAMPLES)))
    import llava as example

    torch.manual_seed(0)
    hf = example.LlavaForConditionalGeneration(example.config()).eval()
    inputs = {"input_ids": example.prompt(), "pixel_values": example.image()}
    seq = Dim("seq", min=example.IMAGE_TOKENS + 1, max=example.MAX_SEQ)
    return hf, inputs, {"input_ids": {1: seq}, "pixel_values": None}


def misnamed():
    model, inputs, _ = llama()
    return model, {"ids": inputs["input_ids"]}
'''


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf_spec")
    (folder / "sizes.py").write_text("SEQ = 6\n")
    (folder / "models.py").write_text(textwrap.dedent(SPEC).replace(
        "EXAMPLES", repr(str(Path(__file__).resolve().parents[2] / "examples"))))
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


def test_a_vision_classifier_as_it_is_returns_its_logits(spec_file, tmp_path):
    out = tmp_path / "vit.dz"
    assert main(["compile", f"{spec_file}:vit", "-o", str(out)]) == 0
    model = runtime.load(out)
    assert [str(s) for s in model.input_specs] == ["pixel_values: f32[1, 3, 32, 32]"]
    spec = load_spec(f"{spec_file}:vit")
    for seed in (0, 1):
        pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            want = spec.module.model(pixel_values=pixels).logits
        assert_fp32_close(model(pixels)[0], want, what=f"logits of image {seed}")


def test_a_multimodal_generator_as_it_is_returns_its_logits(spec_file, tmp_path):
    """LLaVA as from_pretrained returns it: text and image inputs by their forward names, the
    prompt length dynamic, the image features placed at the image tokens."""
    out = tmp_path / "llava.dz"
    assert main(["compile", f"{spec_file}:llava", "-o", str(out)]) == 0
    model = runtime.load(out)
    assert [s.name for s in model.input_specs] == ["input_ids", "pixel_values"]
    spec = load_spec(f"{spec_file}:llava")
    hf = spec.module.model
    ids, pixels = spec.example_inputs
    for extra in (0, 9):
        longer = torch.cat([ids, torch.randint(0, 100, (1, extra))], dim=1)
        with torch.no_grad():
            want = hf(input_ids=longer, pixel_values=pixels, use_cache=False).logits
        assert_fp32_close(model(longer, pixels)[0], want, what=f"logits with {extra} more tokens")
