"""The cockpit in a real headless Chromium (Debian's `chromium`, driven by Playwright through
`executable_path`), against a real uvicorn on 127.0.0.1 serving a real workspace.

Every page: content, live updates (a metrics row written to the run's file shows up without a
reload), approve / reject / rollback round trips (the buttons queue the decision through the
CLI's path, recorded as `ui:<user>`), a POST without the CSRF header refused, a wrong token
refused. Skips, saying why, when there is no Chromium or no Playwright (scripts/ci_browser.sh
installs Chromium; Playwright comes with the test extra).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import threading
import time

import pytest

from swarm.store import Store
from swarm.ui import Runs, bind, make_app
from test_ui import template, write_metrics  # noqa: F401  (template: the workspace built once per module)

CHROMIUM = os.environ.get("SWARMLAB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM} (scripts/ci_browser.sh installs it)"),
]
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        yield b
        b.close()


@pytest.fixture
def server(template, tmp_path, clean_git_home):
    """(base URL, guard, workspace info) of a real uvicorn serving a copy of the workspace."""
    import uvicorn

    root = tmp_path / "ws"
    shutil.copytree(template["root"], root, symlinks=True)
    built = {**template, "root": root, "run": root / ".swarm" / "runs" / "train"}
    runs = Runs(workspace=root)
    sock = bind(0)
    port = sock.getsockname()[1]
    app, guard = make_app(runs, port=port)
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1))
    th = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.time() + 20
    while not srv.started and time.time() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", guard, built
    srv.should_exit = True
    th.join(10)
    runs.close()


@pytest.fixture
def page(browser, server):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    base, guard, _ = server
    pg.goto(guard.login_url())
    yield pg
    ctx.close()


def human_rows(root) -> list[dict]:
    with Store(root) as st:
        return [r for r in st.timeline() if r["kind"].startswith("human_")]


def test_login_and_the_runs_page(page, server):
    base, guard, built = server
    assert page.url == base + "/"
    page.wait_for_selector("#live.on")                                  # the event stream is connected
    row = page.locator('tr[data-run="ws"]')
    assert "add 3-digit numbers" in row.inner_text()
    assert built["awaiting"] in row.locator("td.approvals").inner_text()
    assert "steps 119 / 2000" in row.inner_text()
    cookies = page.context.cookies()
    assert len(cookies) == 1 and cookies[0]["httpOnly"] and cookies[0]["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == "", "scripts cannot read the session"
    page.click('a[href="/r/ws/"]')
    page.wait_for_selector("#curves svg polyline")


def test_wrong_or_reused_token_is_refused(browser, server):
    base, guard, _ = server
    ctx = browser.new_context()
    pg = ctx.new_page()
    r = pg.goto(base + "/login?token=wrong")
    assert r.status == 403
    r = pg.goto(base + "/")
    assert r.status == 401 and "open the link" in pg.content()
    assert pg.goto(guard.login_url()).status == 200                    # the real one, once
    ctx2 = browser.new_context()
    r = ctx2.new_page().goto(guard.login_url())
    assert r.status == 403, "the token works once"
    ctx.close()
    ctx2.close()


def test_run_page_updates_live(page, server):
    base, guard, built = server
    page.goto(base + "/r/ws/")
    page.wait_for_selector("#live.on")
    assert page.inner_text("#step") == "119"
    assert built["kept"] in page.inner_text("#iv-list")
    assert "max_new_tokens: 8" in page.inner_text("#config")
    assert page.locator("#timeline tr[data-seq]").count() > 5
    marks = page.locator("#curves svg text", has_text=f"{built['kept']} recipe_edit")
    assert marks.count() == 1, "the applied intervention is marked on the curves"
    n_points = page.evaluate("document.querySelector('#curves polyline').getAttribute('points').split(' ').length")

    (built["run"] / "heartbeat.json").write_text(json.dumps({"state": "running", "step": 160, "time": time.time()}))
    write_metrics(built["run"], 120, 161)
    t0 = time.monotonic()
    playwright.expect(page.locator("#step")).to_have_text("160", timeout=10_000)
    latency = time.monotonic() - t0
    print(f"new metrics row visible in the browser after {latency:.2f} s")
    assert page.evaluate("document.querySelector('#curves polyline').getAttribute('points').split(' ').length") > n_points
    with Store(built["root"]) as st:
        st.log("diagnosis", name="plateau", step=160)
    page.wait_for_selector("#timeline td.kind.diagnosis")


def test_approve_reject_rollback_round_trips(page, server):
    base, guard, built = server
    page.goto(base + f"/r/ws/iv/{built['awaiting']}/")
    page.wait_for_selector("#live.on")
    report = page.locator("#report")
    assert "Intervention" in report.locator("h1").inner_text()
    assert "<script>" in report.inner_text(), "raw HTML in the report is shown as text"
    assert page.locator("#report script, #report img[src=x]").count() == 0
    assert page.locator("pre.diff span.add", has_text="max_new_tokens: 12").count() == 1
    assert page.evaluate("document.querySelector('img.plot').naturalWidth") > 100, "the plot loads"
    assert "Welch t-test" in page.inner_text("#lifecycle")

    page.click("button[data-post$='/approve']")
    page.wait_for_selector("#action-result.ok")
    assert "approve of" in page.inner_text("#action-result")
    page.wait_for_selector("#iv-head .queued")                           # the page shows the request, live
    rows = human_rows(built["root"])
    assert [(r["kind"], r["id"]) for r in rows] == [("human_approve", built["awaiting"])] and rows[0]["by"].startswith("ui:")
    page.click("button[data-post$='/reject']")                         # the first decision stands
    page.wait_for_selector("#action-result.error")
    assert "already requested" in page.inner_text("#action-result")
    assert len(human_rows(built["root"])) == 1

    page.goto(base + f"/r/ws/iv/{built['kept']}/")
    assert page.locator("button[data-post$='/approve']").count() == 0
    page.click("button[data-post$='/rollback']")
    page.wait_for_selector("#action-result.ok")
    assert [r["kind"] for r in human_rows(built["root"])] == ["human_approve", "human_rollback"]

    # the controller's answer shows up without a reload: it rolls the intervention back
    with Store(built["root"]) as st:
        st.transition(built["kept"], "rolled_back", "rolled back by a human")
    page.wait_for_selector("#iv-head [data-status='rolled_back']")
    assert page.locator("button[data-post$='/rollback']").count() == 0


def test_post_without_csrf_header_is_refused(page, server):
    base, guard, built = server
    page.goto(base + f"/r/ws/iv/{built['awaiting']}/")
    url = f"/r/ws/iv/{built['awaiting']}/approve"
    status = page.evaluate("url => fetch(url, {method: 'POST', credentials: 'same-origin'}).then(r => r.status)", url)
    assert status == 403
    status = page.evaluate("url => fetch(url, {method: 'POST', headers: {'X-CSRF-Token': 'forged'}}).then(r => r.status)", url)
    assert status == 403
    assert human_rows(built["root"]) == []


def test_skills_page_and_stop(page, server):
    base, guard, built = server
    page.goto(base + "/r/ws/skills")
    row = page.locator('tr[data-skill="restart-crashed-job"]')
    assert row.count() == 1 and "active" in row.inner_text()
    assert page.locator("table.skills th", has_text="mean effect").count() == 1


@pytest.mark.slow
def test_approve_in_the_browser_is_applied_by_a_real_controller(tmp_path, clean_git_home):
    """scripts/ui_screenshots.py end to end: a real run, the approval clicked in Chromium, the
    controller applies it and the pages show it (the screenshots land in tmp_path)."""
    import subprocess
    import sys

    script = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "ui_screenshots.py"
    r = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "img")], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "approved in the browser and applied by the controller" in r.stdout
    shots = sorted(p.name for p in (tmp_path / "img").glob("ui-*.png"))
    assert shots == ["ui-intervention-applied.png", "ui-intervention.png", "ui-run-applied.png", "ui-run.png",
                     "ui-runs.png", "ui-skills.png"]
