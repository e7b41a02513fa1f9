"""Text generation against transformers and ONNX Runtime GenAI: TTFT, decode, batch, long context.

One random Llama-shaped checkpoint of about 150M parameters (hidden 1024, 8 layers, 16 heads, 4
KV heads, intermediate 2816, vocab 32000) with a tokenizer.json made by the `tokenizers`
library, written once into --workdir; every peer builds from that same folder:

- dayzero: `dayzero compile CKPT` (a generation artifact; `quantize: {weights: int4}` for int4),
  run through `runtime.load(...).stream`;
- transformers eager `generate` (fp32), its time per token taken by a streamer;
- ONNX Runtime GenAI (`pip install onnxruntime-genai`), built by its own builder
  (`python -m onnxruntime_genai.models.builder -i CKPT -o DIR -p fp32|int4 -e cpu`).

Each measurement runs in a fresh process with 2 threads (peak RSS is that process's). Printed:
TTFT and decode ms/token at prompt 128 + 64 new tokens, batch 1, for each peer (the median of
--rounds runs, the peers taking turns, with each round's ratio beside it) with ratios
against the best peer of the same precision, the memory-bandwidth floor of a decode step
(weight bytes it reads / measured 2-thread read bandwidth) and the FLOP roofline of the prompt
(2 x matmul parameters x tokens / measured GEMM rate); dayzero's decode tokens/s at batch 8
against batch 1 (run in the same rounds, the median of the rounds' ratios); and per context
length (--context) TTFT, decode ms/token, KV-cache bytes and peak RSS, with peers up to
--peers-max tokens (ORT GenAI's CPU attention materialises heads x S x S probabilities),
plotted into --plot.

    python benchmarks/generate.py                              # everything (tens of minutes)
    python benchmarks/generate.py --context 512,2048 --skip-int4
    python benchmarks/generate.py --precisions int4 --int4-group-sizes 32,128   # int4 rows only

Each int4 row prints its quantize config and, beside the decode times, its last-position logit
error against transformers' fp32 forward on the same prompts next to ORT GenAI int4's
(benchmarks/logit_error.py): a coarser block is only a fair win if its error stays comparable.

The harness (floors, parsing, the child protocol) is tested in
tests/benchmarks/test_generate_harness.py; timings belong in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=4, intermediate_size=2816, vocab_size=32000)
THREADS = 2
CHILD_TIMEOUT = 1800
BATCH8 = "dayzero-batch8"  # the batch-8 job's label in the rounds


# -- the checkpoint --------------------------------------------------------------------------
def make_checkpoint(folder: Path, max_positions: int) -> Path:
    """The random Llama checkpoint and a tokenizer.json for it (written once)."""
    if (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file():
        return folder
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(**SHAPE, max_position_embeddings=max_positions, bos_token_id=1,
                         eos_token_id=2, tie_word_embeddings=False)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"t{i}": i for i in range(3, SHAPE["vocab_size"])})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder)
    return folder


def weight_bytes(folder: Path) -> tuple[int, int]:
    """(bytes a decode step reads: every matrix but the embedding table, of which it reads one
    row; matmul parameters a prompt token goes through: all but lm_head, which only the last
    token of the prompt needs, for the FLOP roofline)."""
    from safetensors import safe_open

    read, params = 0, 0
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "np") as f:
            for name in f.keys():
                shape = f.get_slice(name).get_shape()
                count = int(np.prod(shape))
                if "embed_tokens" in name:
                    read += shape[-1] * 4
                    continue
                read += count * 4
                params += count if len(shape) == 2 and "lm_head" not in name else 0
    return read, params


# -- builds (each timed cold, in a fresh process) ---------------------------------------------
def int4_config(group_size: int) -> str:
    """The quantize section of a dayzero int4 row (printed with its figures)."""
    return f"quantize: {{weights: int4, group_size: {group_size}, activations: int8}}"


def int4_peer(group_size: int) -> str:
    return "dayzero-int4" if group_size == 32 else f"dayzero-int4-g{group_size}"


def build_dayzero(folder: Path, out: Path, max_positions: int, group_size: int | None,
                  reuse: bool = False) -> float:
    """Compiled cold in a fresh process (int4 with `group_size`, else fp32); an artifact left
    by an earlier run is rebuilt unless `reuse` (it may come from older code: a stale artifact
    once hid a fusion fix)."""
    config = out.with_suffix(".yaml")
    lines = ["generation: {kv_cache_memory: 1GiB, prefill_chunk: 512, max_batch_tokens: 2048}"]
    if group_size is not None:
        lines.append(int4_config(group_size))
    config.write_text("\n".join(lines) + "\n")
    return _timed_command([sys.executable, "-m", "compiler.cli", "compile", str(folder), "-o",
                           str(out), "--seq-len", f"2:{max_positions}", "--config", str(config),
                           "--force", "-q", "--backend-option",
                           f"session.intra_op_threads={THREADS}"], out, reuse)


def build_genai(folder: Path, out: Path, precision: str) -> float | None:
    seconds = _timed_command([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i",
                              str(folder), "-o", str(out), "-p", precision, "-e", "cpu",
                              "-c", str(out) + ".cache"], out / "genai_config.json")
    config_path = out / "genai_config.json"
    config = json.loads(config_path.read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    options["intra_op_num_threads"] = THREADS
    options["inter_op_num_threads"] = 1
    config_path.write_text(json.dumps(config, indent=2))
    return seconds


def _timed_command(command: list[str], product: Path, reuse: bool = True) -> float:
    if reuse and product.exists():
        return float("nan")  # built by an earlier run: no cold time
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=_env())
    if result.returncode:
        raise RuntimeError(f"{' '.join(command[:6])} failed:\n{result.stderr[-3000:]}")
    return time.perf_counter() - start


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), PYTHONPATH=str(ROOT))
    return env


# -- one measurement, in a child process -----------------------------------------------------
@dataclass
class Result:
    peer: str
    context: int
    batch: int
    ttft_ms: float
    decode_ms: float        # per token of one sequence
    tokens_per_s: float     # decode tokens per second over the batch
    kv_bytes: int
    peak_rss: int

    @classmethod
    def parse(cls, text: str) -> Result:
        for line in reversed(text.strip().splitlines()):
            if line.startswith("{"):
                return cls(**json.loads(line))
        raise ValueError(f"no result line in: {text[-500:]}")


def decode_figures(stamps: list[float], start: float, batch: int, new: int
                   ) -> tuple[float, float, float]:
    """(TTFT ms, decode ms per token of one sequence, decode tokens/s over the batch) from the
    times each token arrived (batch * new stamps in arrival order) after `start`."""
    stamps = sorted(stamps)
    ttft = stamps[0] - start
    decode_start = stamps[batch - 1]  # every sequence has its first token
    decode_tokens = len(stamps) - batch
    span = stamps[-1] - decode_start
    tokens_per_s = decode_tokens / span if span > 0 else float("nan")
    return ttft * 1e3, batch / tokens_per_s * 1e3 if tokens_per_s else float("nan"), tokens_per_s


def prompts(batch: int, context: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(context * 31 + batch)
    return [rng.integers(3, vocab, context).tolist() for _ in range(batch)]


def child(peer: str, path: str, context: int, new: int, batch: int) -> Result:
    ids = prompts(batch, context, SHAPE["vocab_size"])
    run = {"dayzero": _run_dayzero, "transformers": _run_transformers,
           "genai": _run_genai}[peer.split("-")[0]]
    run(path, ids[:1], 8)  # warm up: first-call allocations and kernel selection
    start, stamps, kv = run(path, ids, new)
    ttft, decode, rate = decode_figures(stamps, start, batch, new)
    return Result(peer, context, batch, ttft, decode, rate, kv, peak_rss())


def peak_rss() -> int:
    """This process's peak resident set (VmHWM: its own address space, where getrusage's
    ru_maxrss would carry the parent's peak over the fork)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


