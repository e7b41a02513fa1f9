"""The one error a request can get: `ProtocolError`, in OpenAI's error shape.

Its message and field may quote what the client sent; both are made printable UTF-8 here (a lone
surrogate becomes `\\ud800`), so that writing the error never fails: Starlette encodes JSON
responses as UTF-8, and a surrogate echoed back would turn a 400 into a 500.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from compiler.errors import DayzeroError

T = TypeVar("T")


class ProtocolError(Exception):
    """A request the server refuses: `status` (400 unless said), the `field` at fault, why."""

    def __init__(self, field: str | None, message: str, status: int = 400,
                 kind: str = "invalid_request_error"):
        message = printable(message)
        super().__init__(message)
        self.field = None if field is None else printable(field)
        self.message, self.status, self.kind = message, status, kind

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.field)


def error_body(message: str, kind: str, field: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: what the official clients parse from any non-2xx answer."""
    return {"error": {"message": printable(message), "type": kind, "param": field,
                      "code": None}}


def printable(text: str) -> str:
    """`text` as valid UTF-8 (lone surrogates escaped as \\udXXX)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def guarded(call: Callable[[], T], field: str, what: str) -> T:
    """`call()` (the tokenizer, the chat template, the vision encoder on a request's input),
    any failure of it a 400 naming `field`: the request is what made the artifact's code fail,
    and the server must go on serving the others. A DayzeroError says what is wrong itself; any
    other exception (a template's raw error, a `tokenizers` panic, which is a BaseException)
    is quoted."""
    try:
        return call()
    except DayzeroError as exc:
        raise ProtocolError(field, exc.what) from None
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - pyo3's PanicException is a BaseException
        raise ProtocolError(field, f"{what} failed on {field}: {type(exc).__name__}: "
                            f"{str(exc)[:300]}") from None
