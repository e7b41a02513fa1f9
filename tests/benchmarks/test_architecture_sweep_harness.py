"""benchmarks/architecture_sweep.py's bookkeeping (not its compiles): the generic config shrinking,
outcome classification, the child's result line, the report, and the docs/ops.md section that
`python -m compiler.frontend.opdoc` must keep."""

from __future__ import annotations

import pytest

from benchmarks.shrink_config import kv_heads, shrink, small_value
from compiler.errors import DayzeroError
from compiler.frontend import opdoc
from compiler.frontend.fx_to_ir import UnsupportedOpsError
from tests.benchmarks.scripts import benchmark_script


@pytest.fixture(scope="module")
def sw():
    with benchmark_script("architecture_sweep") as module:
        yield module


def test_the_mappings_are_enumerated_and_selected_by_name(sw):
    archs = sw.architectures()
    names = {a.name for a in archs}
    assert {"causal-lm/llama", "masked-lm/bert", "image-classification/vit"} <= names
    assert {a.mapping for a in archs} == set(sw.MAPPINGS)
    deit = sw.select(archs, "image-classification/deit", None)  # the first of two classes
    assert [a.cls for a in deit] == ["DeiTForImageClassification"]
    picked = sw.select(archs, "llama,BertForMaskedLM,image-classification/vit", None)
    assert [a.cls for a in picked] == ["LlamaForCausalLM", "BertForMaskedLM",
                                       "ViTForImageClassification"]
    assert len(sw.select(archs, None, 3)) == 3
    with pytest.raises(SystemExit, match="no architecture named lama"):
        sw.select(archs, "llama,lama", None)


def test_shrinking_is_one_table_applied_to_every_config(sw):
    from transformers import CLIPConfig, GPT2Config, MistralConfig, ResNetConfig

    mistral = shrink(MistralConfig())
    assert (mistral.hidden_size, mistral.num_hidden_layers, mistral.num_attention_heads,
            mistral.num_key_value_heads, mistral.intermediate_size, mistral.vocab_size) == \
        (64, 2, 4, 2, 128, 512)  # grouped stays grouped: 2 KV heads dividing 4
    gpt2 = shrink(GPT2Config())
    assert (gpt2.n_embd, gpt2.n_layer, gpt2.n_head) == (64, 2, 4)
    assert gpt2.eos_token_id < 512 and gpt2.bos_token_id < 512  # 50256 would not embed
    clip = shrink(CLIPConfig())  # nested sub-configs alike
    assert clip.text_config.hidden_size == clip.vision_config.hidden_size == 64
    assert (clip.vision_config.image_size, clip.vision_config.patch_size) == (64, 8)
    resnet = shrink(ResNetConfig())
    assert list(resnet.hidden_sizes) == [16, 32, 64, 128] and list(resnet.depths) == [1] * 4


def test_experts_kv_heads_and_per_layer_lists(sw):
    from transformers import DeepseekV3Config, FalconConfig, Gemma3TextConfig, MixtralConfig

    mixtral = shrink(MixtralConfig())
    assert (mixtral.num_local_experts, mixtral.num_experts_per_tok) == (4, 2)
    deepseek = shrink(DeepseekV3Config())
    assert (deepseek.n_routed_experts, deepseek.n_group, deepseek.topk_group) == (4, 1, 1)
    assert deepseek.qk_rope_head_dim == deepseek.head_dim == 16
    gemma3 = shrink(Gemma3TextConfig())  # five sliding layers, then a full one
    assert gemma3.layer_types == ["sliding_attention", "full_attention"]
    falcon = shrink(FalconConfig())
    assert falcon.multi_query and falcon.num_attention_heads == 4  # multi-query stays
    # one KV head stays one; as many as the heads stays as many; grouped becomes 2 of 4
    assert [kv_heads(kv, 32) for kv in (1, 8, 32)] == [1, 2, 4]


def test_a_value_outside_the_table_or_unset_is_kept(sw):
    assert small_value("rms_norm_eps", 1e-6) == 1e-6
    assert small_value("n_inner", None) is None  # optional parts stay off
    assert small_value("num_experts_per_tok", None) == 2  # but a router needs its top-k
    assert small_value("use_cache", True) is True
    assert small_value("image_size", [224, 224]) == [64, 64]


