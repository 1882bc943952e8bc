"""The review cockpit: `swarm ui`, a local web app over swarm workspaces.

    swarm ui --workspace WS            # one run
    swarm ui --root runs/ --port 8765  # every workspace under runs/

It prints a one-time login link for 127.0.0.1 and serves, live (server-sent events): the runs
(status, target progress, budget spent, open approvals), a run (curves with intervention marks,
the timeline, the current harness and recipe), an intervention's PR (its report rendered without
raw HTML, the diff, plots, backtest, lifecycle, and approve / reject / rollback buttons that go
through the CLI's own functions) and the skill library. See `swarm.ui.app` for the routes and
`swarm.ui.security` for the login, CSRF, Host and Origin checks.
"""
from typing import Any

__all__ = ["Runs", "Guard", "bind", "make_app", "serve"]


def __getattr__(name: str) -> Any:
    # imported on first use: `swarm run`'s terminal view reads workspaces with swarm.ui.data
    # and should not pay for importing FastAPI
    if name == "Guard":
        from swarm.ui.security import Guard

        return Guard
    if name in __all__:
        from swarm.ui import app

        return getattr(app, name)
    raise AttributeError(f"module 'swarm.ui' has no attribute {name!r}")
