"""Corrupted artifacts against the runtime: every outcome is the same output or a clean error.

Two pristine artifacts are built once (a forward one: the tiny Llama of examples/llama.py; a
generation one: a tiny Llama checkpoint folder with a word tokenizer and a chat template, as
`dayzero compile FOLDER` compiles it). Each case copies one, corrupts one file (manifest.json,
graph.dzir, backend/lowering.json, backend/model.onnx, a safetensors header or body, a tokenizer
file) with a seeded mutation, and usually re-hashes it into the manifest so the load gets past
the hash check to the deeper checks. A worker process (numpy and onnxruntime, no torch) loads
and runs each case: a forward on fixed ids, or `generate` and a chat `generate_text`; the parent
feeds it one case at a time with a deadline, so a crash (a signal) and a hang (the deadline) are
seen and counted, and the worker is restarted.

Outcomes: `same` (the pristine's output), `error` (a DayzeroError: the clean refusal), `changed`
(another output after an edit that legitimately changes the model: its weights, its ONNX graph
or its tokenizer, re-hashed), `suspect` (another output after an edit that should not change
it: a manifest field, a schema file), `raw` (any other exception), `crash`, `hang`. Targets: 0
raw, 0 crash, 0 hang, 0 suspect.

    python benchmarks/fuzz_artifacts.py --cases 4000          # alone; benchmarks/fuzz.py runs all
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("forward", "generation")
FORWARD_IDS = [[1, 5, 9, 17, 33, 65, 129, 200, 3, 4, 7, 11]]
PROMPT_IDS = [[1, 7, 8, 9, 10], [1, 11]]
CHAT = [{"role": "user", "content": "hello world the model runs"}]
WORKER_MEMORY = 4 * 2**30  # address space of the worker: a hostile file cannot take the machine
HOSTILE_VALUES = [
    -1, 0, 1, 2**31, 2**63, -2**63, 2**64, 10**30, 1e308, -1e308, 0.5, "", "x" * 5000, "\ud800",
    "../../etc/passwd", "/etc/passwd", "s0", "s0**64", "Max(" + ",".join(["s0"] * 16) + ")",
    None, True, False, [], {}, [[[[[[]]]]]], {"a": {"b": {}}}, "float32", "bfloat16", "int4",
]


# -- building the pristine artifacts ---------------------------------------------------------------

CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} "
                 "{% endfor %}{% if add_generation_prompt %}assistant :{% endif %}")
WORDS = ["hello", "world", "the", "model", "runs", "on", "day", "zero", "user", "assistant", ":"]


def _checkpoint(folder: Path) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                         max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    vocab.update({f"w{i}": i for i in range(len(vocab), 256)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>", chat_template=CHAT_TEMPLATE).save_pretrained(folder)


def build_pristine(work: Path) -> dict[str, Path]:
    """The forward and generation artifacts every case starts from (built once per folder)."""
    from compiler.cli import main

    work.mkdir(parents=True, exist_ok=True)
    built = {"forward": work / "forward.dz", "generation": work / "generation.dz"}
    if not (built["forward"] / "manifest.json").is_file():
        assert main(["compile", str(ROOT / "examples" / "llama.py") + ":build", "-o",
                     str(built["forward"]), "--force", "-q"]) == 0
    if not (built["generation"] / "manifest.json").is_file():
        _checkpoint(work / "ckpt")
        assert main(["compile", str(work / "ckpt"), "-o", str(built["generation"]),
                     "--seq-len", "2:256", "--force", "-q"]) == 0
    return built


# -- mutations ---------------------------------------------------------------------------------

@dataclass
class Case:
    kind: str
    path: Path
    target: str
    mutation: str
    rehashed: bool
    semantic: bool  # an edit that may legitimately change the output


_SEMANTIC = ("backend/model.onnx", "weights/", "tokenizer/", "graph.dzir")


def _files(root: Path) -> list[str]:
    return sorted(json.loads((root / "manifest.json").read_text())["files"])


def _pick_target(rng: random.Random, files: list[str]) -> str:
    weights = {"manifest.json": 40, "graph.dzir": 12, "backend/lowering.json": 10}
    choices = ["manifest.json"] + files
    return rng.choices(choices, [weights.get(f, 25 / max(1, len(files))) for f in choices])[0]


def _json_paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _json_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:64]):
            yield from _json_paths(item, (*path, index))


def _hostile(rng: random.Random, old):
    roll = rng.random()
    if roll < 0.15 and isinstance(old, int) and not isinstance(old, bool):
        return old + rng.choice([-1, 1, -old - 1, old, 2**40])
    if roll < 0.25 and isinstance(old, str):
        cut = rng.randrange(len(old) + 1)
        return old[:cut] + rng.choice(["", "0", "../", "\x00", "\ud800", "*", ")"]) + old[cut:]
    if roll < 0.30:
        return "DEEP"  # replaced by deep nesting in the text
    return rng.choice(HOSTILE_VALUES)


def mutate_json(rng: random.Random, text: str) -> tuple[str, str]:
    """One structural edit of a JSON document: (new text, what was done)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return mutate_bytes(rng, text.encode()).decode("utf-8", "replace"), "bytes"
    paths = [p for p in _json_paths(doc) if p]
    if not paths or rng.random() < 0.1:
        return mutate_text(rng, text)
    path = rng.choice(paths)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    roll = rng.random()
    if roll < 0.15 and isinstance(parent, dict):
        del parent[key]
        what = f"deleted {_show(path)}"
    elif roll < 0.22 and isinstance(parent, dict):
        parent[f"unknown_{rng.randrange(100)}"] = rng.choice(HOSTILE_VALUES)
        what = f"added a key beside {_show(path)}"
    else:
        parent[key] = _hostile(rng, parent[key])
        what = f"{_show(path)} = {_show(parent[key])}"
    depth = rng.choice([100, 5000, 100000])
    return json.dumps(doc).replace('"DEEP"', "[" * depth + "]" * depth), what


