"""User-facing errors.

Every failure a user can cause (bad model, bad input, bad file) is a `DayzeroError` that says
what is wrong, where, and what to do. The CLI prints it as one message without a traceback;
internal bugs stay ordinary exceptions so they keep their tracebacks.
"""

from __future__ import annotations


class DayzeroError(Exception):
    """An error the user can act on: `what` went wrong, `where` (op, node, file, tensor), `fix`."""

    def __init__(self, what: str, where: str | None = None, fix: str | None = None):
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self.message())

    def message(self) -> str:
        parts = [self.what]
        if self.where:
            parts.append(f"  where: {self.where}")
        if self.fix:
            parts.append(f"  fix: {self.fix}")
        return "\n".join(parts)


class IRParseError(DayzeroError):
    """A .dzir text that does not parse or does not type-check; `where` carries line and column."""


class VerificationError(DayzeroError):
    """A graph that breaks an IR invariant (types, shapes, SSA, dangling uses)."""


class ArtifactError(DayzeroError):
    """An artifact that is missing, corrupted, tampered with or of another format version."""


class InputError(DayzeroError):
    """Inputs given to a compiled model that do not match its input specs."""
