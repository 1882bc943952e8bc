"""`swarm ui` over a real workspace (git + sqlite + the run's JSONL files in tmp_path), through
FastAPI's TestClient and a real uvicorn on 127.0.0.1.

Security: no session → 401; a wrong or reused login token → 403; a wrong Host (DNS rebinding) or
Origin → 403; a POST without the CSRF header, or with another session's → 403, and nothing is
recorded. Pages: runs, a run (curves with marks, timeline, harness/recipe), an intervention
(report rendered with raw HTML shown as text, diff, plot, backtest, lifecycle), skills. Actions go
through `swarm.cli.queue_human` (the CLI's path) and record who acted. Event streams send fresh
fragments when a metrics row lands.
"""
from __future__ import annotations

import json
import pathlib
import shutil
import threading
import time

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from agents.domain import BacktestResult, Diagnosis, Intervention, InterventionKind, Risk, Status
from swarm.cli import app as cli_app
from swarm.report import intervention_report
from swarm.store import Store
from swarm.ui import Runs, bind, make_app
from swarm.ui.data import downsample
from swarm.workspace import Workspace

GOAL = {"goal": "add 3-digit numbers", "target": {"metric": "heldout_acc", "op": ">=", "threshold": 0.9},
        "budget": {"wall_s": 600, "steps": 2000, "worker_cpu_s": 1200, "llm_usd": 1.0}}
RECIPE = {"algorithm": "sft", "lr": 0.003, "steps": 2000}
HARNESS = {"template": "{question}=", "sampling": {"temperature": 1.0, "max_new_tokens": 8}}
HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)> [click me](javascript:alert(1))"


@pytest.fixture(autouse=True)
def _git_home(clean_git_home):
    """A clean git HOME (conftest.clean_git_home)."""


def _iv(kind, changes, diag, risk=Risk.MEDIUM, **kw) -> Intervention:
    return Intervention(kind=kind, changes=changes, risk=risk,
                        diagnosis=Diagnosis(name=diag, summary=f"answers cut short {HOSTILE}", operator="harness_critic",
                                            policy="builtin", step=40, evidence={"truncated_frac": 0.6}),
                        rationale=f"raise the token limit {HOSTILE}", operator="harness_critic", policy="builtin", **kw)


def write_metrics(run: pathlib.Path, start: int, stop: int, segment: int = 0) -> None:
    with open(run / "metrics.jsonl", "a") as f:
        for s in range(start, stop):
            row = {"step": s, "loss": 2.0 / (1 + s / 20), "reward_mean": min(1.0, s / 150), "time": time.time(),
                   "segment": segment, "harness_version": "h-1a2b3c"}
            if s % 10 == 0:
                row["heldout_acc"] = min(0.95, s / 130)
            f.write(json.dumps(row) + "\n")


