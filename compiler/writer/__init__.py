"""Artifact writing, the compile-time half of the artifact format (`runtime.artifact` reads).

`write_artifact` lays the weights out, calls the backend's `lower` and installs the finished
folder atomically; `check_destination` refuses an unwritable output before minutes of work.
"""

from .artifact_writer import (
    TEMP_PURPOSE,
    check_destination,
    removed_on_sigterm,
    sweep_stale_temps,
    value_spec,
    write_artifact,
)

__all__ = ["TEMP_PURPOSE", "check_destination", "removed_on_sigterm", "sweep_stale_temps",
           "value_spec", "write_artifact"]
