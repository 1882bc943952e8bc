"""The `not_learning` fix: a run that does not learn gets a lower lr, from its untrained
checkpoint where its weights are worth nothing (it never learnt, or they grew far past their
untrained size and held-out is back at the not-learning level). Evidence windows are the
hand-built ones of test_detectors.py."""
from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from agents.base import rollback_target  # noqa: E402
from agents.domain import InterventionKind as K, Risk  # noqa: E402
from agents.operators import Diagnostics  # noqa: E402
from test_detectors import make_ev, stuck_rows  # noqa: E402
from test_operators import ctx  # noqa: E402


def test_diagnostics_lowers_the_lr_of_a_run_that_never_learns():
    ivs = [iv for iv in Diagnostics().builtin(make_ev(stuck_rows()), ctx()) if iv.diagnosis.name == "not_learning"]
    assert len(ivs) == 1 and ivs[0].kind == K.RECIPE_EDIT
    assert ivs[0].changes == {"recipe.lr": pytest.approx(1e-3)}  # Adam at 0.3: down to at most 1e-3
    # during a warm-up the logged lr is a share of the peak: the new lr comes from the peak (0.3 → 1e-3),
    # not from the small lr logged now (3e-4 → 3e-5)
    warm = [{**r, "lr": 3e-4} if "lr" in r else r for r in stuck_rows()]
    ivs = [iv for iv in Diagnostics().builtin(make_ev(warm), ctx(recipe={**ctx().recipe, "lr": 0.3}))
           if iv.diagnosis.name == "not_learning"]
    assert ivs[0].changes == {"recipe.lr": pytest.approx(1e-3)}


def test_a_run_that_never_learnt_restarts_from_its_untrained_checkpoint_at_a_lower_lr():
    """With the fresh run's `init` checkpoint known and held-out never above the not-learning
    level, the fix is a rollback to `init` with the lr lowered (the weights trained at lr 0.3 are
    no better than the start); once it had learnt something, only the lr is lowered."""
    cps = [{"name": "init", "step": 0}, {"name": "step_0000050", "step": 50}, {"name": "step_0000100", "step": 100}]
    (iv,) = [iv for iv in Diagnostics().builtin(make_ev(stuck_rows()), ctx(checkpoints=cps)) if iv.diagnosis.name == "not_learning"]
    assert (iv.kind, iv.changes, rollback_target(iv), iv.risk) == (K.ROLLBACK, {"recipe.lr": pytest.approx(1e-3)}, "init", Risk.MEDIUM)
    assert iv.backtest_skipped is None            # a warning-level rollback is backtested (from `init`)
    rows = stuck_rows()
    rows[next(i for i, r in enumerate(rows) if "heldout_acc" in r)]["heldout_acc"] = 0.4   # it once scored
    (iv,) = [iv for iv in Diagnostics().builtin(make_ev(rows), ctx(checkpoints=cps)) if iv.diagnosis.name == "not_learning"]
    assert iv.kind == K.RECIPE_EDIT
    # it once scored, but its weights have since grown to 3x their untrained size (an lr far too
    # high inflates them) and held-out is back at the not-learning level: they are worth nothing
    # (the cause named: inflated_weights, acted on in not_learning's place)
    grown = [dict(r, weight_growth=3.0) if "loss" in r else r for r in rows]
    (iv,) = [iv for iv in Diagnostics().builtin(make_ev(grown), ctx(checkpoints=cps))
             if iv.diagnosis.name in ("not_learning", "inflated_weights")]
    assert iv.diagnosis.name == "inflated_weights"
    assert (iv.kind, rollback_target(iv)) == (K.ROLLBACK, "init") and "grew to 3×" in iv.rationale, iv.rationale
    # one low eval after a good one is not a run that stopped learning: its weights are kept
    evals = [i for i, r in enumerate(grown) if "heldout_acc" in r]
    grown[evals[-2]]["heldout_acc"] = 0.4
    (iv,) = [iv for iv in Diagnostics().builtin(make_ev(grown), ctx(checkpoints=cps)) if iv.diagnosis.name == "not_learning"]
    assert iv.kind == K.RECIPE_EDIT
