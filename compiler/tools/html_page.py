"""One self-contained HTML page (no scripts, no external files) for the reports people open:
`align --html`, `coverage --html`, `compile --report --html`. One style and one writer, so the
pages look alike and a failed write says where."""

from __future__ import annotations

import html
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from runtime.atomic_files import write_atomically

from ..errors import DayzeroError

STYLE = """
body { font-family: sans-serif; margin: 24px; }
table { border-collapse: collapse; font-size: 12px; margin-bottom: 16px; }
td, th { border: 1px solid #ccc; padding: 2px 6px; text-align: left; }
td.num { text-align: right; }
tr.fail td, pre.fail, td.fail { color: #b00; }
td.ok { color: #171; } td.warn { color: #a60; }
"""


def page(title: str, *sections: str) -> str:
    """The page: `sections` are HTML fragments (escape text with `text` or `pre`)."""
    return (f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}'
            f"</title>\n<style>{STYLE}</style></head><body>\n<h1>{html.escape(title)}</h1>\n"
            + "\n".join(sections) + "\n</body></html>\n")


def text(value: str, tag: str = "p") -> str:
    return f"<{tag}>{html.escape(value)}</{tag}>"


def pre(value: str, css: str = "") -> str:
    klass = f' class="{css}"' if css else ""
    return f"<pre{klass}>{html.escape(value)}</pre>"


def table(header: Sequence[str], rows: Iterable[Sequence[object]],
          cell_class=lambda row, col, value: "") -> str:
    """A table of escaped cells; numbers right-aligned; `cell_class` may color a cell."""
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"]
    for row in rows:
        cells = []
        for col, value in enumerate(row):
            css = cell_class(row, col, value) or ("num" if isinstance(value, (int, float))
                                                  else "")
            klass = f' class="{css}"' if css else ""
            cells.append(f"<td{klass}>{html.escape(str(value))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "".join(out) + "</table>"


def write_page(path: str | os.PathLike, content: str, option: str = "--html") -> Path:
    """Write atomically (a reader never sees half a page); a failed write names the path."""
    path = Path(path)
    try:
        write_atomically(path, lambda f: f.write(content.encode("utf-8")),
                         prefix=f".{path.name}.")
    except OSError as exc:
        raise DayzeroError(f"cannot write the report: {exc.strerror or exc}", str(path),
                           f"give {option} a file in a folder you can write") from None
    return path
