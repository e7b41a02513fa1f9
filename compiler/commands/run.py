"""`dayzero run ARTIFACT`: run an artifact on given or generated inputs."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from ..config import OptionAssignment, options_from_assignments, parse_assignment
from ..errors import DayzeroError


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run an artifact")
    p.add_argument("artifact", metavar="ARTIFACT")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    p.add_argument("--size", action="append", default=[], metavar="SYMBOL=N",
                   help="size of a symbolic dim for generated inputs")
    p.add_argument("--output", metavar="FILE.npz")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="ranks to start on this machine for a partitioned artifact (default: "
                   "the artifact's world size); torchrun runs it on several machines")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="how long a collective waits for the other ranks (default 300)")
    p.add_argument("--session", action="append", default=[], type=session_setting,
                   metavar="KEY=VALUE",
                   help="override a recorded onnxruntime session setting for this run "
                        "(repeatable; VALUE is YAML), e.g. --session allow_spinning=false "
                        "--session intra_op_threads=2; allow_spinning takes true, false or auto")
    p.set_defaults(handler=run_command)


def run_command(args) -> int:
    model = _load(args)
    described = getattr(model, "describe", lambda: None)()
    if described:
        print(described)
    inputs = _gather_inputs(model, args.input, _sizes(args.size))
    start = time.perf_counter()
    outputs = model(*inputs)
    elapsed = time.perf_counter() - start
    for spec, out in zip(model.output_specs, outputs):
        stats = (f"mean {out.mean():.6g} std {out.std():.6g}" if out.size and
                 np.issubdtype(out.dtype, np.floating) else "")
        print(f"{spec.name}: {out.dtype}{list(out.shape)} {stats}".rstrip())
    print(f"ran in {elapsed * 1000:.1f} ms")
    if args.output:
        from runtime.npz_files import write_npz

        write_npz(Path(args.output), {s.name: o for s, o in zip(model.output_specs, outputs)})
        print(f"wrote {args.output}")
    return 0


def _load(args):
    """A CompiledModel, or for a partitioned artifact one that launches its ranks here."""
    import runtime
    from runtime.distributed import DEFAULT_TIMEOUT, LaunchedModel, check_world, partitioned_world

    world = partitioned_world(args.artifact)
    nproc = world if args.nproc is None else args.nproc
    if nproc < 1:
        raise DayzeroError(f"--nproc {nproc} is not a positive number of ranks", "--nproc")
    session = options_from_assignments(args.session, "session").get("session")
    if world == 1 and nproc == 1:
        return runtime.load(args.artifact, session=session)
    if session:
        raise DayzeroError("--session cannot override the settings of a partitioned artifact "
                           "yet", args.artifact, "run it without --session")
    from runtime.artifact import _read_manifest

    check_world(_read_manifest(Path(args.artifact)), nproc, f"--nproc {nproc}")
    # the ranks hash their own weight shards; here only sizes and headers are read
    return LaunchedModel(runtime.open_artifact(args.artifact, verify="size"),
                         timeout=args.timeout or DEFAULT_TIMEOUT)


def session_setting(text: str) -> OptionAssignment:
    """argparse type: a bad `--session` is a usage error (exit 2) with one message."""
    try:
        return parse_assignment(text, prefixed=False)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; use KEY=VALUE, e.g. "
                                         "allow_spinning=false") from None


def _sizes(items: list[str]) -> dict[str, int]:
    sizes = {}
    for item in items:
        name, _, value = item.partition("=")
        if not value.isdigit():
            raise DayzeroError(f"--size {item} is not SYMBOL=N", "--size", "e.g. --size s0=64")
        sizes[name] = int(value)
    return sizes


def _gather_inputs(model, items: list[str], sizes: dict[str, int]) -> list[np.ndarray]:
    given = {}
    for item in items:
        name, _, file = item.partition("=")
        if not file:
            raise DayzeroError(f"--input {item} is not NAME=FILE.npy", "--input")
        known = [s.name for s in model.input_specs]
        if name not in known:
            raise DayzeroError(f"--input names '{name}', which is not an input of the model",
                               "--input", f"inputs are {', '.join(known)}")
        try:
            given[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise DayzeroError(f"cannot read {file}: {exc}", f"--input {name}",
                               "give a .npy file written by numpy.save") from None
    if given and len(given) != len(model.input_specs):
        missing = [s.name for s in model.input_specs if s.name not in given]
        raise DayzeroError(f"no --input for {', '.join(missing)}", "--input",
                           "give every input, or none to run on generated inputs")
    if given:
        return [given[s.name] for s in model.input_specs]
    return _generated_inputs(model, sizes)


def _generated_inputs(model, sizes: dict[str, int]) -> list[np.ndarray]:
    """Deterministic inputs within the specs: symbols at --size, else their lower bound (min 8)."""
    rng = np.random.default_rng(0)
    arrays = []
    for spec in model.input_specs:
        shape = []
        for dim in spec.shape:
            if isinstance(dim, int):
                shape.append(dim)
                continue
            lo, hi = spec.ranges.get(dim, (1, None))
            size = sizes.get(dim, max(lo, min(8, hi or 8)))
            shape.append(size)
        if spec.dtype.startswith("f"):
            arrays.append(rng.standard_normal(shape).astype(np.dtype(_np_name(spec.dtype))))
        elif spec.dtype == "bool":
            arrays.append(np.ones(shape, dtype=bool))
        else:
            arrays.append(rng.integers(0, 2, size=shape).astype(_np_name(spec.dtype)))
    print("inputs: generated " + ", ".join(f"{s.name}{list(a.shape)}"
                                            for s, a in zip(model.input_specs, arrays)))
    return arrays


def _np_name(dtype: str) -> str:
    return {"f32": "float32", "f16": "float16", "f64": "float64", "i64": "int64", "i32": "int32",
            "i8": "int8", "u8": "uint8", "bool": "bool"}.get(dtype, "float32")


