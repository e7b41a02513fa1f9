"""derive_generation_step on IR text: a `latent_attention` block (DeepSeek's MLA) becomes
`paged_latent_attention` over pools of latents and rotary keys, positions read the step's
`positions`, and only the selected logits rows are computed."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler.errors import DayzeroError
from compiler.ir import parse_ir, print_ir, verify
from passes.derive_generation_step import DeriveGenerationStep

CASES = Path(__file__).parent / "derive_cases"


def _derive(text: str) -> str:
    graph = parse_ir(text)
    DeriveGenerationStep().run(graph)
    verify(graph)
    return print_ir(graph)


def test_a_latent_block_caches_its_latent_and_rotary_key():
    got = _derive((CASES / "latent.dzir").read_text())
    assert got == (CASES / "latent.expected.dzir").read_text()


def test_a_latent_block_that_is_not_causal_is_named():
    text = (CASES / "latent.dzir").read_text().replace("is_causal=true", "is_causal=false")
    with pytest.raises(DayzeroError, match=r"attention node %att \(latent_attention\).*"
                                           "cannot read a KV cache: it is not causal"):
        _derive(text)


def test_a_latent_step_is_not_tensor_parallel():
    from compiler.config import load_config
    from compiler.generation import generation_section

    graph = parse_ir((CASES / "latent.expected.dzir").read_text())
    section = generation_section(graph, {}, load_config(None), [2], [])
    assert section["layers"] == [[1, 16, 8, None, "latent"]]
    with pytest.raises(DayzeroError, match=r"latent attention %att_paged .*cannot split") as info:
        generation_section(graph, {}, load_config({"parallel": {"tensor_parallel": 2}}), [2], [])
    assert info.value.where == "parallel.tensor_parallel"
