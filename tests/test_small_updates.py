"""A learning rate too low to learn, read from the run: the trainer's update ratio (how far a step
moves the weights relative to their size), the `small_updates` finding it feeds, and the fix that
raises the lr instead of lowering it. Real short runs of the built-in model show the ratio goes with
the lr and separates a run at 1/100 of the lr from a healthy one; hand-built windows pin down when the
finding fires and when it stays quiet."""
from __future__ import annotations

import copy
import statistics
import sys
import pathlib

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from agents.detection import DETECTORS, THRESHOLDS  # noqa: E402
from agents.domain import InterventionKind as K  # noqa: E402
from agents.explorer import Explorer  # noqa: E402
from agents.operators import Diagnostics  # noqa: E402
from test_detectors import KNOWN, make_ev, sft_rows  # noqa: E402
from test_operators import ctx, iv_  # noqa: E402
from trainer.config import RunConfig  # noqa: E402
from trainer.loop import Trainer, step_norms  # noqa: E402

detect = DETECTORS["small_updates"]


def test_update_ratio_is_the_step_norm_over_the_weight_norm():
    before = [torch.tensor([3.0, 0.0]), torch.tensor([[0.0, 4.0]])]
    after = [torch.tensor([6.0, 0.0]), torch.tensor([[0.0, 8.0]])]
    assert step_norms(before, after) == pytest.approx((5.0 / 10.0, 10.0))
    assert step_norms([t.clone() for t in after], after) == (0.0, pytest.approx(10.0))


def _rows(tmp_path, lr: float, name: str) -> list[dict]:
    cfg = RunConfig.model_validate({
        "name": name, "out_dir": str(tmp_path), "seed": 0, "task": {"name": "sort"}, "threads": 1,
        "model": {"kind": "builtin", "d_model": 64, "n_layers": 2, "n_heads": 4, "max_seq_len": 16},
        "harness": {"template": "{question}=", "answer": {"stop": "\n"}, "sampling": {"max_new_tokens": 4},
                    "curriculum": {"start": 4}},
        "recipe": {"algorithm": "sft", "lr": lr, "schedule": "constant", "batch_size": 32, "steps": 30,
                   "eval_interval": 0},
        "checkpoint": {"interval": 0}, "samples_per_step": 0})
    rows: list[dict] = []
    Trainer(cfg, on_step=rows.append).run()
    return rows


def _ratios(tmp_path, lr: float, name: str) -> list[float]:
    return [r["update_ratio"] for r in _rows(tmp_path, lr, name) if "update_ratio" in r]


def test_a_real_run_at_a_hundredth_of_the_lr_moves_its_weights_below_the_floor(tmp_path):
    healthy, low = _ratios(tmp_path, 3e-3, "ok"), _ratios(tmp_path, 3e-5, "low")
    assert len(healthy) == len(low) == 30
    h, lo = statistics.median(healthy[10:]), statistics.median(low[10:])
    assert lo < THRESHOLDS.small_updates_max < h, (lo, h)
    assert 30 < h / lo < 300, (h, lo)          # at this size a step moves the weights about in proportion to the lr


def low_rows(n: int = 120, ratio: float = 1e-4, lr: float = 3e-5, held: float = 0.0) -> list[dict]:
    rows = sft_rows(n=n)
    for r in rows:
        r.update(lr=lr, update_ratio=ratio, loss=2.0 - 0.002 * r["step"], pass_rate=0.0)
        if "heldout_acc" in r:
            r["heldout_acc"] = held
    return rows