def test_compare_scales_the_tolerance_and_requires_nans_in_place(sw):
    import numpy as np

    want = np.array([[100.0, -3.0]])
    assert sw.compare(want + 0.09, want) == (True, pytest.approx(0.09))  # 1e-3 x 100
    assert not sw.compare(want + 0.11, want)[0]
    assert sw.compare(np.array([0.0009]), np.array([0.0]))[0]  # scale at least 1
    assert not sw.compare(np.array([0.0011]), np.array([0.0]))[0]
    assert not sw.compare(np.zeros((1, 3)), np.zeros((1, 2)))[0]
    nan = np.array([np.nan, 1.0])
    assert sw.compare(nan, nan)[0] and not sw.compare(np.array([0.0, 1.0]), nan)[0]
    assert sw.compare(np.array([np.inf]), np.array([np.inf]))[0]


def test_compile_errors_are_grouped_by_op_or_first_line(sw):
    unsupported = UnsupportedOpsError("2 problem(s)", "model M", "add a converter",
                                      {"aten.sort.default": 2, "aten.histc.default": 1})
    assert sw.compile_cause(unsupported) == \
        "unsupported: aten.histc.default, aten.sort.default"
    a = sw.compile_cause(DayzeroError("node 'add_17' has 3 inputs\nmore", "x", "y"))
    b = sw.compile_cause(DayzeroError("node 'mul_2' has 4 inputs"))
    assert a == b == "DayzeroError: node '...' has N inputs"


def test_the_childs_result_line_or_how_it_died(sw):
    arch = sw.Arch("causal-lm", "llama", "LlamaForCausalLM")
    line = sw.RESULT_TAG + '{"arch": "causal-lm/llama", "cls": "LlamaForCausalLM", ' \
        '"outcome": "mismatch", "cause": "c", "max_diff": 0.5, "seconds": 1.0}'
    got = sw.parse_result(arch, 0, f"noise\n{line}\n", "", 7.5)
    assert (got.outcome, got.max_diff, got.seconds) == ("mismatch", 0.5, 7.5)
    died = sw.parse_result(arch, -11, "", "Traceback\nSegfault here\n", 2.0)
    assert died.outcome == "compile error"
    assert died.cause == "process died (exit status -11): Segfault here"


def test_a_child_over_its_time_limit_is_a_timeout(sw):
    got = sw.run_isolated(sw.Arch("causal-lm", "llama", "LlamaForCausalLM"), timeout=0.05)
    assert got.outcome == "timeout" and got.cause == "over 0.05 s"


def _results(sw):
    R = sw.Result
    return [R("causal-lm/llama", "LlamaForCausalLM", "match", max_diff=1e-6),
            R("causal-lm/mixtral", "MixtralForCausalLM", "compile error", "unsupported: aten.sort"),
            R("causal-lm/qwen2_moe", "Qwen2MoeForCausalLM", "compile error",
              "unsupported: aten.sort"),
            R("causal-lm/xlm", "XLMWithLMHeadModel", "mismatch", "max |diff| 3 at size 13"),
            R("masked-lm/bert", "BertForMaskedLM", "match"),
            R("masked-lm/odd", "OddForMaskedLM", "no eager", "config"),
            R("image-classification/vit", "ViTForImageClassification", "timeout", "over 9 s")]


def test_counts_rate_and_failures_by_cause(sw):
    results = _results(sw)
    counts = sw.counts(results)
    assert counts["causal-lm"] == {"match": 1, "compile error": 2, "mismatch": 1}
    assert counts["all"]["match"] == 2 and sum(counts["all"].values()) == 7
    assert sw.match_rate(results) == (2, 6)  # "no eager" is not counted against dayzero
    groups = sw.failures_by_cause(results)
    assert list(groups)[0] == "compile error: unsupported: aten.sort"
    assert [r.cls for r in groups["compile error: unsupported: aten.sort"]] == \
        ["MixtralForCausalLM", "Qwen2MoeForCausalLM"]
    text = sw.report(results)
    assert "| all | 2 | 1 | 2 | 1 | 1 | 7 |" in text
    assert "2 of 6 architectures that run eagerly (33.3%)" in text


