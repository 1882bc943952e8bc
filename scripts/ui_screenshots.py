#!/usr/bin/env python
"""Screenshots of every cockpit page (docs/img/ui-*.png) from a real run.

    .venv/bin/python scripts/ui_screenshots.py [--out docs/img] [--keep DIR]

What it does, end to end: a short real `swarm run` (examples/goals/truncation.yaml scaled to about
a minute of 2 cores, with medium-risk fixes waiting for a human) in a temporary workspace, with
the process job launcher; once the truncation fix waits for approval, `swarm ui`'s app on a free
127.0.0.1 port, opened in headless Chromium (Debian's `chromium`, driven by Playwright): the runs
page, the run page and the intervention page are captured; the approve button is clicked and the
controller applies the fix; the intervention page (applied, with its lifecycle) and the run page
(with the fix marked on the curves) are captured again, then the skills page; the run is stopped.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swarm.store import Store  # noqa: E402
from swarm.ui import Runs, bind, make_app  # noqa: E402

CHROMIUM = os.environ.get("SWARMLAB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def goal() -> dict:
    g = yaml.safe_load((ROOT / "examples" / "goals" / "truncation.yaml").read_text())
    g["target"]["threshold"] = 0.6
    g["run"]["model"].update(d_model=64, n_layers=2)
    g["run"]["recipe"].update(lr=0.005, eval_interval=25, eval_size=100)
    g["run"]["checkpoint"].update(interval=25, keep_last=4)
    g["budget"].update(wall_s=300, steps=3000, worker_cpu_s=900)
    g["approval"] = {"auto": ["low"]}        # the truncation fix (medium risk) waits for a human
    g["swarm"].update(observe_every_s=0.5, observe_quiet_s=0.5, min_steps_between_interventions=20,
                      evaluate_window_steps=30)
    g["swarm"]["backtest"].update(horizon_steps=20, eval_size=50)
    return g


def wait(what: str, pred, timeout: float, proc: subprocess.Popen, log: pathlib.Path):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        if proc.poll() is not None:
            sys.exit(f"the run exited ({proc.returncode}) while waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)
    sys.exit(f"timed out after {timeout:.0f} s waiting for {what}:\n{log.read_text()[-3000:]}")


def interventions(ws: pathlib.Path) -> list:
    if not (ws / ".swarm" / "state.db").exists():
        return []
    with Store(ws) as st:
        return st.list()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"), help="where the PNGs go")
    ap.add_argument("--keep", default=None, help="make the workspace here and keep it (default: a temp dir, removed)")
    a = ap.parse_args()
    from playwright.sync_api import expect, sync_playwright

    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(a.keep) if a.keep else pathlib.Path(tempfile.mkdtemp(prefix="swarm-shots-"))
    tmp.mkdir(parents=True, exist_ok=True)
    ws, log = tmp / "demo", tmp / "controller.log"
    (tmp / "goal.yaml").write_text(yaml.safe_dump(goal(), sort_keys=False))
    with open(log, "ab") as f:
        proc = subprocess.Popen([sys.executable, "-m", "swarm.cli", "run", str(tmp / "goal.yaml"), "--workspace", str(ws),
                                 "--jobs", "process"], cwd=tmp, stdout=f, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
    server = th = runs = None
    try:
        iv = wait("an intervention awaiting approval",
                  lambda: next((x for x in interventions(ws) if x.status.value == "awaiting_approval"), None), 240, proc, log)
        print(f"{iv.id} ({iv.kind.value} after {iv.diagnosis.name}) waits for approval", flush=True)
        import uvicorn

        runs = Runs(root=tmp)
        sock = bind(0)
        app, guard = make_app(runs, port=sock.getsockname()[1])
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1))
        th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        th.start()
        while not server.started:
            time.sleep(0.05)
        base = f"http://127.0.0.1:{guard.port}"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            page = browser.new_context(viewport={"width": 1440, "height": 1100}).new_page()
            page.goto(guard.login_url())
            page.wait_for_selector("#live.on")
            page.screenshot(path=str(out / "ui-runs.png"), full_page=True)
            page.goto(f"{base}/r/demo/")
            page.wait_for_selector("#live.on")
            time.sleep(2)     # a few live updates: the curves move on
            page.screenshot(path=str(out / "ui-run.png"), full_page=True)
            page.goto(f"{base}/r/demo/iv/{iv.id}/")
            page.wait_for_selector("#live.on")
            page.screenshot(path=str(out / "ui-intervention.png"))      # the top: the report runs on for pages
            page.click("button[data-post$='/approve']")
            page.wait_for_selector("#action-result.ok")
            expect(page.locator("#iv-head [data-status]")).to_have_attribute(
                "data-status", __import__("re").compile("applied|evaluating|kept"), timeout=120_000)
            print(f"{iv.id} approved in the browser and applied by the controller", flush=True)
            page.screenshot(path=str(out / "ui-intervention-applied.png"))
            page.goto(f"{base}/r/demo/")
            page.wait_for_selector(f"#curves svg text:has-text('{iv.id}')", timeout=30_000)
            page.screenshot(path=str(out / "ui-run-applied.png"), full_page=True)
            page.goto(f"{base}/r/demo/skills")
            page.screenshot(path=str(out / "ui-skills.png"), full_page=True)
            browser.close()
    finally:
        subprocess.run([sys.executable, "-m", "swarm.cli", "stop", "--workspace", str(ws)], cwd=tmp, capture_output=True)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
        if server is not None:
            server.should_exit = True
            th.join(10)
            runs.close()
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"screenshots in {out}: " + ", ".join(sorted(x.name for x in out.glob("ui-*.png"))))


if __name__ == "__main__":
    main()