def test_fires_on_steps_that_barely_move_the_weights_and_names_the_lr_that_would():
    d = detect(make_ev(low_rows(), recipe={"algorithm": "sft", "lr": 3e-5}), THRESHOLDS, KNOWN)
    assert d is not None and d.severity == "warning"
    factor = min(THRESHOLDS.small_updates_raise_max,
                 (THRESHOLDS.small_updates_aim / 1e-4) ** (1 / THRESHOLDS.small_updates_exponent))
    assert d.evidence["lr_suggested"] == pytest.approx(3e-5 * factor, rel=1e-2)
    assert d.evidence["update_ratio_median"] == pytest.approx(1e-4)
    # the raise follows the ratio's slope in the lr (0.75 in log), not proportion: from a ratio a
    # tenth of the aim, the lr goes up 10^(1/0.75) = 21.5x, not 10x
    d = detect(make_ev(low_rows(ratio=7e-4), recipe={"algorithm": "sft", "lr": 3e-5}), THRESHOLDS, KNOWN)
    assert d.evidence["lr_suggested"] == pytest.approx(6.46e-4, rel=1e-2)
    # one eval in the segment is enough to know the target is not met
    one = [r for r in low_rows() if "heldout_acc" not in r or r["step"] == 100]
    assert detect(make_ev(one, recipe={"algorithm": "sft", "lr": 3e-5}), THRESHOLDS, KNOWN) is not None
    none = [r for r in low_rows() if "heldout_acc" not in r]
    assert detect(make_ev(none, recipe={"algorithm": "sft", "lr": 3e-5}), THRESHOLDS, KNOWN) is None
    # never past 1e-2, where Adam almost never trains a transformer
    d = detect(make_ev(low_rows(lr=5e-3), recipe={"algorithm": "sft", "lr": 5e-3}), THRESHOLDS, KNOWN)
    assert d.evidence["lr_suggested"] == 1e-2
    # at the ceiling no raise is left: no finding, so nothing stands in the way of the search
    assert detect(make_ev(low_rows(lr=8e-3), recipe={"algorithm": "sft", "lr": 8e-3}), THRESHOLDS, KNOWN) is None
    # at a thousandth of a healthy step the raise is capped
    d = detect(make_ev(low_rows(ratio=1e-6), recipe={"algorithm": "sft", "lr": 3e-5}), THRESHOLDS, KNOWN)
    assert d.evidence["lr_suggested"] == pytest.approx(3e-5 * THRESHOLDS.small_updates_raise_max)


def test_quiet_where_the_weights_move_or_held_out_rises_or_the_target_is_met():
    ok = low_rows(ratio=4e-3)
    assert detect(make_ev(ok), THRESHOLDS, KNOWN) is None
    rising = low_rows()
    evals = [r for r in rising if "heldout_acc" in r]
    for i, r in enumerate(evals):
        r["heldout_acc"] = 0.02 * i                  # slow, but learning: not this finding's to change
    assert detect(make_ev(rising), THRESHOLDS, KNOWN) is None
    assert detect(make_ev(low_rows(held=0.96)), THRESHOLDS, KNOWN) is None      # at target (0.95)
    # a run that has learnt part of its task (a pretrained model's fine-tuning, say) moves by small
    # steps by design: not judged
    assert detect(make_ev(low_rows(held=0.3)), THRESHOLDS, KNOWN) is None
    assert detect(make_ev(low_rows(n=THRESHOLDS.small_updates_rows - 1)), THRESHOLDS, KNOWN) is None
    rows = low_rows()
    for r in rows:
        r.pop("update_ratio")                        # a trainer that does not log it: nothing is claimed
    assert detect(make_ev(rows), THRESHOLDS, KNOWN) is None
    grpo = low_rows()
    for r in grpo:
        r["algorithm"] = "grpo"                      # RL steps move the weights less by design
    assert detect(make_ev(grpo), THRESHOLDS, KNOWN) is None


def test_a_warm_up_lr_is_scaled_to_the_recipes_before_it_is_judged():
    """During a warm-up the lr in force is a share of the recipe's: steps of a healthy lr that is
    still ramping up move the weights less (as the lr to the power 0.75), and are not a finding."""
    rows = low_rows(ratio=5e-4, lr=3e-4)             # a tenth of the recipe's 3e-3
    assert detect(make_ev(rows, recipe={"algorithm": "sft", "lr": 3e-3}), THRESHOLDS, KNOWN) is None
    assert detect(make_ev(rows, recipe={"algorithm": "sft", "lr": 3e-4}), THRESHOLDS, KNOWN) is not None


def test_the_fix_raises_the_lr_and_not_learning_no_longer_lowers_it():
    rows = low_rows(ratio=1e-4, lr=3e-5)
    for r in rows:
        r["loss"] = 2.0                              # flat: not_learning fires too
    c = ctx(recipe={"algorithm": "sft", "lr": 3e-5, "kl_coef": 0.0, "group_size": 8})
    ev = make_ev(rows, recipe=copy.deepcopy(c.recipe))
    found = {d.name for d in Diagnostics().diagnose(ev, c)}
    assert {"small_updates", "not_learning"} <= found, found
    (iv,) = Diagnostics().builtin(ev, c)
    assert iv.kind == K.RECIPE_EDIT and iv.diagnosis.name == "small_updates"
    assert iv.changes["recipe.lr"] > 3e-5 * 10, iv.changes
    assert Explorer().builtin(ev, c) == []           # a cause is named: no blind search


