"""`inflated_weights`: an lr far too high grows the weights to many times their untrained size in
a few steps, and the run learns nothing. Found at the first eval (where `not_learning` waits for a
window of a loss that does not move) and fixed by starting over from the untrained checkpoint at a
lower lr. Evidence windows are the hand-built ones of test_detectors.py."""
from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from agents.base import rollback_target  # noqa: E402
from agents.detection import DETECTORS, THRESHOLDS  # noqa: E402
from agents.domain import InterventionKind as K, Risk, Status  # noqa: E402
from agents.operators import Diagnostics  # noqa: E402
from test_detectors import KNOWN, grpo_rows, make_ev, sft_rows  # noqa: E402
from test_operators import ctx  # noqa: E402

INIT = [{"name": "init", "step": 0}, {"name": "step_0000040", "step": 40}]


def blown(n: int = 50, growth: float = 9.0, heldout: float = 0.0) -> list[dict]:
    """An SFT run at lr 0.375: the weights at `growth`× their untrained size from the first steps,
    the loss fallen back from its blow-up to a level it holds, held-out `heldout` at every eval."""
    rows = sft_rows(n)
    for r in rows:
        r.update(lr=0.375, loss=2.4, weight_growth=growth)
        if "heldout_acc" in r:
            r["heldout_acc"] = heldout
    return rows


def detect(rows: list[dict]):
    return DETECTORS["inflated_weights"](make_ev(rows, recipe={"algorithm": "sft", "lr": 0.375}), THRESHOLDS, KNOWN)


def test_weights_grown_far_past_their_start_with_nothing_learnt_are_found_at_the_first_eval():
    rows = blown(12)                                      # one eval, at step 10
    d = detect(rows)
    assert d is not None and d.evidence["weight_growth"] == 9.0 and d.evidence["lr_now"] == 0.375
    assert "not_learning" not in {x.name for x in Diagnostics().diagnose(make_ev(rows), ctx())}   # too few rows yet
    assert detect(blown(growth=1.05)) is None             # a healthy run's growth
    assert detect(blown(heldout=0.3)) is None             # it learns at that size
    assert detect(blown(5)) is None                       # no eval yet
    grpo = [dict(r, weight_growth=9.0) for r in grpo_rows()]
    assert DETECTORS["inflated_weights"](make_ev(grpo), THRESHOLDS, KNOWN) is None   # measured on SFT only
    # grown slowly (past step 100 of training), or a window of a later stretch: a long run at a
    # sane lr, or one stuck for another reason (a resumed segment that starts past step 100 too)
    slow = blown(150)
    for r in slow:
        r["weight_growth"] = 1.0 if r["step"] <= 100 else 1.6
    assert detect(slow) is None
    late = [dict(r, step=r["step"] + 2200) for r in blown()]
    assert detect(late) is None
    # a rollback to a checkpoint of step 40: the segment's steps go on from there, grown by step 100
    back = [dict(r, segment=1, step=r["step"] + 40) for r in blown(40)]
    assert detect(back) is not None
    # one low eval after a good one is not a run that stopped learning; two are
    rows = blown()
    evals = [r for r in rows if "heldout_acc" in r]
    evals[-2]["heldout_acc"] = 0.4
    assert detect(rows) is None
    evals[-3]["heldout_acc"], evals[-2]["heldout_acc"] = 0.4, 0.0
    assert detect(rows) is not None


def test_inflated_weights_start_over_from_the_untrained_checkpoint_at_a_lower_lr():
    ev = make_ev(blown(), recipe={"algorithm": "sft", "lr": 0.375})
    c = ctx(recipe={**ctx().recipe, "lr": 0.375}, checkpoints=INIT)
    (iv,) = [iv for iv in Diagnostics().builtin(ev, c) if iv.diagnosis.name == "inflated_weights"]
    assert (iv.kind, iv.changes, rollback_target(iv), iv.risk) == \
        (K.ROLLBACK, {"recipe.lr": pytest.approx(1e-3)}, "init", Risk.MEDIUM)
    assert "never learnt" in iv.rationale and "lr 0.001" in iv.rationale, iv.rationale
    # no untrained checkpoint to start from: the lr is lowered from where the run is
    (iv,) = [iv for iv in Diagnostics().builtin(ev, ctx(recipe=c.recipe, checkpoints=INIT[1:]))
             if iv.diagnosis.name == "inflated_weights"]
    assert iv.kind == K.RECIPE_EDIT and iv.changes == {"recipe.lr": pytest.approx(1e-3)}
    # an lr lowered before that inflated the weights again is still far too high: it comes down again
    before = Diagnostics().builtin(ev, c)[0].model_copy(update={"status": Status.KEPT})
    again = make_ev(blown(), recipe={"algorithm": "sft", "lr": 1e-3})
    c2 = ctx(recipe={**ctx().recipe, "lr": 1e-3}, checkpoints=INIT, history=[before])
    (iv,) = [iv for iv in Diagnostics().builtin(again, c2) if iv.diagnosis.name == "inflated_weights"]
    assert iv.changes == {"recipe.lr": pytest.approx(1e-4)} and rollback_target(iv) == "init"
