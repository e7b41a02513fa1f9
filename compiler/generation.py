"""Compiling for text generation: the example inputs a step is derived from, and the manifest
section the runtime drives it with.

`compile(..., task="text-generation")` exports the causal LM's forward for one prompt (batch 1,
dynamic sequence), runs the backend's pipeline, then `derive_generation_step`
(passes/derive_generation_step/) turns it into a packed, KV-cached step. The manifest's
`generation` section records the exported forward's signature (so the artifact still answers
`m(input_ids)`), each layer's cache geometry read from the step's paged attention nodes, the
vocabulary, the longest sequence, the end-of-sequence ids and the `generation:` config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.generation.spec import GenerationSpec, LayerCache, parse_bytes
from runtime.generation.tokenizer import tokenizer_file_limit

from .config import CompileConfig
from .errors import DayzeroError
from .ir import Graph

TASKS = ("forward", "text-generation")


def check_task(task: str) -> None:
    if task not in TASKS:
        raise DayzeroError(f"unknown task {task!r}", "task", f"use one of {', '.join(TASKS)}")


def check_parallel(parallel: dict[str, int]) -> None:
    """A generation artifact may be tensor parallel (heads and KV cache split over ranks that
    step together); data, pipeline and expert parallelism have no generation runtime."""
    for key in ("data_parallel", "pipeline_parallel", "expert_parallel"):
        if parallel.get(key, 1) != 1:
            raise DayzeroError(f"config key 'parallel.{key}' = {parallel[key]}: a generation "
                               "artifact is split over ranks by tensor parallelism only",
                               f"parallel.{key}", "remove it; use parallel.tensor_parallel "
                               "(or run one generation artifact per device for data parallel)")


def generation_inputs(example_inputs: tuple, dynamic_shapes: Any) -> tuple[tuple, Any]:
    """The example inputs cut to one prompt (a step's batch axis is its tokens): the first row
    of `input_ids`, with the sequence dim kept dynamic."""
    if not example_inputs or getattr(example_inputs[0], "dim", lambda: 0)() != 2:
        raise DayzeroError("a text-generation model takes input_ids [batch, seq] first",
                           "example inputs", "give (input_ids,) as the example inputs")
    ids = example_inputs[0][:1]
    if dynamic_shapes is None or not isinstance(dynamic_shapes, (tuple, list)) \
            or not isinstance(dynamic_shapes[0], dict) or 1 not in dynamic_shapes[0]:
        raise DayzeroError("a text-generation model needs a dynamic sequence dim on input_ids",
                           "dynamic_shapes",
                           "pass dynamic_shapes=({1: torch.export.Dim('seq', max=...)},)")
    dims = dict(dynamic_shapes[0])
    dims.pop(0, None)  # batch 1: the step packs sequences along the token axis
    return (ids, *example_inputs[1:]), (dims, *dynamic_shapes[1:])


def generation_pipeline(pipeline: list, get_pass, kv_cache_dtype: str = "f32",
                        tensor_parallel: int = 1) -> list:
    """`pipeline` with `derive_generation_step` (and the `fuse` it needs: it pages whole
    attention blocks) before memory planning, which must see the step graph. Tensor parallel,
    `fuse` keeps the projections apart (no merged QKV, gated MLP or linear epilogue): the
    partitioner splits plain linears, column and row parallel."""
    import dataclasses

    # a backend may keep attention blocks unfused for its own kernels (triton: heads=false)
    split = {"mlp": False, "horizontal": False, "epilogue": False} if tensor_parallel > 1 else {}
    pipeline = [dataclasses.replace(p, heads=True, **split) if p.name == "fuse" else p
                for p in pipeline]
    names = [p.name for p in pipeline]
    cut = next((i for i, n in enumerate(names) if n in ("plan_memory", "schedule_for_memory")),
               len(pipeline))
    extra = [] if "fuse" in names[:cut] else [get_pass("fuse")(**split)]
    derive = get_pass("derive_generation_step")(kv_cache_dtype=kv_cache_dtype)
    return [*pipeline[:cut], *extra, derive, *pipeline[cut:]]


def forward_signature(graph: Graph, spec) -> dict[str, Any]:
    """The exported forward's inputs and outputs, as the manifest lists a graph's."""
    return {"inputs": [spec(v) for v in graph.inputs], "outputs": [spec(v) for v in graph.outputs]}


# the step's paged blocks and what their two pools hold (runtime/generation/spec.py)
_PAGED_KINDS = {"paged_attention": "attention", "paged_latent_attention": "latent"}


def _layer_cache(node) -> LayerCache:
    """A paged block's pools per token: the widths of the rows it returns for them."""
    key, value = node.outputs[1].shape, node.outputs[2].shape
    return LayerCache(key[1], key[2], value[2], node.attrs["window"], _PAGED_KINDS[node.op])


def _check_latent_parallel(blocks: list, ranks: int) -> None:
    """The partitioner splits a step's caches by KV heads; a latent cache has none to split."""
    latent = next((n for n in blocks if n.op == "paged_latent_attention"), None)
    if latent is not None and ranks > 1:
        raise DayzeroError(
            f"latent attention %{latent.outputs[0].name} at {latent.loc or 'unknown location'} "
            "caches one latent per token shared by every head, which tensor parallelism cannot "
            "split by KV heads", "parallel.tensor_parallel",
            "compile this model for generation without tensor_parallel")


def generation_section(graph: Graph, forward: dict[str, Any], cfg: CompileConfig,
                       eos_token_ids: list[int], tokenizer: list[str]) -> dict[str, Any]:
    blocks = [n for n in graph.nodes if n.op in _PAGED_KINDS]
    _check_latent_parallel(blocks, cfg.parallel.get("tensor_parallel", 1))
    layers = [_layer_cache(n) for n in blocks]
    tokens = graph.inputs[0].shape[1]
    vocab = graph.outputs[0].shape[-1]
    if not isinstance(vocab, int):
        raise DayzeroError(f"the logits' vocabulary dim {vocab} is not static",
                           "task text-generation", "export with a fixed vocabulary")
    settings = cfg.generation
    spec = GenerationSpec(
        tuple(layers), vocab, graph.symbols[str(tokens)][1], tuple(eos_token_ids),
        parse_bytes(settings["kv_cache_memory"], "generation.kv_cache_memory"),
        settings["block_size"], settings["prefill_chunk"], settings["max_batch_tokens"],
        cache_dtype(cfg))
    return {**spec.to_manifest(), "forward": forward, "tokenizer": tokenizer}


# precision.kv_cache_dtype -> the pool's element type (fp16, bf16 and fp8 are refused earlier)
_CACHE_DTYPES = {"fp32": "f32", "int8": "int8"}


def cache_dtype(cfg: CompileConfig) -> str:
    return _CACHE_DTYPES[cfg.precision["kv_cache_dtype"]]


def eos_token_ids(model: Any) -> list[int]:
    """The end-of-sequence ids a transformers model (or a wrapper holding one) declares."""
    seen, stack = set(), [model]
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        for owner in (getattr(module, "generation_config", None), getattr(module, "config", None)):
            ids = getattr(owner, "eos_token_id", None)
            if ids is not None:
                return [int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids])]
        children = getattr(module, "children", None)
        if callable(children) and len(seen) < 64:
            stack.extend(list(children())[:8])
    return []


