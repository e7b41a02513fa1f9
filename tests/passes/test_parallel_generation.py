"""Tensor parallelism on a generation step: paged_attention split by heads, the KV cache by KV
heads, each rank's cache inputs and new keys and values its own shard (no slice, no gather).

IR text in, rank programs out, and their numbers against the whole step on the reference
interpreter (ranks on threads, tests/passes/parallel_util.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.reference.interpreter import run_graph
from compiler.errors import DayzeroError
from compiler.ir import parse_ir, print_ir
from passes.parallel import Mesh
from passes.parallel.kv_cache_shards import keep_cache_local
from passes.parallel.partition import partition
from tests.passes.parallel_util import run_ranks


def _text(int8: bool) -> str:
    """One attention block of a step (4 heads, 2 KV heads of 8), its cache f32 or int8."""
    cache = "i8" if int8 else "f32"
    scales = ("  input %k_scale_0: f32[kv_slots, 2]\n  input %v_scale_0: f32[kv_slots, 2]\n"
              if int8 else "")
    scale_args = ", %k_scale_0, %v_scale_0" if int8 else ""
    return f"""graph step {{
  symbol s0 in [1, 64]
  symbol kv_slots in [1, 1024]
  symbol step_seqs in [1, 64]
  symbol step_keys in [1, 64]
  input %x: f32[1, s0, 32]
  input %seq_slots: i64[step_seqs, step_keys]
  input %token_seq: i64[s0]
  input %token_len: i64[s0]
  input %k_cache_0: {cache}[kv_slots, 2, 8]
  input %v_cache_0: {cache}[kv_slots, 2, 8]
{scales}  weight @wq: f32[32, 32]
  weight @wk: f32[16, 32]
  weight @wv: f32[16, 32]
  weight @wo: f32[32, 32]
  %q: f32[1, s0, 32] = linear(%x, @wq, _)
  %k: f32[1, s0, 16] = linear(%x, @wk, _)
  %v: f32[1, s0, 16] = linear(%x, @wv, _)
  %a: f32[1, s0, 32], %key_0: f32[s0, 2, 8], %value_0: f32[s0, 2, 8] = paged_attention(\
%q, %k, %v, _, _, %k_cache_0, %v_cache_0, %seq_slots, %token_seq, %token_len{scale_args}) \
{{num_heads=4, kv_num_heads=2, scale=0.35, window=none, softcap=none}}
  %o: f32[1, s0, 32] = linear(%a, @wo, _)
  %y: f32[1, s0, 32] = add(%x, %o)
  return %y, %key_0, %value_0
}}
"""


def _step(int8: bool = False):
    graph = parse_ir(_text(int8))
    gen = torch.Generator().manual_seed(0)
    graph.weight_data = {name: torch.randn(*[int(d) for d in w.type.shape], generator=gen)
                         for name, w in graph.weights.items()}
    return graph


@pytest.mark.parametrize("int8", [False, True], ids=["f32", "int8"])
def test_each_rank_attends_with_its_heads_over_its_share_of_the_pool(int8):
    whole = _step(int8)
    plan = partition(_step(int8), Mesh(tp=2))
    keep_cache_local(plan)
    text = print_ir(plan.ranks[1].graph)
    cache = "i8" if int8 else "f32"
    assert f"input %k_cache_0: {cache}[kv_slots, 1, 8]" in text
    assert f"input %v_cache_0: {cache}[kv_slots, 1, 8]" in text
    assert ("input %v_scale_0: f32[kv_slots, 1]" in text) == int8
    assert "num_heads=2, kv_num_heads=1" in text
    assert "slice(" not in text and "all_gather(" not in text
    assert text.count("all_reduce(") == 1  # the row-parallel output projection
    assert [v.type.shape[1] for v in plan.ranks[1].graph.outputs[1:]] == [1, 1]

    gen = torch.Generator().manual_seed(1)
    if int8:
        pools = [torch.randint(-127, 128, (6, 2, 8), generator=gen, dtype=torch.int8)
                 for _ in range(2)]
        pools += [torch.rand(6, 2, generator=gen) / 50 for _ in range(2)]
    else:
        pools = [torch.randn(6, 2, 8, generator=gen) for _ in range(2)]
    x = torch.randn(1, 3, 32, generator=gen)
    # one sequence: keys 0, 1 in pool slots 4 and 2, then this step's three tokens
    slots = torch.tensor([[4, 2, -2, -3, -4]])
    seq, length = torch.zeros(3, dtype=torch.long), torch.tensor([3, 4, 5])
    want = run_graph(whole, whole.weight_data, [x, slots, seq, length, *pools])

    def rank(r):
        graph = plan.ranks[r].graph
        shards = [p[:, r:r + 1].contiguous() for p in pools]  # this rank's KV head
        return run_graph(graph, graph.weight_data, [x, slots, seq, length, *shards])

    got = run_ranks(2, rank)
    for r in range(2):
        np.testing.assert_allclose(np.asarray(got[r][0]), np.asarray(want[0]), rtol=1e-5,
                                   atol=1e-5)
    for i in (1, 2):  # the new keys and values: each rank's KV head
        joined = torch.cat([torch.as_tensor(np.asarray(got[r][i])) for r in range(2)], dim=1)
        np.testing.assert_allclose(joined.numpy(), np.asarray(want[i]), rtol=1e-6, atol=1e-6)


def test_kv_heads_that_do_not_divide_are_refused():
    with pytest.raises(DayzeroError, match=r"'parallel.tensor_parallel' = 4 does not divide the "
                                           r"2 KV heads of paged_attention %a"):
        partition(_step(), Mesh(tp=4))


def test_generation_is_not_data_or_pipeline_parallel():
    import compiler

    with pytest.raises(DayzeroError, match=r"parallel.pipeline_parallel' = 2: a generation "
                                           "artifact is split over ranks by tensor parallelism"):
        compiler.compile(torch.nn.Linear(2, 2), (torch.zeros(1, 2, dtype=torch.long),),
                         task="text-generation",
                         config={"parallel": {"pipeline_parallel": 2}})
