"""A goal is checked against what the trainer can measure and what its settings can hold.

The target's metric comes from the names the trainer's evaluation writes
(`trainer.runlog.HELDOUT_METRICS`, held to `Trainer.evaluate` here); every float setting of a goal
or run config refuses `.inf`/`.nan` naming the field (one rule, `allow_inf_nan=False` on every
settings model, checked over all of them); a config file naming a key twice is refused with the
key and its lines; `fork_from` must name a checkpoint the trainer can load. The CLI side (one
line, exit 2, nothing created) is tests/test_bad_input.py over tests/bad_goals/.
"""
from __future__ import annotations

import math
import typing

import pytest
import torch
from pydantic import BaseModel

from swarm.goal import Goal
from trainer.config import ConfigError, RunConfig, load_yaml
from trainer.runlog import HELDOUT_METRICS, heldout_row

GOAL = {"goal": "add 3-digit numbers", "target": {"metric": "heldout_acc", "op": ">=", "threshold": 0.9},
        "run": {"task": {"name": "addition"}, "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32}}}


def test_the_metrics_a_target_may_name_are_the_ones_the_trainers_evaluation_writes(make_cfg):
    from trainer.loop import Trainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tr = Trainer(RunConfig.parse(make_cfg()))
        ev = tr.evaluate()
        tr.close()
    finally:
        torch.set_num_threads(threads)
    # the rates a goal may target, and beside them the SFT answer loss a backtest reads (not a rate,
    # so not a target: a goal's threshold is checked in [0, 1])
    rates = {k: v for k, v in ev.items() if k in HELDOUT_METRICS}
    assert list(rates) == list(HELDOUT_METRICS), "Trainer.evaluate writes other held-out rates than HELDOUT_METRICS"
    assert set(ev) - set(rates) == {"heldout_loss", "heldout_loss_se"}, ev
    assert all(0.0 <= v <= 1.0 for v in rates.values()), ev
    with pytest.raises(ConfigError):
        Goal.parse({**GOAL, "target": {"metric": "heldout_loss", "op": "<=", "threshold": 0.5}})
    summary = {"pass_rate": 0.5, "malformed_rate": 0.25, "truncation_rate": 0.0, "reward_mean": 0.5}
    assert heldout_row(summary) == {"heldout_acc": 0.5, "heldout_malformed": 0.25, "heldout_truncated": 0.0}
    for metric in HELDOUT_METRICS:
        g = Goal.parse({**GOAL, "target": {"metric": metric, "op": "<=", "threshold": 0.05}})
        assert g.target.metric == metric


def _models(tp: typing.Any) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for a in typing.get_args(tp) for m in _models(a)]


def _holds_float(tp: typing.Any) -> bool:
    return tp is float or any(_holds_float(a) for a in typing.get_args(tp))


def settings_models(root: type[BaseModel]) -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = []
    stack = [root]
    while stack:
        m = stack.pop()
        if m not in seen:
            seen.append(m)
            stack += [s for f in m.model_fields.values() for s in _models(f.annotation)]
    return seen


def float_fields(root: type[BaseModel], prefix: tuple = ()) -> list[tuple]:
    """Paths of every float field below `root`; a list of models is entered at index 0."""
    out = []
    for name, f in root.model_fields.items():
        path = prefix + (name,)
        if _holds_float(f.annotation):
            out.append(path)
        for sub in _models(f.annotation):
            out += float_fields(sub, path + ((0,) if typing.get_origin(f.annotation) is list else ()))
    return out


def test_every_settings_model_refuses_non_finite_floats():
    models = settings_models(Goal) + settings_models(RunConfig)
    lax = sorted({m.__name__ for m in models if m.model_config.get("allow_inf_nan") is not False})
    assert not lax, f"settings models that accept .inf/.nan: {lax}"


def _put(d: dict, path: tuple, value: float) -> dict:
    import copy

    out = copy.deepcopy(d)
    node = out
    for i, p in enumerate(path[:-1]):
        nxt = path[i + 1]
        if isinstance(node, list):
            node = node[p]
            continue
        node = node.setdefault(p, [{}] if isinstance(nxt, int) else {})
    node[path[-1]] = value
    return out


# a goal's faults are its top-level `perturbations:` (run.perturbations is refused as such)
GOAL_FLOATS = float_fields(Goal) + [("run",) + p for p in float_fields(RunConfig) if p[0] != "perturbations"]


@pytest.mark.parametrize("path", GOAL_FLOATS, ids=[".".join(map(str, p)) for p in GOAL_FLOATS])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_a_non_finite_float_setting_is_refused_naming_the_field(path, value):
    assert len(GOAL_FLOATS) >= 25, "the walk found too few float settings"
    data = _put(GOAL, path, value)
    if path[0] == "perturbations":
        data["perturbations"][0].setdefault("kind", "stall")
    with pytest.raises(ConfigError) as e:
        Goal.parse(data)
    msg = str(e.value)
    assert "\n" not in msg and f"{'.'.join(map(str, path))}={value!r}" in msg, msg


def test_a_duplicate_key_is_refused_with_its_lines_and_a_merge_may_still_be_overridden(tmp_path):
    ok = tmp_path / "ok.yaml"
    ok.write_text("base: &b {lr: 0.01, steps: 5}\nrecipe:\n  <<: *b\n  lr: 0.02\n")
    assert load_yaml(ok, "config file")["recipe"] == {"lr": 0.02, "steps": 5}
    cases = {"top: 1\nother: 2\ntop: 3\n": "duplicate key 'top' (first at line 1) at line 3",
             "recipe:\n  lr: 1\n  lr: 2\n": "duplicate key 'lr' in recipe (first at line 2) at line 3",
             "perturbations:\n  - {kind: stall, seconds: 1, seconds: 2}\n": "duplicate key 'seconds' in perturbations[0]",
             "1: a\n0x1: b\n": "duplicate key 1 (first at line 1)"}
    for text, needle in cases.items():
        p = tmp_path / "dup.yaml"
        p.write_text(text)
        with pytest.raises(ConfigError, match="not valid YAML") as e:
            load_yaml(p, "config file")
        assert needle in str(e.value), str(e.value)
    run = tmp_path / "run.yaml"
    run.write_text("recipe: {lr: 0.01}\nthreads: 1\nrecipe: {lr: 10}\n")
    with pytest.raises(ConfigError, match="duplicate key 'recipe'"):
        RunConfig.from_yaml(run)


def test_fork_from_must_name_a_checkpoint_the_trainer_can_load(tmp_path):
    from trainer.checkpoint import CheckpointManager
    from trainer.preflight import check_fork_from

    ckpt = CheckpointManager(tmp_path / "ckpts").save({"step": 3}, 3)
    check_fork_from(str(ckpt))
    Goal.parse({**GOAL, "run": {**GOAL["run"], "fork_from": str(ckpt)}})
    bare = tmp_path / "bare.pt"
    bare.write_bytes(b"x")
    for path, needle in ((tmp_path / "gone.pt", "checkpoint file not found"), (tmp_path, "a folder"),
                         (bare, "no readable manifest bare.json"), (ckpt.with_suffix(".json"), "not a checkpoint file")):
        with pytest.raises(ConfigError, match=needle):
            check_fork_from(str(path))
    with pytest.raises(ConfigError, match=r"run\.fork_from=.*gone\.pt'"):
        Goal.parse({**GOAL, "run": {**GOAL["run"], "fork_from": str(tmp_path / "gone.pt")}})
