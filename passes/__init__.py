"""Graph -> Graph transforms, one per module, run by name through the pass manager.

Built-in passes register themselves (`@register_pass`) when their module is imported below; a new
pass is one new module holding a `Pass` subclass, plus its import line here.
"""

from . import (  # noqa: F401  (imported to register the built-in passes)
    decompose_fused,
    derive_generation_step,
    eliminate_common_subexpressions,
    eliminate_dead_code,
    fold_constants,
    fuse,
    fuse_groups,
    parallel,
    plan_memory,
    precision,
    quantize_experts,
    quantize_weights,
    recognize_causal_masks,
    remove_noops,
    schedule_for_memory,
)
from .base import OptionSpec, Pass, PassResult
from .manager import PassCrashError, PassManager, PassRecord
from .pipeline import DEFAULT_PIPELINE, format_pipeline, parse_pipeline
from .registry import (
    available_passes,
    describe_passes,
    get_pass,
    register_pass,
    unregister_pass,
)

__all__ = ["DEFAULT_PIPELINE", "OptionSpec", "Pass", "PassCrashError", "PassManager",
           "PassRecord", "PassResult", "available_passes", "describe_passes", "format_pipeline",
           "get_pass", "parse_pipeline", "register_pass", "unregister_pass"]
