"""The benchmark suite's scenario generator (swarmbench/scenarios.py): deterministic seeds, goals
built from the trainer's generic fault mechanisms, fault origins (generator v5), families that fit
their model, suite folders.
"""
from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from swarmbench.scenarios import FAMILIES, MECHANISMS, generate, hardest, load_suite, parse_seeds, scenario_from_data, write_suite
from trainer.config import ConfigError, Perturbation
from trainer.perturb import expand

ROOT = pathlib.Path(__file__).resolve().parents[1]


# ---- generator ----------------------------------------------------------------------------------

def test_generator_is_deterministic_and_seeds_differ():
    assert generate(7) == generate(7)
    assert generate(7) != generate(8)
    names = {generate(s)["scenario"]["name"] for s in range(30)}
    assert len(names) > 20


def test_generated_scenarios_are_valid_goals_from_generic_mechanisms():
    seen_mech, seen_counts = set(), set()
    for s in range(300):
        data = generate(s)
        sc = scenario_from_data(data, f"gen-{s}")           # validated as a goal, faults checked as the trainer will
        seen_counts.add(len(sc.faults))
        seen_mech |= {f["name"] for f in sc.faults}
        for p in data.get("perturbations", []):
            assert "shortcut" not in p                       # generic mechanisms, never the named shortcuts
            expand(Perturbation.model_validate(p))
    assert seen_counts == {0, 1, 2}
    assert seen_mech == {m[0] for m in MECHANISMS}


def test_every_origin_is_drawn_and_a_config_fault_is_the_goals_own_config():
    """Generator v5: each scenario's faults share one origin. A `config` fault leaves no
    perturbation (nothing changes at a step, nothing to go back to): its values are the run config
    the goal starts from, and the private header keeps the family's run for the oracle. The origin
    is never in the goal's own fields."""
    from swarmbench.scenarios import MECHANISM_ORIGINS, ORIGINS
    from trainer.config import get_dotted

    seen = set()
    for s in range(200):
        data = generate(s)
        sc = scenario_from_data(data, f"gen-{s}")
        origin = data["scenario"]["origin"]
        seen.add(origin)
        assert "origin" not in json.dumps({k: v for k, v in data.items() if k != "scenario"})
        assert all(f["origin"] == origin and origin in MECHANISM_ORIGINS[f["name"]] for f in sc.faults)
        if origin != "config":
            assert sc.healthy_goal()["run"] == data["run"]
            continue
        assert not data.get("perturbations") and sc.faults
        fam_run = FAMILIES[data["scenario"]["family"]].run
        assert sc.healthy_goal()["run"] == fam_run and data["run"] != fam_run
        for f in sc.faults:
            field = f["what"].split(" ")[0]
            if field.startswith(("recipe.", "harness.")) and f["name"] != "curriculum":
                assert get_dotted(data, "run." + field)[1] != get_dotted({"run": fam_run}, "run." + field)[1], f
        if any(f["name"] == "curriculum" for f in sc.faults):   # harder training, the family's held-out difficulty
            cur = data["run"]["harness"]["curriculum"]
            assert cur["start"] > fam_run["harness"]["curriculum"]["start"] == cur["end"]
    assert seen == set(ORIGINS) | {"none"}


def test_each_origin_draws_each_of_its_mechanisms_and_only_its_own_kinds():
    """Data faults live in the data pipeline (no override: no harness or recipe version moves), the
    machine's in the process; every mechanism of an origin is drawn in it, on every family it fits."""
    from swarmbench.scenarios import MECHANISM_ORIGINS
    from trainer.perturb import DATA_KINDS

    kinds = {"data": set(DATA_KINDS), "infra": {"kill", "stall", "corrupt_checkpoint", "slow_worker", "oom"},
             "drift": {"override"}}
    drawn: dict[str, set[str]] = {o: set() for o in kinds}
    for s in range(400):
        data = generate(s)
        origin = data["scenario"]["origin"]
        if origin in kinds:
            assert {p["kind"] for p in data["perturbations"]} <= kinds[origin], (s, data["perturbations"])
            drawn[origin] |= {f["name"] for f in data["scenario"]["faults"]}
    for origin, names in drawn.items():
        assert names == {m for m, os in MECHANISM_ORIGINS.items() if origin in os}, (origin, names)
    assert set(MECHANISM_ORIGINS) == {m[0] for m in MECHANISMS}