def mutate_text(rng: random.Random, text: str) -> tuple[str, str]:
    lines = text.splitlines(keepends=True) or [""]
    i = rng.randrange(len(lines))
    roll = rng.random()
    if roll < 0.25:
        del lines[i]
        return "".join(lines), f"deleted line {i + 1}"
    if roll < 0.45:
        lines.insert(i, lines[rng.randrange(len(lines))])
        return "".join(lines), f"duplicated a line at {i + 1}"
    if roll < 0.55:
        return text[:rng.randrange(len(text) + 1)], "truncated"
    line = lines[i]
    cut = rng.randrange(len(line) + 1)
    token = rng.choice(["%", "@", "(", ")", "[", "]", "{", "}", ",", "-", "s0", "s9", "**64",
                        "f32", "i64", "9" * 30, "nan", "\ud800", " ", "\n", '"', "Max(s0,s0)"])
    lines[i] = line[:cut] + token + line[cut + rng.randrange(0, 3):]
    return "".join(lines), f"edited line {i + 1}"


def mutate_bytes(rng: random.Random, data: bytes, header: int = 4096) -> bytes:
    data = bytearray(data)
    roll = rng.random()
    if roll < 0.2 or not data:
        return bytes(data[:rng.randrange(len(data) + 1)])
    if roll < 0.3:
        return bytes(data) + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    span = min(len(data), header) if rng.random() < 0.7 else len(data)
    for _ in range(rng.randrange(1, 8)):
        data[rng.randrange(span)] = rng.randrange(256)
    return bytes(data)


def mutate_safetensors(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    if len(data) < 8 or rng.random() < 0.3:
        return mutate_bytes(rng, data, header=64), "bytes"
    size = int.from_bytes(data[:8], "little")
    if size > len(data) - 8:
        return mutate_bytes(rng, data, header=64), "bytes"
    header, what = mutate_json(rng, data[8:8 + size].decode("utf-8", "replace"))
    raw = header.encode("utf-8", "surrogatepass")
    return len(raw).to_bytes(8, "little") + raw + data[8 + size:], f"header: {what}"


def _show(value) -> str:
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."


def make_case(rng: random.Random, pristine: dict[str, Path], folder: Path, index: int) -> Case:
    kind = rng.choice(KINDS)
    root = folder / f"case{index}"
    shutil.copytree(pristine[kind], root)
    target = _pick_target(rng, _files(root))
    path = root / target
    if target.endswith(".safetensors"):
        data, what = mutate_safetensors(rng, path.read_bytes())
    elif target.endswith(".json"):
        text, what = mutate_json(rng, path.read_text(encoding="utf-8"))
        data = text.encode("utf-8", "surrogatepass")
    elif target.endswith((".dzir", ".jinja", ".txt")):
        text, what = mutate_text(rng, path.read_text(encoding="utf-8"))
        data = text.encode("utf-8", "surrogatepass")
    else:
        data, what = mutate_bytes(rng, path.read_bytes()), "bytes"
    path.write_bytes(data)
    rehashed = target != "manifest.json" and rng.random() < 0.85
    if rehashed:
        _rehash(root, target, data)
    semantic = rehashed and target.startswith(_SEMANTIC)
    return Case(kind, root, target, what, rehashed, semantic)


def _rehash(root: Path, target: str, data: bytes) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"][target] = {**manifest["files"][target], "size": len(data),
                                 "sha256": hashlib.sha256(data).hexdigest()}
    (root / "manifest.json").write_text(json.dumps(manifest))


# -- the worker: load and run, one case per line ---------------------------------------------------

