"""Mixture-of-experts checkpoint folders: one tensor per expert (what save_pretrained writes and
the Hub stores) bound to transformers 5's stacked expert parameters by its own conversion
mapping, streamed expert by expert, and compared with the eager model; broken expert tensors are
one error naming the tensor and its file."""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import runtime
from compiler.checkpoint import CheckpointError, compile_checkpoint, open_checkpoint, read_layout
from compiler.checkpoint.conversion import ConversionRules, plan
from compiler.checkpoint.lazy import ShardReader
from compiler.checkpoint.lazy_converted import LazyConverted, LazyStack
from compiler.driver import compile
from compiler.ir import DType

from .checkpoint_util import index, logits, save

pytest.importorskip("transformers")

VOCAB = 64
TINY = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64)
EXPERTS = dict(num_local_experts=4, num_experts=4, n_routed_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=16, shared_expert_intermediate_size=32,
               first_k_dense_replace=0, n_group=1, topk_group=1)
# model type -> how the Hub names expert e's (gate, up, down) projections of a layer's block
HUB_NAMES = {
    "mixtral": ("block_sparse_moe", "w1", "w3", "w2"),
    "qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "qwen2_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "olmoe": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "deepseek_v3": ("mlp", "gate_proj", "up_proj", "down_proj"),
}
# onnxruntime, except DeepSeek-V3: compiled from the module in memory (no checkpoint) its
# onnxruntime artifact is 1.2e-3 off eager (the reference backend is exact), a backend matter
BACKEND = {"deepseek_v3": "reference"}


def tiny_moe(model_type: str, **sizes):
    from transformers import AutoConfig, AutoModelForCausalLM

    if model_type == "deepseek_v3":  # its latent attention has as many K/V heads as queries
        sizes.setdefault("num_key_value_heads", TINY["num_attention_heads"])
    config = AutoConfig.for_model(model_type, **{**TINY, **sizes})
    for key, value in EXPERTS.items():
        if hasattr(config, key) and key not in sizes:
            setattr(config, key, value)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def hub_layout(model, model_type: str, folder, files: int = 2):
    """The Hub's per-expert layout, written by hand (not by transformers' reverse conversion):
    each stacked [E, 2I, H] gate_up and [E, H, I] down split into E tensors per projection,
    experts dealt round-robin over `files` shards, with an index."""
    block, gate, up, down = HUB_NAMES[model_type]
    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    shard_of: dict[str, int] = {}
    for name, value in model.state_dict().items():
        value = value.detach().contiguous()
        if not name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
            hub = name.replace(".mlp.", f".{block}.") if ".mlp.gate." in name else name
            tensors[hub], shard_of[hub] = value, 0
            continue
        stem = name.rsplit(".experts.", 1)[0].replace(".mlp", f".{block}") + ".experts"
        for e in range(value.shape[0]):
            if name.endswith("gate_up_proj"):
                half = value.shape[1] // 2
                parts = {gate: value[e, :half], up: value[e, half:]}
            else:
                parts = {down: value[e]}
            for proj, part in parts.items():
                hub = f"{stem}.{e}.{proj}.weight"
                tensors[hub], shard_of[hub] = part.clone(), e % files
    names = [f"model-{i + 1:05d}-of-{files:05d}.safetensors" for i in range(files)]
    for i, file in enumerate(names):
        save_file({n: t for n, t in tensors.items() if shard_of[n] == i}, folder / file)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: names[shard_of[n]] for n in tensors}}))
    model.config.save_pretrained(folder)
    return folder


def _ids(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def _assert_matches(out, eager, lengths=(5, 11)) -> None:
    model = runtime.load(out)
    for length in lengths:
        ids = _ids(length, length)
        np.testing.assert_allclose(model(ids.numpy())[0], logits(eager, ids), atol=1e-5,
                                   rtol=1e-5)


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory):
    """What save_pretrained writes for Mixtral: per-expert w1/w2/w3, in several shards."""
    return save(tiny_moe("mixtral"), tmp_path_factory.mktemp("mixtral"), shard="20KB")