def test_the_swarm_is_never_told_the_origin_or_the_fault():
    """What a method gets is the goal (the header stays with the bench); what the swarm's operators
    read of it (`Goal.public`) holds no perturbation, no fault name and no origin."""
    import re

    from swarm.goal import Goal
    from swarmbench.scenarios import MECHANISM_ORIGINS, ORIGINS
    from trainer.config import RunConfig

    # the fault names that are no goal field's name (template, curriculum, verifier ... are fields a goal sets)
    fields: set[str] = set()

    def collect(node):
        if isinstance(node, dict):
            fields.update(node.get("properties") or {})
            for v in node.values():
                collect(v)
        elif isinstance(node, list):
            for v in node:
                collect(v)

    collect([Goal.model_json_schema(), RunConfig.model_json_schema()])
    names = sorted(set(MECHANISM_ORIGINS) - fields) + sorted(ORIGINS[1:])
    assert {"data_format", "data_shift", "duplicates", "slow_worker", "oom", "label_noise"} <= set(names)
    words = re.compile(r"\b(" + "|".join(names) + r"|origin|perturb\w*)\b")
    for s in range(200):
        sc = scenario_from_data(generate(s), f"gen-{s}")
        assert "scenario" not in sc.goal and "origin" not in json.dumps(sc.goal)
        outside = json.dumps({k: v for k, v in sc.goal.items() if k != "perturbations"})
        assert not any(f["what"] in outside for f in sc.faults), s
        public = json.dumps(Goal.parse(sc.goal).public())
        assert words.search(public) is None, (s, words.search(public))
        for p in sc.goal.get("perturbations", []):   # a fault's own values appear nowhere the operators read
            for k in ("style", "levels", "pool", "max_batch_size"):
                assert k not in p or f'"{k}"' not in public


def test_a_data_fault_fits_the_model_in_the_format_it_writes():
    """The examples a data-origin scenario trains on (drawn by the trainer's own data pipeline, with
    its faults in force) fit the family's model: the fault is what it names, not a crash at the
    first long example."""
    from harness.spec import HarnessSpec
    from trainer.config import Perturbation
    from trainer.perturb import draw_example
    from trainer.tasks import make_task

    tasks: dict[str, object] = {}
    checked = 0
    for s in range(300):
        data = generate(s)
        if data["scenario"]["origin"] != "data":
            continue
        run = data["run"]
        task = tasks.setdefault(run["task"]["name"], make_task(run["task"]["name"], **run["task"].get("options", {})))
        harness = HarnessSpec.model_validate(run["harness"])
        faults = [expand(Perturbation.model_validate(p)) for p in data["perturbations"]]
        exs = [draw_example(task, i, run["harness"]["curriculum"]["start"], faults) for i in range(300)]
        longest = max(2 + len(harness.render(e.question)) + len(harness.answer.render(e.solution or e.answer)) for e in exs)
        assert longest <= run["model"]["max_seq_len"], (data["scenario"]["name"], longest)
        checked += 1
    assert checked >= 40


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_fits_its_model_up_to_the_hardest_difficulty_a_fault_can_set(name):
    """A curriculum fault may set any difficulty up to the family's max: its prompts and SFT targets
    must still fit the model (else the fault would be a crash at the first long example, not the
    fault the scenario names), and its learnable base difficulty must be one the task has."""
    from harness.spec import HarnessSpec
    from trainer.tasks import make_task

    fam = FAMILIES[name]
    run = fam.run
    task = make_task(run["task"]["name"], **run["task"].get("options", {}))
    harness = HarnessSpec.model_validate(run["harness"])
    start = run["harness"]["curriculum"]["start"]
    assert task.min_difficulty == fam.min_difficulty <= start <= fam.max_difficulty <= task.max_difficulty
    for d in (start, hardest(fam)):
        exs = [task.example("train", index=i, difficulty=d) for i in range(2000)]
        # characters of the prompt and the SFT target, plus <bos> and <eos> (a sample of 2000: the
        # families whose expressions vary in length, countdown and reasoning-gym, have room beyond it)
        longest = max(2 + len(fam.run["harness"]["template"].format(question=e.question))
                      + len(harness.answer.render(e.solution or e.answer)) for e in exs)
        assert longest <= run["model"]["max_seq_len"], (name, d, longest)
        if d == start:
            assert max(len(e.question) for e in exs) >= fam.question_len


def test_suite_files_round_trip_and_plain_goal_files_load(tmp_path):
    paths = write_suite(tmp_path / "s", [3, 4])
    suite = load_suite(tmp_path / "s")
    assert [s.name for s in suite] == sorted(generate(x)["scenario"]["name"] for x in (3, 4))
    again = load_suite(tmp_path / "s")
    assert [s.content_hash for s in suite] == [s.content_hash for s in again]
    # a comment does not change the content hash; a field does
    p = paths[0]
    p.write_text("# a comment\n" + p.read_text())
    assert load_suite(tmp_path / "s")[[s.path for s in suite].index(str(p))].content_hash == suite[[s.path for s in suite].index(str(p))].content_hash
    public = load_suite(ROOT / "examples" / "goals")
    assert {"healthy", "lr_too_high"} <= {s.name for s in public}
    assert next(s for s in public if s.name == "healthy").faults == []


def test_bad_suite_input_is_one_clear_error(tmp_path):
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"goal": "x", "run": {"recipe": {"lr": -1}}}))
    with pytest.raises(ConfigError, match=r"bad.yaml.*recipe.lr"):
        load_suite(tmp_path)
    with pytest.raises(ConfigError, match="not a folder"):
        load_suite(tmp_path / "nope")
    with pytest.raises(ConfigError, match="'x3'"):
        parse_seeds(["1", "x3"])
    assert parse_seeds(["0-2", "5"]) == [0, 1, 2, 5]
