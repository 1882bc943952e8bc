"""The benchmark suite's scenario generator (swarm/bench/scenarios.py): deterministic seeds, goals
built from the trainer's generic fault mechanisms, fault origins (generator v5), families that fit
their model, suite folders.
"""
from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from swarm.bench.scenarios import FAMILIES, MECHANISMS, generate, hardest, load_suite, parse_seeds, scenario_from_data, write_suite
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
    for s in range(120):
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
    from swarm.bench.scenarios import MECHANISM_ORIGINS, ORIGINS
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
    assert task.min_difficulty <= start <= fam.max_difficulty <= task.max_difficulty
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
