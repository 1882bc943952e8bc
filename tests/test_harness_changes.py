"""harness/changes.py: a harness change validated as the live trainer validates it (against the
run config's own dotted-path validation, the path the trainer took before it called the harness,
and against a real trainer's `set_fields`), the no-op check, what each field touches; the harness
faults; and the content hashes of existing specs, which must never move.

    .venv/bin/python -m pytest tests/test_harness_changes.py -q
"""
from __future__ import annotations

import pathlib

import pytest
import yaml

from harness import changes
from harness.faults import HARNESS_FAULTS
from harness.spec import HarnessSpec
from trainer.config import ConfigError, RunConfig, set_dotted
from trainer.control import Command
from trainer.tasks.base import make_task

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _live_refusal(spec: HarnessSpec, change: dict, task) -> str | None:
    """The reference: the run config's dotted-path validation key by key, then the task's difficulty
    check (what `Trainer.apply_overrides` + `set_fields` did before the harness owned it, and what
    swarm/backtest.py's check_change runs)."""
    try:
        cfg = RunConfig.parse({"harness": spec.model_dump(mode="json")})
        for k, v in change.items():
            cfg = set_dotted(cfg, k, v)
        task.check_difficulty(cfg.harness.curriculum.start)
    except (ConfigError, ValueError, TypeError) as e:
        return str(e).replace("invalid config: ", "")
    return None


BAND = HarnessSpec(curriculum={"pass_rate_min": 0.3})
CHANGES = [
    (HarnessSpec(), {"harness.sampling.temperature": 0.7}),
    (HarnessSpec(), {"harness.sampling.temperature": 9}),
    (HarnessSpec(), {"harness.sampling.temperature": "hot"}),
    (HarnessSpec(), {"harness.sampling.max_new_tokens": 0, "harness.sampling.temperature": 0.5}),
    (HarnessSpec(), {"harness.template": "no placeholder"}),
    (HarnessSpec(), {"harness.template": "Q: {question}\nA:"}),
    (HarnessSpec(), {"harness.template.x": 1}),
    (HarnessSpec(), {"harness.nope": 1}),
    (HarnessSpec(), {"harness.curriculum.end.x": 1}),
    (HarnessSpec(), {"harness.curriculum.end": None}),
    (HarnessSpec(), {"harness.curriculum.start": 99}),
    (HarnessSpec(), {"harness.curriculum.start": 2, "harness.curriculum.end": 6, "harness.curriculum.ramp_steps": 50}),
    (HarnessSpec(), {"harness.curriculum.pass_rate_min": 0.9, "harness.curriculum.pass_rate_max": 0.5}),
    (BAND, {"harness.curriculum.pass_rate_max": 0.2, "harness.curriculum.pass_rate_min": 0.1}),   # invalid on the way
    (BAND, {"harness.curriculum.pass_rate_min": 0.1, "harness.curriculum.pass_rate_max": 0.2}),
    (HarnessSpec(), {"harness.answer.regex": "(a)(b)"}),
    (HarnessSpec(), {"harness.answer": {"stop": "</a>", "regex": "<a>(.*?)</a>"}}),
    (HarnessSpec(), {"harness.reward.verifier": "digits_any_order"}),
    (HarnessSpec(), {"harness.reward.verifier": "lenient"}),
    (HarnessSpec(), {"harness.reward.format_bonus": float("nan")}),
    (HarnessSpec(), {"harness.sampling": {"temperature": 0.5}}),
    (HarnessSpec(), {"harness.filters.dedupe": True, "harness.filters.max_prompt_chars": 0}),
]


@pytest.mark.parametrize("spec, change", CHANGES, ids=[str(c) for _, c in CHANGES])
def test_check_change_says_what_the_trainer_says(spec, change):
    task = make_task("addition")
    want = _live_refusal(spec, change, task)
    assert changes.check_change(spec, change, task.check_difficulty) == want
    assert changes.check_change(spec.model_dump(mode="json"), change, task.check_difficulty) == want   # a dict too
    if want is None:
        cfg = set_dotted(RunConfig.parse({"harness": spec.model_dump(mode="json")}), *next(iter(change.items())))
        for k, v in list(change.items())[1:]:
            cfg = set_dotted(cfg, k, v)
        assert changes.apply_changes(spec, change) == cfg.harness
    else:
        assert want   # a reason, never an empty string
    refused = [c for _, c in CHANGES if _live_refusal(HarnessSpec(), c, task)]
    assert len(refused) >= 10   # the table covers refusals of every kind


def test_a_non_harness_key_is_refused_by_name():
    assert "'recipe.lr'" in changes.check_change(HarnessSpec(), {"recipe.lr": 0.1})
    with pytest.raises(changes.HarnessChangeError):
        changes.apply_changes(HarnessSpec(), {"recipe.lr": 0.1})


