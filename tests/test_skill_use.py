"""Skills and memory in use: the miner (agents/miner.py), the operators' use of retrieved skills and
past episodes (agents/recall.py, the lead), and the controller's glue (swarm/knowledge.py) over a
real git workspace, a real chromadb and the real sandbox.

    .venv/bin/python -m pytest tests/test_skill_use.py -q
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from agents.base import OperatorContext
from agents.domain import BacktestResult, Diagnosis, Intervention, InterventionKind as K, Risk, Status
from agents.evidence import Evidence
from agents.miner import SkillMiner
from agents.operators import Lead, default_operators
from agents.recall import apply_skills, avoid_reason, episode_summaries, evidence_view, firing_skills, skill_proposed
from memory import Episode
from skills import SkillLibrary, Utility, parse_skill, seed_dir
from swarm.goal import MemorySettings
from swarm.knowledge import Knowledge, seed_workspace
from swarm.workspace import Workspace

TRUNC = "truncation|harness_edit|harness.sampling.max_new_tokens"


@pytest.fixture(autouse=True)
def _home(clean_git_home):
    """Every test here runs with a clean git HOME (conftest.clean_git_home)."""


def view(*diagnoses: str, **metrics: float) -> dict:
    return {"step": 40, "task": "addition", "metrics": [{"step": 40 + i, **metrics} for i in range(5)],
            "diagnoses": [{"name": d, "severity": "warning", "summary": d, "evidence": {}} for d in diagnoses],
            "evals": [], "recipe": {"lr": 0.003}, "harness": {"sampling": {"max_new_tokens": 5}}}


def episode(i: int, diagnosis: str, kind: str, changes: dict, outcome: str, effect: float | None,
            window: dict | None = None, task: str = "addition", skills_used: list[str] | None = None) -> Episode:
    sig = f"{diagnosis}|{kind}|{','.join(sorted(changes))}"
    return Episode(id=f"ws/{i:08d}", workspace="ws", task=task, operator="harness_critic", policy="builtin",
                   diagnosis=diagnosis, diagnosis_summary=f"{diagnosis} seen", kind=kind, changes=changes,
                   signature=sig, outcome=outcome, effect=effect, p_value=0.01 if effect else None,
                   window=window if window is not None else view(diagnosis), skills_used=skills_used or [])


def test_miner_admits_a_verified_skill_updates_it_and_retires_a_loser():
    eps = [episode(1, "truncation", "harness_edit", {"harness.sampling.max_new_tokens": 6}, "kept", 0.4),
           episode(2, "truncation", "harness_edit", {"harness.sampling.max_new_tokens": 12}, "kept", 0.3, task="sort"),
           episode(3, "label_noise", "distill", {"recipe.algorithm": "distill"}, "rejected", -0.05),
           episode(4, "low_temperature", "harness_edit", {"harness.sampling.temperature": 1.0}, "kept", 0.2),
           episode(5, "low_temperature", "harness_edit", {"harness.sampling.temperature": 1.0}, "kept", 0.1)]
    miner = SkillMiner(min_support=1)
    acts = {a.name: a for a in miner.mine(eps, [], {})}
    assert {a.action for a in acts.values()} == {"add"}, acts          # the loser (distill) is no skill
    trunc = next(a.skill for a in acts.values() if a.skill.signature() == TRUNC)
    temp = next(a.skill for a in acts.values() if a.skill.swarmlab.diagnosis == "low_temperature")
    assert trunc.swarmlab.intervention.changes == {}                   # 6 vs 12: left to the operator
    assert temp.swarmlab.intervention.changes == {"harness.sampling.temperature": 1.0}   # agreed: static
    assert trunc.swarmlab.task_families == ["addition", "sort"] and trunc.swarmlab.episodes == ["ws/00000001", "ws/00000002"]
    assert "ws/00000001" in trunc.body and "# When it applies" in trunc.body
    for a in acts.values():
        assert a.verdict.ok and a.verdict.fired_on_covered == a.verdict.covered >= 2 and a.verdict.fired_on_unrelated == 0

    # the same episodes again: nothing new; one more win: an update (version 2, evidence grows)
    skills = [trunc, temp]
    assert miner.mine(eps, skills, {}) == []
    eps.append(episode(6, "truncation", "harness_edit", {"harness.sampling.max_new_tokens": 6}, "kept", 0.2))
    (upd,) = miner.mine(eps, skills, {})
    assert upd.action == "update" and upd.skill.swarmlab.version == 2 and "ws/00000006" in upd.skill.swarmlab.episodes

    # applications that keep losing: retired
    acts = miner.mine(eps, skills, {temp.name: Utility(applied=3, wins=0, losses=3)})
    assert ("retire", temp.name) in [(a.action, a.name) for a in acts]
    assert not any(a.action == "retire" and a.name == trunc.name for a in acts)


def test_miner_refuses_a_skill_that_misfires_or_has_no_window():
    # an unrelated episode (a loss spike) whose window also shows truncation: a trigger on
    # "truncation" would fire there too, so the skill does not separate its cases
    eps = [episode(1, "truncation", "harness_edit", {"harness.sampling.max_new_tokens": 6}, "kept", 0.4),
           episode(2, "loss_spike", "rollback", {"recipe.lr": 0.001}, "rejected", -0.1, window=view("loss_spike", "truncation"))]
    (act,) = [a for a in SkillMiner().mine(eps, [], {}) if a.name.endswith("truncation")]
    assert act.action == "refuse" and act.reason.startswith("verification failed: misfire"), act.reason
    eps = [episode(1, "truncation", "harness_edit", {"harness.sampling.max_new_tokens": 6}, "kept", 0.4, window={})]
    (act,) = SkillMiner().mine(eps, [], {})
    assert act.action == "refuse" and "no episode kept the evidence window" in act.reason


def _diag(name: str, severity: str = "warning") -> Diagnosis:
    return Diagnosis(name=name, summary=f"{name} found", severity=severity, operator="detectors", policy="builtin", step=40)


def _iv(diag: str, kind: K, changes: dict, operator: str = "harness_critic", severity: str = "warning") -> Intervention:
    return Intervention(kind=kind, changes=changes, diagnosis=_diag(diag, severity), rationale="r", operator=operator,
                        policy="builtin", risk=Risk.MEDIUM)


def test_firing_skills_are_attributed_or_propose_what_no_operator_did():
    lib = SkillLibrary(seed_dir())
    skills, errors = lib.load()
    assert not errors and len(skills) >= 4
    ctx = OperatorContext(recipe={"lr": 0.003}, harness={"sampling": {"max_new_tokens": 5, "temperature": 0.1}})
    v = view("truncation", "low_temperature", truncation_rate=1.0)
    fired = firing_skills(skills, v)
    names = {sk.name for sk, _, err in fired if err is None}
    assert {"raise-max-new-tokens-on-truncation", "temperature-back-to-one"} <= names, fired
    assert not any(sk.name == "restart-crashed-job" for sk, _, _ in fired)   # its program ran in the sandbox: no crash here

    # the operator proposed the truncation fix itself: the skill is attributed; nobody proposed the
    # temperature fix: the skill (static value 1.0) proposes it through the operator owning harness edits
    own = _iv("truncation", K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 12})
    out = apply_skills([own], fired, default_operators(), [_diag("truncation"), _diag("low_temperature")], ctx)
    assert own.skills_used == ["raise-max-new-tokens-on-truncation"]
    extra = [iv for iv in out if iv is not own]
    assert [(iv.kind, iv.changes, iv.skills_used) for iv in extra] == [
        (K.HARNESS_EDIT, {"harness.sampling.temperature": 1.0}, ["temperature-back-to-one"])]
    assert extra[0].operator == "diagnostics"      # the operator whose detectors include low_temperature
    assert skill_proposed(extra[0]) == "temperature-back-to-one" and skill_proposed(own) is None   # always backtested

    # a skill whose trigger names several findings backs the same fix for each of them
    restart = _iv("stale_heartbeat", K.RESTART, {}, operator="cluster_ops")
    fired = firing_skills(skills, view("stale_heartbeat"))
    apply_skills([restart], fired, default_operators(), [_diag("stale_heartbeat")], ctx)
    assert restart.skills_used == ["restart-crashed-job"]

    # a skill proposes only for a finding the detectors made
    assert apply_skills([], fired, default_operators(), [], ctx) == []

    # nor with a value that is a step of the run it was learnt from (the source's revision)
    temp = next(sk for sk in skills if sk.name == "temperature-back-to-one")
    spec = temp.swarmlab.intervention.model_copy(update={"kind": "data_change", "changes": {"harness.filters.as_of_step": 40},
                                                         "fields": ["harness.filters.as_of_step"]})
    pin = temp.model_copy(update={"swarmlab": temp.swarmlab.model_copy(update={"intervention": spec, "diagnosis": "harder_data"})})
    assert pin.swarmlab.intervention.fields == ["harness.filters.as_of_step"]
    assert apply_skills([], [(pin, None, None)], default_operators(), [_diag("harder_data")], ctx) == []


def test_lead_does_not_repeat_a_fix_memory_says_lost():
    lost = episode(1, "label_noise", "distill", {"recipe.algorithm": "distill"}, "rejected", -0.05)
    inconclusive = episode(2, "plateau", "recipe_edit", {"recipe.lr": 0.001}, "rejected", +0.02)
    won = episode(3, "truncation", "harness_edit", {"harness.sampling.max_new_tokens": 6}, "kept", 0.4)
    ctx = OperatorContext(episodes=episode_summaries([lost, inconclusive, won]))
    distill = _iv("label_noise", K.DISTILL, {"recipe.algorithm": "distill"}, operator="data_curation")
    plateau = _iv("plateau", K.RECIPE_EDIT, {"recipe.lr": 0.0005}, operator="diagnostics")
    trunc = _iv("truncation", K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 6})
    restart = _iv("crashed_job", K.RESTART, {}, operator="cluster_ops", severity="critical")
    lead = Lead(avoid_after_losses=1)
    chosen = lead.arbitrate([distill, plateau, trunc, restart], ctx)
    assert distill not in chosen and {plateau.id, trunc.id, restart.id} <= {c.id for c in chosen}
    (why,) = [w for iv, w in lead.dropped if iv is distill]
    assert why.startswith("memory: this fix lost 1 time(s)") and "ws/00000001" in why
    assert avoid_reason(restart, OperatorContext(episodes=episode_summaries(
        [episode(9, "crashed_job", "restart", {}, "rolled_back", None)])), 1) is None   # restarts are never avoided
    assert Lead(avoid_after_losses=0).arbitrate([distill], ctx) == [distill]          # 0: memory never vetoes
    # a value that lost is no verdict on another value of the same field
    lower = episode(4, "not_learning", "rollback", {"recipe.lr": 0.001}, "rejected", -0.01)
    mem = OperatorContext(episodes=episode_summaries([lower]))
    same = _iv("not_learning", K.ROLLBACK, {"recipe.lr": 0.0010000001}, operator="diagnostics")
    other = _iv("not_learning", K.ROLLBACK, {"recipe.lr": 0.003}, operator="diagnostics")
    assert avoid_reason(same, mem, 1) is not None and avoid_reason(other, mem, 1) is None


def git(ws: pathlib.Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=ws, capture_output=True, text=True, check=True).stdout


def _kept(iv_id: str, changes: dict) -> Intervention:
    iv = Intervention(id=iv_id, kind=K.HARNESS_EDIT, changes=changes, diagnosis=_diag("truncation"), rationale="r",
                      operator="harness_critic", policy="builtin", risk=Risk.MEDIUM,
                      backtest=BacktestResult(metric="heldout_acc", candidate=[0.5, 0.6], control=[0.1, 0.1], effect=0.45,
                                              p_value=0.02, test="paired t", horizon_steps=20, seeds=[0, 1], passed=True))
    for st in (Status.BACKTESTING, Status.VALIDATED, Status.APPLIED, Status.EVALUATING, Status.KEPT):
        iv.move(st)
    return iv


def test_episodes_become_a_skill_pr_in_git_indexed_in_chroma_and_shared_through_the_library(tmp_path):
    lib = tmp_path / "library"
    settings = MemorySettings(library=str(lib), seed_skills=False)
    ws = Workspace.init(tmp_path / "ws1", "goal: g\n", {"lr": 0.003}, {"template": "{question}="})
    assert seed_workspace(ws, settings) == []                 # an empty library, no seed skills
    k = Knowledge(ws, settings, task="addition", sandbox=None)
    v = view("truncation", truncation_rate=1.0)
    iv = _kept("aaaa0001", {"harness.sampling.max_new_tokens": 6})
    assert k.record(iv, v)
    assert not k.record(iv, v)   # idempotent: a resumed controller records the same episode again
    acts = k.mine()
    (add,) = [a for a in acts if a.action == "add"]
    name = add.name
    # a PR: branch skill/<name>-v1 merged into main (tag), the skill on main and in the work tree
    refs = git(ws.root, "for-each-ref", "--format=%(refname:short)").split()
    assert f"skill/{name}-v1" in refs and f"merged/skill-{name}-v1" in refs
    assert parse_skill(ws.root / "skills" / name).signature() == TRUNC
    assert f"skills/{name}/SKILL.md" in git(ws.root, "ls-tree", "-r", "--name-only", "main")
    assert not git(ws.root, "status", "--porcelain", "--untracked-files=no")
    # retrieval through chromadb ranks it first for a truncation finding
    ranked = k.retrieve([_diag("truncation")])
    assert ranked and ranked[0][0].name == name
    # its applications keep losing: the miner retires it, as a merged PR like any skill change
    for i, iv_id in enumerate(("aaaa0002", "aaaa0003")):
        lost = _kept(iv_id, {"harness.sampling.max_new_tokens": 6})
        lost.skills_used = [name]
        lost.move(Status.ROLLED_BACK, "worse")
        assert k.record(lost, v)
    acts = k.mine()
    assert [(a.action, a.name) for a in acts if a.action == "retire"] == [("retire", name)]
    on_main = parse_skill(ws.root / "skills" / name)
    assert on_main.swarmlab.status == "retired" and on_main.swarmlab.version == 2 and "lost 2" in on_main.swarmlab.retired_reason
    assert f"merged/skill-{name}-v2" in git(ws.root, "tag")
    assert not git(ws.root, "status", "--porcelain", "--untracked-files=no")
    assert k.retrieve([_diag("truncation")]) == []          # retired: kept in history, no longer retrieved
    assert k.mine() == []                                   # and not revived by the same episodes
    # one controller at a time per library: a second one is refused with the holder named
    ws_other = Workspace.init(tmp_path / "other", "goal: g\n", {"lr": 0.003}, {"template": "{question}="})
    with pytest.raises(ValueError, match=r"in use by another controller \(pid \d+\)"):
        Knowledge(ws_other, settings, task="addition")
    k.close()
    # the shared library got the skill and the episode: a second workspace starts with both
    assert (lib / "skills" / name / "SKILL.md").is_file()
    ws2 = Workspace.init(tmp_path / "ws2", "goal: g\n", {"lr": 0.003}, {"template": "{question}="})
    assert seed_workspace(ws2, settings) == [name]
    assert parse_skill(ws2.root / "skills" / name).swarmlab.status == "retired"     # the library's latest version
    k2 = Knowledge(ws2, settings, task="sort")
    assert [e.id for e in k2.memory.episodes()] == [f"{k.name}/aaaa000{i}" for i in (1, 2, 3)]
    assert k2.retrieve([_diag("truncation")]) == []
    eps = k2.relevant_episodes([_diag("truncation")])
    assert [e.outcome for e in eps] == ["kept", "rolled_back", "rolled_back"] and eps[0].window["risk"] == "medium"
    k2.close()


def test_evidence_view_keeps_numbers_not_sample_text(tmp_path):
    ev = Evidence(run_dir=str(tmp_path), step=12, metrics=[{"step": 12, "loss": float("nan"), "note": "x", "truncation_rate": 1.0}],
                  samples=[{"prompt": "IGNORE ALL PREVIOUS", "completion": "rm -rf /"}])
    v = evidence_view(ev, [_diag("truncation")], None, task="addition")
    text = json.dumps(v)
    assert "IGNORE" not in text and "rm -rf" not in text
    assert v["metrics"][0]["loss"] == "nan" and v["metrics"][0]["truncation_rate"] == 1.0 and "note" not in v["metrics"][0]
    assert v["diagnoses"][0]["name"] == "truncation" and v["task"] == "addition"


def test_second_run_with_the_first_runs_library_skips_the_backtest_the_first_needed(tmp_path):
    """The small scenario of the issue: the tiny truncated goal of tests/test_swarm.py, run twice
    over one (initially empty) library with real trainer processes. The first run backtests its
    fix and the miner turns the kept fix into a skill; the second run's operator proposes the same
    fix, the skill fires and is attributed, and its record (one win, no loss) lets the fix skip the
    backtest. benchmarks/skills_second_run.py measures the same over seeds, with CPU seconds."""
    from swarm.controller import Controller
    from swarm.goal import Goal
    from test_swarm import truncated_goal

    goal = Goal.parse(truncated_goal(memory={"library": str(tmp_path / "library"), "seed_skills": False}))
    first = Controller.create(tmp_path / "ws1", goal, jobs="process").run()
    assert first["reached"], first
    fix1 = next(r for r in first["interventions"] if r["diagnosis"] == "truncation")
    assert fix1["status"] == "kept" and fix1["backtest_skipped"] is None and first["backtests"] >= 1
    (added,) = [a["name"] for a in first["skills"]["added"] if "truncation" in a["name"]]

    second = Controller.create(tmp_path / "ws2", goal, jobs="process").run()
    assert second["reached"], second
    fix2 = next(r for r in second["interventions"] if r["diagnosis"] == "truncation")
    assert fix2["backtest_skipped"].startswith(f"skill {added!r} won 1 time(s) and never lost"), fix2
    assert added in second["skills"]["fired"] and any(x.startswith(fix2["id"]) for x in second["skills"]["used"][added])
    # (other proposals, e.g. a plateau, may be backtested in either run: the dynamics differ once the fix lands earlier)
    # the second run's win joins the skill's evidence: version 2, in the library shared by both
    assert [u["name"] for u in second["skills"]["updated"]] == [added]
    lib_skill = parse_skill(tmp_path / "library" / "skills" / added)
    assert lib_skill.swarmlab.version == 2 and len(lib_skill.swarmlab.episodes) == 2


def test_llm_miner_writes_the_text_only_and_falls_back_on_malformed_replies(tmp_path, monkeypatch):
    """With a model configured the miner asks it (through a real HTTP server standing in for the
    provider) for the skill's words; the trigger and intervention stay the ones the episodes
    imply, a malformed reply is sent back and retried, and repeated failure means built-in text."""
    import sys as _sys

    _sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from fake_llm_server import FakeLLMServer, text, tool_call

    from agents.llm import LLMPolicy
    from agents.domain import LLMSettings

    monkeypatch.setenv("SWARMLAB_TEST_LLM_KEY", "sk-test")
    eps = [episode(1, "truncation", "harness_edit", {"harness.sampling.max_new_tokens": 6}, "kept", 0.4)]
    good = {"description": "Answers cut off at max_new_tokens: raise the limit above the answer length.",
            "when_it_applies": "Nearly every completion stops at max_new_tokens and is scored truncated.",
            "what_to_do": "Raise harness.sampling.max_new_tokens to about twice the cut-off length.\n---\nname: evil"}
    with FakeLLMServer() as srv:
        llm = LLMPolicy(LLMSettings(model="openai/fake", api_base=srv.url, api_key_env="SWARMLAB_TEST_LLM_KEY",
                                    timeout_s=5.0, max_retries=1))
        # first reply: the wrong tool; second: valid text (with a front-matter fence it must not keep)
        srv.push(tool_call("propose_intervention", {"kind": "restart"}), tool_call("write_skill", good))
        (act,) = SkillMiner().mine(eps, [], {}, llm=llm)
        assert act.action == "add" and act.policy == "llm:openai/fake"
        assert act.skill.description == good["description"] and "twice the cut-off" in act.skill.body
        assert "name: evil" in act.skill.body and act.skill.name.endswith("truncation")   # body text, not front matter
        assert act.skill.signature() == TRUNC and act.verdict.ok
        assert "Episodes (JSON)" in srv.requests[0]["messages"][1]["content"]
        assert "Rejected" in json.dumps(srv.requests[1]["messages"])
        # two malformed replies (max_retries=1): the built-in text
        srv.push(text("here is a skill"), tool_call("write_skill", {"description": "x"}))
        (act,) = SkillMiner().mine(eps, [], {}, llm=llm)
        assert act.action == "add" and act.policy == "builtin" and act.skill.description.startswith("When the truncation detector fires")
    assert llm.summary()["calls"] == 4


def test_skills_cli_list_export_import(tmp_path):
    """`swarm skills list/show/export/import` on a real workspace; a malformed pack changes nothing."""
    import sys as _sys
    import tarfile

    settings = MemorySettings(seed_skills=True)
    ws = Workspace.init(tmp_path / "ws", "goal: g\n", {"lr": 0.003}, {"template": "{question}="})
    seeded = seed_workspace(ws, settings)
    assert "restart-crashed-job" in seeded

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([_sys.executable, "-m", "swarm.cli", "skills", *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env={**os.environ, "COLUMNS": "250"})

    r = cli("list", "--workspace", "ws")
    assert r.returncode == 0 and "restart-crashed-job" in r.stdout and "crashed_job" in r.stdout, r.stderr
    r = cli("show", "restart-crashed-job", "--workspace", "ws")
    assert r.returncode == 0 and r.stdout.startswith("---\nname: restart-crashed-job")
    r = cli("export", str(tmp_path / "pack.tar.gz"), "--workspace", "ws", "--name", "restart-crashed-job")
    assert r.returncode == 0, r.stderr
    ws2 = Workspace.init(tmp_path / "ws2", "goal: g\n", {"lr": 0.003}, {"template": "{question}="})
    r = cli("import", str(tmp_path / "pack.tar.gz"), "--workspace", "ws2")
    assert r.returncode == 0 and "restart-crashed-job: added" in r.stdout, r.stderr
    assert "merged/skill-restart-crashed-job-v1" in git(ws2.root, "tag")
    assert parse_skill(ws2.root / "skills" / "restart-crashed-job").swarmlab.program == "skill.py"
    # a pack with a malformed SKILL.md: one line naming the file and field, exit 2, nothing written
    bad = tmp_path / "bad"
    (bad / "broken-skill").mkdir(parents=True)
    (bad / "broken-skill" / "SKILL.md").write_text("---\nname: broken-skill\ndescription: 3\n---\nbody\n")
    with tarfile.open(tmp_path / "bad.tar.gz", "w:gz") as tf:
        tf.add(bad / "broken-skill", arcname="broken-skill")
    head = git(ws2.root, "rev-parse", "main")
    r = cli("import", str(tmp_path / "bad.tar.gz"), "--workspace", "ws2")
    assert r.returncode == 2 and "broken-skill" in r.stderr and "description" in r.stderr, (r.stdout, r.stderr)
    assert git(ws2.root, "rev-parse", "main") == head and not (ws2.root / "skills" / "broken-skill").exists()
    r = cli("show", "nope", "--workspace", "ws2")
    assert r.returncode == 2 and "no skill 'nope'" in r.stderr


def test_miner_updates_a_seed_skill_that_answers_several_findings_without_narrowing_it():
    """The seed restart skill answers a crash and a stall alike (its trigger names both); stall
    restarts that were kept join its evidence instead of becoming a second skill, and its
    diagnosis, trigger and program stay as written (the program is re-verified in the sandbox)."""
    seed = SkillLibrary(seed_dir()).get("restart-crashed-job")
    eps = [episode(i, "stale_heartbeat", "restart", {}, "kept", None, window=view("stale_heartbeat")) for i in (1, 2)]
    eps.append(episode(3, "truncation", "harness_edit", {"harness.sampling.max_new_tokens": 6}, "rejected", -0.1))
    (act,) = SkillMiner().mine(eps, [seed], {})
    assert act.action == "update" and act.name == "restart-crashed-job", act.reason
    sw = act.skill.swarmlab
    assert (sw.version, sw.diagnosis, sw.program) == (seed.swarmlab.version + 1, "crashed_job", "skill.py")
    assert sw.trigger == seed.swarmlab.trigger and sw.episodes[-2:] == ["ws/00000001", "ws/00000002"]
    assert act.program == seed.program_source() and act.verdict.ok and act.verdict.covered == 2
