"""Block sizes for the GEMM kernels: a heuristic from the shapes, refined by timing on a GPU.

`heuristic` picks tiles no larger than the problem (a 5-row GEMM gets 16-row tiles, not 128)
and a K step that keeps a pipeline stage small. On CUDA, `Autotuner.choose` also times a handful
of candidate configs the first time a kernel meets a size bucket (sizes rounded up to powers of
two, so a growing sequence length does not retune every step) and keeps the fastest for the rest
of the process. The cache lives on the `Autotuner` instance, which the executable owns: nothing
is global, and two loaded models never share or race on it. Under Triton's interpreter timings
mean nothing, so tuning is off and the heuristic decides. The timer is a parameter, so the
selection logic is tested on CPU with a fake one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Sizes = tuple[int, int, int, int]  # M, N, K, batch count


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


Run = Callable[[Config], None]
Timer = Callable[[Run, Config], float]  # (launch with a config, the config) -> time, any unit

# Candidates tried besides the heuristic's choice (the common winners of Triton's matmul tutorial).
CANDIDATES = (
    Config(128, 128, 32, 8, 3), Config(128, 64, 32, 4, 4), Config(64, 128, 32, 4, 4),
    Config(64, 64, 32, 4, 4), Config(64, 64, 64, 4, 3), Config(32, 64, 32, 4, 5),
    Config(16, 64, 64, 4, 4),
)
MAX_CANDIDATES = 6


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _clamp(n: int, low: int, high: int) -> int:
    return max(low, min(high, n))


def heuristic(sizes: Sizes, itemsize: int = 4) -> Config:
    """Tiles up to 128 x 128 but no larger than the output (16 at least: `tl.dot`'s minimum),
    a K step of 32 (64 for 16-bit types, whose tiles are half the bytes), 8 warps for the
    largest tiles."""
    m, n, k, _ = sizes
    block_m, block_n = _clamp(_pow2(m), 16, 128), _clamp(_pow2(n), 16, 128)
    block_k = _clamp(_pow2(k), 16, 64 if itemsize <= 2 else 32)
    warps = 8 if block_m * block_n >= 128 * 128 else 4
    return Config(block_m, block_n, block_k, warps, 3)


def candidates(sizes: Sizes, itemsize: int = 4) -> list[Config]:
    """The heuristic's config first, then the table's that are not larger than the problem."""
    m, n, k, _ = sizes
    first = heuristic(sizes, itemsize)
    out = [first]
    for config in CANDIDATES:
        if config.block_m <= max(16, _pow2(m)) and config.block_n <= max(16, _pow2(n)) and \
                config.block_k <= max(16, _pow2(k)) and config not in out:
            out.append(config)
    return out[:MAX_CANDIDATES]


def bucket(sizes: Sizes) -> Sizes:
    m, n, k, batches = sizes
    return _pow2(m), _pow2(n), _pow2(k), _pow2(batches)


def cuda_timer(run: Run, config: Config, repeat: int = 5) -> float:
    """Median milliseconds of `run(config)` on the current CUDA stream (after one warm-up
    call, which also compiles the config)."""
    import torch

    run(config)
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(config)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


class Autotuner:
    """Per-executable choice of GEMM configs: (kernel name, size bucket) -> the fastest config."""

    def __init__(self, enabled: bool, timer: Timer = cuda_timer):
        self.enabled, self.timer = enabled, timer
        self.cache: dict[tuple[str, Sizes], Config] = {}

    def choose(self, kernel: str, sizes: Sizes, run: Run, itemsize: int = 4) -> Config:
        """The config to launch `kernel` with at `sizes`. With tuning on, the first call per
        size bucket times every candidate through `run` (which must not write the real
        outputs: the executable gives it scratch ones) and ties go to the earlier candidate.
        A candidate that fails to launch (too much shared memory, say) is skipped; if all
        fail, the first failure is raised."""
        if not self.enabled:
            return heuristic(sizes, itemsize)
        key = (kernel, bucket(sizes))
        if key not in self.cache:
            self.cache[key] = self._tune(candidates(sizes, itemsize), run)
        return self.cache[key]

    def _tune(self, configs: list[Config], run: Run) -> Config:
        best, best_time, failure = None, float("inf"), None
        for config in configs:
            try:
                elapsed = self.timer(run, config)
            except Exception as exc:  # noqa: BLE001 - a config this GPU cannot compile
                failure = failure or exc
                continue
            if elapsed < best_time:
                best, best_time = config, elapsed
        if best is None:
            raise failure
        return best
