"""A fixed sample of benchmarks/architecture_sweep.py, run in CI: transformers architectures of
every family the sweep covers (decoders with MHA, GQA and MQA, learned and rotary positions,
encoders, ViT-style and convolutional image classifiers), each built from the sweep's generically
shrunk default config and compiled on onnxruntime through the sweep's own `check_architecture`,
so this sample and `python benchmarks/architecture_sweep.py` cannot disagree on what "matches"
means. The whole sweep (every architecture, minutes each on two cores) runs on request."""

from __future__ import annotations

import pytest

from tests.benchmarks.scripts import benchmark_script

SAMPLE = [
    "causal-lm/llama", "causal-lm/gpt2", "causal-lm/qwen2", "causal-lm/mistral",
    "causal-lm/phi3", "causal-lm/gemma", "causal-lm/gpt_neox", "causal-lm/opt",
    "causal-lm/falcon", "causal-lm/mpt", "masked-lm/bert", "masked-lm/roberta",
    "masked-lm/distilbert",
    "image-classification/vit", "image-classification/deit", "image-classification/resnet",
]


@pytest.fixture(scope="module")
def sweep():
    with benchmark_script("architecture_sweep") as module:
        yield module


@pytest.mark.parametrize("name", SAMPLE)
def test_architecture_compiles_and_matches_eager(sweep, name, tmp_path):
    (arch,) = sweep.select(sweep.architectures(), name, None)
    result = sweep.check_architecture(arch, tmp_path)
    assert result.outcome == "match", f"{name} ({arch.cls}): {result.outcome}: {result.cause}"