def build_workspace(root: pathlib.Path, steps: int = 120) -> dict:
    """A workspace as a run leaves it: an intervention awaiting approval (open PR), one kept
    (merged), one rejected (closed), metrics, heartbeat, status file, seed skills."""
    from swarm.goal import MemorySettings
    from swarm.knowledge import seed_workspace

    ws = Workspace.init(root, yaml.safe_dump(GOAL), RECIPE, HARNESS)
    seed_workspace(ws, MemorySettings(seed_skills=True))
    run = ws.swarm_dir / "runs" / "train"
    run.mkdir(parents=True)
    write_metrics(run, 1, steps)
    (run / "heartbeat.json").write_text(json.dumps({"state": "running", "step": steps - 1, "time": time.time()}))
    (ws.swarm_dir / "status.json").write_text(json.dumps({"steps": steps - 1, "wall_s": 42.0, "worker_cpu_s": 80.0,
                                                           "llm": {"cost_usd": 0.0}}))
    st = Store(ws.root)
    st.start_run("main", "add")
    bt = BacktestResult(metric="heldout_acc", candidate=[0.6, 0.62], control=[0.3, 0.31], effect=0.305, p_value=0.004,
                        test="Welch t-test, one-sided", horizon_steps=20, seeds=[0, 1], passed=True)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    out = {}
    for name, kind, changes, fate in (
            ("kept", InterventionKind.RECIPE_EDIT, {"recipe.lr": 0.001}, Status.KEPT),
            ("awaiting", InterventionKind.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 12}, Status.AWAITING_APPROVAL),
            ("rejected", InterventionKind.DATA_CHANGE, {"harness.sampling.temperature": 0.5}, Status.REJECTED)):
        iv = _iv(kind, changes, "truncation" if name == "awaiting" else "loss_plateau", backtest=bt)
        st.put(iv)
        st.log("proposed", id=iv.id, iv_kind=kind.value)
        st.transition(iv.id, Status.BACKTESTING, "forked at step 40")
        iv = st.transition(iv.id, Status.VALIDATED, "effect +0.305, p=0.004")
        md, files = intervention_report(iv, rows, [])
        iv.branch = ws.open_pr(iv, md, files)
        st.put(iv)
        if fate == Status.AWAITING_APPROVAL:
            st.transition(iv.id, Status.AWAITING_APPROVAL, "risk medium needs a human")
        elif fate == Status.KEPT:
            ws.approve(iv.id)
            st.transition(iv.id, Status.APPLIED, "applied at step 60", applied_step=60)
            st.transition(iv.id, Status.EVALUATING, "judged over 40 steps")
            st.transition(iv.id, Status.KEPT, "heldout_acc 0.4 → 0.8")
        else:
            st.transition(iv.id, Status.REJECTED, "rejected by a human")
            ws.reject(iv.id, note="rejected by a human")
        out[name] = iv.id
    st.close()
    return {"root": ws.root, "run": run, **out}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """Built once per module (reports draw PNGs, seeding commits skills); each test gets a copy."""
    d = tmp_path_factory.mktemp("template")
    with pytest.MonkeyPatch.context() as mp:
        (d / "home").mkdir()
        mp.setenv("HOME", str(d / "home"))
        mp.setenv("GIT_CONFIG_NOSYSTEM", "1")
        mp.delenv("GIT_CONFIG_GLOBAL", raising=False)
        mp.delenv("SWARMLAB_LIBRARY", raising=False)
        return build_workspace(d / "ws")


@pytest.fixture
def built(template, tmp_path):
    root = tmp_path / "ws"
    shutil.copytree(template["root"], root, symlinks=True)
    return {**template, "root": root, "run": root / ".swarm" / "runs" / "train"}


def login(client: TestClient, guard) -> None:
    r = client.get(f"/login?token={guard.token}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")


@pytest.fixture
def client(built):
    runs = Runs(workspace=built["root"])
    app, guard = make_app(runs, port=8765)
    with TestClient(app, base_url="http://127.0.0.1:8765") as c:
        c.guard = guard
        yield c
    runs.close()


def csrf_of(html: str) -> str:
    return html.split('name="csrf-token" content="')[1].split('"')[0]


# ---- security -------------------------------------------------------------------------------------
def test_no_session_is_401_and_the_token_works_once(client):
    assert client.get("/").status_code == 401
    assert client.get("/static/cockpit.js").status_code == 401
    assert client.post("/r/ws/stop").status_code == 401
    assert client.get("/login?token=wrong").status_code == 403
    login(client, client.guard)
    assert client.get("/").status_code == 200
    client.cookies.clear()
    r = client.get(f"/login?token={client.guard.token}", follow_redirects=False)
    assert r.status_code == 403 and "already used" in r.text
    assert client.get("/").status_code == 401