# the files of a Hugging Face tokenizer a generation artifact carries (tokenizer.json is the
# tokenizer itself; the others hold its special tokens and chat template)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "chat_template.json", "generation_config.json")
TOKENIZER_DIR = "tokenizer"
GENERATION_CONFIG = "generation_config.json"


def tokenizer_files(folder: str | Path | None) -> dict[str, bytes]:
    """{artifact path: bytes} of the tokenizer in `folder` (a checkpoint folder), or {} when it
    has neither a tokenizer.json nor a generation_config.json. The generation config travels
    without a tokenizer too: its logit processors (forced eos, bad words, ...) act on ids."""
    if folder is None:
        return {}
    with_tokenizer = (Path(folder) / TOKENIZER_FILES[0]).is_file()
    found = {}
    for name in TOKENIZER_FILES if with_tokenizer else (GENERATION_CONFIG,):
        path = Path(folder) / name
        if not path.is_file():
            continue
        limit = tokenizer_file_limit(name)
        if path.stat().st_size > limit:  # the runtime would refuse the artifact
            raise DayzeroError(f"{name} is larger than the {limit >> 20} MiB a generation "
                               "artifact's tokenizer file may have", str(path),
                               "check the tokenizer files of the checkpoint")
        found[f"{TOKENIZER_DIR}/{name}"] = path.read_bytes()
    return found