def test_save_pretrained_writes_one_tensor_per_expert(mixtral_dir):
    names = set(index(mixtral_dir)["weight_map"])
    assert "model.layers.0.block_sparse_moe.experts.3.w3.weight" in names
    assert not any(n.endswith("gate_up_proj") for n in names)


def test_save_pretrained_folder_matches_eager(saved_model, tmp_path):
    model = tiny_moe(saved_model)
    folder = save(model, tmp_path / "ckpt", shard="20KB")
    ckpt = open_checkpoint(folder)
    stacked = {n for n in ckpt.module.state_dict() if ".experts." in n}
    assert stacked and set(ckpt.binding.converted) == stacked
    out = compile(ckpt.module, ckpt.example_inputs, out=tmp_path / "m.dz",
                  backend=BACKEND.get(saved_model, "onnxruntime"),
                  dynamic_shapes=ckpt.dynamic_shapes, checkpoint=ckpt)
    experts = [n for n in ckpt.layout.tensors if ".experts." in n]
    stats = ckpt.reader.stats
    # fold_constants' transposes of the stacked weights (for the `moe` op) are computed when
    # the writer reaches them: each stack is read whole once, then, and streamed out as one
    # tensor; every other tensor streams as it is
    assert stats.materialized == len(stacked)
    assert stats.tensors == len(ckpt.layout.tensors) - len(experts) + len(stacked)
    assert not any(".experts.0." in n for n in runtime.load(out).artifact.weight_locations())
    _assert_matches(out, model)