def test_evals_of_an_sft_run_write_the_held_out_answer_loss_and_it_falls_as_the_run_learns(tmp_path):
    from trainer.runlog import read_jsonl

    cfg = RunConfig.model_validate({
        "name": "ev", "out_dir": str(tmp_path), "seed": 0, "task": {"name": "sort"}, "threads": 1,
        "model": {"kind": "builtin", "d_model": 64, "n_layers": 2, "n_heads": 4, "max_seq_len": 16},
        "harness": {"template": "{question}=", "answer": {"stop": "\n"}, "sampling": {"max_new_tokens": 4},
                    "curriculum": {"start": 4}},
        "recipe": {"algorithm": "sft", "lr": 3e-3, "schedule": "constant", "batch_size": 32, "steps": 40,
                   "eval_interval": 20, "eval_size": 50},
        "checkpoint": {"interval": 0}, "samples_per_step": 0})
    Trainer(cfg).run()
    evals = [r for r in read_jsonl(tmp_path / "ev" / "metrics.jsonl") if "heldout_loss" in r]
    assert len(evals) >= 2, evals
    assert all(0 < r["heldout_loss_se"] < r["heldout_loss"] for r in evals)
    assert evals[-1]["heldout_loss"] < evals[0]["heldout_loss"] - 3 * evals[0]["heldout_loss_se"]


def test_a_large_lr_raise_whose_held_out_answer_loss_fell_is_validated_on_held_out_and_not_high_risk():
    """Accuracy still zero in both arms, the answers' likelihood credibly better for the candidate:
    validated on a held-out signal, so the 40x raise is rated by what can go wrong (medium) rather
    than by its size alone (high), as a move measured only on the training loss still is."""
    from agents.domain import Risk
    from swarm.decisions import (HELDOUT_LOSS_SIGNAL, ArmScore, Pair, Rule, Validated, assign_risk, decide)

    def arm(hl):
        return ArmScore(target=0.0, format_fail=0.0, loss=2.0, loss_se=0.01, heldout_loss=hl, heldout_loss_se=0.02)
    pairs = [Pair(0, arm(1.5), arm(2.0))]
    d = decide(pairs, Rule(eval_size=200, losses_compare=True, heldout_compares=True))
    assert isinstance(d, Validated) and d.signal.name == HELDOUT_LOSS_SIGNAL, d
    # the same arms where the targets are not rendered alike: the answer loss is not compared
    d2 = decide(pairs, Rule(eval_size=200, losses_compare=False, heldout_compares=False))
    assert not isinstance(d2, Validated), d2
    iv = iv_(K.RECIPE_EDIT, {"recipe.lr": 1.2e-3}, "small_updates")
    now = {"recipe.lr": 3e-5}
    assert assign_risk(iv, now, now, validated_on=d.signal.name).risk == Risk.MEDIUM
    assert assign_risk(iv, now, now, validated_on="SFT training loss").risk == Risk.HIGH


def test_rows_and_evals_from_before_the_controllers_latest_change_do_not_count():
    """After the lr was raised, the window still holds the steps at the old lr: they show the lr the
    change replaced, so neither small_updates nor plateau (which would start a search while the
    change is still judged) reads them."""
    import dataclasses

    # a change of something else (no lr in it) 30 rows ago: the steps before it do not count, and
    # 30 since are too few to judge
    rows = low_rows(n=180)
    after = dataclasses.replace(KNOWN, settled_since=rows[149]["time"])
    ev = make_ev(rows, recipe={"algorithm": "sft", "lr": 3e-5})
    assert detect(ev, THRESHOLDS, KNOWN) is not None
    assert detect(ev, THRESHOLDS, after) is None
    longer = make_ev(low_rows(n=200), recipe={"algorithm": "sft", "lr": 3e-5})
    assert detect(longer, THRESHOLDS, after) is not None       # 50 rows since, as small: judged again
    rows = low_rows(n=200)
    for r in rows[150:]:
        r.update(lr=1.4e-3, update_ratio=5e-3)                # the raise moved the weights
    assert detect(make_ev(rows, recipe={"algorithm": "sft", "lr": 1.4e-3}), THRESHOLDS, after) is None
    plateau = DETECTORS["plateau"]
    soon = make_ev(rows[:180], recipe={"algorithm": "sft", "lr": 1.4e-3})
    assert plateau(soon, THRESHOLDS, KNOWN) is not None        # held-out 0 for 18 evals: stuck, by every eval
    assert plateau(soon, THRESHOLDS, after) is None            # 3 evals since the change, none better: ...
    flat_longer = make_ev(low_rows(n=250), recipe={"algorithm": "sft", "lr": 1.4e-3})
    assert plateau(flat_longer, THRESHOLDS, after) is not None  # ... stuck once it has 5 evals since, none better


