"""`dayzero generate ARTIFACT --prompt TEXT`: stream a generation artifact's text, then its speed.

The prompt goes through the tokenizer the artifact carries (`--chat` wraps it as one user
message in the chat template); tokens are printed as they come, decoded incrementally, and a
last line on stderr says the time to first token, the decode rate and the KV cache the run used.
"""

from __future__ import annotations

import sys

from ..errors import DayzeroError


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text with a generation artifact")
    p.add_argument("artifact", metavar="ARTIFACT")
    p.add_argument("--prompt", required=True, metavar="TEXT")
    p.add_argument("--chat", action="store_true",
                   help="send the prompt as a user message through the chat template")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N")
    p.add_argument("--temperature", type=float, default=None, metavar="T",
                   help="sample at this temperature (default: greedy)")
    p.add_argument("--top-k", type=int, default=None, metavar="K")
    p.add_argument("--top-p", type=float, default=None, metavar="P")
    p.add_argument("--seed", type=int, default=None, metavar="S")
    p.add_argument("--kv-cache-memory", default=None, metavar="SIZE",
                   help="KV cache size for this run, e.g. 512MiB (default: as compiled)")
    p.set_defaults(handler=generate_command)


def generate_command(args) -> int:
    import runtime

    model = runtime.load(args.artifact, kv_cache_memory=args.kv_cache_memory)
    try:
        return _generate(model, args)
    finally:
        close = getattr(model, "close", None)  # a tensor-parallel model stops its ranks
        if close is not None:
            close()


def _generate(model, args) -> int:
    from runtime.generation.model import GenerationModel

    if not isinstance(model, GenerationModel):
        model.generate()
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise DayzeroError(f"{args.artifact} carries no tokenizer, so it cannot read --prompt",
                           args.artifact, "compile it from a checkpoint folder that has a "
                           "tokenizer.json, or call runtime.load(...).generate with token ids")
    ids = tokenizer.chat_ids([{"role": "user", "content": args.prompt}]) if args.chat \
        else tokenizer.encode(args.prompt)
    sampling = {"do_sample": args.temperature is not None, "temperature": args.temperature or 1.0,
                "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed}
    shown = ""
    new: list[int] = []
    for token in model.stream([ids], max_new_tokens=args.max_new_tokens, **sampling):
        new.append(token[1])
        text = tokenizer.decode(new)
        if text.startswith(shown):  # a multi-byte character waits for its last token
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text
    sys.stdout.write("\n")
    print(_summary(model, len(ids)), file=sys.stderr)
    return 0


def _summary(model, prompt_tokens: int) -> str:
    stats = model.stats
    rate = stats.decode_tokens_per_s
    ttft = f"{stats.first_token_s * 1000:.0f} ms" if stats.first_token_s is not None else "-"
    ranks = getattr(model, "ranks", 1)  # a tensor-parallel model: each rank holds 1/ranks
    used = stats.peak_blocks * model.runner.layout.block_bytes * ranks
    decode = f"{rate:.1f} tokens/s" if rate else "-"
    return (f"prompt {prompt_tokens} tokens, generated {stats.generated_tokens}: TTFT {ttft}, "
            f"decode {decode}; KV cache {stats.peak_blocks} of {stats.total_blocks} blocks "
            f"({used / 2**20:.1f} of {model.runner.cache_bytes * ranks / 2**20:.0f} MiB"
            + (f" over {ranks} ranks)" if ranks > 1 else ")"))