def test_stacked_experts_interleave_gate_and_up_per_expert(mixtral_dir):
    """gate_up_proj[e] is expert e's w1 rows then its w3 rows, as transformers stacks them."""
    ckpt = open_checkpoint(mixtral_dir)
    group = ckpt.binding.converted["model.layers.0.mlp.experts.gate_up_proj"]
    handle = group.handle("model.layers.0.mlp.experts.gate_up_proj", ckpt.reader, DType.f32,
                          ckpt.binding.rules)
    assert isinstance(handle, LazyStack) and handle.shape == (4, 64, 32)
    assert [p.record.name.rsplit("experts.", 1)[1] for p in handle.parts[:4]] == \
        ["0.w1.weight", "0.w3.weight", "1.w1.weight", "1.w3.weight"]
    want = tiny_moe("mixtral").model.layers[0].mlp.experts.gate_up_proj.detach()
    assert torch.equal(torch.as_tensor(handle), want)
    bf16 = handle.astype_lazy(DType.bf16)
    assert isinstance(bf16, LazyStack) and torch.equal(torch.as_tensor(bf16), want.bfloat16())


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each case compiles a model (about 20 s of CPU): CI runs one per layout, `--sweep` all."""
    for argument, always in (("hub_model", "mixtral"), ("saved_model", "qwen3_moe")):
        if argument in metafunc.fixturenames:
            everyone = metafunc.config.getoption("sweep")
            metafunc.parametrize(argument, sorted(HUB_NAMES) if everyone else [always])


def test_hub_layout_by_hand_matches_eager(hub_model, tmp_path):
    """Per-expert tensors written with safetensors under the Hub's names, experts spread over
    two shards: each family's names are mapped by transformers' table, not by dayzero."""
    model = tiny_moe(hub_model)
    folder = hub_layout(model, hub_model, tmp_path / "ckpt")
    out = compile_checkpoint(folder, tmp_path / "m.dz",
                             backend=BACKEND.get(hub_model, "onnxruntime"))
    _assert_matches(out, model)


def test_a_transposed_stack_folds_without_being_read(mixtral_dir):
    """fold_constants on a streamed stack: the transposed weight is a handle computed when it
    is read (one stack at a time, at write time), not a tensor computed by the pass."""
    from compiler.ir import parse_ir
    from passes import parse_pipeline

    ckpt = open_checkpoint(mixtral_dir)
    name = "model.layers.0.mlp.experts.gate_up_proj"
    handle = ckpt.binding.converted[name].handle(name, ckpt.reader, DType.f32, ckpt.binding.rules)
    e, n, k = handle.shape
    g = parse_ir(f"""graph main {{
  input %x: f32[{e}, 2, {k}]
  weight @w: f32[{e}, {n}, {k}]
  %t: f32[{e}, {k}, {n}] = permute(@w) {{dims=[0, 2, 1]}}
  %y: f32[{e}, 2, {n}] = matmul(%x, %t)
  return %y
}}
""")
    g.weight_data = {"w": handle}
    assert parse_pipeline("fold_constants")[0].run(g).changed
    folded = g.weight_data["folded.t"]
    assert isinstance(folded, LazyConverted) and ckpt.reader.stats.materialized == 0
    assert torch.equal(folded.load(), handle.load().transpose(1, 2))
    chunks = b"".join(bytes(c) for c in folded.iter_chunks(chunk_bytes=4096))
    assert chunks == handle.load().transpose(1, 2).contiguous().numpy().tobytes()


def test_streaming_a_stacked_expert_weight_keeps_memory_bounded(tmp_path):
    """A 64 MiB stacked gate_up (8 experts, a 4 MiB w1 and w3 each) streams in chunks:
    resident memory grows by a few chunks, never by the stacked tensor."""
    psutil = pytest.importorskip("psutil")
    model = tiny_moe("mixtral", hidden_size=512, intermediate_size=2048, num_local_experts=8,
                     num_experts=8,
                     num_attention_heads=4, num_key_value_heads=1)
    folder = hub_layout(model, "mixtral", tmp_path / "ckpt")
    del model
    gc.collect()
    ckpt = open_checkpoint(folder)
    name = "model.layers.0.mlp.experts.gate_up_proj"
    handle = ckpt.binding.converted[name].handle(name, ckpt.reader, DType.f32, ckpt.binding.rules)
    assert handle.nbytes == 64 * 2**20 and len(handle.parts) == 16
    proc = psutil.Process()
    before = peak = proc.memory_info().rss
    total = 0
    for chunk in handle.iter_chunks(chunk_bytes=2 * 2**20):
        total += chunk.nbytes
        np.frombuffer(chunk, np.float32).sum()  # touch every page
        peak = max(peak, proc.memory_info().rss)
    assert total == handle.nbytes
    assert peak - before < 16 * 2**20  # a few chunks at most, never the 64 MiB stack
    assert ckpt.reader.stats.materialized == 0
    ckpt.reader.close()


# -- broken expert tensors: one error, naming the tensor and its file -----------------------

@pytest.fixture
def hub_dir(tmp_path):
    return hub_layout(tiny_moe("mixtral"), "mixtral", tmp_path / "ckpt")


def _rewrite(folder, change) -> None:
    """Apply `change(tensors)` to every shard's tensors (dict, edited in place); re-index."""
    from safetensors.torch import load_file

    weight_map = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors = load_file(path)
        change(tensors)
        save_file(tensors, path)
        weight_map.update({n: path.name for n in tensors})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def _shard_of(folder, name: str) -> str:
    return index(folder)["weight_map"][name]


def test_an_expert_of_the_wrong_shape_is_named_with_its_file(hub_dir):
    bad = "model.layers.0.block_sparse_moe.experts.2.w1.weight"
    file = _shard_of(hub_dir, bad)
    _rewrite(hub_dir, lambda t: t.update({bad: t[bad][:16]}) if bad in t else None)
    with pytest.raises(CheckpointError) as info:
        open_checkpoint(hub_dir)
    text, err = str(info.value), info.value
    assert f"tensor '{bad}' ({file}) is f32[16, 32], but " in text
    assert "experts.0.w1.weight' of the same stack is f32[32, 32]" in text
    assert err.where == f"{hub_dir / file}, tensor '{bad}'"
    assert "missing, misnamed or damaged" in err.fix and "belongs to these weights" not in text


def test_a_misnamed_expert_is_named_with_its_file(hub_dir):
    good = "model.layers.0.block_sparse_moe.experts.2.w3.weight"
    bad = good.replace(".w3.", ".w4.")
    file = _shard_of(hub_dir, good)
    _rewrite(hub_dir, lambda t: t.update({bad: t.pop(good)}) if good in t else None)
    with pytest.raises(CheckpointError) as info:
        open_checkpoint(hub_dir)
    text = str(info.value)
    assert "'model.layers.0.mlp.experts.gate_up_proj' is stacked from 4 '.experts.*.w3.weight' " \
           "tensors" in text and "expert(s) 2 missing" in text
    assert f"unexpected tensor '{bad}' ({file})" in text
    assert "belongs to these weights" not in text


