"""The goal's words count: a sentence names its task (and its difficulty) through the matcher of
swarm/words.py over the names the task families declare; a sentence that names no task, two
equally, another task than `run.task`, or a difficulty the task lacks is refused in one line with
exit code 2 by `swarm validate` and `swarm run` (the refusals in tests/bad_goals/ go through both in
tests/test_bad_input.py). Matching only: no training, no Ray."""
from __future__ import annotations

import json
import pathlib
import sys

import pytest
import yaml
from typer.testing import CliRunner

from swarm.cli import app
from swarm.goal import Goal
from swarm.words import Refused, Understood, understand
from trainer.config import ConfigError
from trainer.tasks import TASKS

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import fake_llm_server as fake  # noqa: E402  (the scripted OpenAI-compatible server)

runner = CliRunner()
TARGET = {"metric": "heldout_acc", "op": ">=", "threshold": 0.9}

# sentence -> (task, options, difficulty): every family, several phrasings, number words included
SENTENCES = [
    ("a policy that adds 3-digit numbers with >= 95% exact match within 20 CPU minutes", "addition", {}, 3),
    ("sum two five-digit integers", "addition", {}, 5),
    ("a policy that adds numbers", "addition", {}, None),
    ("addition of numbers of 4 digits, on 2 CPU cores", "addition", {}, 4),
    ("a policy that multiplies 2-digit numbers with >= 90% held-out exact match", "multiplication", {}, 2),
    ("the product of one-digit numbers", "multiplication", {}, 1),
    ("a policy that sorts lists of 5 digits with >= 90% held-out exact match", "sort", {}, 5),
    ("a policy that sorts 3-digit sequences with >= 85% held-out exact match, on 2 CPU cores", "sort", {}, 3),
    ("sort digit strings of length 7 in ascending order", "sort", {}, 7),
    ("a policy that reverses 4-digit strings with >= 90% held-out exact match", "reverse", {}, 4),
    ("write sequences of eight digits backwards", "reverse", {}, 8),
    ("a policy that solves the countdown game with 3 numbers", "countdown", {}, 3),
    ("count down: reach the target from five given numbers", "countdown", {}, 5),
    ("countdown", "countdown", {}, None),
    ("a policy that writes Python functions of 2 stages", "code", {}, 2),
    ("a policy that writes 4-stage list pipelines in python", "code", {}, 4),
    ("writes python functions that sort lists", "code", {}, None),   # two names of code beat one of sort
    ("a policy that solves reasoning-gym basic arithmetic at level 2", "rg", {"dataset": "basic_arithmetic"}, 2),
    ("train on basic_arithmetic", "rg", {"dataset": "basic_arithmetic"}, None),
    ("reasoning gym spell backward puzzles", "rg", {"dataset": "spell_backward"}, None),
    ("the reasoning-gym countdown dataset", "rg", {"dataset": "countdown"}, None),   # not the built-in one
]


@pytest.mark.parametrize("sentence,name,options,difficulty", SENTENCES, ids=[s[0][:40] for s in SENTENCES])
def test_a_sentence_names_its_task_and_difficulty(sentence, name, options, difficulty):
    u = understand(sentence, None)
    assert isinstance(u, Understood), u
    assert (u.spec.name, u.spec.options, u.spec.difficulty, u.source) == (name, options, difficulty, "words")
    assert u.spec.said, "what in the sentence named the task is recorded"


def test_every_family_is_named_by_some_sentence_of_the_table():
    assert {name for _, name, _, _ in SENTENCES} == set(TASKS), "a family no sentence reaches"


@pytest.mark.parametrize("sentence,needles", [
    ("a policy that juggles", ["names no task", "addition ('add', 'sum')", "write run.task"]),
    ("asdf qwer zxcv", ["names no task"]),
    ("", ["names no task"]),
    ("a policy for 3-digit numbers", ["names no task", "suggest addition or multiplication"]),
    ("a policy that adds and sorts numbers", ["names addition ('adds') and sort ('sorts') equally",
                                              "{name: addition} or {name: sort}"]),
    ("reverse and sort lists", ["equally"]),
    ("a reasoning gym policy", ["reasoning-gym but no dataset", "options: {dataset: ...}"]),
    ("adds 20-digit numbers", ["addition at 20 digits", "1..12", "run.harness.curriculum.start"]),
    ("sorts lists of 1 digit", ["sort at length 1", "2..12"]),
    ("countdown with 9 numbers", ["countdown at 9 numbers", "2..6"]),
])
def test_a_sentence_that_cannot_be_understood_is_refused_in_one_line(sentence, needles):
    r = understand(sentence, None)
    assert isinstance(r, Refused), r
    assert "\n" not in r.line and r.line.startswith("invalid goal: goal=")
    for n in needles:
        assert n in r.line, (n, r.line)


