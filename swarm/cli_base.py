"""What every CLI module shares: the two consoles, the workspace option's help, and `fail` (one
error line, exit code 2)."""
from __future__ import annotations

import typer
from rich.console import Console

from sandboxes.text import clean_text

err = Console(stderr=True)
out = Console()

WS_HELP = "workspace directory (a git repository; state in WORKSPACE/.swarm)"
DEFAULT_WS = "workspace"


def fail(msg: str, code: int = 2) -> None:
    from rich.markup import escape

    # one line whatever the message holds: values quoted from a file may carry newlines or "[...]"
    err.print(f"[bold red]error:[/] {escape(clean_text(msg, newlines=False))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)
