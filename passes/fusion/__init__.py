"""Fusion: pattern sets for the `fuse` pass, fusion groups for kernel generators, and reports.

The rules, by family: activations, norms (and the residual add before a norm), attention,
rotary, mlp (gated MLP and linear epilogues), horizontal (merging linears that share an input);
sets.py orders them into phases. groups.py partitions the remaining elementwise and reduction ops
into kernels (`fuse_groups`); decompose.py lowers fused ops back to primitives for backends
without a kernel; report.py summarizes what fusion did. See docs/fusion.md.
"""