def tokenizer_vocabulary_warning(folder: str | Path, model: Any) -> str | None:
    """What to warn of when the tokenizer in `folder` has fewer ids than `model` has logits:
    an id past the tokenizer that the model generates decodes to no text (a streamed chunk is
    empty). Many checkpoints pad the vocabulary to a round size, so it is a warning; None when
    the sizes agree or either is unknown (no tokenizer.json, no vocabulary the model names)."""
    vocab = model_vocabulary(model)
    path = Path(folder) / TOKENIZER_FILES[0]
    if vocab is None or not path.is_file():
        return None
    tokens = tokenizer_size(path)
    if tokens is None:
        return (f"{path} does not parse as a tokenizer: the artifact's text cannot be checked "
                f"against the model's vocabulary of {vocab}")
    if tokens >= vocab:
        return None
    return (f"the tokenizer ({path}) has {tokens} tokens but the model's vocabulary has {vocab}: "
            f"generated ids {tokens} to {vocab - 1} decode to no text (pad the tokenizer's "
            "vocabulary, or check that the folder's tokenizer belongs to this model)")


def model_vocabulary(model: Any) -> int | None:
    """The number of logits a transformers causal LM (or a wrapper holding one) produces: its
    output embedding's rows, else its config's vocab_size."""
    head = getattr(model, "get_output_embeddings", None)
    head = head() if callable(head) else None
    rows = getattr(head, "out_features", None)
    if isinstance(rows, int):
        return rows
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = getattr(text, "vocab_size", None)
    return vocab if isinstance(vocab, int) and vocab > 0 else None


def tokenizer_size(path: Path) -> int | None:
    """How many ids a Hugging Face tokenizer.json spells: one past the largest id of its model's
    vocabulary and its added tokens (None when the file is not such a tokenizer)."""
    import json

    if path.stat().st_size > tokenizer_file_limit(path.name):
        return None
    try:
        data = json.loads(path.read_bytes())
        vocab = data["model"]["vocab"]
        ids = list(vocab.values()) if isinstance(vocab, dict) else [len(vocab) - 1]
        ids += [token["id"] for token in data.get("added_tokens") or []]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    ids = [i for i in ids if isinstance(i, int) and not isinstance(i, bool)]
    return max(ids) + 1 if ids else None


def check_generation_config(files: dict[str, bytes], model: Any, folder: str | Path,
                            eos: list[int]) -> None:
    """A checkpoint's generation_config.json that the runtime would refuse is refused now, at
    compile time, naming the field (its logit processors: runtime/logit_processors.py)."""
    import json

    from runtime.logit_processors import LogitProcessors

    data = files.get(f"{TOKENIZER_DIR}/{GENERATION_CONFIG}")
    vocab = model_vocabulary(model)
    if data is None or vocab is None:
        return
    source = str(Path(folder) / GENERATION_CONFIG)
    try:
        config = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise DayzeroError(f"{source} is not JSON: {str(exc)[:200]}", source,
                           "fix or remove the checkpoint's generation_config.json") from None
    if not isinstance(config, dict):
        raise DayzeroError(f"{source} holds a {type(config).__name__}, not an object", source,
                           "fix or remove the checkpoint's generation_config.json")
    LogitProcessors.from_config(config, vocab, eos, source=source, error=DayzeroError)