def test_held_out_evidence_that_conflicts_is_measured_again_never_read_away():
    """The answers likelier for the candidate, its output format credibly worse: the two held-out
    signals disagree, so the fix gets another seed where a look remains and is not validated at the
    last one (the answer loss comes first in the order, but it does not silence the format count)."""
    from swarm.decisions import ArmScore, Extend, Pair, Rejected, Rule, Validated, decide

    def arm(hl, ff):
        return ArmScore(target=0.0, format_fail=ff, heldout_loss=hl, heldout_loss_se=0.02)
    conflict = [Pair(0, arm(1.5, 0.40), arm(2.0, 0.05))]
    assert isinstance(decide(conflict, Rule(eval_size=200, losses_compare=True, heldout_compares=True, looks=2, look=1)), Extend)
    d = decide(conflict, Rule(eval_size=200, losses_compare=True, heldout_compares=True, looks=2, look=2))
    assert isinstance(d, Rejected) and "credibly worse" in d.reason, d
    # a credible gain on the target itself decides, as it always has
    on_target = [Pair(0, ArmScore(target=0.5, format_fail=0.40, heldout_loss=1.5, heldout_loss_se=0.02),
                      ArmScore(target=0.1, format_fail=0.05, heldout_loss=2.0, heldout_loss_se=0.02))]
    assert isinstance(decide(on_target, Rule(eval_size=200, losses_compare=True, heldout_compares=True, looks=2, look=2)), Validated)
    agree = [Pair(0, arm(1.5, 0.05), arm(2.0, 0.05))]
    assert isinstance(decide(agree, Rule(eval_size=200, losses_compare=True, heldout_compares=True, looks=2, look=2)), Validated)


def test_a_raise_kept_for_small_steps_is_not_lowered_again_by_not_learning():
    """Still not learning after a kept raise: the two rules would undo each other, so neither moves
    the lr again by rule; the search takes over, bracketed by the value the raise came from."""
    from agents.domain import Status

    rows = low_rows(ratio=5e-3, lr=1.2e-3)
    for r in rows:
        r["loss"] = 2.0
    c = ctx(recipe={"algorithm": "sft", "lr": 1.2e-3, "kl_coef": 0.0, "group_size": 8})
    raised = iv_(K.RECIPE_EDIT, {"recipe.lr": 1.2e-3}, "small_updates", status=Status.KEPT)
    ev = make_ev(rows, recipe=copy.deepcopy(c.recipe))
    assert "not_learning" in {d.name for d in Diagnostics().diagnose(ev, c)}
    assert [iv.changes for iv in Diagnostics().builtin(ev, c)] == [{"recipe.lr": 1.2e-4}]   # without the raise
    assert Diagnostics().builtin(ev, ctx(**{**c.model_dump(), "history": [raised]})) == []


def test_a_data_change_is_judged_on_the_held_out_answer_loss_too():
    """A curriculum or a filter changes what the arms train on, so their training losses do not
    compare; the held-out set and how its answers are rendered stay the same, so the held-out answer
    loss does. A change of the answer format or the template renders them differently: not read."""
    from swarm.backtest import rule_for
    from swarm.decisions import HELDOUT_LOSS_SIGNAL, ArmScore, Pair, Validated, decide

    base = {"recipe": {"algorithm": "sft"}}

    def rule(changes: dict):
        return rule_for(iv_(K.DATA_CHANGE, changes), base, alpha=0.2, higher_is_better=True, metric="heldout_acc",
                        eval_size=200, looks=1, look=1)

    data = rule({"harness.curriculum.start": 3})
    assert (data.heldout_compares, data.losses_compare) == (True, False)
    assert rule({"harness.filters.dedupe": True}).heldout_compares
    assert not rule({"harness.answer.stop": "\n"}).heldout_compares
    assert not rule({"harness.template": "Q: {question} A:"}).heldout_compares
    assert not rule({"recipe.algorithm": "distill"}).heldout_compares
    # arms still at zero accuracy: the curriculum's gain shows on the answers' likelihood alone
    pairs = [Pair(s, ArmScore(target=0.0, format_fail=0.0, heldout_loss=1.2, heldout_loss_se=0.02),
                  ArmScore(target=0.0, format_fail=0.0, heldout_loss=1.6, heldout_loss_se=0.02)) for s in (0, 1)]
    d = decide(pairs, data)
    assert isinstance(d, Validated) and d.signal.name == HELDOUT_LOSS_SIGNAL, d


