"""Expert modules that loop over the experts a batch hit, traced as one grouped computation.

Remote-code and older mixture-of-experts models compute their experts as
`for e in (mask.sum(...) > 0).nonzero(): i = int(e.item()) ...`: the number of iterations is
data, so torch.export cannot trace them (LongCat-Flash, Step3). transformers fixes a contract
for such modules (`forward(hidden_states, top_k_index, top_k_weights)` over stacked
`gate_up_proj`/`up_proj` and `down_proj`, its experts interface) and a sort-based grouped
implementation of it that torch.export traces and the frontend converts to `grouped_matmul`.
While tracing, a module that follows the contract without dispatching through the interface
runs that implementation instead. Expert ids past the weight stacks are zero-computation
"identity experts" (LongCat-Flash): they pass their token through, scaled by its weight.

The swap is a claim about code dayzero did not write, so it is checked, not assumed: each
candidate weight layout runs beside the module's own forward on a probe routing that hits
every expert, and only one that reproduces it is used. A module none reproduces keeps its own
forward, and torch.export reports it as before.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

_CONTRACT = ("hidden_states", "top_k_index", "top_k_weights")
_PROBE_TOLERANCE = 1e-4


@dataclass(frozen=True)
class _Layout:
    """How a module stores its stacked expert weights (transformers' decorator arguments)."""
    transposed: bool
    interleaved: bool

    def routed_experts(self, module: torch.nn.Module) -> int:
        return module.down_proj.shape[0]

    def hidden_size(self, module: torch.nn.Module) -> int:
        return module.down_proj.shape[2 if self.transposed else 1]


_LAYOUTS = tuple(_Layout(t, i) for t in (False, True) for i in (False, True))


@contextlib.contextmanager
def traceable_experts(model: torch.nn.Module) -> Iterator[list[str]]:
    """Within the block, every expert-loop module of `model` that a probe shows to be
    transformers' experts contract runs the grouped implementation. Yields the names of the
    modules swapped; restores their own forwards on exit."""
    # (module, its name, the forward its instance held before: a hook's, say, or None)
    swapped: list[tuple[torch.nn.Module, str, object]] = []
    verified: dict[type, _Layout | None] = {}
    try:
        for name, module in model.named_modules():
            if not _follows_contract(module):
                continue
            kind = type(module)
            if kind not in verified:
                verified[kind] = _verified_layout(module)
            if verified[kind] is not None:
                swapped.append((module, name, vars(module).get("forward")))
                module.forward = _grouped_forward(module, verified[kind])
        yield [name for _, name, _ in swapped]
    finally:
        for module, _, previous in swapped:
            if previous is None:
                del module.forward  # the class's forward shows through again
            else:
                module.forward = previous


def _follows_contract(module: torch.nn.Module) -> bool:
    if callable(getattr(type(module), "_apply_gate", None)):
        return False  # already dispatches through transformers' experts interface
    try:
        names = tuple(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return False
    stacked = getattr(module, "gate_up_proj", None)
    if stacked is None:
        stacked = getattr(module, "up_proj", None)
    down = getattr(module, "down_proj", None)
    return (names == _CONTRACT and callable(getattr(module, "act_fn", None))
            and all(isinstance(w, torch.Tensor) and w.dim() == 3 for w in (stacked, down)))


def _grouped_forward(module: torch.nn.Module, layout: _Layout) -> Callable:
    def forward(hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        return _grouped_experts(module, layout, hidden_states, top_k_index, top_k_weights)
    return forward


def _grouped_experts(module: torch.nn.Module, layout: _Layout, hidden_states: torch.Tensor,
                     top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' grouped experts over the routed stacks, plus the identity experts.

    Ids at or past the routed count are the interface's expert-parallel sentinels: sorted to
    the tail, left out of every group and zeroed, so they cost no GEMM and add nothing."""
    from transformers.integrations.moe import grouped_mm_experts_forward

    routed = layout.routed_experts(module)
    view = _ExpertsView(module, layout, routed)
    out = grouped_mm_experts_forward(view, hidden_states, top_k_index, top_k_weights)
    identity = torch.where(top_k_index >= routed, top_k_weights, 0).sum(-1, keepdim=True)
    return out + (hidden_states * identity.to(hidden_states.dtype))


class _ExpertsView:
    """The attributes grouped_mm_experts_forward reads, over the module's own tensors (read at
    call time: torch.export substitutes them while tracing)."""

    def __init__(self, module: torch.nn.Module, layout: _Layout, routed: int):
        self._module, self._layout = module, layout
        self.num_experts = routed
        self.has_gate = getattr(module, "gate_up_proj", None) is not None
        self.has_bias = getattr(module, "down_proj_bias", None) is not None
        self.has_post_expert_norm = False
        self.is_transposed = layout.transposed
        self._is_expert_parallel = True  # ids >= routed are identity experts, masked out
        self.act_fn = module.act_fn

    def __getattr__(self, name: str):
        if name in ("gate_up_proj", "up_proj", "down_proj", "gate_up_proj_bias",
                    "up_proj_bias", "down_proj_bias"):
            stack = getattr(self._module, name)
            routed = self.num_experts
            return stack if stack is None or len(stack) == routed else stack[:routed]
        raise AttributeError(name)

    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self._layout.interleaved:
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        else:
            gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


def _verified_layout(module: torch.nn.Module) -> _Layout | None:
    """The first layout whose grouped forward reproduces the module on a probe routing."""
    probe = _probe_module(module)
    for layout in _LAYOUTS:
        if not _shapes_fit(module, layout):
            continue
        inputs = _probe_routing(probe, layout)
        try:
            with torch.no_grad():
                expected = type(module).forward(probe, *inputs)
                got = _grouped_experts(probe, layout, *inputs)
        except Exception:  # a layout that does not fit the code fails in it any way it may
            continue
        # reordered sums of a low-precision model differ by its rounding; a wrong layout
        # differs by the values themselves
        tolerance = max(_PROBE_TOLERANCE, 16 * torch.finfo(expected.dtype).eps)
        if got.shape == expected.shape and torch.allclose(
                got, expected, rtol=tolerance, atol=tolerance):
            return layout
    return None


def _shapes_fit(module: torch.nn.Module, layout: _Layout) -> bool:
    stacked = getattr(module, "gate_up_proj", None)
    gated = stacked is not None
    stacked = stacked if gated else module.up_proj
    down = module.down_proj
    hidden, inner = (down.shape[2], down.shape[1]) if layout.transposed else down.shape[1:]
    width = inner * (2 if gated else 1)
    expected = (hidden, width) if layout.transposed else (width, hidden)
    return tuple(stacked.shape[1:]) == expected and stacked.shape[0] >= down.shape[0]


def _probe_module(module: torch.nn.Module) -> torch.nn.Module:
    """The module itself, or where its weights are on meta (a checkpoint compile) a shallow
    copy over float32 random stand-ins: one expert's values broadcast to the stack, so no
    memory."""
    if not any(p.device.type == "meta" for p in module.parameters(recurse=False)):
        return module
    probe = copy.copy(module)
    generator = torch.Generator().manual_seed(0)
    probe._parameters = {
        name: None if p is None else torch.nn.Parameter(
            torch.randn((1, *p.shape[1:]), generator=generator).expand(p.shape),
            requires_grad=False)
        for name, p in module._parameters.items()}
    return probe


def _probe_routing(module: torch.nn.Module, layout: _Layout) -> tuple[torch.Tensor, ...]:
    """Tokens that between them hit every expert id, identity experts included, with
    distinct ids per token and random positive weights."""
    stacked = getattr(module, "gate_up_proj", None)
    experts = (stacked if stacked is not None else module.up_proj).shape[0]
    top_k = min(2, experts)
    tokens = -(-experts // top_k) + 1
    generator = torch.Generator().manual_seed(0)
    dtype = module.down_proj.dtype
    hidden = torch.randn(tokens, layout.hidden_size(module), generator=generator, dtype=dtype)
    ids = (torch.arange(tokens * top_k) % experts).reshape(tokens, top_k)
    weights = torch.rand(tokens, top_k, generator=generator, dtype=dtype) + 0.5
    return hidden, ids, weights
