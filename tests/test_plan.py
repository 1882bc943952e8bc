"""The plan (swarm/plan.py): every run field a goal leaves out is chosen from the task's own facts
or defaults, with its source; a field the goal writes is never changed. The lengths it chooses are
checked against generated examples at the task's highest difficulty, tokenised as the built-in
model does. No training."""
from __future__ import annotations

import json
import pathlib

import pytest
import yaml
from typer.testing import CliRunner

from swarm.cli import app
from swarm.goal import Goal
from swarm.plan import Choice, Plan, Source
from trainer.config import RunConfig, get_dotted
from trainer.tasks import TASKS, Split, make_task
from trainer.tokenizer import DEFAULT_CHARSET, CharTokenizer

MINIMAL = pathlib.Path(__file__).resolve().parents[1] / "examples" / "goals" / "minimal"
TARGET = {"metric": "heldout_acc", "op": ">=", "threshold": 0.9}
runner = CliRunner()

# one sentence per family; indices past the plan's own probes (it measures examples 0..63 where a
# family's lengths are not derived), so a measured bound is tested on examples it never saw
FAMILIES = {
    "addition": ("a policy that adds 3-digit numbers", 200),
    "multiplication": ("a policy that multiplies 2-digit numbers", 200),
    "sort": ("a policy that sorts lists of 5 digits", 200),
    "reverse": ("a policy that reverses 4-digit strings", 200),
    "countdown": ("a policy that solves the countdown game with 3 numbers", 300),
    "code": ("a policy that writes Python functions of 2 stages", 60),
    "rg": ("a policy that solves reasoning-gym basic arithmetic", 40),
}


def goal(sentence: str, run: dict | None = None) -> Goal:
    return Goal.parse({"goal": sentence, "target": TARGET, **({"run": run} if run is not None else {})})


