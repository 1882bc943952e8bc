"""Reports follow the lifecycle, on a real git workspace and a real sqlite store in tmp_path.

An intervention's REPORT.md (what `swarm review` prints) is rewritten in its PR on every status
change recorded by the store: awaiting approval, applied at step N on branch B, evaluating,
kept; a rejection moves the closed tag (keeping its note); a rollback still reverts exactly what
was merged. The CLI shows the current report.
"""
from __future__ import annotations

import json
import pathlib

import pytest
from typer.testing import CliRunner

from agents.domain import Diagnosis, Intervention, InterventionKind, Risk, Status
from swarm.cli import app
from swarm.report import LifecycleReports, intervention_report
from swarm.store import Store
from swarm.workspace import Workspace

RECIPE = {"algorithm": "sft", "lr": 0.003, "schedule": "cosine", "warmup_steps": 10, "steps": 300}
HARNESS = {"template": "{question}=", "sampling": {"temperature": 1.0, "max_new_tokens": 8}}
GOAL = "goal: add 3-digit numbers\ntarget: {metric: heldout_acc, op: '>=', threshold: 0.95}\n"


@pytest.fixture(autouse=True)
def _git_home(clean_git_home):
    """A clean git HOME (conftest.clean_git_home)."""


def make_iv(changes, kind=InterventionKind.RECIPE_EDIT, **over) -> Intervention:
    return Intervention(kind=kind, changes=changes,
                        diagnosis=Diagnosis(name="loss_spike", summary="loss jumped", operator="diagnostics",
                                            policy="builtin", step=100),
                        rationale="lr too high", operator="diagnostics", policy="builtin", **over)


@pytest.fixture
def live(tmp_path):
    """(workspace, store subscribed to LifecycleReports, run dir with metrics)."""
    ws = Workspace.init(tmp_path / "ws", GOAL, RECIPE, HARNESS)
    run = ws.swarm_dir / "runs" / "train"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / s, "time": float(s)}) + "\n"
                                               for s in range(1, 130)))
    st = Store(ws.root)
    st.subscribe(LifecycleReports(ws, run))
    yield ws, st, run
    st.close()


def table_value(md: str, field: str) -> str:
    row = next(line for line in md.splitlines() if line.startswith(f"| {field} |"))
    return row.split("|")[2].strip()


def test_report_is_rewritten_on_every_status_change(live):
    ws, st, run = live
    iv = make_iv({"recipe.lr": 0.001}, risk=Risk.HIGH)
    st.put(iv)
    st.transition(iv.id, Status.VALIDATED, "backtest passed")       # no PR yet: nothing to rewrite
    iv = st.get(iv.id)
    md, files = intervention_report(iv, [], [])
    iv.branch = ws.open_pr(iv, md, files)
    st.put(iv)
    assert table_value(ws.report(iv.id), "status") == "validated"

    st.transition(iv.id, Status.AWAITING_APPROVAL, "risk high needs a human")
    assert table_value(ws.report(iv.id), "status") == "awaiting_approval"
    assert ws.intervention(iv.id).status == Status.AWAITING_APPROVAL, "intervention.json follows too"

    merge = ws.approve(iv.id)
    st.transition(iv.id, Status.APPLIED, "applied at step 120", applied_step=120)
    md = ws.report(iv.id)
    assert table_value(md, "status") == "applied" and table_value(md, "applied at step") == "120"
    assert table_value(md, "branch") == f"iv/{iv.id}-recipe_edit"
    assert ws.pr_state(iv.id) == "merged" and ws.repo.tags[f"merged/{iv.id}"].commit.hexsha == merge
    assert ws.repo.heads.main.commit.hexsha == merge, "main is not touched by a report update"
    assert ws.repo.git.status("--porcelain") == ""

    st.transition(iv.id, Status.EVALUATING, "judged over the next 50 steps")
    st.transition(iv.id, Status.KEPT, "heldout_acc 0.4 → 0.8 over 50 steps")
    md = ws.report(iv.id)
    assert table_value(md, "status") == "kept"
    lifecycle = md.split("### Lifecycle")[1]
    for status in ("validated", "awaiting_approval", "applied", "evaluating", "kept"):
        assert f"| {status} |" in lifecycle, status
    assert "0.4 → 0.8" in lifecycle
    assert "Report of intervention" in ws.repo.heads[f"iv/{iv.id}-recipe_edit"].commit.message

    # `swarm review` prints the current report
    r = CliRunner().invoke(app, ["review", iv.id, "--workspace", str(ws.root)])
    assert r.exit_code == 0, r.output
    assert "| status | kept |" in r.output and "| applied at step | 120 |" in r.output

    # a rollback still reverts exactly what was merged (textually: the report updates are not on main)
    sha = ws.rollback(iv.id)
    assert "key by key" not in ws.repo.commit(sha).message and ws.current_recipe() == RECIPE
    st.transition(iv.id, Status.ROLLED_BACK, "rolled back by a human")
    assert ws.pr_state(iv.id) == "reverted" and table_value(ws.report(iv.id), "status") == "rolled_back"


def test_rejected_report_moves_the_closed_tag_and_keeps_its_note(live):
    ws, st, _ = live
    iv = make_iv({"harness.sampling.temperature": 0.7}, kind=InterventionKind.HARNESS_EDIT, risk=Risk.HIGH)
    st.put(iv)
    iv = st.transition(iv.id, Status.VALIDATED, "ok")
    md, files = intervention_report(iv, [], [])
    ws.open_pr(iv, md, files)
    st.transition(iv.id, Status.AWAITING_APPROVAL, "needs a human")
    old_tip = ws.repo.heads[f"iv/{iv.id}-harness_edit"].commit
    ws.reject(iv.id, note="too risky")
    st.transition(iv.id, Status.REJECTED, "rejected by a human")
    tag = ws.repo.tags[f"closed/{iv.id}"]
    assert tag.tag.message.strip() == "rejected: too risky" and list(tag.commit.parents) == [old_tip]
    assert ws.pr_state(iv.id) == "closed" and table_value(ws.report(iv.id), "status") == "rejected"
    assert "rejected by a human" in ws.report(iv.id)


def test_interrupted_merge_tag_is_repaired_before_the_branch_moves(live):
    """A controller killed between the merge and its tag: the state is read from the branch tip
    being on main; the report update tags the merge first, so the PR stays merged."""
    ws, st, _ = live
    iv = make_iv({"recipe.lr": 0.002})
    st.put(iv)
    iv = st.transition(iv.id, Status.VALIDATED, "ok")
    ws.open_pr(iv, "# r\n", {})
    ws.approve(iv.id)
    merge = ws.repo.tags[f"merged/{iv.id}"].commit
    ws.repo.delete_tag(ws.repo.tags[f"merged/{iv.id}"])
    assert ws.pr_state(iv.id) == "merged"
    st.transition(iv.id, Status.APPLIED, "applied at step 5", applied_step=5)
    assert ws.pr_state(iv.id) == "merged" and ws.repo.tags[f"merged/{iv.id}"].commit == merge
    assert table_value(ws.report(iv.id), "status") == "applied"


def test_a_failing_follower_never_undoes_the_transition(live, caplog):
    ws, st, _ = live

    def broken(iv):
        raise RuntimeError("disk full")

    st.subscribe(broken)
    iv = make_iv({"recipe.lr": 0.002})
    st.put(iv)
    st.transition(iv.id, Status.VALIDATED, "ok")
    assert st.get(iv.id).status == Status.VALIDATED
    assert "disk full" in caplog.text
