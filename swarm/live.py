"""Terminal views of a swarm run: tables that keep ids whole at any width.

    table = fit_table(console, ["id", "kind", "status", ...], rows, keep=("id",))
    console.print(table)

Rich shrinks every column of a table wider than the terminal and cuts cells with an ellipsis,
so at 80 columns (a pipe, a narrow terminal) an intervention id became "4a29…" — and the id is
what `swarm approve ID` needs. `fit_table` never cuts a cell: it adds columns in the order given
(most important first) while the table still fits, and names the columns it left out in the
caption; `--json` on the commands gives every field.
"""
from __future__ import annotations

from typing import Sequence

from rich import box
from rich.console import Console
from rich.table import Table


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], cols: list[int], caption: str | None) -> Table:
    t = Table(box=box.SIMPLE_HEAD, caption=caption, caption_justify="left")
    for i in cols:
        t.add_column(header[i], no_wrap=True, overflow="ignore")
    for r in rows:
        t.add_row(*(r[i] for i in cols))
    return t


def fit_table(console: Console, header: Sequence[str], rows: Sequence[Sequence[str]],
              keep: Sequence[str] = ("id",)) -> Table:
    """A table of `rows` whose cells are never cut or wrapped. Columns are taken in `header`'s
    order while the table fits `console.width`; the `keep` columns are always there (wider than
    the terminal if they must: a terminal then wraps the line, an id stays whole). Columns left
    out are named in the caption."""
    missing = [k for k in keep if k not in header]
    if missing:
        raise ValueError(f"fit_table: keep columns {missing} are not in the header {list(header)}")
    cols = [i for i, h in enumerate(header) if h in keep]
    unbounded = console.options.update_width(1_000_000)   # a measurement is otherwise capped at the width
    for i, _ in enumerate(header):
        if i in cols:
            continue
        trial = sorted(cols + [i])
        if console.measure(_table(header, rows, trial, None), options=unbounded).maximum <= console.width:
            cols = trial
    left_out = [h for i, h in enumerate(header) if i not in cols]
    caption = f"not shown at {console.width} columns: {', '.join(left_out)} (--json shows all)" if left_out else None
    return _table(header, rows, cols, caption)