@pytest.mark.parametrize("sentence,run_task,ok", [
    ("adds 3-digit numbers", {"name": "addition"}, True),
    ("a policy that juggles", {"name": "addition"}, True),            # names nothing: run.task alone says
    ("sorts lists of 5 digits", {"name": "addition"}, False),
    ("sorts lists of 5 digits", {"name": "reverse"}, False),
    ("adds and sorts numbers", {"name": "sort"}, True),               # the tie is settled by run.task
    ("adds and sorts numbers", {"name": "countdown"}, False),
    ("reasoning-gym basic arithmetic", {"name": "rg", "options": {"dataset": "basic_arithmetic"}}, True),
    ("reasoning-gym basic arithmetic", {"name": "rg", "options": {"dataset": "chain_sum"}}, False),
    ("reasoning-gym puzzles", {"name": "rg", "options": {"dataset": "chain_sum"}}, True),
])
def test_run_task_and_the_sentence_must_agree(sentence, run_task, ok):
    u = understand(sentence, run_task)
    assert isinstance(u, Understood) == ok, u
    if ok:
        assert u.source == "run" and u.spec.name == run_task["name"]
    else:
        assert "but run.task is" in u.line and "make them agree" in u.line


def test_several_stated_difficulties_are_not_guessed_and_unread_options_are_said():
    u = understand("adds 2-digit and 3-digit numbers", None)
    assert isinstance(u, Understood) and u.spec.difficulty is None
    assert any("several difficulties (2, 3)" in n for n in u.spec.notes)
    u = understand("countdown with 4 numbers up to 50", None)
    assert isinstance(u, Understood) and u.spec.options == {}
    assert any("max_number, max_target not read" in n for n in u.spec.notes)


def test_percentages_and_cpu_counts_are_not_difficulties():
    u = understand("a policy that adds numbers with >= 95% exact match on 2 CPU cores within 20 CPU minutes", None)
    assert isinstance(u, Understood) and u.spec.difficulty is None


def goal_file(tmp_path: pathlib.Path, sentence: str, **extra) -> pathlib.Path:
    p = tmp_path / "goal.yaml"
    p.write_text(yaml.safe_dump({"goal": sentence, "target": TARGET, "budget": {"worker_cpu_s": 600}, **extra}))
    return p


def test_validate_prints_the_task_the_sentence_names(tmp_path):
    res = runner.invoke(app, ["validate", str(goal_file(tmp_path, "a policy that sorts lists of 5 digits with >= 90% "
                                                                  "held-out exact match"))])
    assert res.exit_code == 0, res.output
    first = res.stdout.splitlines()[0]
    assert first == "ok: sort task (length 5), target heldout_acc >= 0.9", res.stdout
    assert "from the words: task=sort, harness.curriculum.start=5" in res.stdout


