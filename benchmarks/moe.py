"""A Mixtral-shaped mixture-of-experts model compiled by dayzero (onnxruntime, com.microsoft.MoE)
against PyTorch eager on the same inputs.

transformers' MixtralForCausalLM with random weights, scaled down (default: hidden 1024,
8 experts, top-2, 4 layers, expert inner size 3584 as Mixtral's 3.5 x hidden), compiled with a
dynamic sequence length. Alternates eager and the artifact in rounds so that the machine's drift
hits both alike; prints the median per forward of each, their ratio, the MoE blocks' routed
FLOPs against what a dense all-experts evaluation would spend, and the largest difference of the
logits (which must stay within dayzero's fp32 bound).

    python benchmarks/moe.py                                  # the default shape, seq 128
    python benchmarks/moe.py --hidden 256 --layers 2 --seq 32 64 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import compiler  # noqa: E402
import runtime  # noqa: E402
from compiler.hf_models import wrap_pretrained  # noqa: E402


def build(args) -> torch.nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(hidden_size=args.hidden, intermediate_size=args.intermediate,
                           num_hidden_layers=args.layers, num_attention_heads=args.heads,
                           num_key_value_heads=max(1, args.heads // 4), vocab_size=args.vocab,
                           num_local_experts=args.experts, num_experts_per_tok=args.top_k,
                           max_position_embeddings=4096)
    return MixtralForCausalLM(config).eval()


def moe_flops(args, seq: int) -> tuple[float, float]:
    """(routed, dense) multiply-adds x 2 of the MoE blocks for one forward of `seq` tokens."""
    per_expert_token = 2 * 3 * args.hidden * args.intermediate  # gate, up, down
    routed = args.layers * seq * args.top_k * per_expert_token
    return routed, routed * args.experts / args.top_k


def timed(fn, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=3584)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--seq", type=int, nargs="+", default=[128])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    hf = build(args)
    module, inputs = wrap_pretrained(hf, {"input_ids": torch.randint(0, args.vocab, (1, 8))},
                                     "benchmarks/moe.py")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "moe.dz"
        start = time.perf_counter()
        compiler.compile(module, inputs, out, dynamic_shapes=({1: torch.export.Dim("seq",
                                                                                   max=4096)},))
        print(f"compiled in {time.perf_counter() - start:.1f} s")
        model = runtime.load(out)
        print("| seq | eager ms | dayzero ms | eager / dayzero | MoE GFLOP routed | dense | "
              "max abs diff |")
        print("|---|---|---|---|---|---|---|")
        for seq in args.seq:
            gen = torch.Generator().manual_seed(seq)
            ids = torch.randint(0, args.vocab, (1, seq), generator=gen)
            with torch.no_grad():
                want = hf(input_ids=ids, use_cache=False).logits.numpy()
            got = model(ids.numpy())[0]
            eager, ours = [], []
            as_numpy = ids.numpy()
            for _ in range(args.rounds):  # alternate, so that drift hits both alike
                with torch.no_grad():
                    eager += timed(lambda ids=ids: hf(input_ids=ids, use_cache=False), 1)
                ours += timed(lambda x=as_numpy: model(x), 1)
            e, d = statistics.median(eager) * 1e3, statistics.median(ours) * 1e3
            routed, dense = moe_flops(args, seq)
            diff = float(np.max(np.abs(got - want)))
            print(f"| {seq} | {e:.1f} | {d:.1f} | {e / d:.2f} | {routed / 1e9:.2f} | "
                  f"{dense / 1e9:.2f} | {diff:.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