def test_the_docs_section_survives_opdoc_and_replaces_itself(sw):
    doc = sw.DOC.read_text()
    if sw.BEGIN in doc:  # start from the document without a sweep section
        head, rest = doc.split(sw.BEGIN, 1)
        doc = head.rstrip("\n") + "\n" + rest.split(sw.END, 1)[1].lstrip("\n")
    results = _results(sw)
    command = sw.recorded_command(["--only", "llama,vit", "--json", "/tmp/r.jsonl",
                                   "--write-docs", "--timeout", "9"])
    assert command == "python benchmarks/architecture_sweep.py --only llama,vit --timeout 9"
    section = sw.docs_section(results, command, 289)
    assert "7 of the 289 architectures" in section and "reran" not in section
    rerun = sw.docs_section(results, command, 289, rerun="sweep.jsonl")
    assert "--timeout 9` with transformers" in rerun
    assert "(reran those `--only` names; the other rows are sweep.jsonl's)" in rerun
    assert section.startswith(sw.BEGIN) and section.endswith(sw.END)
    assert "| causal-lm/mixtral | MixtralForCausalLM | compile error | unsupported: aten.sort |" \
        in section
    written = sw.write_docs(doc, section)
    assert written.startswith(doc.rstrip("\n")) and written.count(sw.BEGIN) == 1
    # opdoc regenerates only its own markers: the sweep table stays, and --check stays clean
    assert opdoc.update(written) == sw.write_docs(opdoc.update(doc), section)
    assert opdoc.BEGIN in written and opdoc.END in written
    # a second sweep replaces the table in place, keeping the op tables
    again = sw.write_docs(written, sw.docs_section(results[:1], "python x", 1))
    assert again.count(sw.BEGIN) == 1 and "MixtralForCausalLM" not in again
    assert opdoc.render() in again


def test_zero_initialized_matrices_get_random_values(sw):
    """AFMoE zero-inits its router gate: every expert scores alike, topk's choice among equal
    scores is unspecified, and the sweep compared tie-breaking (a mismatch on onnxruntime)."""
    import torch
    from transformers import AfmoeConfig, AfmoeForCausalLM

    torch.manual_seed(0)
    model = AfmoeForCausalLM(shrink(AfmoeConfig())).eval()
    gate = model.model.layers[1].mlp.router.gate.weight
    bias = model.model.layers[1].mlp.expert_bias
    assert not gate.any()
    names = sw.randomize_zero_matrices(model)
    assert "model.layers.1.mlp.router.gate.weight" in names
    assert gate.any() and 0.01 < float(gate.std()) < 0.04
    assert not bias.any()  # vectors keep their init
    scores = torch.sigmoid(model.model.layers[1].mlp.router.gate(torch.randn(8, 64)))
    assert len(set(scores.flatten().tolist())) == scores.numel()  # no ties left to break


def test_unset_expert_counts_are_set_where_the_default_does_not_build(sw):
    """dots.llm1's default config leaves its routed and shared experts None and does not build
    (torch.empty(None, ...)); Gemma 4's unset num_experts means dense and stays so."""
    import torch
    from transformers import Dots1Config, Dots1ForCausalLM, Gemma4TextConfig

    dots = shrink(Dots1Config())
    assert (dots.n_routed_experts, dots.n_shared_experts, dots.num_experts_per_tok) == (4, 1, 2)
    model = Dots1ForCausalLM(dots).eval()
    with torch.no_grad():
        assert model(torch.randint(0, 512, (1, 8))).logits.shape == (1, 8, 512)
    assert shrink(Gemma4TextConfig()).num_experts is None


def test_ernie_moe_top_k_fits_the_shrunk_experts(sw):
    """ERNIE 4.5 MoE names its top-k `moe_k` (6 by default): 6 of 4 shrunk experts made topk
    fail in eager ('selected index k out of range'), so the sweep skipped an MoE model."""
    import torch
    from transformers import Ernie4_5_MoeConfig, Ernie4_5_MoeForCausalLM

    config = shrink(Ernie4_5_MoeConfig())
    assert (config.moe_num_experts, config.moe_k, config.moe_num_shared_experts) == (4, 2, 1)
    model = Ernie4_5_MoeForCausalLM(config).eval()
    with torch.no_grad():
        assert model(torch.randint(0, 512, (1, 8))).logits.shape == (1, 8, 512)