def _run(kind: str, path: str):
    import numpy as np

    import runtime

    model = runtime.load(path)
    if kind == "forward":
        return np.asarray(model(np.asarray(FORWARD_IDS, dtype=np.int64))[0]).round(4).tolist()
    ids = model.generate(PROMPT_IDS[0:1], max_new_tokens=4).tolist()
    text = model.generate_text(CHAT, max_new_tokens=4)
    return [ids, text]


def worker(pristine: dict[str, str]) -> None:
    """Read `kind path` lines, answer one JSON outcome per line (runs in its own process)."""
    import resource

    from compiler.errors import DayzeroError

    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
    # answers go to a private copy of stdout; whatever else writes to stdout (a library's print,
    # a native warning on fd 1) goes to stderr, so it cannot be taken for an answer
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    expected = {kind: _run(kind, path) for kind, path in pristine.items()}
    print(json.dumps({"ready": True}), file=answers, flush=True)
    for line in sys.stdin:
        kind, path = line.rstrip("\n").split(" ", 1)
        try:
            got = _run(kind, path)
            answer = {"outcome": "same" if got == expected[kind] else "changed"}
        except DayzeroError as err:
            answer = {"outcome": "error", "detail": err.what.splitlines()[0][:200]}
        except BaseException as err:  # noqa: BLE001 - what the fuzz is looking for
            if isinstance(err, KeyboardInterrupt):
                raise
            answer = {"outcome": "raw", "detail": f"{type(err).__name__}: {str(err)[:300]}",
                      "where": _last_frame(err)}
        print(json.dumps(answer), file=answers, flush=True)


def _last_frame(err: BaseException) -> str:
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return "" if tb is None else f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"


class Worker:
    """The worker process seen from the parent: `ask` with a deadline, restarted after a death."""

    def __init__(self, pristine: dict[str, Path], deadline: float):
        self.pristine = {k: str(v) for k, v in pristine.items()}
        self.deadline = deadline
        self.proc: subprocess.Popen | None = None

    def _start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", json.dumps(self.pristine)], cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ready = self._read(120.0)
        if not ready or not ready.get("ready"):
            raise RuntimeError("the fuzz worker did not start (pristine artifacts fail to run?)")

    def _read(self, seconds: float) -> dict | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], seconds)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def ask(self, case: Case) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write(f"{case.kind} {case.path}\n")
        self.proc.stdin.flush()
        answer = self._read(self.deadline)
        if answer is not None:
            return answer
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            return {"outcome": "hang", "detail": f"no answer in {self.deadline:.0f} s"}
        code = self.proc.wait()
        return {"outcome": "crash", "detail": f"worker exited with {code}"}

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


# -- the run -----------------------------------------------------------------------------------

FAILURES = ("raw", "crash", "hang", "suspect")


@dataclass
class Report:
    counts: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(self.counts[name] for name in FAILURES)

    def line(self) -> str:
        order = ("same", "error", "changed", *FAILURES)
        return ", ".join(f"{name} {self.counts[name]}" for name in order)


def classify(case: Case, answer: dict) -> str:
    outcome = answer["outcome"]
    if outcome == "changed" and not case.semantic:
        return "suspect"
    return outcome


def run(cases: int, seed: int, work: Path, deadline: float = 60.0,
        log=print, verbose: bool = False) -> Report:
    """`cases` seeded corrupted artifacts through one worker; the failures described."""
    pristine = build_pristine(work / "pristine")
    report = Report()
    rng = random.Random(seed)
    start = time.perf_counter()
    worker_ = Worker(pristine, deadline)
    try:
        with tempfile.TemporaryDirectory(dir=work) as scratch:
            for index in range(cases):
                case = make_case(rng, pristine, Path(scratch), index)
                answer = worker_.ask(case)
                outcome = classify(case, answer)
                report.counts[outcome] += 1
                text = (f"case {index} ({case.kind}, {case.target}: {case.mutation}) -> "
                        f"{outcome}: {answer.get('detail', '')} {answer.get('where', '')}")
                text = text.encode("utf-8", "backslashreplace").decode("utf-8")
                if outcome in FAILURES:
                    report.failures.append(text)
                if outcome in FAILURES or verbose:
                    log(text)
                shutil.rmtree(case.path, ignore_errors=True)
    finally:
        worker_.close()
    report.seconds = time.perf_counter() - start
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "dz-fuzz")
    parser.add_argument("--deadline", type=float, default=60.0,
                        help="seconds a case may take before it counts as a hang")
    parser.add_argument("--verbose", action="store_true", help="print every case")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    report = run(args.cases, args.seed, args.work, args.deadline, verbose=args.verbose)
    print(f"artifacts: {args.cases} cases in {report.seconds:.0f} s: {report.line()}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
