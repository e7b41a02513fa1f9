"""shard_expert_parallel: split every `moe` op's stacked experts over the expert-parallel ranks.

Seeds `shard(@w) {layout="ep:S0"}` on each moe op's expert weights and biases; the moe sharding
rule and `localize` do the rest (expert_parallel.py says how a rank runs its experts, and why).
`with_moe_fusion` is the pipeline a partitioned compile runs with `expert_parallel`: the `moe`
pattern set of `fuse` alone, since only fused moe ops can be split.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.errors import DayzeroError
from compiler.ir import Graph, Node, format_node
from passes.base import Pass, PassResult
from passes.registry import register_pass

from .expert_parallel import EXPERT_OPERANDS, EXPERTS, PLACED, operand_names

KEY = "parallel.expert_parallel"


def with_moe_fusion(pipeline: str) -> str:
    """`pipeline` with the `moe` pattern set of `fuse` (and no other) before its dead-code
    elimination (else at its end): a partitioned compile runs the plain pipeline, whose
    primitive MoE ops expert parallelism cannot split, while every other fused op would run
    replicated (tensor parallelism shards the unfused projections)."""
    from passes.fuse import Fuse
    from passes.fusion.sets import SET_NAMES
    from passes.pipeline import format_pipeline, parse_pipeline

    passes = parse_pipeline(pipeline)
    names = [p.name for p in passes]
    at = names.index("eliminate_dead_code") if "eliminate_dead_code" in names else len(names)
    fuse = Fuse(**{name: name == "moe" for name in SET_NAMES})
    return format_pipeline([*passes[:at], fuse, *passes[at:]])


def _where(node: Node) -> str:
    return f"node `{format_node(node)}`" + (f" from {node.loc}" if node.loc else "")


def check_experts(node: Node, size: int) -> None:
    """`size` divides the node's experts, and the node has nothing expert parallelism cannot
    place yet; else an error naming the config key and the node."""
    names = operand_names()
    experts = node.inputs[names.index("w_gate_up")].type.shape[0]
    if experts % size:
        raise DayzeroError(
            f"config key '{KEY}' = {size} does not divide the {experts} experts of moe "
            f"%{node.output.name}", _where(node),
            f"choose a {KEY} that divides the number of experts ({experts})")
    extra = [n for n, v in zip(names, node.inputs) if v is not None and n not in PLACED]
    if extra:
        raise DayzeroError(
            f"config key '{KEY}': moe %{node.output.name} has operand(s) {extra} that expert "
            "parallelism does not place", _where(node),
            f"compile this model without {KEY} (tensor parallelism still applies)")


def _seed(graph: Graph, node: Node, index: int) -> None:
    """`shard(operand) {layout="ep:S0"}` in front of the operand (one per weight)."""
    value = node.inputs[index]
    for user, _ in value.uses:
        if user.op == "shard" and user.attrs["layout"] == str(EXPERTS):
            graph.set_input(node, index, user.output)
            return
    seed = graph.add_node("shard", [value], {"layout": str(EXPERTS)}, loc=node.loc,
                          names=[f"{value.name}.ep"], before=node)
    graph.set_input(node, index, seed.output)


@register_pass
@dataclass(frozen=True)
class ShardExpertParallel(Pass):
    """Split every `moe` op's stacked experts over the expert-parallel ranks.

    Needs: a graph whose mixture-of-experts blocks are fused into `moe` ops (the `moe` set of
    `fuse`). Guarantees: every moe op reads its stacked expert operands through
    `shard {layout="ep:S0"}` seeds (propagate_sharding and localize do the rest); an error
    naming `parallel.expert_parallel` and the node when `size` does not divide an op's experts,
    and when the graph has no moe op. Exists so that a model's experts are spread by
    configuration, like its attention heads.
    """

    name = "shard_expert_parallel"
    summary = "split the experts of every moe op over the expert-parallel ranks"
    size: int = 1

    def run(self, graph: Graph) -> PassResult:
        if self.size <= 1:
            return PassResult(graph, False)
        nodes = [n for n in graph.nodes if n.op == "moe"]
        if not nodes:
            raise DayzeroError(
                f"config key '{KEY}' = {self.size}, but the graph has no moe op to split",
                graph.name, "check that the model is a mixture of experts and that its MoE "
                "blocks fused (dayzero compile --report lists why the moe rule did not fire); "
                "a `passes:` list needs fuse{...} with moe=true before partitioning")
        names = operand_names()
        for node in nodes:
            check_experts(node, self.size)
            for name in EXPERT_OPERANDS:
                index = names.index(name)
                if node.inputs[index] is not None:
                    _seed(graph, node, index)
        return PassResult(graph, True)
