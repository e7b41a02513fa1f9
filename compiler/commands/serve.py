"""`dayzero serve ARTIFACT`: a generation artifact behind an OpenAI-compatible HTTP API.

POST /v1/completions and /v1/chat/completions (streamed as server-sent events or whole),
GET /v1/models, /health and /metrics; continuous batching over the artifact's paged KV cache.
The server itself is runtime/serving; this command checks the arguments and the artifact first,
so a wrong one fails with a message before any port is opened.
"""

from __future__ import annotations

from pathlib import Path

from ..config import options_from_assignments
from ..errors import DayzeroError
from .run import session_setting


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a generation artifact over an OpenAI-compatible "
                                     "HTTP API")
    p.add_argument("artifact", metavar="ARTIFACT")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch-tokens", type=int, default=None, metavar="N",
                   help="tokens per batched step (default: as compiled)")
    p.add_argument("--max-queue", type=int, default=64, metavar="N",
                   help="requests waiting for their first token before new ones get 429")
    p.add_argument("--model-name", default=None, metavar="NAME",
                   help="the model id clients send (default: the artifact folder's name)")
    p.add_argument("--kv-cache-memory", default="auto", metavar="SIZE",
                   help="KV cache size, e.g. 512MiB; auto (the default): what --max-model-len "
                        "x --max-num-seqs tokens need, at most half the memory available after "
                        "the weights and the activation arena")
    p.add_argument("--max-model-len", type=int, default=None, metavar="N",
                   help="the context served: prompt plus new tokens (default: the artifact's "
                        "positions)")
    p.add_argument("--max-num-seqs", type=int, default=256, metavar="N",
                   help="sequences generated at once; more wait their turn (default 256)")
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="do not reuse the KV blocks of prompt prefixes seen before (automatic "
                        "prefix caching is on by default)")
    p.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                   help="seconds in-flight requests get to finish after SIGTERM")
    p.add_argument("--body-timeout", type=float, default=30.0, metavar="S",
                   help="seconds a client gets to send a request's body (408 after them); "
                        "bodies are at most 16 MiB (413)")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="ranks of a tensor-parallel artifact (its parallel.tensor_parallel); "
                        "this process is rank 0 and starts the others")
    p.add_argument("--session", action="append", default=[], type=session_setting,
                   metavar="KEY=VALUE",
                   help="override a recorded onnxruntime session setting, as `dayzero run "
                        "--session` (e.g. allow_spinning=true on a machine the server has to "
                        "itself)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(handler=serve_command)


def serve_command(args) -> int:
    _check_args(args)
    _require_serve_extra()
    from runtime.generation.model import GenerationModel
    from runtime.serving.memory import load_served

    _check_ranks(args)
    session = options_from_assignments(args.session, "session").get("session")
    model, context = load_served(args.artifact, args.kv_cache_memory, args.max_model_len,
                                 args.max_num_seqs, session, args.max_batch_tokens)
    if not isinstance(model, GenerationModel):
        model.generate()  # a forward artifact: says to compile with --task text-generation
    model.prefix_cache = not args.no_prefix_cache
    compiled = model.spec.max_batch_tokens
    if args.max_batch_tokens is not None and args.max_batch_tokens > compiled:
        raise DayzeroError(f"--max-batch-tokens {args.max_batch_tokens} is more than the "
                           f"{compiled} tokens per step the artifact was compiled for",
                           "--max-batch-tokens", f"pass at most {compiled}, or recompile with "
                           "a larger generation.max_batch_tokens")
    from runtime.serving.server import serve

    name = args.model_name or Path(args.artifact).resolve().name
    return serve(model, name, host=args.host, port=args.port,
                 max_batch_tokens=args.max_batch_tokens, max_queue=args.max_queue,
                 drain_timeout=args.drain_timeout, log_level=args.log_level,
                 body_timeout=args.body_timeout, max_model_len=context,
                 max_num_seqs=args.max_num_seqs)


def _check_ranks(args) -> None:
    """--nproc is the world the artifact was partitioned for, said before anything starts."""
    from runtime.distributed import partitioned_world

    world = partitioned_world(args.artifact)
    if args.nproc == world:
        return
    if world == 1:
        raise DayzeroError(f"--nproc {args.nproc}: {args.artifact} runs on one process (it was "
                           "not compiled tensor parallel)", "--nproc",
                           "drop --nproc, or compile with parallel: {tensor_parallel: N}")
    raise DayzeroError(f"{args.artifact} is tensor parallel over {world} ranks, but --nproc is "
                       f"{args.nproc}", "--nproc", f"pass --nproc {world}")


def _check_args(args) -> None:
    if args.nproc < 1:
        raise DayzeroError(f"--nproc {args.nproc} is not a positive number of ranks", "--nproc",
                           "pass --nproc 1, or the ranks of a tensor-parallel artifact")
    for flag, value, low in (("--max-batch-tokens", args.max_batch_tokens, 1),
                             ("--max-queue", args.max_queue, 1), ("--port", args.port, 0),
                             ("--max-num-seqs", args.max_num_seqs, 1),
                             ("--max-model-len", args.max_model_len, 2)):
        if value is not None and value < low:
            raise DayzeroError(f"{flag} {value} is less than {low}", flag,
                               f"pass {flag} of at least {low}")
    if args.port > 65535:
        raise DayzeroError(f"--port {args.port} is not a TCP port", "--port",
                           "pass a port in 0..65535")
    if not args.body_timeout > 0:
        raise DayzeroError(f"--body-timeout {args.body_timeout} is not a positive number of "
                           "seconds", "--body-timeout", "pass e.g. --body-timeout 30")
    if args.drain_timeout < 0:
        raise DayzeroError(f"--drain-timeout {args.drain_timeout} is negative",
                           "--drain-timeout", "pass a number of seconds >= 0")


def _require_serve_extra() -> None:
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise DayzeroError(f"dayzero serve needs the serve extra: {exc.name} is not installed",
                           "dayzero serve", "pip install -e '.[serve]'") from None
