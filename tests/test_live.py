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

from swarm.cli import app
from agents.domain import BacktestResult, Diagnosis, Intervention, InterventionKind, Status
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