def test_an_expert_without_a_number_is_named(hub_dir):
    good = "model.layers.0.block_sparse_moe.experts.1.w2.weight"
    bad = good.replace(".1.", ".one.")
    file = _shard_of(hub_dir, good)
    _rewrite(hub_dir, lambda t: t.update({bad: t.pop(good)}) if good in t else None)
    with pytest.raises(CheckpointError) as info:
        open_checkpoint(hub_dir)
    assert f"tensor '{bad}' ({file}) of 'model.layers.0.mlp.experts.down_proj' has no expert " \
           "number" in str(info.value)
    assert info.value.where == f"{hub_dir / file}, tensor '{bad}'"


def test_more_experts_than_the_config_is_a_config_mismatch(hub_dir):
    config = json.loads((hub_dir / "config.json").read_text())
    config["num_local_experts"] = 3
    (hub_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as info:
        open_checkpoint(hub_dir)
    text = str(info.value)
    assert "shape mismatch 'model.layers.0.mlp.experts.down_proj' (made from 4 tensors such " \
           "as 'model.layers.0.block_sparse_moe.experts.0.w2.weight'" in text
    assert "checkpoint f32[4, 32, 32], model expects f32[3, 32, 32]" in text


# -- conversions that are not a plain stack: transformers' own operations, a parameter at a time

def test_a_transposing_conversion_runs_transformers_operations(tmp_path):
    """qwen3_vl_moe's table transposes a stacked [E, H, 2I] checkpoint tensor: no byte order
    gives that, so transformers' Transpose runs on this one tensor when it is written."""
    from transformers.core_model_loading import Transpose, WeightConverter

    stored = torch.randn(4, 8, 6)
    (tmp_path / "config.json").write_text("{}")
    save_file({"layers.0.mlp.experts.gate_up_proj": stored}, tmp_path / "model.safetensors")
    layout = read_layout(tmp_path)
    rules = ConversionRules(None, [], [WeightConverter(
        "mlp.experts.gate_up_proj", "mlp.experts.gate_up_proj", operations=[Transpose(1, 2)])],
        "")
    expected = {"layers.0.mlp.experts.gate_up_proj": object()}
    result = plan(layout, rules, expected)
    assert not result.problems
    group = result.groups["layers.0.mlp.experts.gate_up_proj"]
    assert group.outputs == {"layers.0.mlp.experts.gate_up_proj": (4, 6, 8)}
    reader = ShardReader(layout)
    handle = group.handle("layers.0.mlp.experts.gate_up_proj", reader, DType.bf16, rules)
    assert isinstance(handle, LazyConverted) and handle.shape == (4, 6, 8)
    written = b"".join(bytes(c) for c in handle.iter_chunks(chunk_bytes=16))
    assert written == stored.transpose(1, 2).contiguous().bfloat16().view(torch.int16) \
        .numpy().tobytes()
    assert reader.stats.tensors == 1 and reader.stats.bytes_written == 4 * 6 * 8 * 2


def test_integer_histc_of_the_meta_device_expert_path_counts_exactly(tmp_path):
    """A checkpoint's model is exported on the meta device, where transformers' expert path
    counts tokens per expert with histc of int32 (CPU takes floats only, so eager is checked
    on the float copy): the counts are exact and int32, as torch returns them."""

    class Count(torch.nn.Module):
        def forward(self, ids):
            return torch.histc(ids, bins=4, min=0, max=3)

    ids = torch.tensor([0, 3, 2, 2, 7, -1, 1, 3, 2**24 + 1], dtype=torch.int32)
    out = compile(Count(), (ids.to("meta"),), out=tmp_path / "m.dz", backend="onnxruntime")
    got = runtime.load(out)(ids.numpy())[0]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, torch.histc(ids.double(), 4, 0, 3).int().numpy())