def test_a_credible_answer_loss_gain_outweighs_a_target_lower_within_its_noise():
    """Near the floor exact match moves by whole examples: one example fewer right for the candidate
    is noise, and the likelihood of the right answers, read on every answer, decides. A held-out
    signal credibly worse still stops it."""
    from swarm.decisions import HELDOUT_LOSS_SIGNAL, ArmScore, Extend, Pair, Rejected, Rule, Validated, decide

    def pairs(ff_cand: float = 0.1):
        return [Pair(s, ArmScore(target=0.10, format_fail=ff_cand, heldout_loss=1.2, heldout_loss_se=0.02),
                     ArmScore(target=0.115, format_fail=0.1, heldout_loss=1.6, heldout_loss_se=0.02)) for s in (0, 1)]

    rule = Rule(eval_size=200, heldout_compares=True, looks=2, look=2)
    d = decide(pairs(), rule)
    assert isinstance(d, Validated) and d.signal.name == HELDOUT_LOSS_SIGNAL and "not credibly" in d.reason, d
    # an earlier look adds a seed first, as for any lower target
    assert isinstance(decide(pairs(), Rule(eval_size=200, heldout_compares=True, looks=2, look=1)), Extend)
    worse = decide(pairs(ff_cand=0.6), rule)                                  # format credibly worse
    assert isinstance(worse, Rejected) and worse.harmed, worse
    assert isinstance(decide(pairs(), Rule(eval_size=200, looks=2, look=2)), Rejected)   # the loss not read


def test_the_raise_lowers_a_decay_it_would_make_strong_and_weights_grown_large_are_not_judged():
    """A weight decay that is weak at a tiny lr pulls the weights in fast at the raised one: it comes
    down in the same change. Weights grown far past their start (an lr far too high before) make
    every step look small: no finding."""
    from agents.step_detectors import DECAY_PULL_FLAT, NORM_GROWN

    d = detect(make_ev(low_rows(), recipe={"algorithm": "sft", "lr": 3e-5, "weight_decay": 5.0}), THRESHOLDS, KNOWN)
    assert d.evidence["weight_decay_suggested"] == pytest.approx(DECAY_PULL_FLAT / d.evidence["lr_suggested"], rel=0.05)
    c = ctx(recipe={"algorithm": "sft", "lr": 3e-5, "weight_decay": 5.0, "kl_coef": 0.0, "group_size": 8})
    rows = low_rows()
    for r in rows:
        r["loss"] = 2.0
    (iv,) = Diagnostics().builtin(make_ev(rows, recipe=copy.deepcopy(c.recipe)), c)
    assert set(iv.changes) == {"recipe.lr", "recipe.weight_decay"} and iv.changes["recipe.weight_decay"] < 0.5, iv.changes
    weak = detect(make_ev(low_rows(), recipe={"algorithm": "sft", "lr": 3e-5, "weight_decay": 0.01}), THRESHOLDS, KNOWN)
    assert weak.evidence["weight_decay_suggested"] is None                    # stays weak at the raised lr
    # the growth is over the untrained start, not the window: weights inflated long before it and
    # flat since count, weights that only grew as training does do not stop the finding
    for growth, quiet in ((NORM_GROWN + 0.5, True), (1.05, False)):
        rows = [dict(r, weight_norm=60.0 * growth, weight_growth=growth) for r in low_rows()]
        assert (detect(make_ev(rows, recipe={"algorithm": "sft", "lr": 3e-5}), THRESHOLDS, KNOWN) is None) == quiet