def test_the_table_covers_every_family():
    assert set(FAMILIES) == set(TASKS)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_chosen_lengths_hold_every_answer_and_prompt_at_the_highest_difficulty(family):
    sentence, n = FAMILIES[family]
    g = goal(sentence)
    cfg = g.run_config("r", "/tmp")
    assert cfg.task.name == family
    task = make_task(cfg.task.name, **cfg.task.options)
    tok = CharTokenizer(cfg.model.charset or DEFAULT_CHARSET)
    h = cfg.harness
    chars = set(cfg.model.charset or DEFAULT_CHARSET)
    longest = (0, 0)
    for d in sorted({task.max_difficulty, (task.min_difficulty + task.max_difficulty) // 2}):
        for split in Split:
            for i in range(100, 100 + n // 2):
                try:
                    ex = task.example(split, i, d)
                except ValueError:
                    break   # a split with no question at this difficulty
                prompt = h.render(ex.question)
                completion = h.answer.render(ex.solution or ex.answer)
                new = len(tok.encode(completion)) + (0 if h.answer.stop else 1)   # + <eos> when no stop
                seq = 1 + len(tok.encode(prompt)) + new                           # <bos> + prompt + completion
                longest = max(longest, (new, seq))
                assert new <= h.sampling.max_new_tokens, (d, ex.answer, new, h.sampling.max_new_tokens)
                assert seq <= cfg.model.max_seq_len, (d, ex.question, seq, cfg.model.max_seq_len)
                assert len(prompt) <= h.filters.max_prompt_chars, (d, len(prompt))
                if cfg.model.charset:
                    assert set(prompt + completion) <= chars, set(prompt + completion) - chars
                assert h.answer.extract(completion) == (ex.solution or ex.answer).strip(), "the format reads its answer back"
    assert longest[0] > 0, "no example generated"
    # and not wildly more: within the bound's own margin (x1.5 + 8 where measured, exact where derived)
    assert h.sampling.max_new_tokens <= longest[0] * 1.6 + 12, (h.sampling.max_new_tokens, longest)


def test_derived_lengths_are_exact_bounds_reached_by_some_example():
    """Where a family derives its lengths (arithmetic, sequences, countdown), the bound is tight
    enough that examples reach it (a carry for addition, every number two digits for countdown)."""
    for name, d in (("addition", 3), ("multiplication", 3), ("sort", 5), ("reverse", 5)):
        task = make_task(name)
        q, a = task.max_lengths(d)
        seen = [task.example(Split.TRAIN, i, d) for i in range(500)]
        assert max(len(e.question) for e in seen) == q and max(len(e.answer) for e in seen) == a, name
    cd = make_task("countdown")
    q, a = cd.max_lengths(4)
    seen = [cd.example(Split.TRAIN, i, 4) for i in range(3000)]
    assert max(len(e.question) for e in seen) <= q and max(len(e.answer) for e in seen) <= a
    assert max(len(e.answer) for e in seen) >= a - 2, "the countdown bound is far from what is written"


# a value for each planned field, different from what the plan would choose, that validates
WRITTEN = {
    "harness.curriculum.start": 4,
    "harness.sampling.max_new_tokens": 9,
    "model.max_seq_len": 64,
    "model.charset": "0123456789s:=\nrx",
    "harness.answer": {"stop": "\n", "reverse_digits": True},
    "harness.template": "{question}:=",
    "harness.filters.max_prompt_chars": 300,
    "model.d_model": 64,
    "recipe.lr": 0.001,
    "recipe.batch_size": 32,
}


def nested(field: str, value) -> dict:
    out: dict = {}
    node = out
    parts = field.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


@pytest.mark.parametrize("field", sorted(WRITTEN))
def test_a_field_the_goal_writes_is_never_changed_by_the_plan(field):
    run = nested(field, WRITTEN[field])
    g = goal("a policy that sorts lists of 5 digits", run)
    cfg = g.run_config("r", "/tmp").model_dump(mode="json")
    found, value = get_dotted(cfg, field)
    assert found
    if isinstance(WRITTEN[field], dict):
        assert {k: value[k] for k in WRITTEN[field]} == WRITTEN[field]
    else:
        assert value == WRITTEN[field]
    if field != "harness.filters.max_prompt_chars":   # not a field the plan picks for sort
        c = g.plan().get(field)
        assert c.source is Source.USER and c.value == WRITTEN[field]
    assert g.run == run, "the goal's own run is never rewritten"


def test_every_written_field_survives_together():
    run = {k: v for k, v in WRITTEN.items()}
    merged: dict = {}
    for f, v in run.items():
        n = nested(f, v)
        for top, sub in n.items():
            merged.setdefault(top, {})
            _deep_update(merged[top], sub)
    g = goal("a policy that sorts lists of 5 digits", merged)
    cfg = g.run_config("r", "/tmp").model_dump(mode="json")
    for f, v in WRITTEN.items():
        got = get_dotted(cfg, f)[1]
        assert (got if not isinstance(v, dict) else {k: got[k] for k in v}) == v, f
    assert cfg["task"]["name"] == "sort"
    assert {c.source for c in g.plan().choices} <= {Source.USER, Source.WORDS, Source.DEFAULT}


def _deep_update(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict):
            _deep_update(dst.setdefault(k, {}), v)
        else:
            dst[k] = v


def test_a_goal_that_writes_its_task_runs_as_written():
    """Today's contract for complete goals: run.task written -> the run as written, RunConfig's
    defaults for the rest; the plan records that and nothing else."""
    run = {"task": {"name": "sort"}, "model": {"d_model": 64, "n_heads": 4}, "harness": {"curriculum": {"start": 4}}}
    g = goal("a policy that sorts lists of 4 digits", run)
    assert g.run_config("r", "/tmp") == RunConfig.parse({**run, "name": "r", "out_dir": "/tmp"})
    p = g.plan()
    assert not p.applied and p.task_from == "run"
    assert {c.source for c in p.choices} == {Source.USER, Source.DEFAULT}


def test_the_sources_of_a_minimal_goal():
    p = goal("a policy that sorts lists of 5 digits").plan()
    assert p.applied
    src = {c.field: c.source for c in p.choices}
    assert src["task"] is Source.WORDS and src["harness.curriculum.start"] is Source.WORDS
    assert src["harness.sampling.max_new_tokens"] is Source.TASK and src["model.max_seq_len"] is Source.TASK
    assert src["model.charset"] is Source.TASK and src["recipe.lr"] is Source.DEFAULT
    assert p.get("harness.sampling.max_new_tokens").evidence["difficulty"] == 12
    free = goal("a policy that solves reasoning-gym basic arithmetic").plan()
    assert free.get("harness.curriculum.start").source is Source.TASK   # the sentence states no level
    assert free.get("harness.answer").source is Source.TASK and free.get("model.charset").source is Source.DEFAULT


def test_arithmetic_answers_are_planned_lowest_digit_first_unless_the_goal_writes_the_answer():
    p = goal("a policy that adds 3-digit numbers")
    c = p.plan().get("harness.answer")
    assert c.source is Source.TASK and c.value["reverse_digits"] is True and "carry" in c.why
    cfg = p.run_config("r", "/tmp")
    assert cfg.harness.answer.reverse_digits and cfg.harness.answer.render("123") == "321\n"
    # what the task's verifier reads back is the answer in its usual order
    assert cfg.harness.answer.extract(cfg.harness.answer.render("123")) == "123"
    written = goal("a policy that adds 3-digit numbers", {"harness": {"answer": {"reverse_digits": False}}})
    assert written.plan().get("harness.answer").source is Source.USER
    assert not written.run_config("r", "/tmp").harness.answer.reverse_digits
    # a family whose answer is not a number worked out digit by digit keeps the one-word default
    assert goal("a policy that sorts lists of 5 digits").plan().get("harness.answer").source is Source.DEFAULT


def test_the_plan_is_json_and_reads_back_equal():
    for sentence in ("a policy that sorts lists of 5 digits", "countdown with 4 numbers"):
        p = goal(sentence, {"recipe": {"lr": 0.01}}).plan()
        text = json.dumps(p.to_json())
        assert Plan.from_json(json.loads(text)) == p


def test_a_later_source_replaces_a_chosen_field_but_never_a_written_one():
    p = goal("a policy that sorts lists of 5 digits", {"recipe": {"lr": 0.01}}).plan()
    piloted = p.choose(Choice("model.d_model", 96, Source.PILOT, "won the pilot", {"table": [[64, 0.4], [96, 0.7]]}))
    assert piloted.get("model.d_model").value == 96 and piloted.run({})["model"]["d_model"] == 96
    with pytest.raises(ValueError, match="written in the goal"):
        p.choose(Choice("recipe.lr", 0.003, Source.MEMORY, "a similar run's lr"))
    assert p.get("recipe.lr").value == 0.01


@pytest.mark.parametrize("path", sorted(MINIMAL.glob("*.yaml")), ids=lambda p: p.stem)
def test_each_minimal_goal_validates_with_its_task_from_the_words(path):
    data = yaml.safe_load(path.read_text())
    assert set(data) <= {"goal", "target", "budget"}, "a minimal goal is a sentence, a target and a budget"
    res = runner.invoke(app, ["validate", str(path)])
    assert res.exit_code == 0, res.output
    assert "plan (the task comes from the words" in res.stdout and "from the task:" in res.stdout


def test_there_is_a_minimal_goal_for_every_family():
    names = {Goal.load(p).run_config("r", "/tmp").task.name for p in MINIMAL.glob("*.yaml")}
    assert names == set(TASKS)