@pytest.mark.parametrize("sentence,run,needle", [
    ("a policy that juggles", None, "names no task"),
    ("a policy that adds and sorts numbers", None, "equally"),
    ("a policy that sorts lists of 5 digits", {"task": {"name": "addition"}}, "but run.task is addition"),
])
def test_validate_and_run_refuse_in_one_line_with_exit_code_2(tmp_path, monkeypatch, sentence, run, needle):
    monkeypatch.chdir(tmp_path)
    path = goal_file(tmp_path, sentence, **({"run": run} if run else {}))
    for args in (["validate", str(path)], ["run", str(path), "--workspace", str(tmp_path / "ws"), "--jobs", "process"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2, res.output
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: invalid goal: goal=") and needle in lines[0], res.output
    assert not (tmp_path / "ws").exists()


def test_a_goal_built_in_code_records_the_refusal_instead_of_raising(tmp_path):
    """Goal.parse (the bench, the controller's saved copy) refuses nothing about the words; it keeps
    what was understood, and trains RunConfig's default task as before. Goal.load (a goal file) refuses."""
    g = Goal.parse({"goal": "x"})
    assert isinstance(g.understood, Refused) and g.plan() is None
    assert g.run_config("r", "/tmp").task.name == "addition"
    (tmp_path / "g.yaml").write_text(yaml.safe_dump({"goal": "x"}))
    with pytest.raises(ConfigError, match="names no task"):
        Goal.load(tmp_path / "g.yaml")


def test_the_task_from_the_words_is_what_trains():
    g = Goal.parse({"goal": "a policy that reverses strings of length 6", "target": TARGET})
    cfg = g.run_config("r", "/tmp")
    assert cfg.task.name == "reverse" and cfg.harness.curriculum.start == 6
    assert g.run == {}, "the goal's own run is never rewritten"


# ---- the LLM path: the real litellm client against the scripted server ---------------------------
KEY_ENV = "SWARMLAB_TEST_LLM_KEY"


@pytest.fixture
def lead(monkeypatch):
    from agents.domain import LLMSettings
    from agents.llm import LLMPolicy

    monkeypatch.setenv(KEY_ENV, "sk-test-123")
    srv = fake.FakeLLMServer()
    policy = LLMPolicy(LLMSettings(model="openai/fake", api_base=srv.url, api_key_env=KEY_ENV, timeout_s=5.0,
                                   max_retries=2))
    yield srv, policy
    srv.close()


def test_the_llm_reads_the_sentence_through_one_validated_tool_call(lead):
    from swarm.words import TASK_TOOL, understand_by_llm

    srv, policy = lead
    srv.push(fake.tool_call(TASK_TOOL, {"task": "sort", "difficulty": 5, "reason": "orders five digits"}))
    u = understand_by_llm("put five digits in order", None, policy.ask)
    assert isinstance(u, Understood) and u.source == "words"
    assert (u.spec.name, u.spec.options, u.spec.difficulty) == ("sort", {}, 5) and u.spec.said[0].startswith("llm")
    sent = srv.requests[-1]
    assert "put five digits in order" in json.dumps(sent["messages"])
    assert sent["tools"][0]["function"]["name"] == TASK_TOOL


@pytest.mark.parametrize("bad,error", [
    ({"task": "juggling"}, "not a family"),
    ({"task": "rg", "dataset": "no_such_dataset"}, "not a reasoning-gym dataset"),
    ({"task": "addition", "difficulty": 40}, "addition takes 1..12"),
    ({"task": "sort", "dataset": "basic_arithmetic"}, "only for it"),
    ("{not json", "not valid JSON"),
])
def test_a_reply_outside_the_registry_goes_back_to_the_model(lead, bad, error):
    from swarm.words import TASK_TOOL, understand_by_llm

    srv, policy = lead

    srv.push(fake.tool_call(TASK_TOOL, bad), fake.tool_call(TASK_TOOL, {"task": "addition", "difficulty": 3}))
    u = understand_by_llm("add three-digit numbers", None, policy.ask)
    assert isinstance(u, Understood) and u.spec.name == "addition" and u.spec.difficulty == 3
    assert len(srv.requests) == 2 and error in json.dumps(srv.requests[-1]["messages"])


def test_no_answer_from_the_llm_leaves_the_matcher_to_read_the_sentence(lead):
    from swarm.words import understand_by_llm

    srv, policy = lead
    srv.push(fake.http_error(500))
    u = understand_by_llm("a policy that reverses 6-digit strings", None, policy.ask)
    assert isinstance(u, Understood) and (u.spec.name, u.spec.difficulty) == ("reverse", 6)
    assert any("the LLM gave no task spec" in n for n in u.spec.notes)


def test_the_llm_reading_no_task_or_another_than_run_task_is_refused(lead):
    from swarm.words import TASK_TOOL, understand_by_llm

    srv, policy = lead

    srv.push(fake.tool_call(TASK_TOOL, {"task": "none", "reason": "juggling is not a task"}),
             fake.tool_call(TASK_TOOL, {"task": "sort"}))
    out = understand_by_llm("a policy that juggles", None, policy.ask)
    assert isinstance(out, Refused) and "the LLM read no task" in out.line and "\n" not in out.line
    out = understand_by_llm("put digits in order", {"name": "addition"}, policy.ask)
    assert isinstance(out, Refused) and "but run.task is addition" in out.line


def test_a_goal_changed_after_parsing_is_understood_afresh():
    g = Goal.parse({"goal": "a policy that adds 2-digit numbers", "target": TARGET})
    assert g.run_config("r", "/tmp").task.name == "addition"
    g.goal = "a policy that sorts lists of 4 digits"
    cfg = g.run_config("r", "/tmp")
    assert (cfg.task.name, cfg.harness.curriculum.start) == ("sort", 4)
