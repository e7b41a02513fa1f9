"""`dayzero run ARTIFACT`: run an artifact on given or generated inputs."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from ..config import OptionAssignment, options_from_assignments, parse_assignment
from ..errors import DayzeroError

SIZE_HELP = ("size of a symbolic dim for generated inputs: the artifact's symbol (s0) or the "
             "torch.export Dim name it was compiled from (seq); `dayzero inspect` lists them")
INPUT_HELP = ("an input from a file: NAME=FILE.npy, or NAME=FILE.npz (the array called NAME "
              "in it, else its only array)")

# generated inputs larger than this are refused (a typo in --size, not a model to run)
MAX_GENERATED_BYTES = 16 * 2**30


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run an artifact")
    p.add_argument("artifact", metavar="ARTIFACT")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help=INPUT_HELP)
    p.add_argument("--size", action="append", default=[], metavar="SYMBOL=N",
                   help=SIZE_HELP)
    p.add_argument("--output", metavar="FILE.npz",
                   help="write the outputs here (by output name); without it they are "
                        "discarded after the statistics are printed")
    p.add_argument("--check", metavar="SPEC",
                   help="also run SPEC (the file.py:function the artifact was compiled from) "
                        "in PyTorch eager on the same inputs and say whether the outputs "
                        "match (max abs error within 1e-5 x max(1, max|eager|))")
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
    print(_timing(model, elapsed))
    if args.output:
        from runtime.npz_files import write_npz

        path = Path(args.output)
        try:
            write_npz(path, {s.name: o for s, o in zip(model.output_specs, outputs)})
        except OSError as exc:
            raise DayzeroError(f"cannot write {path}: {exc.strerror or exc}", "--output",
                               "choose a writable location for the .npz file") from None
        print(f"wrote {args.output}")
    else:
        print("outputs discarded (--output FILE.npz keeps them)")
    if args.check:
        print(check_against_eager(args.check, model, inputs, outputs))
    return 0


def _timing(model, elapsed: float) -> str:
    """The run time; for ranks launched by this call, their start-up apart from the run."""
    ranks = getattr(model, "last_timing", None)
    if not ranks:
        return f"ran in {elapsed * 1000:.1f} ms"
    run = ranks["run_seconds"]
    return (f"ran in {run * 1000:.1f} ms on {model.nproc} ranks; starting and loading the "
            f"ranks took {(elapsed - run) * 1000:.1f} ms more")


def check_against_eager(spec_text: str, model, inputs: list[np.ndarray],
                        outputs: tuple[np.ndarray, ...]) -> str:
    """The verdict of `run --check`: the artifact's outputs against the SPEC's module in
    PyTorch eager on the same inputs; a mismatch is an error naming the output."""
    import torch

    from ..spec import load_spec

    spec = load_spec(spec_text)
    if spec.checkpoint is not None:
        raise DayzeroError("--check needs a file.py:function SPEC; a checkpoint folder has no "
                           "weights in memory to run eagerly", "--check",
                           "use `dayzero align` for a checkpoint")
    with torch.no_grad():
        eager = spec.module(*[torch.from_numpy(np.array(x)) for x in inputs])
    if isinstance(eager, torch.Tensor):
        eager = (eager,)
    eager = [e.detach().numpy() if isinstance(e, torch.Tensor) else np.asarray(e)
             for e in (eager if isinstance(eager, (list, tuple)) else [eager])]
    if len(eager) != len(outputs):
        raise DayzeroError(f"{spec_text} returns {len(eager)} output(s), the artifact "
                           f"{len(outputs)}", "--check",
                           "give the SPEC the artifact was compiled from")
    worst, tolerance = 0.0, 0.0
    for out_spec, got, want in zip(model.output_specs, outputs, eager):
        if got.shape != want.shape:
            raise DayzeroError(f"output {out_spec.name} is {list(got.shape)}, PyTorch eager "
                               f"gives {list(want.shape)}", f"--check {spec_text}",
                               "give the SPEC the artifact was compiled from")
        want64, got64 = want.astype(np.float64), got.astype(np.float64)
        error = float(np.max(np.abs(got64 - want64))) if want.size else 0.0
        tol = 1e-5 * max(1.0, float(np.max(np.abs(want64))) if want.size else 1.0)
        if not error <= tol:  # NaN fails too
            raise DayzeroError(f"output {out_spec.name} differs from PyTorch eager: max abs "
                               f"error {error:.3g} > tolerance {tol:.3g}",
                               f"--check {spec_text}", "`dayzero align SPEC` finds the first "
                               "IR node that diverges (quantized or bf16 weights differ by "
                               "design)")
        worst, tolerance = max(worst, error), max(tolerance, tol)
    return (f"matches PyTorch eager within {worst:.3g} (max abs error; tolerance "
            f"{tolerance:.3g} = 1e-5 x max(1, max|eager|))")


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

    manifest = _read_manifest(Path(args.artifact))
    check_world(manifest, nproc, f"--nproc {nproc}")
    if manifest.get("generation") is not None:  # rank 0 here starts the others
        return runtime.load(args.artifact, timeout=args.timeout)
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


def _symbols(model) -> tuple[dict[str, tuple[int, int | None]], dict[str, str]]:
    """The artifact's size symbols with their ranges, and the Dim names that alias them."""
    ranges = {}
    for spec in model.input_specs:
        ranges.update(spec.ranges)
    recorded = getattr(model, "manifest", {}).get("symbol_aliases", {})
    aliases = {name: sym for name, sym in recorded.items()
               if isinstance(name, str) and sym in ranges} if isinstance(recorded, dict) else {}
    return ranges, aliases


