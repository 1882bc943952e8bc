"""The pure parts of benchmarks/plan_vs_handwritten.py: how each arm's goal is built from the
minimal goal, the ratio, the per-family rows and the verdict, and that every family's two goal
files exist and validate (`Goal.load`: the words agree with the hand-written run.task)."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("plan_vs_handwritten", ROOT / "benchmarks" / "plan_vs_handwritten.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_arm_goal_takes_sentence_target_budget_from_minimal() -> None:
    minimal = {"goal": "a policy that sorts lists of 5 digits", "target": {"metric": "heldout_acc", "op": ">=", "threshold": 0.9},
               "budget": {"wall_s": 900, "steps": 3000, "worker_cpu_s": 1800}}
    hand = {"goal": "something else", "target": {"metric": "heldout_acc", "op": ">=", "threshold": 0.99},
            "run": {"seed": 7, "task": {"name": "sort"}}, "budget": {"wall_s": 10, "steps": 1, "worker_cpu_s": 1}}
    g = bench.arm_goal(hand, minimal, seed=3, wall_s=2400)
    assert g["goal"] == minimal["goal"] and g["target"] == minimal["target"]
    assert g["budget"] == {"wall_s": 2400.0, "steps": 3000, "worker_cpu_s": 1800}
    assert g["run"] == {"seed": 3, "task": {"name": "sort"}}
    assert hand["run"]["seed"] == 7, "the goal read from disk is not changed"
    assert "memory" not in g
    g = bench.arm_goal(minimal, minimal, seed=0, wall_s=60, library="/tmp/lib", sentence="two digits")
    assert g["goal"] == "two digits" and g["memory"] == {"library": "/tmp/lib"}
    assert g["budget"]["wall_s"] == 900.0, "a cap below the goal's own wall budget does not lower it"
    assert g["run"] == {"seed": 0}


@pytest.mark.parametrize("a, b, want", [(10.0, 5.0, 2.0), (None, 5.0, None), (5.0, None, None), (5.0, 0.0, None)])
def test_ratio(a, b, want) -> None:
    assert bench.ratio(a, b) == want


def _run(row: str, arm: str, cpu: float | None, seed: int = 0) -> dict:
    return {"row": row, "arm": arm, "seed": seed, "reached": cpu is not None, "worker_cpu_s_to_target": cpu}


def test_rows_and_verdict() -> None:
    runs = [_run("sort", "minimal", 30.0), _run("sort", "handwritten", 10.0),
            _run("addition", "minimal", None), _run("addition", "handwritten", 100.0),
            _run("reverse", "minimal", 9.0), _run("reverse", "handwritten", 10.0),
            _run("countdown", "minimal", 5.0),                      # its hand-written arm did not run
            _run("mem:addition", "memory_next", 50.0)]
    rows = bench.family_rows(runs)
    assert [r["family"] for r in rows] == ["addition", "sort", "reverse", "countdown"]
    assert [r["ratio"] for r in rows] == [None, 3.0, 0.9, None]
    v = bench.verdict(rows)
    assert v["pairs"] == 3 and v["ratios"] == 2 and v["minimal_missed"] == ["addition s0"]
    assert v["median_ratio"] == pytest.approx(1.95) and not v["median_ok"] and not v["all_reached"]
    assert v["median_ratio_at_least"] is None, "the addition minimal run's spend is unknown: no bound"
    v = bench.verdict(bench.family_rows([_run("sort", "minimal", 11.0), _run("sort", "handwritten", 10.0)]))
    assert v["all_reached"] and v["median_ok"]


def test_a_run_stopped_short_bounds_its_ratio() -> None:
    stopped = {**_run("addition", "minimal", None), "worker_cpu_s": 400.0}
    rows = bench.family_rows([stopped, _run("addition", "handwritten", 100.0),
                              _run("sort", "minimal", 12.0), _run("sort", "handwritten", 10.0),
                              _run("reverse", "minimal", 90.0), _run("reverse", "handwritten", 10.0)])
    assert rows[0]["ratio"] is None and rows[0]["ratio_at_least"] == 4.0
    v = bench.verdict(rows)
    assert v["median_ratio"] == pytest.approx(5.1) and v["median_ratio_at_least"] == 4.0
    assert not v["median_ok"], "a minimal goal that missed its target fails the median target too"


@pytest.mark.parametrize("family", list(bench.FAMILIES))
def test_goal_files_load(family: str) -> None:
    from swarm.goal import Goal

    minimal_rel, hand_rel, _ = bench.FAMILIES[family]
    minimal = bench.read_goal(minimal_rel)
    for base in (minimal, bench.read_goal(hand_rel)):
        g = Goal.parse(bench.arm_goal(base, minimal, seed=0, wall_s=60))
        assert g.target.threshold == minimal["target"]["threshold"]


@pytest.mark.parametrize("pair", list(bench.MEMORY_PAIRS))
def test_memory_pair_goals_load(pair: str, tmp_path) -> None:
    """Both goals of a pair pass `swarm validate`'s check of the words (Goal.load) and are planned."""
    from swarm.goal import Goal

    for family, sentence in bench.MEMORY_PAIRS[pair]:
        minimal = bench.read_goal(bench.FAMILIES[family][0])
        f = tmp_path / f"{family}.yaml"
        f.write_text(yaml.safe_dump(bench.arm_goal(minimal, minimal, 0, 60, str(tmp_path / "lib"), sentence, threads=1)))
        g = Goal.load(f)
        assert g.plan().applied and g.plan().task.name == family and g.memory.library == str(tmp_path / "lib")


def test_write_md_lists_rows_not_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    row = {**_run("sort", "minimal", 30.0), "capped": False, "steps": 100, "pilot_cpu_s": 20.0, "worker_cpu_s": 30.0}
    bench.write_md({"meta": {"note": "time"}, "runs": [row, {**row, "arm": "handwritten", "worker_cpu_s_to_target": 10.0,
                                                              "worker_cpu_s": 10.0, "pilot_cpu_s": None}]})
    md = (tmp_path / f"{bench.NAME}.md").read_text()
    assert "**3.00×**" in md and "Not run: addition, reverse, countdown, rg, code, memory:addition, memory:sort, memory:reverse. time" in md
