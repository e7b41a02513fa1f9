"""A causal LM checkpoint folder with a tokenizer, compiled and run from the command line:
`dayzero compile CKPT` makes a generation artifact carrying the tokenizer (hashed), whose
`generate_text` (plain and chat) says what transformers says, and `dayzero generate` streams it."""

from __future__ import annotations

import json

import pytest
import torch

import runtime
from compiler.cli import main
from tests.generation.tiny_lms import checkpoint_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return root / "lm", checkpoint_folder(root / "lm")


@pytest.fixture(scope="module")
def artifact(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("art") / "lm.dz"
    assert main(["compile", str(folder[0]), "-o", str(out), "--seq-len", "2:64", "-q"]) == 0
    return out


def test_the_folder_compiles_to_a_generation_artifact_with_its_tokenizer(artifact):
    manifest = json.loads((artifact / "manifest.json").read_text())
    section = manifest["generation"]
    assert section["eos_token_ids"] == [2] and section["max_positions"] == 64
    assert "tokenizer/tokenizer.json" in manifest["files"]
    assert "tokenizer/tokenizer_config.json" in section["tokenizer"]
    assert [i["name"] for i in section["forward"]["inputs"]] == ["input_ids"]


def _transformers_text(folder, ids: list[int], new: int) -> str:
    from transformers import AutoTokenizer

    path, hf = folder
    tok = AutoTokenizer.from_pretrained(path)
    tensor = torch.tensor([ids])
    with torch.no_grad():
        out = hf.generate(tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=new,
                          do_sample=False, pad_token_id=0)
    return tok.decode(out[0, len(ids):], skip_special_tokens=True)


def test_generate_text_says_what_transformers_says(folder, artifact):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder[0])
    model = runtime.load(artifact)
    prompt = "hello world the model runs"
    ids = tok(prompt)["input_ids"]
    assert model.tokenizer.encode(prompt) == ids
    assert model.generate_text(prompt, max_new_tokens=12) == _transformers_text(folder, ids, 12)
    messages = [{"role": "user", "content": "a cat sat ?"}]
    chat_ids = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"])
    assert model.tokenizer.chat_ids(messages) == chat_ids
    assert model.generate_text(messages, max_new_tokens=12) == \
        _transformers_text(folder, chat_ids, 12)


def test_dayzero_generate_streams_text_then_speed_and_cache(artifact, capsys):
    model = runtime.load(artifact)
    want = model.generate_text("the cat sat", max_new_tokens=10)
    capsys.readouterr()
    assert main(["generate", str(artifact), "--prompt", "the cat sat",
                 "--max-new-tokens", "10"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == want.strip()
    assert "TTFT" in err and "tokens/s" in err and "KV cache" in err


def test_generate_on_a_forward_artifact_says_how_to_compile_one(folder, tmp_path, capsys):
    out = tmp_path / "fwd.dz"
    assert main(["compile", str(folder[0]), "-o", str(out), "--seq-len", "2:64", "-q",
                 "--task", "forward"]) == 0
    assert "generation" not in json.loads((out / "manifest.json").read_text())
    capsys.readouterr()
    assert main(["generate", str(out), "--prompt", "hello"]) == 1
    assert "--task text-generation" in capsys.readouterr().err


def _compiles_and_generates_as_transformers(hf, folder, seq_len: str, ids: torch.Tensor,
                                            new: int):
    """`hf`'s save_pretrained folder compiled by the CLI (text generation by default for a
    *ForCausalLM), its greedy tokens against transformers'; the artifact's path."""
    from tests.generation.test_generate_matches_transformers import (
        assert_same_greedy,
        transformers_generate,
    )

    hf.generation_config.eos_token_id = None
    hf.save_pretrained(folder / "ckpt")
    out = folder / "lm.dz"
    assert main(["compile", str(folder / "ckpt"), "-o", str(out), "--seq-len", seq_len,
                 "-q"]) == 0
    want, logits = transformers_generate(hf, ids, new)
    got = runtime.load(out).generate(ids.numpy(), max_new_tokens=new, eos_token_id=[])
    assert_same_greedy(got[0], want, logits, ids.shape[1])
    return out


@pytest.mark.parametrize("name", ["gpt2", "qwen3", "mistral", "gemma2", "phi3"])
def test_each_architecture_generates_from_its_checkpoint_folder(name, tmp_path):
    """The module tests' architectures again, as `save_pretrained` folders compiled by the CLI
    (text-generation by default for a *ForCausalLM)."""
    from tests.generation.tiny_lms import prompt, tiny_lm

    _compiles_and_generates_as_transformers(tiny_lm(name), tmp_path, "2:64", prompt(7, seed=5),
                                            16)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The MoE families of test_checkpoint_moe: CI runs Mixtral and the fixed sample."""
    if "moe_type" in metafunc.fixturenames:
        from tests.compiler.test_checkpoint_moe import HUB_NAMES
        from tests.sweeps import sweep

        metafunc.parametrize("moe_type", sweep(metafunc.config, sorted(HUB_NAMES), str,
                                               always={"mixtral"}))


def test_a_moe_checkpoint_folder_generates_with_fused_experts(moe_type, tmp_path):
    """A MoE model's save_pretrained folder (one tensor per expert) compiles by default to a
    generation artifact whose step runs the fused `moe` block, and generates what transformers
    does. Exported on the meta device, transformers counts the experts' tokens as int32 (a
    form the `moe` rule once missed, leaving the step derivation to refuse the block).
    `pytest --sweep` runs every family (Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V3)."""
    from tests.compiler.test_checkpoint_moe import tiny_moe

    hf = tiny_moe(moe_type)
    ids = torch.randint(0, hf.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(3))
    out = _compiles_and_generates_as_transformers(hf, tmp_path, "2:48", ids, 12)
    assert " = moe(" in (out / "graph.dzir").read_text()
