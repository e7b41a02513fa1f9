"""GenerationModel: a generation artifact as `runtime.load` returns it.

Its graph is a KV-cached generation step (passes/derive_generation_step.py). `generate` and
`stream` run prompts through it as transformers' `generate` does (same arguments, same output
layout: prompts left-padded to one length, then the new tokens, rows that stopped early padded);
`generate_text` adds the artifact's tokenizer. Called like any model, `m(input_ids)` is the
prefill forward it was compiled from (logits for every position): `dayzero run`, `bench` and
`align` use it so.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.errors import InputError

from ..model import CompiledModel
from ..sampling import SamplingParams
from ..specs import specs_from_manifest
from ..to_numpy import to_numpy
from .engine import StepRunner
from .prompts import Prompts, check_request
from .scheduler import Scheduler
from .scheduler import Sequence as Request
from .spec import GenerationSpec
from .step import StepPart
from .tokenizer import ArtifactTokenizer, load_tokenizer


class GenerationModel:
    def __init__(self, step: CompiledModel, *, kv_cache_memory: int | None = None):
        self.step_model = step
        self.spec = GenerationSpec.from_manifest(step.manifest.get("generation"),
                                                 str(step.path))
        forward = {"symbols": step.manifest.get("symbols", {}),
                   **step.manifest["generation"].get("forward", {})}
        self.input_specs = specs_from_manifest(forward, "inputs")
        self.output_specs = specs_from_manifest(forward, "outputs")
        self._kv_cache_memory = kv_cache_memory
        self._runner: StepRunner | None = None
        self._tokenizer: ArtifactTokenizer | None | bool = False  # False: not read yet
        self.stats = GenerationStats()

    def __getattr__(self, name: str) -> Any:  # path, manifest, backend, describe, ...
        return getattr(self.step_model, name)

    def __repr__(self) -> str:
        return f"GenerationModel({str(self.path)!r}, backend={self.backend.name!r})"

    @property
    def runner(self) -> StepRunner:
        if self._runner is None:  # the pool is allocated at first use, then kept
            self._runner = StepRunner(self.step_model, self.spec, self._kv_cache_memory)
        return self._runner

    @property
    def tokenizer(self) -> ArtifactTokenizer | None:
        """The tokenizer the artifact carries (None if compiled without one)."""
        if self._tokenizer is False:
            self._tokenizer = load_tokenizer(self.step_model)
        return self._tokenizer

    def generate_text(self, prompt: str | Sequence[Mapping[str, Any]], max_new_tokens: int = 64,
                      **kwargs: Any) -> str:
        """The text generated after `prompt` (a string), or after chat `messages` rendered with
        the artifact's chat template; other arguments as `generate`."""
        tokenizer = self._require_tokenizer()
        ids = (tokenizer.encode(prompt) if isinstance(prompt, str)
               else tokenizer.chat_ids(prompt))
        out = self.generate([ids], max_new_tokens=max_new_tokens, **kwargs)
        return tokenizer.decode(out[0, len(ids):].tolist())  # one prompt: no padding

    def _require_tokenizer(self) -> ArtifactTokenizer:
        if self.tokenizer is None:
            raise InputError(f"{self.path} carries no tokenizer", str(self.path),
                             "compile from a checkpoint folder with tokenizer.json (or pass "
                             "compile(..., tokenizer=FOLDER)); or call generate with ids")
        return self.tokenizer

    # -- the prefill forward ----------------------------------------------------------------
    def __call__(self, input_ids: Any) -> tuple[np.ndarray]:
        """Logits [batch, seq, vocab] for every position, as the exported forward returns."""
        ids = np.asarray(to_numpy(input_ids))
        prompts = Prompts.from_ids(ids, None, self.spec)
        runner = self.runner
        rows = []
        for tokens in prompts.rows:
            runner.allocator.grow("forward", len(tokens))
            try:
                table = runner.allocator.tables["forward"]
                part = StepPart(np.asarray(tokens, np.int64), 0, table)
                rows.append(self._all_logits(part))
            finally:
                runner.allocator.release("forward")
        return (np.stack(rows),)

    def _all_logits(self, part: StepPart) -> np.ndarray:
        # every position's logits: one part per token would change nothing but the row choice
        from .step import build_step

        step = build_step([part], self.spec.block_size)
        n = len(part.tokens)
        step.feeds["logit_indices"] = np.arange(n, dtype=np.int64)
        return self.runner.call(step.feeds)[0].reshape(n, -1)

    # -- generation ---------------------------------------------------------------------------
    def generate(self, input_ids: Any, max_new_tokens: int = 20, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None, eos_token_id: int | Sequence[int] | None = None,
                 attention_mask: Any = None, pad_token_id: int | None = None) -> np.ndarray:
        """Token ids [batch, prompt_len + new], as transformers' `generate` returns them."""
        prompts, requests = self._requests(input_ids, attention_mask, max_new_tokens,
                                           SamplingParams(do_sample, temperature, top_k, top_p,
                                                          seed), eos_token_id)
        for _ in self._schedule(requests):
            pass
        return prompts.assemble([r.generated for r in requests], pad_token_id)

    def stream(self, input_ids: Any, max_new_tokens: int = 20, do_sample: bool = False,
               temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
               seed: int | None = None, eos_token_id: int | Sequence[int] | None = None,
               attention_mask: Any = None) -> Iterator[Any]:
        """Token ids as they come: ints for one prompt, (row, token) pairs for a batch."""
        prompts, requests = self._requests(input_ids, attention_mask, max_new_tokens,
                                           SamplingParams(do_sample, temperature, top_k, top_p,
                                                          seed), eos_token_id)
        row_of = {id(r): i for i, r in enumerate(requests)}
        for event in self._schedule(requests):
            yield event.token if prompts.single else (row_of[id(event.sequence)], event.token)

    def _requests(self, input_ids, attention_mask, max_new_tokens, sampling, eos_token_id):
        prompts = Prompts.from_ids(input_ids, attention_mask, self.spec)
        eos = self.spec.eos_token_ids if eos_token_id is None else (
            (eos_token_id,) if isinstance(eos_token_id, (int, np.integer)) else eos_token_id)
        check_request(prompts, max_new_tokens, self.spec, self.runner)
        requests = []
        for row, tokens in enumerate(prompts.rows):
            rng = np.random.default_rng([sampling.seed, row]) if sampling.seed is not None \
                else None
            requests.append(Request(list(tokens), max_new_tokens, sampling,
                                    frozenset(int(t) for t in eos), rng))
        return prompts, requests

    def _schedule(self, requests: list[Request]):
        scheduler = Scheduler(self.runner)
        for request in requests:
            scheduler.add(request)
        stats = self.stats = GenerationStats(prompt_tokens=sum(r.prompt_len for r in requests))
        start = time.perf_counter()
        try:
            for event in scheduler.run():
                stats.record(event.sequence, time.perf_counter() - start, self.runner)
                yield event
            stats.preemptions = scheduler.preemptions
        finally:
            for request in requests:  # an abandoned stream frees its blocks
                if not request.finished:
                    scheduler.cancel(request)


@dataclass
class GenerationStats:
    """What the last `generate` / `stream` call did: time to first token, generated tokens
    and when the last came, preemptions, and the most cache blocks in use."""
    prompt_tokens: int = 0
    generated_tokens: int = 0
    first_token_s: float | None = None
    last_token_s: float = 0.0
    preemptions: int = 0
    peak_blocks: int = 0
    total_blocks: int = 0

    def record(self, seq: Request, elapsed: float, runner: StepRunner) -> None:
        self.generated_tokens += 1
        self.first_token_s = elapsed if self.first_token_s is None else self.first_token_s
        self.last_token_s = elapsed
        self.peak_blocks = max(self.peak_blocks, runner.allocator.used)
        self.total_blocks = runner.allocator.num_blocks

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first per second of decoding (None before a second token)."""
        span = self.last_token_s - (self.first_token_s or 0.0)
        return (self.generated_tokens - 1) / span if self.generated_tokens > 1 and span > 0 \
            else None
