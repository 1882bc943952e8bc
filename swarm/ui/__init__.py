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
from swarm.ui.app import Runs, bind, make_app, serve
from swarm.ui.security import Guard

__all__ = ["Runs", "Guard", "bind", "make_app", "serve"]
