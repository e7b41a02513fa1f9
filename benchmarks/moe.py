"""A Mixtral- or DeepSeek-V3-shaped mixture-of-experts model compiled by dayzero (onnxruntime,
com.microsoft.MoE) against PyTorch eager on the same inputs.

transformers' MixtralForCausalLM with random weights, scaled down (default: hidden 1024,
8 experts, top-2, 4 layers, expert inner size 3584 as Mixtral's 3.5 x hidden), or with
`--model deepseek_v3` DeepseekV3ForCausalLM (hidden 1024, 64 routed experts in 8 groups of
which 4 are kept, top-6, 2 shared experts, expert inner size 256, MLA with a 128-wide latent,
every layer MoE), compiled with a dynamic sequence length. Alternates eager and the artifact in
rounds so that the machine's drift hits both alike; prints the median per forward of each, their
ratio, the MoE blocks' routed FLOPs (chosen and shared experts) against what a dense all-experts
evaluation would spend, and the largest difference of the logits (which must stay within
dayzero's fp32 bound).

    python benchmarks/moe.py                                  # the default shape, seq 128
    python benchmarks/moe.py --hidden 256 --layers 2 --seq 32 64 --rounds 3
    python benchmarks/moe.py --model deepseek_v3 --layers 2 --seq 64
    python benchmarks/moe.py --quantize int4                  # int4 experts: QMoE

With `--quantize int4` the artifact is compiled with `quantize: {weights: int4, group_size:
32, activations: int8}` (`--activations float` for fp32 activations): routed experts as
com.microsoft.QMoE on int4 codes, every other linear as MatMulNBits;
the last column is then the relative RMS error of the logits against eager's fp32 (int4 is
not within fp32's bound).
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
    if args.model == "deepseek_v3":
        return build_deepseek(args)
    config = MixtralConfig(hidden_size=args.hidden, intermediate_size=args.intermediate,
                           num_hidden_layers=args.layers, num_attention_heads=args.heads,
                           num_key_value_heads=max(1, args.heads // 4), vocab_size=args.vocab,
                           num_local_experts=args.experts, num_experts_per_tok=args.top_k,
                           max_position_embeddings=4096)
    return MixtralForCausalLM(config).eval()


def build_deepseek(args) -> torch.nn.Module:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(
        hidden_size=args.hidden, intermediate_size=3 * args.hidden,
        moe_intermediate_size=args.intermediate, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.heads, vocab_size=args.vocab,
        n_routed_experts=args.experts, num_experts_per_tok=args.top_k,
        n_shared_experts=args.shared, n_group=args.groups, topk_group=args.groups // 2,
        first_k_dense_replace=0, kv_lora_rank=128, q_lora_rank=384, qk_rope_head_dim=32,
        qk_nope_head_dim=64, v_head_dim=64, max_position_embeddings=4096)
    model = DeepseekV3ForCausalLM(config).eval()
    with torch.no_grad():  # a bias that changes choices, as a trained one does
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn(buf.shape) * 0.05)
    return model


DEFAULTS = {  # model -> its shape's defaults
    "mixtral": dict(intermediate=3584, experts=8, top_k=2, shared=0),
    "deepseek_v3": dict(intermediate=256, experts=64, top_k=6, shared=2, groups=8),
}


def moe_flops(args, seq: int) -> tuple[float, float]:
    """(routed, dense) multiply-adds x 2 of the MoE blocks for one forward of `seq` tokens: the
    chosen experts plus the shared ones, against every expert plus the shared ones."""
    per_expert_token = 2 * 3 * args.hidden * args.intermediate  # gate, up, down
    per_layer_token = args.layers * seq * per_expert_token
    return (per_layer_token * (args.top_k + args.shared),
            per_layer_token * (args.experts + args.shared))


def timed(fn, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(DEFAULTS), default="mixtral")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, help="expert inner size")
    parser.add_argument("--experts", type=int)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--shared", type=int, help="shared experts (deepseek_v3)")
    parser.add_argument("--groups", type=int, help="expert groups, half kept (deepseek_v3)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--seq", type=int, nargs="+", default=[128])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quantize", choices=["int4", "int8"], help="quantized weights")
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument("--activations", choices=["float", "int8"], default="int8",
                        help="with --quantize: int8 activations (QMoE accuracy_level 4)")
    args = parser.parse_args(argv)
    for key, value in DEFAULTS[args.model].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.model == "mixtral":
        args.shared = 0

    hf = build(args)
    module, inputs = wrap_pretrained(hf, {"input_ids": torch.randint(0, args.vocab, (1, 8))},
                                     "benchmarks/moe.py")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "moe.dz"
        start = time.perf_counter()
        config = ({"quantize": {"weights": args.quantize, "group_size": args.group_size,
                                "activations": args.activations}} if args.quantize else None)
        compiler.compile(module, inputs, out, config=config,
                         dynamic_shapes=({1: torch.export.Dim("seq", max=4096)},))
        print(f"compiled in {time.perf_counter() - start:.1f} s")
        model = runtime.load(out)
        print(f"{args.model}: hidden {args.hidden}, {args.experts} experts, top-{args.top_k}, "
              f"{args.shared} shared, expert inner {args.intermediate}, {args.layers} layers"
              + (f", {args.quantize} weights (group {args.group_size}, {args.activations} "
                 "activations)" if args.quantize else ""))
        error = "relative RMS logit error" if args.quantize else "max abs diff"
        print("| seq | eager ms | dayzero ms | eager / dayzero | MoE GFLOP routed | dense | "
              f"{error} |")
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
            diff = (float(np.sqrt(((got - want) ** 2).mean() / (want ** 2).mean()))
                    if args.quantize else float(np.max(np.abs(got - want))))
            print(f"| {seq} | {e:.1f} | {d:.1f} | {e / d:.2f} | {routed / 1e9:.2f} | "
                  f"{dense / 1e9:.2f} | {diff:.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