def test_the_compared_sizes_are_the_static_sizes(sw, monkeypatch, tmp_path):
    """A model without a dynamic sequence graph (Falcon-Mamba) is compiled at static sizes and
    runs exact sizes only; by default those were 8 and powers of two, so the comparison at 13 was
    refused ('this artifact runs seq = 4, 8, 16, 32 only'). The sweep names the sizes it runs."""
    import compiler

    seen = {}

    def fake_compile(module, values, **options):
        seen.update(options)
        raise RuntimeError("stop here")

    monkeypatch.setattr(compiler, "compile", fake_compile)
    (arch,) = sw.select(sw.architectures(), "causal-lm/gpt2", None)
    result = sw.check_architecture(arch, tmp_path)
    assert result.outcome == "compile error" and "stop here" in result.cause
    assert seen["static_sizes"] == list(sw.SEQ_LENGTHS) and seen["dynamic_shapes"] is not None


def test_an_unset_head_dim_is_the_derived_one(sw):
    """Hunyuan's default leaves head_dim None and its attention computes None ** -0.5 (dense and
    MoE did not run eagerly); Mixtral derives the same 16 from hidden 64 / 4 heads."""
    import torch
    from transformers import HunYuanMoEV1Config, HunYuanMoEV1ForCausalLM, MixtralConfig

    config = shrink(HunYuanMoEV1Config())
    assert config.head_dim == 16 == config.hidden_size // config.num_attention_heads
    assert shrink(MixtralConfig()).head_dim == 16
    model = HunYuanMoEV1ForCausalLM(config).eval()
    with torch.no_grad():
        assert model(torch.randint(0, 512, (1, 8))).logits.shape == (1, 8, 512)


def test_state_space_heads_span_the_expanded_width(sw):
    """Mamba2 validates hidden x expand == heads x head_dim: 4 heads of 16 against 64 x 2 did
    not build ('Inconsistent configuration'), so Mamba2 counted as 'no eager'."""
    import torch
    from transformers import Mamba2Config, Mamba2ForCausalLM

    config = shrink(Mamba2Config())
    assert (config.hidden_size, config.expand, config.head_dim, config.num_heads) == (64, 2, 16, 8)
    model = Mamba2ForCausalLM(config).eval()
    with torch.no_grad():
        assert model(torch.randint(0, 512, (1, 8))).logits.shape == (1, 8, 512)


def test_a_resumed_sweep_runs_what_is_missing_or_named_and_reports_on_all(sw, tmp_path,
                                                                          monkeypatch):
    path = tmp_path / "r.jsonl"
    assert sw.recorded_results(path) == {}
    results = _results(sw)
    with path.open("w") as f:
        for r in results[:3]:
            f.write(sw.json.dumps(sw.asdict(r)) + "\n")
        f.write(sw.json.dumps(sw.asdict(sw.Result("causal-lm/llama", "LlamaForCausalLM",
                                                  "mismatch", "later"))) + "\n")
    recorded = sw.recorded_results(path)
    assert list(recorded) == ["causal-lm/llama", "causal-lm/mixtral", "causal-lm/qwen2_moe"]
    assert recorded["causal-lm/llama"].cause == "later"  # the latest line wins
    archs = sw.select(sw.architectures(), "llama,mixtral,masked-lm/bert", None)
    assert [a.name for a in sw.to_run(archs, recorded, None)] == ["masked-lm/bert"]
    assert sw.to_run(archs, recorded, "llama,mixtral,masked-lm/bert") == archs
    ran = []

    def fake_sweep(archs, timeout, jobs, progress):
        out = [sw.Result(a.name, a.cls, "match") for a in archs]
        ran.extend(a.name for a in archs)
        for r in out:
            progress(r)
        return out

    monkeypatch.setattr(sw, "sweep", fake_sweep)
    assert sw.main(["--only", "mixtral,masked-lm/bert", "--resume", str(path)]) == 0
    assert ran == ["causal-lm/mixtral", "masked-lm/bert"]
    latest = sw.recorded_results(path)
    assert {k: r.outcome for k, r in latest.items()} == {
        "causal-lm/llama": "mismatch", "causal-lm/mixtral": "match",
        "causal-lm/qwen2_moe": "compile error", "masked-lm/bert": "match"}