def _resolve_sizes(model, sizes: dict[str, int]) -> dict[str, int]:
    """--size names (symbols or their Dim names) to symbols, each checked against its range."""
    ranges, aliases = _symbols(model)
    resolved: dict[str, int] = {}
    for name, value in sizes.items():
        symbol = aliases.get(name, name)
        if symbol not in ranges:
            known = [f"{s} ({', '.join(n for n, t in aliases.items() if t == s)})"
                     if s in aliases.values() else s for s in sorted(ranges)]
            raise DayzeroError(f"--size {name}={value}: the artifact's inputs have no size "
                               f"symbol '{name}'", "--size",
                               f"its symbols are {', '.join(known)}" if known else
                               "its inputs have static shapes; drop --size")
        lo, hi = ranges[symbol]
        if value < lo or (hi is not None and value > hi):
            shown = f"{symbol} ({name})" if symbol != name else symbol
            raise DayzeroError(f"--size {name}={value} is outside the range of {shown}, "
                               f"[{lo}, {hi if hi is not None else 'unbounded'}]", "--size",
                               "pick a size in the range the model was exported for")
        if symbol in resolved and resolved[symbol] != value:
            raise DayzeroError(f"--size sets {symbol} twice ({resolved[symbol]} and {value})",
                               "--size", "give each symbol once")
        resolved[symbol] = value
    return resolved


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
        given[name] = _read_array(name, file)
    if given and len(given) != len(model.input_specs):
        missing = [s.name for s in model.input_specs if s.name not in given]
        raise DayzeroError(f"no --input for {', '.join(missing)}", "--input",
                           "give every input, or none to run on generated inputs")
    if given:
        if sizes:
            raise DayzeroError("--size sets the sizes of generated inputs, but every input is "
                               "given with --input", "--size", "drop --size")
        return [given[s.name] for s in model.input_specs]
    return _generated_inputs(model, _resolve_sizes(model, sizes))


def _read_array(name: str, file: str) -> np.ndarray:
    """A .npy file's array, or from an .npz the array called `name`, else its only array."""
    try:
        loaded = np.load(file, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            return loaded
        with loaded:
            if name in loaded.files:
                return loaded[name]
            if len(loaded.files) == 1:
                return loaded[loaded.files[0]]
            keys = ", ".join(loaded.files) or "none"
    except (OSError, ValueError, EOFError) as exc:
        raise DayzeroError(f"cannot read {file}: {exc}", f"--input {name}",
                           "give a .npy file written by numpy.save (or an .npz by "
                           "numpy.savez)") from None
    raise DayzeroError(f"{file} holds several arrays ({keys}) and none is called '{name}'",
                       f"--input {name}", f"name the array '{name}' in the .npz, or save it "
                       "alone with numpy.save")


def _generated_inputs(model, sizes: dict[str, int]) -> list[np.ndarray]:
    """Deterministic inputs within the specs: symbols at --size, else their lower bound (min 8)."""
    rng = np.random.default_rng(0)
    shapes = []
    for spec in model.input_specs:
        shape = []
        for dim in spec.shape:
            if isinstance(dim, int):
                shape.append(dim)
                continue
            if dim not in spec.ranges:  # an expression of symbols, e.g. 2*s0
                from runtime.dims import eval_dim

                values = {s: sizes.get(s, _default_size(r)) for s, r in spec.ranges.items()}
                shape.append(eval_dim(dim, values))
                continue
            shape.append(sizes.get(dim, _default_size(spec.ranges[dim])))
        shapes.append(shape)
    total = sum(int(np.prod(shape, dtype=object)) * np.dtype(_np_name(spec.dtype)).itemsize
                for shape, spec in zip(shapes, model.input_specs))
    if total > MAX_GENERATED_BYTES:
        raise DayzeroError(f"generated inputs of shapes {shapes} would take "
                           f"{total / 2**30:.1f} GiB", "--size",
                           "give smaller sizes, or the inputs themselves with --input")
    arrays = []
    for spec, shape in zip(model.input_specs, shapes):
        if spec.dtype.startswith("f"):
            arrays.append(rng.standard_normal(shape).astype(np.dtype(_np_name(spec.dtype))))
        elif spec.dtype == "bool":
            arrays.append(np.ones(shape, dtype=bool))
        else:
            arrays.append(rng.integers(0, 2, size=shape).astype(_np_name(spec.dtype)))
    print("inputs: generated " + ", ".join(f"{s.name}{list(a.shape)}"
                                            for s, a in zip(model.input_specs, arrays)))
    return arrays


def _default_size(bounds: tuple[int, int | None]) -> int:
    lo, hi = bounds
    return max(lo, min(8, hi or 8))


def _np_name(dtype: str) -> str:
    return {"f32": "float32", "f16": "float16", "f64": "float64", "i64": "int64", "i32": "int32",
            "i8": "int8", "u8": "uint8", "bool": "bool"}.get(dtype, "float32")


