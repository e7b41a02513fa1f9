"""GenerationModel: a generation artifact as `runtime.load` returns it.

Its graph is a KV-cached generation step (passes/derive_generation_step/). `generate` and
`stream` run prompts through it as transformers' `generate` does (same arguments, same output
layout: prompts left-padded to one length, then the new tokens, rows that stopped early padded);
`generate_text` adds the artifact's tokenizer. An image-text artifact also takes images: chat
messages with image parts, or `pixel_values` beside ids whose image tokens are expanded
(vision.py). Called like any model, `m(input_ids)` is the
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
from .generation_config import read_generation_config
from .prompts import Prompts, check_request
from .scheduler import Scheduler
from .scheduler import Sequence as Request
from .spec import GenerationSpec, check_step_graph, checked_cache_memory
from .step import StepPart
from .tokenizer import ArtifactTokenizer, load_tokenizer
from .vision import ImageEncoder, ImageRows, image_feeds, split_messages


class GenerationModel:
    def __init__(self, step: CompiledModel, *, kv_cache_memory: int | None = None,
                 prefix_cache: bool = True):
        self.step_model = step
        self.prefix_cache = prefix_cache  # reuse cached prompt blocks (runtime/prefix_cache.py)
        self.spec = GenerationSpec.from_manifest(step.manifest.get("generation"),
                                                 str(step.path))
        artifact = step.artifact
        if not isinstance(step, CompiledModel):  # tensor parallel: the global graph's specs
            artifact.check_consistency()  # (a CompiledModel's were checked at its load)
        check_step_graph(self.spec, artifact.typed.inputs, artifact.typed.outputs,
                         str(step.path))
        checked_cache_memory(self.spec, kv_cache_memory)  # before the pool is sized from it
        forward = {"symbols": step.manifest.get("symbols", {}),
                   **step.manifest["generation"].get("forward", {})}
        self.input_specs = specs_from_manifest(forward, "inputs")
        self.output_specs = specs_from_manifest(forward, "outputs")
        self._kv_cache_memory = kv_cache_memory
        self._runner: StepRunner | None = None
        self._tokenizer: ArtifactTokenizer | None | bool = False  # False: not read yet
        section = step.manifest["generation"].get("vision")
        self.vision = None if section is None else ImageEncoder(step, section)
        self.stats = GenerationStats()
        self.logit_processors = read_generation_config(step, self.spec)

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
        messages, images, fields = split_messages(prompt)
        if images and self.vision is None:
            raise InputError(f"{self.path} is a text-only model: it takes no images",
                             fields[0], "send text only, or compile an image-text checkpoint")
        ids = (tokenizer.encode(prompt) if isinstance(prompt, str)
               else tokenizer.chat_ids(messages))
        if self.vision is not None:
            ids = self.vision.expand(ids)
            kwargs["images"] = images
        out = self.generate([ids], max_new_tokens=max_new_tokens, **kwargs)
        return tokenizer.decode(out[0, len(ids):].tolist())  # one prompt: no padding

    def _require_tokenizer(self) -> ArtifactTokenizer:
        if self.tokenizer is None:
            raise InputError(f"{self.path} carries no tokenizer", str(self.path),
                             "compile from a checkpoint folder with tokenizer.json (or pass "
                             "compile(..., tokenizer=FOLDER)); or call generate with ids")
        return self.tokenizer

    # -- the prefill forward ----------------------------------------------------------------
    def __call__(self, input_ids: Any, image_embeds: Any = None,
                 image_mask: Any = None) -> tuple[np.ndarray]:
        """Logits [batch, seq, vocab] for every position, as the exported forward returns (an
        image-text artifact's forward also takes image rows [batch, seq, hidden] and their
        mask [batch, seq]; without them, no token is an image's)."""
        ids = np.asarray(to_numpy(input_ids))
        prompts = Prompts.from_ids(ids, None, self.spec)
        images = _forward_images(ids, image_embeds, image_mask)
        runner = self.runner
        rows = []
        for row, tokens in enumerate(prompts.rows):
            runner.allocator.grow("forward", len(tokens))
            try:
                table = runner.allocator.tables["forward"]
                part = StepPart(np.asarray(tokens, np.int64), 0, table, images=images[row])
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
        feeds = step.feeds
        if self.runner.image_width is not None:  # the part's image rows, if any
            feeds = {**feeds, **image_feeds([part], self.runner.image_width)}
        return self.runner.call(feeds)[0].reshape(n, -1)

    # -- generation ---------------------------------------------------------------------------
    def generate(self, input_ids: Any, max_new_tokens: int = 20, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None, eos_token_id: int | Sequence[int] | None = None,
                 attention_mask: Any = None, pad_token_id: int | None = None,
                 pixel_values: Any = None, images: Sequence[Any] | None = None,
                 **processors: Any) -> np.ndarray:
        """Token ids [batch, prompt_len + new], as transformers' `generate` returns them.

        An image-text artifact takes `pixel_values` [n, 3, H, W] (the image processor's) or
        `images` (encoded PNG/JPEG bytes), the n images in order over the prompts' expanded
        image tokens, as transformers' LlavaForConditionalGeneration does."""
        prompts, requests = self._requests(input_ids, attention_mask, max_new_tokens,
                                           SamplingParams(do_sample, temperature, top_k, top_p,
                                                          seed), eos_token_id,
                                           _images(pixel_values, images), processors)
        for _ in self._schedule(requests):
            pass
        return prompts.assemble([r.generated for r in requests], pad_token_id)

    def stream(self, input_ids: Any, max_new_tokens: int = 20, do_sample: bool = False,
               temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
               seed: int | None = None, eos_token_id: int | Sequence[int] | None = None,
               attention_mask: Any = None, pixel_values: Any = None,
               images: Sequence[Any] | None = None, **processors: Any) -> Iterator[Any]:
        """Token ids as they come: ints for one prompt, (row, token) pairs for a batch."""
        prompts, requests = self._requests(input_ids, attention_mask, max_new_tokens,
                                           SamplingParams(do_sample, temperature, top_k, top_p,
                                                          seed), eos_token_id,
                                           _images(pixel_values, images), processors)
        row_of = {r.seq_id: i for i, r in enumerate(requests)}
        for event in self._schedule(requests):
            yield event.token if prompts.single else (row_of[event.sequence.seq_id], event.token)

    def _requests(self, input_ids, attention_mask, max_new_tokens, sampling, eos_token_id,
                  images=None, processors=None):
        prompts = Prompts.from_ids(input_ids, attention_mask, self.spec)
        eos = self.logit_processors.eos_token_ids if eos_token_id is None else (
            (eos_token_id,) if isinstance(eos_token_id, (int, np.integer)) else eos_token_id)
        logit_processors = self.logit_processors.for_call(processors, eos)
        # the expanded prompt's length is what the cache must hold: checked before any work
        check_request(prompts, max_new_tokens, self.spec, self.runner)
        rows = self._image_rows(prompts, images)
        requests = []
        for row, tokens in enumerate(prompts.rows):
            rng = np.random.default_rng([sampling.seed, row]) if sampling.seed is not None \
                else None
            requests.append(Request(list(tokens), max_new_tokens, sampling,
                                    frozenset(int(t) for t in eos), rng, images=rows[row],
                                    processors=logit_processors))
        return prompts, requests

    def _image_rows(self, prompts: Prompts, images: list | None) -> list:
        """Each prompt's image features (None for a prompt without images)."""
        if self.vision is None:
            if images:
                raise InputError(f"{self.path} is a text-only model: it takes no images",
                                 "images", "send text only, or compile an image-text "
                                 "checkpoint")
            return [None] * len(prompts.rows)
        features = self.vision.features(images or [])
        return self.vision.place(prompts.rows, features)

    def _schedule(self, requests: list[Request]):
        scheduler = Scheduler(self.runner, prefix_cache=self.prefix_cache)
        for request in requests:
            scheduler.add(request)
        stats = self.stats = GenerationStats(prompt_tokens=sum(r.prompt_len for r in requests))
        scheduler.on_step = stats.count_step
        start = time.perf_counter()
        try:
            for event in scheduler.run():
                if event.error is not None:
                    raise _sequence_error(requests, event)
                stats.record(event.sequence, time.perf_counter() - start, self.runner)
                yield event
            stats.preemptions = scheduler.preemptions
            stats.cached_tokens = sum(r.cached_prompt_tokens for r in requests)
        finally:
            for request in requests:  # an abandoned stream frees its blocks
                if not request.finished:
                    scheduler.cancel(request)


def _sequence_error(requests: list[Request], event) -> InputError:
    """The error of a sequence the scheduler ended without a token (non-finite logits),
    naming its prompt: generate and stream stop at the first (the rest are cancelled)."""
    row = next(i for i, r in enumerate(requests) if r is event.sequence)
    return InputError(f"input_ids[{row}]: {event.error}; generation stopped",
                      f"input_ids[{row}]", "the model produced non-finite logits: check its "
                      "inputs and weights (`dayzero align`)")


def _forward_images(ids: np.ndarray, embeds: Any, mask: Any) -> list:
    """Each row's ImageRows of the prefill forward's `image_embeds` and `image_mask`."""
    batch = 1 if ids.ndim == 1 else ids.shape[0]
    if embeds is None and mask is None:
        return [None] * batch
    embeds = np.asarray(to_numpy(embeds), np.float32)
    mask = np.asarray(to_numpy(mask)).astype(bool)
    if embeds.ndim != 3 or mask.shape != embeds.shape[:2] \
            or mask.shape != ids.reshape(batch, -1).shape:
        raise InputError(f"image_embeds {list(embeds.shape)} and image_mask "
                         f"{list(mask.shape)} do not match input_ids {list(ids.shape)}",
                         "image_embeds", "pass [batch, seq, hidden] rows and a [batch, seq] "
                         "mask")
    return [ImageRows(np.flatnonzero(m).astype(np.int64), e[m]) for e, m in zip(embeds, mask)]


def _images(pixel_values: Any, images: Sequence[Any] | None) -> list | None:
    """The request's images: pixel values [n, 3, H, W] split per image, or encoded bytes."""
    if pixel_values is not None and images:
        raise InputError("both pixel_values and images given", "pixel_values",
                         "pass the images one way")
    if pixel_values is not None:
        return list(np.asarray(to_numpy(pixel_values)))
    return list(images) if images else None


@dataclass
class GenerationStats:
    """What the last `generate` / `stream` call did: time to first token, generated tokens
    and when the last came, preemptions, the most cache blocks in use, the tokens its steps
    computed and the prompt tokens it found in the prefix cache instead."""
    prompt_tokens: int = 0
    generated_tokens: int = 0
    first_token_s: float | None = None
    last_token_s: float = 0.0
    preemptions: int = 0
    peak_blocks: int = 0
    total_blocks: int = 0
    computed_tokens: int = 0
    cached_tokens: int = 0

    def count_step(self, tokens: int, sequences: int) -> None:
        self.computed_tokens += tokens

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
