"""label_noise: SFT targets that disagree with right answers, read from the loss (a rise on unchanged data
and config, or a high flat floor) against what the policy answers, on hand-built evidence windows
shaped like the trainer's rows (tests/test_detectors.py's helpers)."""
from __future__ import annotations

import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from agents.detection import DETECTORS, THRESHOLDS  # noqa: E402
from agents.harness_detectors import labels_changed  # noqa: E402
from test_detectors import KNOWN, fired, make_ev, sft_rows  # noqa: E402


def test_label_noise():
    rows = sft_rows()
    rng = random.Random(1)
    for r in rows[-30:]:
        r.update(loss=0.42 + rng.uniform(-0.02, 0.02), pass_rate=0.8)
    rising = make_ev(rows)  # held-out still climbing (sft_rows' evals): a loss pause is not noise
    assert DETECTORS["label_noise"](rising, THRESHOLDS, KNOWN) is None
    for r in rows[-30:]:
        if "heldout_acc" in r:
            r["heldout_acc"] = 0.6  # ... held-out stalled below its earlier best
    d = fired(make_ev(rows), "label_noise")
    assert d.evidence["loss_second_half_median"] > THRESHOLDS.label_noise_floor
    # the policy's loss on the task's own held-out answers: below its training floor, the targets
    # disagree with the answers; credibly above it, the run fits its targets better than the answers
    # (a slow learner whose loss is high everywhere), and nothing says the labels are wrong
    last = max(i for i, r in enumerate(rows) if "heldout_acc" in r)

    def answered(loss: float, se: float = 0.02, **row):
        return make_ev([dict(r, heldout_loss=loss, heldout_loss_se=se, **row) if i == last else r
                        for i, r in enumerate(rows)])

    assert fired(answered(0.2), "label_noise").evidence["heldout_loss"] == 0.2
    assert fired(answered(0.44), "label_noise")                  # within two standard errors: not told apart
    for loss in (0.5, 0.8):
        assert DETECTORS["label_noise"](answered(loss), THRESHOLDS, KNOWN) is None, loss
    # an eval of an earlier segment, or at another difficulty than the training rows, says nothing of this floor
    # step 30's eval, then a rollback: nothing to compare this floor with until an eval of the new
    # segment, which then decides; the same for a harness version begun within the segment
    before = [dict(r, segment=int(i > 29), **({"heldout_loss": 0.8, "heldout_loss_se": 0.02} if i == 29 else {}))
              for i, r in enumerate(rows)]
    assert DETECTORS["label_noise"](make_ev(before), THRESHOLDS, KNOWN) is None
    for loss, fires in ((0.8, False), (0.2, True)):
        after = [dict(r, heldout_loss=loss, heldout_loss_se=0.02) if i == last else r for i, r in enumerate(before)]
        assert (DETECTORS["label_noise"](make_ev(after), THRESHOLDS, KNOWN) is not None) == fires, loss
    edited = [dict(r, harness_version="bbbb" if i >= 40 else "aaaa",
                   **({"heldout_loss": 0.8, "heldout_loss_se": 0.02} if i == 39 else {})) for i, r in enumerate(rows)]
    assert DETECTORS["label_noise"](make_ev(edited), THRESHOLDS, KNOWN) is None    # step 40's eval: the old harness
    edited[last] = dict(edited[last], heldout_loss=0.2, heldout_loss_se=0.02)
    assert fired(make_ev(edited), "label_noise")
    # a run that writes no answer loss (an agent or script trainer): the floor alone, as before
    assert fired(make_ev(rows), "label_noise")
    assert fired(make_ev([dict(r, difficulty=2) for r in answered(0.8).metrics]), "label_noise")
    # the trainer checks its labels and the task's verifier accepts them: a high loss has another cause
    checked = [dict(r, label_ok=1.0) for r in rows]
    assert DETECTORS["label_noise"](make_ev(checked), THRESHOLDS, KNOWN) is None
    bad = [dict(r, label_ok=0.6) for r in rows]
    assert fired(make_ev(bad), "label_noise")
    for r in rows[-30:]:
        r["pass_rate"] = 0.0  # stuck and wrong: not label noise
        if "heldout_acc" in r:
            r["heldout_acc"] = 0.0
    assert DETECTORS["label_noise"](make_ev(rows), THRESHOLDS, KNOWN) is None


def test_label_noise_when_the_loss_rises_on_the_same_data_and_config_while_answers_stay_right():
    """The other way label noise shows: mid-run, the loss of the latest rows is 2x and 0.1 above the
    lowest it reached on the same segment, difficulty, harness and recipe, and held-out accuracy did
    not fall. A curriculum step, a harness edit or a rollback in between, a policy that got worse,
    or one that answers nothing right, is not it."""
    def run(since: int = 20, **last):
        rows = sft_rows(100)
        rng = random.Random(2)
        for r in rows[-since:]:
            r.update({"loss": 0.4 + rng.uniform(-0.02, 0.02), "pass_rate": 0.9, **last})
        return rows

    d = fired(make_ev(run()), "label_noise")
    assert d.evidence["loss_low"] < 0.1 < 0.38 < d.evidence["loss_now"] and "targets changed" in d.summary
    assert d.evidence["heldout_then"] == 0.92 and d.evidence["low_at_step"] == 80
    # row 81 is the first at the raised level: it trained on step 80's data, the first changed
    assert d.evidence["good_before_step"] == 80
    # a change in the second half of a block leaves that block's median low: counted from its start
    d = fired(make_ev(run(since=28)), "label_noise")
    assert d.evidence["good_before_step"] == 72, d.evidence
    # (the flat-floor way may still see these: held-out has stalled at its best; this way does not)
    for changed in ({"difficulty": 4}, {"harness_version": "bbbb"}, {"recipe_version": "r2"}, {"segment": 1}):
        assert labels_changed(make_ev(run(**changed)), THRESHOLDS) is None, changed
    worse = run()
    for r in worse[-20:]:
        if "heldout_acc" in r:
            r["heldout_acc"] = 0.8          # the policy got worse: a loss rise of another kind
    assert labels_changed(make_ev(worse), THRESHOLDS) is None
    wrong = run(pass_rate=0.0)
    for r in wrong[-20:]:
        if "heldout_acc" in r:
            r["heldout_acc"] = 0.0
    assert DETECTORS["label_noise"](make_ev(wrong), THRESHOLDS, KNOWN) is None
    assert DETECTORS["label_noise"](make_ev(sft_rows(100)), THRESHOLDS, KNOWN) is None     # healthy throughout


# ---- real trainer runs --------------------------------------------------------------------------