_LOADED: dict[str, object] = {}


SESSION = {"intra_op_threads": THREADS, "allow_spinning": True}


def _run_dayzero(path: str, ids: list[list[int]], new: int):
    import runtime

    # spinning forced on, as ORT GenAI's sessions have it: `auto` reads the load average, which
    # the previous child's run leaves at about the core count, and would turn it off
    model = _LOADED.get(path) or runtime.load(path, session=SESSION)
    _LOADED[path] = model
    stamps = []
    start = time.perf_counter()
    for _ in model.stream(ids, max_new_tokens=new, eos_token_id=[]):
        stamps.append(time.perf_counter())
    return start, stamps, model.stats.peak_blocks * model.runner.layout.block_bytes


def _run_transformers(path: str, ids: list[list[int]], new: int):
    import torch
    from transformers import LlamaForCausalLM
    from transformers.generation.streamers import BaseStreamer

    torch.set_num_threads(THREADS)
    model = _LOADED.get(path) or LlamaForCausalLM.from_pretrained(path).eval()
    _LOADED[path] = model
    stamps: list[float] = []

    class Stamps(BaseStreamer):
        seen_prompt = False

        def put(self, value):
            if self.seen_prompt:
                stamps.extend([time.perf_counter()] * value.reshape(-1, 1).shape[0])
            self.seen_prompt = True

        def end(self):
            pass

    tensor = torch.tensor(ids)
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=new,
                       min_new_tokens=new, do_sample=False, pad_token_id=0, streamer=Stamps())
    cfg = model.config
    kv = (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * 4 * (len(ids[0]) + new)
          * (cfg.hidden_size // cfg.num_attention_heads) * len(ids))
    return start, stamps, kv


def _run_genai(path: str, ids: list[list[int]], new: int):
    os.environ["ORT_DISABLE_TELEMETRY"] = "1"  # before GenAI loads onnxruntime
    import onnxruntime_genai as og

    model = _LOADED.get(path) or og.Model(path)
    _LOADED[path] = model
    params = og.GeneratorParams(model)
    length = len(ids[0]) + new
    params.set_search_options(max_length=length, min_length=length, do_sample=False,
                              batch_size=len(ids))
    generator = og.Generator(model, params)
    stamps = []
    start = time.perf_counter()
    generator.append_tokens(np.asarray(ids, np.int32))
    while not generator.is_done():
        generator.generate_next_token()
        stamps.extend([time.perf_counter()] * len(ids))
    cfg = json.loads((Path(path) / "genai_config.json").read_text())["model"]["decoder"]
    kv = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_size"] * 4 \
        * length * len(ids)
    return start, stamps, kv


def measure(peer: str, path: Path, context: int, new: int, batch: int) -> Result | str:
    """`child` in a fresh process; a failure or timeout is returned as its reason."""
    command = [sys.executable, __file__, "--child", peer, str(path), str(context), str(new),
               str(batch)]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=_env(),
                              timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"timed out after {CHILD_TIMEOUT} s"
    if done.returncode:
        return (done.stderr.strip().splitlines() or ["failed"])[-1][:160]
    return Result.parse(done.stdout)


ERROR_PROMPTS = 4


def measure_rounds(jobs: dict[str, tuple[str, Path, int]], context: int, new: int,
                   rounds: int) -> tuple[dict[str, Result | str], dict[str, list[Result]]]:
    """Every job (label: peer, path, batch) `rounds` times, the jobs taking turns within a
    round, so that a change in the shared machine's load falls on all of them alike. Per
    label: its median run (TTFT, decode and rate each the median over the rounds; the highest
    peak RSS), or the first failure; and the runs themselves, for per-round ratios."""
    runs: dict[str, list[Result | str]] = {label: [] for label in jobs}
    for _ in range(rounds):
        for label, (peer, path, batch) in jobs.items():
            if not any(isinstance(r, str) for r in runs[label]):
                runs[label].append(measure(peer, path, context, new, batch))
    medians: dict[str, Result | str] = {}
    for label, results in runs.items():
        failed = [r for r in results if isinstance(r, str)]
        medians[label] = failed[0] if failed else median_result(results)
    return medians, {k: [r for r in rs if isinstance(r, Result)] for k, rs in runs.items()}


def batch_ratios(batched: list[Result], single: list[Result]) -> list[float]:
    """Each round's decode tokens/s of the batch against that round's batch 1."""
    return [b.tokens_per_s / s.tokens_per_s for b, s in zip(batched, single)]


def median_result(results: list[Result]) -> Result:
    """One Result whose timings are the medians of `results` (same peer and shape)."""
    def median(field: str) -> float:
        return float(np.median([getattr(r, field) for r in results]))
    return replace(results[0], ttft_ms=median("ttft_ms"), decode_ms=median("decode_ms"),
                   tokens_per_s=median("tokens_per_s"),
                   peak_rss=max(r.peak_rss for r in results))


def round_ratios(mine: list[Result], theirs: list[list[Result]]) -> str:
    """Each round's decode time against that round's best peer: how steady the ratio is."""
    ratios = [m.decode_ms / min(t[k].decode_ms for t in theirs) for k, m in enumerate(mine)
              if all(k < len(t) for t in theirs)]
    return "  per round: " + ", ".join(f"{r:.2f}x" for r in ratios)


def print_logit_errors(folder: Path, peers: dict[str, Path], prompt: int) -> None:
    """Each int4 peer's last-position logits against transformers' fp32 on the same prompts
    (each peer in a fresh process, as the timings)."""
    from logit_error import error_figures

    got = {}
    for peer, path in {"transformers": folder, **peers}.items():
        out = Path(path).parent / f"logits-{peer}.npy"
        done = subprocess.run([sys.executable, __file__, "--logits-child", peer, str(path),
                               str(prompt), str(out)], cwd=ROOT, capture_output=True,
                              text=True, env=_env(), timeout=CHILD_TIMEOUT)
        if done.returncode:
            print(f"  logits of {peer} unavailable: "
                  f"{(done.stderr.strip().splitlines() or ['failed'])[-1][:160]}")
            continue
        got[peer] = np.load(out)
    if "transformers" not in got:
        return
    print(f"\n## int4 logit error against transformers fp32 (last position of "
          f"{ERROR_PROMPTS} prompts of {prompt})")
    for peer, logits in got.items():
        if peer != "transformers":
            e = error_figures(got["transformers"], logits)
            print(f"  {peer:<20} rel RMS {e['rel_rms']:.4f}  max abs {e['max_abs']:.4f}  "
                  f"top-1 agrees {e['top1']:.0%}")


# -- machine floors --------------------------------------------------------------------------
def read_bandwidth(threads: int = THREADS, megabytes: int = 512) -> float:
    """Bytes per second a `threads`-thread matrix-vector product streams from a matrix far
    larger than the caches: what a decode step's weight reads can reach here (the better of
    torch's and ONNX Runtime's GEMV, each the median of 8 calls: the best one is at the
    mercy of a neighbour's quiet moment)."""
    import torch

    torch.set_num_threads(threads)
    rows = (megabytes << 20) // (4 * 4096)
    matrix, vector = torch.randn(rows, 4096), torch.randn(4096)
    seconds = _median_time(lambda: torch.mv(matrix, vector))
    run = _ort_gemv(matrix.numpy(), threads)
    if run is not None:
        seconds = min(seconds, _median_time(run))
    return matrix.numel() * 4 / seconds


def _median_time(call, calls: int = 8) -> float:
    call()  # first-call allocations
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _ort_gemv(matrix: np.ndarray, threads: int):
    """A call of ONNX Runtime's Gemm of one row by `matrix` transposed (the weights as
    dayzero's and GenAI's decode steps hold them, prepacked at load), or None without ORT."""
    try:
        from onnx import TensorProto, helper, numpy_helper

        from backends.onnxruntime.ort_module import ort  # telemetry off (issue 33)
    except ImportError:
        return None
    node = helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)
    graph = helper.make_graph(
        [node], "gemv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4096])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, matrix.shape[0]])],
        [numpy_helper.from_array(matrix, "w")])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    session = ort.InferenceSession(helper.make_model(graph).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feeds = {"x": np.ones((1, 4096), np.float32)}
    return lambda: session.run(None, feeds)


def gemm_rate() -> float:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from peers import gemm_rate as measured

    return measured(THREADS)[0]


# -- the report ------------------------------------------------------------------------------
def ratio_line(name: str, value: float, best: float, floor: float, factor: float,
               floor_factor: float) -> str:
    """`value` against the best peer and the floor: the target is met when value <= factor x
    best or <= floor_factor x floor, whichever is larger."""
    limit = max(factor * best, floor_factor * floor)
    verdict = "meets" if value <= limit else "MISSES"
    return (f"  {name}: {value:8.1f} ms = {value / best:.2f}x best peer, {value / floor:.2f}x "
            f"floor ({floor:.1f} ms); target <= {limit:.1f} ms: {verdict}")


def _table(rows: list[Result | tuple[str, str]]) -> str:
    lines = [f"  {'peer':<14}{'context':>8}{'batch':>6}{'TTFT ms':>10}{'ms/token':>10}"
             f"{'tok/s':>9}{'KV MiB':>9}{'RSS MiB':>9}"]
    for r in rows:
        if isinstance(r, tuple):
            lines.append(f"  {r[0]:<14}  unavailable: {r[1]}")
            continue
        lines.append(f"  {r.peer:<14}{r.context:>8}{r.batch:>6}{r.ttft_ms:>10.1f}"
                     f"{r.decode_ms:>10.2f}{r.tokens_per_s:>9.1f}{r.kv_bytes / 2**20:>9.1f}"
                     f"{r.peak_rss / 2**20:>9.0f}")
    return "\n".join(lines)


def plot(results: list[Result], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for peer in sorted({r.peer for r in results}):
        rows = sorted((r for r in results if r.peer == peer), key=lambda r: r.context)
        x = [r.context for r in rows]
        axes[0].plot(x, [r.ttft_ms / 1e3 for r in rows], "o-", label=peer)
        axes[1].plot(x, [r.decode_ms for r in rows], "o-", label=peer)
        axes[2].plot(x, [r.peak_rss / 2**30 for r in rows], "o-", label=peer)
    for ax, title in zip(axes, ("TTFT (s)", "decode (ms/token)", "peak RSS (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", default="512,2048,8192,32768")
    p.add_argument("--peers-max", type=int, default=8192)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--max-positions", type=int, default=32768 + 64,
                   help="the checkpoint's and artifacts' position range (one build serves every "
                        "--context up to it)")
    p.add_argument("--workdir", default="/tmp/dayzero-generate-bench")
    p.add_argument("--skip-int4", action="store_true", help="the same as --precisions fp32")
    p.add_argument("--precisions", default="fp32,int4",
                   help="rows to run: fp32 (with batch 8 and long context), int4, or both")
    p.add_argument("--int4-group-sizes", default="32",
                   help="dayzero int4 rows, one per quantization block size (ORT GenAI's "
                        "-p int4 uses 32)")
    p.add_argument("--reuse-builds", action="store_true",
                   help="run dayzero artifacts an earlier run left in --workdir (not cold)")
    p.add_argument("--skip-peers", action="store_true")
    p.add_argument("--rounds", type=int, default=3,
                   help="runs of each peer (and of dayzero's batch 8), taking turns; "
                        "medians and per-round ratios are printed")
    p.add_argument("--plot", default="generate-context.png")
    p.add_argument("--child", nargs=5, metavar=("PEER", "PATH", "CONTEXT", "NEW", "BATCH"))
    p.add_argument("--logits-child", nargs=4, metavar=("PEER", "PATH", "PROMPT", "OUT"))
    args = p.parse_args(argv)
    if args.child:
        peer, path, context, new, batch = args.child
        print(json.dumps(child(peer, path, int(context), int(new), int(batch)).__dict__))
        return 0
    if args.logits_child:
        from logit_error import save

        peer, path, prompt, out = args.logits_child
        save(peer, path, prompts(ERROR_PROMPTS, int(prompt), SHAPE["vocab_size"]), out)
        return 0
    precisions = set(args.precisions.split(",")) - ({"int4"} if args.skip_int4 else set())
    groups = [int(g) for g in args.int4_group_sizes.split(",")] if "int4" in precisions else []
    contexts = [int(c) for c in args.context.split(",")]
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    positions = max(max(contexts + [args.prompt]) + args.new, args.max_positions)
    folder = make_checkpoint(work / f"llama-150m-{positions}", positions)
    paths = {}
    if "fp32" in precisions:
        paths = {"dayzero": work / f"dayzero-{positions}.dz", "transformers": folder,
                 "genai-fp32": work / "genai-fp32"}
    for group in groups:
        paths[int4_peer(group)] = work / (int4_peer(group) + f"-{positions}.dz")
    if groups:
        paths["genai-int4"] = work / "genai-int4"
    if args.skip_peers:
        paths = {k: v for k, v in paths.items() if k.startswith("dayzero")}
    print(f"# generation benchmark: {folder.name}, {THREADS} threads, load "
          f"{os.getloadavg()[0]:.2f}")
    builds = {}
    for peer, path in paths.items():
        try:
            if peer.startswith("dayzero"):
                group = next((g for g in groups if peer == int4_peer(g)), None)
                builds[peer] = build_dayzero(folder, path, positions, group, args.reuse_builds)
            elif peer.startswith("genai"):
                builds[peer] = build_genai(folder, path, peer.split("-")[1])
        except Exception as exc:  # a peer that cannot build is reported, not fatal
            builds[peer] = str(exc).splitlines()[-1][:160]
    for peer, seconds in builds.items():
        print(f"  build {peer}: " + (f"{seconds:.1f} s cold" if isinstance(seconds, float)
                                     else f"FAILED {seconds}"))
    read, params = weight_bytes(folder)
    bandwidth, rate = read_bandwidth(), gemm_rate()
    floor_decode = read / bandwidth * 1e3
    floor_ttft = 2 * params * args.prompt / rate * 1e3
    print(f"  weights read per decode token {read / 2**20:.0f} MiB; read bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s -> decode floor {floor_decode:.1f} ms/token; GEMM "
          f"{rate / 1e9:.0f} GFLOP/s -> prompt-{args.prompt} roofline {floor_ttft:.1f} ms")
    usable = {k: v for k, v in paths.items() if not isinstance(builds.get(k, 0.0), str)}

    print(f"\n## prompt {args.prompt}, {args.new} new tokens, batch 1 (median of "
          f"{args.rounds} rounds)")
    jobs = {peer: (peer, path, 1) for peer, path in usable.items()}
    if "fp32" in precisions and "dayzero" in usable:  # batch 8 in the same rounds as batch 1
        jobs[BATCH8] = ("dayzero", usable["dayzero"], 8)
    main_rows, runs = measure_rounds(jobs, args.prompt, args.new, max(args.rounds, 1))
    print(_table([r if isinstance(r, Result) else (k, r) for k, r in main_rows.items()
                  if k != BATCH8]))
    targets = [("fp32", "dayzero", ("transformers", "genai-fp32"), 0.9, "")] + [
        ("int4", int4_peer(g), ("genai-int4",), 0.9, int4_config(g)) for g in groups]
    for precision, ours, peers, factor, label in targets:
        mine = main_rows.get(ours)
        theirs = [main_rows[p] for p in peers if isinstance(main_rows.get(p), Result)]
        if not isinstance(mine, Result) or not theirs:
            continue
        best_decode = min(r.decode_ms for r in theirs)
        best_ttft = min(r.ttft_ms for r in theirs)
        floor = floor_decode / (8 if precision == "int4" else 1)
        print(f"{precision}:" if ours == "dayzero" else f"{ours} ({label}):")
        print(ratio_line("decode ms/token", mine.decode_ms, best_decode, floor, factor,
                         1.1 if precision == "fp32" else 0))
        if precision == "fp32":
            print(ratio_line("TTFT", mine.ttft_ms, best_ttft, floor_ttft, 0.9, 1.2))
        if len(runs[ours]) > 1:
            print(round_ratios(runs[ours], [runs[p] for p in peers if runs.get(p)]))
    if groups:
        print_logit_errors(folder, {k: v for k, v in usable.items() if "int4" in k}, args.prompt)
    if "fp32" not in precisions:
        return 0
    batch8 = main_rows.get(BATCH8)
    if isinstance(batch8, Result) and isinstance(main_rows.get("dayzero"), Result):
        ratios = batch_ratios(runs[BATCH8], runs["dayzero"])
        ratio = float(np.median(ratios))
        print(f"\n## batch 8: {batch8.tokens_per_s:.1f} decode tokens/s against batch 1's "
              f"{main_rows['dayzero'].tokens_per_s:.1f}: {ratio:.2f}x (median of the rounds' "
              f"ratios: {', '.join(f'{r:.2f}x' for r in ratios)}); target >= 5x: "
              f"{'meets' if ratio >= 5 else 'MISSES'}")
        print(_table([batch8]))

    print("\n## long context (batch 1)")
    results: list[Result] = []
    rows: list[Result | tuple[str, str]] = []
    for context in contexts:
        for peer in ("dayzero", "transformers", "genai-fp32"):
            if peer not in usable or (peer != "dayzero" and context > args.peers_max):
                continue
            got = measure(peer, usable[peer], context, args.new, 1)
            rows.append(got if isinstance(got, Result) else (f"{peer}@{context}", got))
            if isinstance(got, Result):
                results.append(got)
    print(_table(rows))
    if results and args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
