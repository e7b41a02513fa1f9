"""Generation steps for the paged_attention kernel tests (ONNX Runtime's native kernel, the
Triton kernel): packed tokens of several sequences over keys in scattered pool slots, and the
op's decomposition evaluated in float64 as the reference."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from backends.reference.interpreter import run_graph
from compiler.ir import DType, Graph, TensorType

NAMES = ["q", "k", "v", "cos", "sin", "k_cache", "v_cache", "seq_slots", "token_seq",
         "token_len"]


@dataclass
class Step:
    """A generation step: per sequence, (cached keys, new tokens); keys live in scattered pool
    slots, -1 pads each slot list to `length`."""

    sequences: list[tuple[int, int]]
    heads: int = 4
    kv_heads: int = 2
    size: int = 16
    v_size: int | None = None
    rotary: bool = True
    attrs: dict = field(default_factory=dict)
    pool: int = 64
    pad: int = 3
    seed: int = 0

    def arrays(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        v_size = self.v_size or self.size
        tokens = sum(new for _, new in self.sequences)
        length = max(cached + new for cached, new in self.sequences) + self.pad
        free = list(rng.permutation(self.pool))
        slots = np.full((len(self.sequences), length), -1, np.int64)
        token_seq, token_len, positions = [], [], []
        t = 0
        for i, (cached, new) in enumerate(self.sequences):
            slots[i, :cached] = [free.pop() for _ in range(cached)]
            slots[i, cached:cached + new] = [-2 - (t + j) for j in range(new)]
            token_seq += [i] * new
            token_len += [cached + j + 1 for j in range(new)]
            positions += [cached + j for j in range(new)]
            t += new
        out = {
            "q": rng.standard_normal((1, tokens, self.heads * self.size)),
            "k": rng.standard_normal((1, tokens, self.kv_heads * self.size)),
            "v": rng.standard_normal((1, tokens, self.kv_heads * v_size)),
            "k_cache": rng.standard_normal((self.pool, self.kv_heads, self.size)),
            "v_cache": rng.standard_normal((self.pool, self.kv_heads, v_size)),
        }
        out = {k: a.astype(np.float32) for k, a in out.items()}
        if self.rotary:  # full width: the halves differ (the kernel assumes nothing of them)
            angles = np.asarray(positions)[:, None] / 100.0 ** (np.arange(self.size) / self.size)
            out["cos"] = np.cos(angles).astype(np.float32)
            out["sin"] = np.sin(angles * 1.1).astype(np.float32)
        out.update(seq_slots=slots, token_seq=np.asarray(token_seq, np.int64),
                   token_len=np.asarray(token_len, np.int64))
        return out

    def graph(self, dtype: DType, arrays: dict[str, np.ndarray]) -> Graph:
        g = Graph("paged")
        values = {}
        for name in NAMES:
            if name in arrays:
                a = arrays[name]
                kind = DType.i64 if a.dtype == np.int64 else dtype
                values[name] = g.add_input(name, TensorType(kind, a.shape))
        node = g.add_node("paged_attention", [values.get(n) for n in NAMES],
                          dict(num_heads=self.heads, kv_num_heads=self.kv_heads, **self.attrs))
        g.outputs = list(node.outputs)
        return g


def reference(step: Step, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The op's decomposition evaluated in float64 by the reference interpreter."""
    wide = {k: a.astype(np.float64) if a.dtype == np.float32 else a for k, a in arrays.items()}
    g = step.graph(DType.f64, wide)
    return [t.numpy() for t in run_graph(g, {}, [wide[v.name] for v in g.inputs])]


def assert_same(got: np.ndarray, want: np.ndarray, tol: float = 1e-5) -> None:
    """NaN exactly where the reference has NaN, the same infinities, finite values close."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=tol, atol=tol)



STEPS = {
    "prefill": Step([(0, 9)]),
    "decode-scattered": Step([(37, 1), (20, 1)], pool=80),
    "mixed": Step([(11, 5), (30, 1), (7, 1)]),
    "mixed-mha": Step([(11, 5), (30, 1), (7, 1)], heads=3, kv_heads=3, size=8),
    "mixed-mqa-no-rotary": Step([(11, 5), (30, 1), (7, 1)], heads=4, kv_heads=1, rotary=False),
    "mqa-two-tiles": Step([(11, 5), (30, 1)], heads=10, kv_heads=1, size=8),  # 8 + 2 heads
    "gpt2-style": Step([(5, 3), (12, 1)], heads=2, kv_heads=2, size=24, rotary=False),
    "v-size-differs": Step([(6, 2), (40, 1)], size=16, v_size=12),
    "window": Step([(11, 5), (30, 1), (7, 1)], attrs=dict(window=4)),
    "softcap": Step([(11, 5), (30, 1)], attrs=dict(softcap=2.0, scale=0.9)),
    "window-softcap-odd-size": Step([(3, 4), (50, 1)], size=10, attrs=dict(window=8,
                                                                           softcap=5.0)),
    "long-decode": Step([(300, 1), (129, 2)], heads=8, kv_heads=2, size=64, pool=512),
    # prompt chunks in the kernel's blocks of 32 tokens, a run straddling two, over several
    # 64-key chunks
    "long-prefill": Step([(150, 40), (70, 3)], heads=8, kv_heads=2, size=32, pool=256),
    "gqa-two-tiles-two-kv": Step([(11, 5), (30, 1)], heads=20, kv_heads=2, size=8),
    # few tasks over long slot lists: the kernel splits the keys into parts, then combines them
    "split-decode": Step([(3000, 1), (700, 1)], heads=8, kv_heads=2, size=64, pool=3800),
    "split-decode-window-softcap": Step([(2100, 1), (1900, 1)], size=24, pool=4050,
                                        attrs=dict(window=1500, softcap=3.0)),
    "split-prefill": Step([(1100, 9)], heads=8, kv_heads=2, size=16, pool=1200),
    # a decode step of 4 or more sequences: each token's task takes every kv head at once
    "wide-decode": Step([(37, 1), (20, 1), (5, 1), (64, 1), (90, 1)], heads=8, kv_heads=2,
                        size=16, pool=300),
    "wide-decode-with-a-prompt-chunk": Step([(12, 1), (30, 7), (40, 1), (3, 1), (70, 1)],
                                            pool=200),
    "wide-decode-two-tiles": Step([(11, 1), (30, 1), (7, 1), (19, 1)], heads=20, kv_heads=2,
                                  size=8, pool=100),
    "wide-decode-window-softcap": Step([(33, 1), (8, 1), (21, 1), (50, 1)], pool=150,
                                       attrs=dict(window=9, softcap=4.0)),
    # more kv heads than one task takes (32): two groups of them per token
    "wide-decode-40-kv-heads": Step([(9, 1), (14, 1), (3, 1), (20, 1)], heads=40, kv_heads=40,
                                    size=8, pool=80),
    # heads of 256 floats: the kernel packs two kv heads' keys and values at a time
    "wide-decode-grouped-packing": Step([(20, 1), (9, 1), (33, 1), (5, 1)], heads=4,
                                        kv_heads=4, size=256, pool=100),
    "wide-split-decode": Step([(1100, 1), (900, 1), (600, 1), (1200, 1)], heads=8, kv_heads=2,
                              size=16, pool=3900),
}