def test_a_real_run_at_a_hundred_times_the_lr_inflates_its_weights_past_the_growth_a_healthy_run_shows(tmp_path):
    """The trainer logs the weights' norm over their untrained size: about 1 after the first step,
    still below NORM_GROWN after 30 healthy steps, past it at 100× the lr; and the detector's reading
    of it is the newest row's."""
    from agents.step_detectors import NORM_GROWN, weights_grown

    def growth(lr: float, name: str) -> list[float]:
        return [r["weight_growth"] for r in _rows(tmp_path, lr, name) if "weight_growth" in r]

    healthy, high = growth(3e-3, "ok"), growth(0.3, "high")
    assert len(healthy) == len(high) == 30
    assert healthy[0] == pytest.approx(1.0, abs=0.02) and high[0] == pytest.approx(1.0, abs=0.2)
    assert healthy[-1] < NORM_GROWN < high[-1], (healthy[-1], high[-1])
    assert weights_grown(make_ev([dict(r, weight_growth=g) for r, g in zip(sft_rows(n=30), high)])) == high[-1]
    assert weights_grown(make_ev([dict(r, weight_growth=g) for r, g in zip(sft_rows(n=30), healthy)])) is None


def test_the_judge_reads_the_live_answer_loss_at_most_the_backtests_horizon_from_its_fork():
    """The backtest records its control arms' answer loss and where they forked; after applying, the
    judge reads the live run's newest eval at most the horizon past the fork (it has trained at most
    as many steps since the fork as the arms, some of them before the change: a comparison that can
    only understate the change), for a change validated on that loss, applied to the state its arms
    forked, rendering the answers alike."""
    import types

    from agents.domain import Diagnosis, Intervention
    from swarm.backtest import result
    from swarm.decisions import ArmScore, Pair, Rule, decide
    from swarm.deciding import Deciding
    from swarm.judging import AnswerLoss

    ps = [Pair(s, ArmScore(0.0, heldout_loss=1.0, heldout_loss_se=0.02),
               ArmScore(0.0, heldout_loss=2.0 + 0.2 * s, heldout_loss_se=0.03)) for s in (0, 1)]
    d = decide(ps, Rule(eval_size=200, looks=1, look=1, heldout_compares=True))
    bt = result(d, ps, metric="heldout_acc", horizon=80, seeds=[0, 1], cpu_s=1.0, eval_size=200, fork_step=160)
    assert bt.passed and bt.signal == "held-out answer loss", bt
    assert (bt.control_heldout_loss, bt.fork_step) == (pytest.approx(2.1), 160)
    assert bt.control_heldout_loss_se == pytest.approx((2 * 0.03 ** 2) ** 0.5 / 2)

    me = types.SimpleNamespace(base_cfg={"recipe": {"algorithm": "sft"}})
    diag = Diagnosis(name="small_updates", summary="s", operator="diagnostics", policy="builtin")

    def iv(kind=K.RECIPE_EDIT, changes=None, **bt_update):
        return Intervention(kind=kind, changes=changes or {"recipe.lr": 3e-3}, diagnosis=diag, rationale="r",
                            operator="diagnostics", policy="builtin", applied_step=175,
                            backtest=bt.model_copy(update=bt_update))

    # the timeline since applying at step 175: evals at 200, 225, 250, 275
    evals = [{"step": s, "heldout_acc": 0.0, "heldout_loss": 1.9 - s / 1000, "heldout_loss_se": 0.02} for s in (200, 225, 250, 275)]
    got = Deciding.answer_loss(me, iv(), evals)            # 160 + 80 = 240: the eval at 225
    assert got == AnswerLoss(pytest.approx(1.675), 0.02, pytest.approx(2.1), bt.control_heldout_loss_se, arms=2)
    assert Deciding.answer_loss(me, iv(), evals[1:]).after == pytest.approx(1.675)
    assert Deciding.answer_loss(me, iv(), evals[2:]) is None                                            # none by 240
    assert Deciding.answer_loss(me, iv(), [dict(evals[1], heldout_loss="nan")]) is None
    assert Deciding.answer_loss(me, iv(fork_step=None), evals) is None                                  # fork unknown
    assert Deciding.answer_loss(me, iv(signal="held-out format failures"), evals) is None               # validated otherwise
    assert Deciding.answer_loss(me, iv(kind=K.ROLLBACK), evals) is None
    assert Deciding.answer_loss(me, iv(changes={"harness.template": "{question}:"}), evals) is None      # answers rendered anew
    assert Deciding.answer_loss(me, iv(passed=False), evals) is None
    assert Deciding.answer_loss(me, iv(control_heldout_loss=None), evals) is None