def test_streamed_expert_stacks_are_quantized_when_written(mixtral_dir):
    """quantize_experts on streamed stacks (fold_constants' transposes of the checkpoint's
    experts) reads nothing: the codes and scales are handles, quantized when the writer
    reaches them, each stack read once for both, and equal to quantizing it in memory."""
    from compiler.checkpoint.lazy_quantized import LazyQuantized
    from compiler.ir import parse_ir
    from passes import parse_pipeline
    from passes.quantize_experts import quantize_stack

    ckpt = open_checkpoint(mixtral_dir)
    stacks = {}
    for short, name in (("gate_up", "gate_up_proj"), ("down", "down_proj")):
        name = f"model.layers.0.mlp.experts.{name}"
        handle = ckpt.binding.converted[name].handle(name, ckpt.reader, DType.f32,
                                                     ckpt.binding.rules)
        e, n, k = handle.shape
        stacks[short] = handle.map_lazily(lambda t: t.transpose(1, 2).contiguous(), (e, k, n),
                                          DType.f32)
    (e, hidden, wide), inner = stacks["gate_up"].shape, stacks["down"].shape[1]
    g = parse_ir(f"""graph main {{
  symbol s0 in [1, 16]
  input %x: f32[s0, {hidden}]
  input %logits: f32[s0, {e}]
  weight @w_gate_up: f32[{e}, {hidden}, {wide}]
  weight @w_down: f32[{e}, {inner}, {hidden}]
  %y: f32[s0, {hidden}] = moe(%x, %logits, @w_gate_up, @w_down) {{top_k=2}}
  return %y
}}
""")
    g.weight_data = {"w_gate_up": stacks["gate_up"], "w_down": stacks["down"]}
    assert parse_pipeline("quantize_experts{bits=4,group_size=16}")[0].run(g).changed
    assert ckpt.reader.stats.materialized == 0
    for short in ("gate_up", "down"):
        codes, scales = g.weight_data[f"w_{short}.q4"], g.weight_data[f"w_{short}.scales"]
        assert isinstance(codes, LazyQuantized) and isinstance(scales, LazyQuantized)
        assert tuple(g.weights[f"w_{short}.q4"].shape) == codes.shape
        assert tuple(g.weights[f"w_{short}.scales"].shape) == scales.shape
        stats = ckpt.reader.stats
        before = stats.materialized
        streamed = [b"".join(bytes(c) for c in h.iter_chunks(4096)) for h in (codes, scales)]
        both = stats.materialized - before
        unit = codes.shape[1] * codes.shape[2] * 16  # one expert: the source read once, as
        for _ in stacks[short].slices(unit):  # a job reads it
            pass
        assert both == stats.materialized - before - both > 0  # one read serves both handles
        source = stacks[short].load()
        want_codes, want_scales = quantize_stack(source, 4, 16)
        assert want_codes.shape == codes.shape and want_scales.shape == scales.shape
        assert streamed == [want_codes.numpy().tobytes(), want_scales.numpy().tobytes()]
    ckpt.reader.close()


def test_an_int4_checkpoint_compile_matches_the_in_memory_one(mixtral_dir, tmp_path):
    """The same codes whether the experts are quantized from the streamed checkpoint at write
    time or from the model in memory by the pass: the two artifacts agree."""
    config = {"quantize": {"weights": "int4", "group_size": 16}}
    streamed = runtime.load(compile_checkpoint(mixtral_dir, tmp_path / "ckpt.dz",
                                               config=config))
    ckpt = open_checkpoint(mixtral_dir)
    model = tiny_moe("mixtral")
    model.config.use_cache = False
    in_memory = runtime.load(compile(model, ckpt.example_inputs, out=tmp_path / "mem.dz",
                                     dynamic_shapes=ckpt.dynamic_shapes, config=config))
    assert "quantized_moe" in (tmp_path / "ckpt.dz" / "graph.dzir").read_text()
    for length in (3, 12):
        ids = _ids(length, length).numpy()
        np.testing.assert_allclose(streamed(ids)[0], in_memory(ids)[0], rtol=1e-5, atol=1e-5)