def test_wrong_host_or_origin_is_refused(client):
    login(client, client.guard)
    assert client.get("/").status_code == 200
    assert client.get("/", headers={"Host": "localhost:8765"}).status_code == 200
    r = client.get("/", headers={"Host": "evil.example:8765"})      # DNS rebinding: the attacker's name
    assert r.status_code == 403 and "Host" in r.text
    assert client.get("/", headers={"Host": "127.0.0.1:9999"}).status_code == 403
    r = client.get("/", headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "Origin" in r.text
    # refused before the login too: a rebinding page cannot even redeem a leaked token
    client.cookies.clear()
    fresh = TestClient(client.app, base_url="http://evil.example:8765")
    assert fresh.get(f"/login?token={client.guard.token}").status_code == 403


def test_post_needs_the_sessions_csrf_header(client, built):
    login(client, client.guard)
    csrf = csrf_of(client.get(f"/r/ws/iv/{built['awaiting']}/").text)
    url = f"/r/ws/iv/{built['awaiting']}/approve"
    for headers in ({}, {"X-CSRF-Token": "nope"}, {"X-CSRF-Token": csrf, "Origin": "http://evil.example"}):
        r = client.post(url, headers=headers)
        assert r.status_code == 403, headers
    with Store(built["root"]) as st:
        assert not st.timeline(kind="human_approve"), "a refused POST records nothing"
    r = client.post(url, headers={"X-CSRF-Token": csrf, "Origin": "http://127.0.0.1:8765"})
    assert r.status_code == 200 and "queued" in r.json()["message"]


def test_security_headers(client):
    login(client, client.guard)
    r = client.get("/")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"


# ---- pages ----------------------------------------------------------------------------------------
def test_runs_page(client, built):
    login(client, client.guard)
    html = client.get("/").text
    assert 'href="/r/ws/"' in html and "add 3-digit numbers" in html
    assert built["awaiting"] in html, "open approvals are listed"
    assert "steps 119 / 2000" in html and "wall clock" in html, "budget spent"
    assert "heldout_acc 0.8462 &gt;= 0.9" in html and '<meter min="0" max="1" value="0.94' in html, "target progress"


def test_run_page(client, built):
    login(client, client.guard)
    html = client.get("/r/ws/").text
    assert "<svg" in html and "polyline" in html and f"{built['kept']} recipe_edit" in html, "curves with the applied mark"
    assert 'data-events="/r/ws/events"' in html
    for iid in (built["kept"], built["awaiting"], built["rejected"]):
        assert iid in html
    assert "transition" in html and "proposed" in html, "the timeline"
    assert "max_new_tokens: 8" in html and "lr: 0.001" in html, "main's current harness and recipe"
    assert "h-1a2b3c" in html, "the live harness version"
    assert client.get("/r/nope/").status_code == 404


def test_intervention_page_renders_the_report_without_raw_html(client, built):
    login(client, client.guard)
    iid = built["awaiting"]
    html = client.get(f"/r/ws/iv/{iid}/").text
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;script&gt;" in html, "raw HTML in the report is shown as text"
    assert "click me" in html and 'href="javascript' not in html, "no script links"
    assert "<table>" in html and "<h1>Intervention" in html, "the markdown is rendered"
    assert '+  max_new_tokens: 12' in html, "the diff"
    assert 'src="metrics.png"' in html and "Welch t-test" in html and "awaiting_approval" in html
    assert f'data-post="/r/ws/iv/{iid}/approve"' in html and f'data-post="/r/ws/iv/{iid}/reject"' in html
    png = client.get(f"/r/ws/iv/{iid}/metrics.png")
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG") and png.headers["content-type"] == "image/png"
    assert "sandbox" in png.headers["content-security-policy"]
    assert client.get(f"/r/ws/iv/{iid}/REPORT.md").status_code == 404
    assert client.get(f"/r/ws/iv/{iid}/..%2F..%2Fgoal.yaml").status_code == 404
    kept = client.get(f"/r/ws/iv/{built['kept']}/").text
    assert f'data-post="/r/ws/iv/{built["kept"]}/rollback"' in kept and "approve</button>" not in kept
    assert client.get("/r/ws/iv/deadbeef/").status_code == 404


def test_skills_page(client):
    login(client, client.guard)
    html = client.get("/r/ws/skills").text
    assert "restart-crashed-job" in html and "retrieved" in html and "mean effect" in html


# ---- actions ----------------------------------------------------------------------------------------
def test_actions_go_through_the_cli_path_and_record_who(client, built):
    login(client, client.guard)
    csrf = csrf_of(client.get("/").text)
    h = {"X-CSRF-Token": csrf}
    r = client.post(f"/r/ws/iv/{built['awaiting']}/reject", headers=h)
    assert r.status_code == 200, r.text
    r = client.post(f"/r/ws/iv/{built['kept']}/approve", headers=h)
    assert r.status_code == 409 and "needs status awaiting_approval" in r.json()["error"]
    r = client.post(f"/r/ws/iv/{built['kept']}/rollback", headers=h)
    assert r.status_code == 200
    assert client.post(f"/r/ws/iv/{built['kept']}/delete", headers=h).status_code == 404
    with Store(built["root"]) as st:
        rows = [r for r in st.timeline() if r["kind"].startswith("human_")]
    assert [(r["kind"], r["id"]) for r in rows] == [("human_reject", built["awaiting"]), ("human_rollback", built["kept"])]
    assert all(r["by"].startswith("ui:") for r in rows)
    # the CLI sees the same queue: asking again is refused with the same words
    res = CliRunner().invoke(cli_app, ["reject", built["awaiting"], "--workspace", str(built["root"])])
    assert res.exit_code == 2 and "already requested" in res.output
    page = client.get(f"/r/ws/iv/{built['kept']}/").text
    assert "rollback requested by ui:" in page
    r = client.post("/r/ws/stop", headers=h)
    assert r.status_code == 200 and (built["root"] / ".swarm" / "stop").exists()


# ---- live ------------------------------------------------------------------------------------------
def test_downsample_keeps_extremes_and_segments():
    rows = [{"step": s, "loss": 1.0, "segment": 0} for s in range(100_000)]
    rows[53_210]["loss"] = 50.0                       # one spike
    rows[70_000]["loss"] = float("nan")
    rows += [{"step": s, "loss": 0.5, "segment": 1} for s in range(1000)]
    rows += [{"step": s * 100, "heldout_acc": 0.5, "segment": 0} for s in range(300)]
    out = downsample(rows, max_points=400)
    assert len([r for r in out if "loss" in r]) <= 450
    assert any(r["loss"] == 50.0 for r in out if "loss" in r), "the spike survives"
    assert any(r.get("step") == 70_000 and r["loss"] != r["loss"] for r in out if "loss" in r), "non-finite kept"
    assert {r.get("segment") for r in out} == {0, 1}
    assert len([r for r in out if "heldout_acc" in r]) == 300, "sparse evals keep every row"
    small = rows[:50]
    assert downsample(small, 400) == small


def test_event_stream_sends_new_metrics_on_a_real_server(built):
    runs = Runs(workspace=built["root"])
    sock = bind(0)
    port = sock.getsockname()[1]
    app, guard = make_app(runs, port=port)
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=10) as c:
            for _ in range(100):
                try:
                    if c.get("/").status_code == 401:
                        break
                except httpx.TransportError:
                    time.sleep(0.05)
            assert c.get(f"/login?token={guard.token}").status_code == 303 and c.get("/").status_code == 200
            assert sock.getsockname()[0] == "127.0.0.1"
            with c.stream("GET", "/r/ws/events") as resp:
                assert resp.headers["content-type"].startswith("text/event-stream")
                events = _events(resp.iter_lines())
                first = next(events)
                assert set(first) >= {"run-status", "curves", "timeline", "iv-list"}
                assert "step <b id=\"step\">119</b>" in first["run-status"]
                (built["run"] / "heartbeat.json").write_text(json.dumps({"state": "running", "step": 180, "time": time.time()}))
                write_metrics(built["run"], 120, 181)
                second = next(events)
                assert "180" in second["run-status"] and second["curves"] != first["curves"]
    finally:
        server.should_exit = True
        th.join(10)
        runs.close()


def _events(lines):
    kind = None
    for line in lines:
        if line.startswith("event:"):
            kind = line.split(":", 1)[1].strip()
        elif line.startswith("data:") and kind == "update":
            yield json.loads(line[5:])


def test_root_serves_every_workspace_under_it(template, tmp_path):
    shutil.copytree(template["root"], tmp_path / "runs" / "a", symlinks=True)
    shutil.copytree(template["root"], tmp_path / "runs" / "group" / "b", symlinks=True)
    (tmp_path / "runs" / "not-a-run").mkdir()
    runs = Runs(root=tmp_path / "runs")
    assert sorted(runs.found()) == ["a", "group~b"]
    app, guard = make_app(runs, port=8765)
    with TestClient(app, base_url="http://127.0.0.1:8765") as c:
        login(c, guard)
        html = c.get("/").text
        assert 'href="/r/a/"' in html and 'href="/r/group~b/"' in html
        assert c.get("/r/group~b/").status_code == 200
        assert c.get("/r/..~..~etc/").status_code == 404
    runs.close()
