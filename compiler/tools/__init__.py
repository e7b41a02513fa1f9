"""Adaptation tools for the Day-0 workflow: operator coverage and numerical alignment.

- `coverage`: which ops a model uses and, per backend, which run natively, by fallback, or not
  at all (`partial_export` exports past unsupported ops to list them all).
- `align`: a backend's intermediate values against the reference interpreter's, value by value
  (`correspond` matches values across passes, `metrics` and `thresholds` judge them, `layers`
  groups them, `align_text` / `align_html` report them, `align_target` sets up what to compare).

The `dayzero coverage`, `dayzero align` and `dayzero bench` commands are thin wrappers over these.
"""
