"""Terminal views: `swarm interventions` keeps ids whole at any width (80 columns through a pipe,
a narrow console, a wide one), on a real workspace's sqlite store."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from rich.console import Console
from typer.testing import CliRunner

from agents.domain import BacktestResult, Diagnosis, Intervention, InterventionKind, Status
from swarm.cli import app
from swarm.live import fit_table
from swarm.store import Store
from swarm.workspace import Workspace

GOAL = "goal: add\ntarget: {metric: heldout_acc, op: '>=', threshold: 0.95}\n"
HEADER = ["id", "status", "kind", "diagnosis", "effect", "p", "applied at", "risk", "operator", "policy"]


@pytest.fixture(autouse=True)
def _git_home(clean_git_home):
    """A clean git HOME (conftest.clean_git_home)."""


@pytest.fixture
def ws_with_ivs(tmp_path):
    ws = Workspace.init(tmp_path / "ws", GOAL, {"algorithm": "sft", "lr": 0.003}, {"template": "{question}="})
    st = Store(ws.root)
    ids = []
    for i, (kind, diag, status) in enumerate([
            (InterventionKind.HARNESS_EDIT, "truncation_of_answers_at_max_new_tokens", Status.AWAITING_APPROVAL),
            (InterventionKind.RECIPE_EDIT, "loss_spike", Status.VALIDATED),
            (InterventionKind.DATA_CHANGE, "noisy_labels", Status.REJECTED)]):
        iv = Intervention(id=f"4a29bc{i:02d}-{'x' * 10 * i}", kind=kind,
                          diagnosis=Diagnosis(name=diag, summary="s", operator="harness_critic", policy="llm:openai/gpt-4o-mini"),
                          rationale="r", operator="harness_critic", policy="llm:openai/gpt-4o-mini",
                          backtest=BacktestResult(metric="heldout_acc", candidate=[0.5], control=[0.4], effect=0.1,
                                                  p_value=0.01, test="welch", horizon_steps=20, seeds=[0], passed=True))
        st.put(iv)
        if status == Status.AWAITING_APPROVAL:
            st.transition(iv.id, Status.VALIDATED)
        st.transition(iv.id, status)
        ids.append(iv.id)
    st.close()
    return ws.root, ids


@pytest.mark.parametrize("width", [40, 80, 200])
def test_fit_table_never_cuts_a_cell(width):
    rows = [["4a29bc01deadbeef", "awaiting_approval", "harness_edit", "truncation", "+0.123", "0.010", "120",
             "high", "harness_critic", "llm:openai/gpt-4o-mini"]]
    con = Console(width=width, record=True, color_system=None)
    con.print(fit_table(con, HEADER, rows))
    text = con.export_text()
    assert "4a29bc01deadbeef" in text and "…" not in text
    shown = [h for h in HEADER if h in text.split("─")[0]]
    assert max(map(len, text.splitlines())) <= width
    if width >= 200:
        assert shown == HEADER and "not shown" not in text
    else:
        assert "not shown at" in text, "the caption names what was left out"
        for cell in rows[0][: len(shown)]:
            assert cell in text


def test_keep_names_a_column_of_the_header():
    with pytest.raises(ValueError, match="nope"):
        fit_table(Console(width=80), HEADER, [], keep=("nope",))


def test_interventions_at_80_columns_keeps_ids_whole(ws_with_ivs):
    root, ids = ws_with_ivs
    r = CliRunner().invoke(app, ["interventions", "--workspace", str(root)], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    for iid in ids:
        assert iid in r.output, (iid, r.output)
    assert "…" not in r.output and "awaiting_approval" in r.output
    assert max(map(len, r.output.splitlines())) <= 80
    assert "not shown at 80 columns" in r.output

    j = CliRunner().invoke(app, ["interventions", "--workspace", str(root), "--json"])
    rows = json.loads(j.output)
    assert [x["id"] for x in rows] == ids and rows[0]["status"] == "awaiting_approval"


def test_interventions_through_a_pipe(ws_with_ivs):
    """The console script itself, its output piped (no terminal: rich assumes 80 columns)."""
    root, ids = ws_with_ivs
    exe = pathlib.Path(sys.executable).parent / "swarm"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run([str(exe), "interventions", "--workspace", str(root)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert all(iid in out.stdout for iid in ids) and "…" not in out.stdout


# ---- the live view --------------------------------------------------------------------------------
import re  # noqa: E402
import time  # noqa: E402

from swarm.live import EventLines, Follower, JsonLines, Tick, render, sinks_for, sparkline  # noqa: E402
from test_ui import built, template  # noqa: E402,F401  (fixtures: a copy of one built workspace per test)

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_sparkline():
    assert sparkline([0.0, 0.5, 1.0], lo=0.0, hi=1.0) == "▁▅█"
    assert sparkline([]) == "" and sparkline([2.0, 2.0]) == "▅▅"
    assert len(sparkline(list(range(100)), width=10)) == 10


def test_render_shows_step_target_budget_open_interventions_and_events(built):
    f = Follower(built["root"], [])
    t = f.tick()
    events = list(reversed(f.view.store.timeline()[-4:]))
    con = Console(width=110, record=True, color_system=None)
    con.print(render(t.overview, events, t0=None, width=110))
    text = con.export_text()
    f.view.close()
    assert "step 119/2000" in text
    assert "heldout_acc 0.846 ≥ 0.9" in text and "▂▂▃▃▄▅▅▆▆▇█" in text, "target against threshold, sparkline of the evals"
    assert "steps" in text and "119 / 2000" in text and "wall clock" in text and "42s / 600s" in text and "━" in text
    assert built["awaiting"] in text and "awaiting_approval" in text and f"swarm approve {built['awaiting']}" in text
    assert built["kept"] not in text.split("newest events")[0], "only open interventions are listed"
    assert "newest events" in text and "transition" in text


def test_follower_hands_new_rows_and_events_and_drops_a_failing_sink(built, caplog):
    from test_ui import write_metrics

    got: list[Tick] = []

    class Rec:
        closed = False

        def update(self, view, tick):
            got.append(tick)

        def close(self):
            Rec.closed = True

    class Broken:
        def update(self, view, tick):
            raise RuntimeError("terminal gone")

        def close(self):
            pass

    f = Follower(built["root"], [Broken(), Rec()], interval_s=0.05).start()
    try:
        deadline = time.time() + 10
        while not got and time.time() < deadline:
            time.sleep(0.02)
        first_rows = sum(len(t.rows) for t in got)
        assert first_rows == 119 and any(e["kind"] == "transition" for t in got for e in t.events)
        write_metrics(built["run"], 120, 130)
        with Store(built["root"]) as st:
            st.log("diagnosis", name="plateau", step=129)
    finally:
        f.stop()
    assert Rec.closed and got[-1].final
    assert sum(len(t.rows) for t in got) == 129, "every row exactly once"
    assert [e["name"] for t in got for e in t.events if e["kind"] == "diagnosis"] == ["plateau"]
    assert "Broken stopped following the run" in caplog.text and len(f.sinks) == 1


def test_event_lines_and_json_lines(built):
    import io

    f = Follower(built["root"], [])
    t = f.tick(final=True)
    con = Console(width=200, record=True, color_system=None)
    EventLines(con).update(f.view, t)
    text = con.export_text()
    assert f"transition {built['kept']} evaluating → kept" in text
    assert "step 119" in text and f"awaiting approval: {built['awaiting']}" in text
    buf = io.StringIO()
    JsonLines(buf).update(f.view, t)
    rows = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert len(rows) == len(t.events) and rows[0]["event"]["kind"] == t.events[0]["kind"]
    f.view.close()
    with pytest.raises(ValueError, match="loud"):
        sinks_for("loud", con)
    assert sinks_for("quiet", con) == [] and type(sinks_for("live", con)[0]).__name__ == "EventLines"
    assert type(sinks_for("live", Console(force_terminal=True))[0]).__name__ == "LiveView"


def _real_run(tmp_path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    from test_swarm import tiny_goal, write_goal

    goal = write_goal(tmp_path / "goal.yaml", tiny_goal(perturbations=[{"shortcut": "truncation", "at_step": 0}]))
    return subprocess.run([sys.executable, "-m", "swarm.cli", "run", str(goal), "--workspace", str(tmp_path / "ws"),
                           "--jobs", "process", *extra], cwd=tmp_path, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


@pytest.mark.slow
def test_live_view_captured_from_a_real_run(tmp_path):
    """`swarm run` on a terminal (rich told it is one): frames of the live view as the run goes."""
    r = _real_run(tmp_path, env={"TTY_COMPATIBLE": "1", "COLUMNS": "110"})
    assert r.returncode == 0, r.stderr[-3000:]
    text = ANSI.sub("", r.stdout)
    assert "swarm · ws" in text and "target heldout_acc" in text and "≥ 0.6" in text
    assert "steps" in text and "wall clock" in text and "worker CPU" in text
    assert "newest events" in text and "transition" in text and "job_started" in text
    assert "open interventions" in text, "the truncation fix is shown while it is open"
    assert "✓ met" in text and "target_met" in text, "the last frame, then the summary line"
    steps = [int(m) for m in re.findall(r"step (\d+)/1500", text)]
    assert len(set(steps)) > 3 and steps == sorted(steps), "redrawn as the run goes"


@pytest.mark.slow
def test_json_lines_from_a_real_run(tmp_path):
    notes = tmp_path / "notes.txt"
    script = tmp_path / "note.py"
    script.write_text(f"import os\nopen({str(notes)!r}, 'a').write(os.environ['SWARM_EVENT'] + '\\n')\n")
    r = _real_run(tmp_path, "--json", "--notify", f"{sys.executable} {script}")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    events, summary = lines[:-1], lines[-1]
    assert events and all(set(x) == {"event"} for x in events)
    kinds = [x["event"]["kind"] for x in events]
    assert "job_started" in kinds and "transition" in kinds and kinds[-1] == "finished"
    assert summary["reached"] is True and summary["reason"] == "target_met"
    assert notes.read_text().splitlines()[-1] == "finished", "the notify command ran when the run ended"
    r = subprocess.run([sys.executable, "-m", "swarm.cli", "resume", "--workspace", str(tmp_path / "ws"), "--jobs",
                        "process", "--quiet"], cwd=tmp_path, capture_output=True, text=True, timeout=200)
    assert "swarm · " not in r.stdout and "{" not in r.stdout


def test_notify_runs_the_command_when_an_intervention_waits_and_when_the_run_ends(built, tmp_path):
    from swarm.live import Notify

    out = tmp_path / "notes.jsonl"
    script = tmp_path / "note.py"
    script.write_text("import json, os, sys\n"
                      f"open({str(out)!r}, 'a').write(json.dumps({{k: v for k, v in os.environ.items() if k.startswith('SWARM_')}}) + '\\n')\n")
    n = Notify(f"{sys.executable} {script}")
    f = Follower(built["root"], [n])
    f.tick()                                                # the history: one intervention went to awaiting_approval
    with Store(built["root"]) as st:
        st.log("finished", reason="target_met", report="r")
    f.stop()
    notes = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["SWARM_EVENT"] for x in notes] == ["awaiting_approval", "finished"]
    assert notes[0]["SWARM_INTERVENTION"] == built["awaiting"] and "needs a human" in notes[0]["SWARM_DETAIL"]
    assert notes[0]["SWARM_APPROVE"].startswith(f"swarm approve {built['awaiting']} --workspace ")
    assert notes[1]["SWARM_DETAIL"] == "target_met" and notes[1]["SWARM_WORKSPACE"] == str(built["root"].resolve())
    with pytest.raises(ValueError, match="empty"):
        Notify("   ")


def test_notify_is_checked_before_anything_is_created(tmp_path):
    from test_swarm import tiny_goal, write_goal

    goal = write_goal(tmp_path / "goal.yaml", tiny_goal())
    r = CliRunner().invoke(app, ["run", str(goal), "--workspace", str(tmp_path / "ws"), "--jobs", "process",
                                 "--notify", "no-such-notifier --x"])
    assert r.exit_code == 2 and "no command 'no-such-notifier'" in r.output and not (tmp_path / "ws").exists()
    r = CliRunner().invoke(app, ["run", str(goal), "--workspace", str(tmp_path / "ws"), "--notify", "echo 'unclosed"])
    assert r.exit_code == 2 and "--notify" in r.output and not (tmp_path / "ws").exists()


def test_the_goal_names_the_notify_command(tmp_path):
    """`notify:` in the goal is the hook `swarm run` uses, checked by the same rule as --notify
    before anything is created, and by `swarm validate` too (a hook validate accepts, run never
    refuses); the flag overrides a good one."""
    from test_swarm import tiny_goal, write_goal

    goal = write_goal(tmp_path / "goal.yaml", tiny_goal(notify="no-such-notifier --x"))
    for args in (["run", str(goal), "--workspace", str(tmp_path / "ws"), "--jobs", "process"], ["validate", str(goal)]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and "notify='no-such-notifier --x': no command 'no-such-notifier'" in r.output, r.output
        assert not (tmp_path / "ws").exists()
    goal = write_goal(tmp_path / "goal.yaml", tiny_goal(notify=f"{sys.executable} -c pass"))
    assert CliRunner().invoke(app, ["validate", str(goal)]).exit_code == 0
    r = CliRunner().invoke(app, ["run", str(goal), "--workspace", str(tmp_path / "ws"), "--jobs", "process",
                                 "--notify", "echo 'unclosed"])
    assert r.exit_code == 2 and "--notify=\"echo 'unclosed\"" in r.output and not (tmp_path / "ws").exists()


def test_worker_cpu_shown_keeps_up_with_the_trainers_heartbeats(built):
    """The status file is exact as of its last write; while a long backtest runs the trainers'
    heartbeats (live job and arms) already report more, and the budget shows the larger."""
    import json

    from swarm.ui.data import RunView

    view = RunView("r", built["root"])
    before = next(b["spent"] for b in view.budget() if b["key"] == "worker_cpu_s")
    arm = built["root"] / ".swarm" / "backtests" / "bt-x-candidate-s0"
    arm.mkdir(parents=True)
    (arm / "heartbeat.json").write_text(json.dumps({"time": 0.0, "pid": 1, "step": 5, "state": "running",
                                                    "cpu_s": before + 500.0}))
    after = next(b["spent"] for b in view.budget() if b["key"] == "worker_cpu_s")
    view.close()
    assert after >= before + 500.0