def test_a_live_trainer_accepts_and_refuses_as_check_change(make_cfg):
    from trainer.loop import Trainer

    tr = Trainer(RunConfig.parse(make_cfg()))
    accepted = []
    try:
        for i, change in enumerate(({"harness.sampling.temperature": 0.5, "harness.template": "Q {question}="},
                                    {"harness.sampling.temperature": 9}, {"harness.curriculum.start": 99},
                                    {"harness.template.x": 1})):
            before = tr.harness
            why = changes.check_change(before, change, tr.task.check_difficulty)
            cmd = Command(id=str(i), cmd="set_fields", fields=change)
            try:
                got = tr.apply_command(cmd)
            except ValueError as e:
                assert why is not None and str(e).replace("invalid config: ", "") == why
                assert tr.harness == before
                accepted.append(False)
            else:
                assert why is None
                accepted.append(True)
                assert got["harness_version"] == tr.harness.version == changes.apply_changes(before, change).version
    finally:
        tr.close()
    assert accepted == [True, False, False, False]


def test_noop_change_compares_with_the_live_version():
    spec = HarnessSpec(template="{question:.3}=")
    restore = {"harness.template": "{question}="}
    live_broken, live_restored = spec.version, HarnessSpec().version
    assert changes.noop_change(spec, restore, live_broken) is None                       # the live run is still broken
    why = changes.noop_change(spec, restore, live_restored)                              # a rollback restored it already
    assert why and live_restored in why and "harness version" in why
    assert changes.noop_change(spec, restore, None) is None                              # live version unknown
    assert changes.noop_change(spec, {}, live_restored) is None
    assert changes.noop_change(spec, {"harness.sampling.temperature": 99}, live_restored) is None   # cannot make it
    # what the change makes counts, not the path: valid at the end, invalid on the way
    band = HarnessSpec(curriculum={"pass_rate_min": 0.3})
    to = {"harness.curriculum.pass_rate_max": 0.2, "harness.curriculum.pass_rate_min": 0.1}
    made = HarnessSpec(curriculum={"pass_rate_min": 0.1, "pass_rate_max": 0.2}).version
    assert changes.noop_change(band, to, made) is not None


@pytest.mark.parametrize("key, objective, data, same_targets", [
    ("harness.reward.verifier", True, False, False),
    ("harness.reward.format_bonus", True, False, False),
    ("harness.curriculum.start", False, True, False),
    ("harness.filters.dedupe", False, True, False),
    ("harness.template", False, False, True),
    ("harness.sampling.temperature", False, False, True),
    ("harness.answer.stop", False, False, False),
])
def test_what_a_field_touches(key, objective, data, same_targets):
    assert (changes.changes_objective(key), changes.changes_data(key), changes.keeps_sft_targets(key)) == \
        (objective, data, same_targets)


def test_task_scoring_is_the_reward_defaults():
    assert changes.TASK_SCORING == {"harness.reward.kind": "exact", "harness.reward.format_bonus": 0.0,
                                    "harness.reward.verifier": "task"}


@pytest.mark.parametrize("name", sorted(HARNESS_FAULTS))
def test_every_harness_fault_applies_and_is_a_perturbation_shortcut(name):
    from trainer.perturb import SHORTCUTS

    fault = HARNESS_FAULTS[name]
    broken = changes.apply_changes(HarnessSpec(), fault)
    assert broken.version != HarnessSpec().version
    assert all(k.startswith("harness.") for k in fault)
    assert SHORTCUTS[name] == ("override", {"set": fault})


# The content hashes of specs that exist today (the default, and the examples' harnesses): moving
# behaviour out of harness/spec.py must not move them, or every recorded run's version changes.
VERSIONS = {
    "default": "fc8657ab9ddd",
    "examples/addition_sft.yaml": "40be27abe4d5",
    "examples/goals/reward_hack.yaml": "e88f4fd192f1",
}


def test_versions_of_existing_specs_are_unchanged():
    assert HarnessSpec().version == VERSIONS["default"]
    for path in ("examples/addition_sft.yaml", "examples/goals/reward_hack.yaml"):
        data = yaml.safe_load((ROOT / path).read_text())
        data = data.get("run", data)
        assert HarnessSpec.model_validate(data["harness"]).version == VERSIONS[path], path
    every_field = HarnessSpec(template="Q: {question}\nA:", answer={"regex": r"<a>(.*?)</a>", "stop": "</a>", "prefix": "<a>"},
                              reward={"kind": "partial", "format_bonus": 0.1, "verifier": "digits_any_order"},
                              curriculum={"start": 2, "end": 5, "ramp_steps": 100, "pass_rate_min": 0.1, "pass_rate_max": 0.9},
                              filters={"dedupe": True, "max_prompt_chars": 64},
                              sampling={"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 32})
    assert every_field.version == "f1e65c098e2a"
    # a field added since enters the hash only when set
    assert HarnessSpec(filters={"check_labels": True}).version != HarnessSpec().version == VERSIONS["default"]
