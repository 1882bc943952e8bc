"""A batch too small to learn from, read from the run: the trainer's half-batch gradient
measurements, the gradient noise scale they give, the `small_batch` finding it feeds and the fix
that raises the batch. The measurement is checked against a full backward pass; a real short run
of the built-in model shows a batch of 2 far below its noise scale where one of 64 is not;
hand-built windows pin down when the finding fires and when it stays quiet."""
from __future__ import annotations

import copy
import dataclasses
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from agents.detection import DETECTORS, THRESHOLDS  # noqa: E402
from agents.step_detectors import BATCH_RAISE_MAX, noise_scale  # noqa: E402,F401
from agents.domain import InterventionKind as K  # noqa: E402
from agents.explorer import Explorer  # noqa: E402
from agents.operators import Diagnostics  # noqa: E402
from harness.render import sft_target  # noqa: E402
from test_detectors import KNOWN, make_ev, sft_rows  # noqa: E402
from test_operators import ctx  # noqa: E402
from trainer.algorithms.sft import NOISE_EVERY, sft_loss  # noqa: E402
from trainer.config import RunConfig  # noqa: E402
from trainer.loop import Trainer  # noqa: E402
from trainer.tasks import Split  # noqa: E402

detect = DETECTORS["small_batch"]


def _cfg(tmp_path, name: str, batch: int, steps: int) -> RunConfig:
    return RunConfig.model_validate({
        "name": name, "out_dir": str(tmp_path), "seed": 0, "task": {"name": "sort"}, "threads": 1,
        "model": {"kind": "builtin", "d_model": 64, "n_layers": 2, "n_heads": 4, "max_seq_len": 16},
        "harness": {"template": "{question}=", "answer": {"stop": "\n"}, "sampling": {"max_new_tokens": 4},
                    "curriculum": {"start": 4}},
        "recipe": {"algorithm": "sft", "lr": 3e-3, "schedule": "constant", "batch_size": batch, "steps": steps,
                   "eval_interval": 0},
        "checkpoint": {"interval": 0}, "samples_per_step": 0})


def test_the_halves_leave_the_batchs_gradient_and_measure_its_noise(tmp_path):
    t = Trainer(_cfg(tmp_path, "halves", 16, 1))
    exs = [t.task.example(Split.TRAIN, i, 4) for i in range(16)]
    prompts = [t.prompt_ids(e) for e in exs]
    targets = [t.target_ids(sft_target(t.harness, e.solution or e.answer)) for e in exs]
    loss, _ = sft_loss(t, prompts, targets)
    t.opt.zero_grad()
    loss.backward()
    full = [p.grad.clone() for p in t.params]
    na, nb = sum(map(len, targets[:8])), sum(map(len, targets[8:]))
    la, _ = sft_loss(t, prompts[:8], targets[:8])
    lb, _ = sft_loss(t, prompts[8:], targets[8:])
    m = t.backward_halves(la, lb, na / (na + nb), nb / (na + nb), 8, 8)
    assert max(float((p.grad - f).abs().max()) for p, f in zip(t.params, full)) < 1e-6
    assert m["grad_sq"] > m["grad_dot"] > 0 and m["grad_half"] == 8 and m["grad_batch"] == 16
    # two identical halves: no noise between them
    la, _ = sft_loss(t, prompts[:8], targets[:8])
    lb, _ = sft_loss(t, prompts[:8], targets[:8])
    same = t.backward_halves(la, lb, 0.5, 0.5, 8, 8)
    assert same["grad_dot"] == pytest.approx(same["grad_sq"], rel=1e-5)


def test_a_measured_step_is_the_step_it_would_have_been(tmp_path, monkeypatch):
    """Every step measured against none: the same weights, loss and gradient norm, at an odd batch."""
    import trainer.algorithms.sft as sft

    def run(every: int, name: str) -> tuple[list[dict], list[torch.Tensor]]:
        monkeypatch.setattr(sft, "NOISE_EVERY", every)
        rows: list[dict] = []
        t = Trainer(_cfg(tmp_path, name, 5, 3), on_step=rows.append)
        t.run()
        return rows, [p.detach().clone() for p in t.params]

    (measured, w1), (plain, w2) = run(1, "every"), run(10 ** 9, "never")
    assert all("grad_dot" in r for r in measured if "loss" in r and "heldout_acc" not in r)
    assert sum("grad_dot" in r for r in plain) <= 1          # step 0 only
    assert max(float((a - b).abs().max()) for a, b in zip(w1, w2)) < 1e-5
    for a, b in zip([r for r in measured if "grad_norm" in r], [r for r in plain if "grad_norm" in r]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
        assert a["update_ratio"] == pytest.approx(b["update_ratio"], rel=1e-3)
    # halves of 2 and 3 examples: the noise of a mean over their harmonic mean, 2.4
    assert {r["grad_half"] for r in measured if "grad_half" in r} == {2.4}


def test_a_real_run_with_a_batch_of_two_is_far_below_its_noise_scale(tmp_path):
    def ratio(batch: int) -> float:
        rows: list[dict] = []
        Trainer(_cfg(tmp_path, f"b{batch}", batch, 12 * NOISE_EVERY), on_step=rows.append).run()
        measured = [r for r in rows if "grad_dot" in r]
        assert len(measured) == 12
        return batch / noise_scale(measured, THRESHOLDS.batch_signal_se)

    small, healthy = ratio(2), ratio(64)
    assert small < THRESHOLDS.batch_snr_min < healthy, (small, healthy)


def batch_rows(n: int = 8 * NOISE_EVERY + 20, scale: float = 40.0, half: float = 1.0, held: float = 0.0) -> list[dict]:
    """A run whose half-batch measurements give noise scale `scale` (|G|² = 1)."""
    rows = sft_rows(n=n)
    for r in rows:
        if r["step"] % NOISE_EVERY == 1:          # the row of step s measures the update from s - 1
            r.update(grad_dot=1.0, grad_sq=1.0 + scale / half, grad_half=half, grad_batch=2 * half)
        if "heldout_acc" in r:
            r["heldout_acc"] = held
    return rows


RECIPE = {"algorithm": "sft", "lr": 3e-3, "batch_size": 2}


def test_fires_where_the_batch_is_far_below_the_noise_scale_and_names_the_batch_it_needs():
    d = detect(make_ev(batch_rows(), recipe=RECIPE), THRESHOLDS, KNOWN)
    assert d is not None and d.evidence["noise_scale_lower"] == pytest.approx(40.0)
    assert d.evidence["batch_suggested"] == min(
        int(THRESHOLDS.batch_aim * 40), BATCH_RAISE_MAX * 2)
    # a scale past any a learning run shows, or no signal above the noise at all: the run is stuck
    # for another reason, which no batch cures
    for dot, sq in ((1.0, 1.0 + 2 * THRESHOLDS.batch_noise_max), (-0.1, 41.0)):
        rows = batch_rows()
        for r in rows:
            if "grad_dot" in r:
                r.update(grad_dot=dot, grad_sq=sq)
        assert detect(make_ev(rows, recipe=RECIPE), THRESHOLDS, KNOWN) is None


def test_quiet_where_the_batch_is_large_enough_or_held_out_rises_or_the_target_is_met():
    big = batch_rows(half=32.0)
    assert detect(make_ev(big, recipe=dict(RECIPE, batch_size=64)), THRESHOLDS, KNOWN) is None
    # products scattered around a small signal, a few of them large: the bound on the signal keeps
    # the scale from looking large (6 at one SE; the ratio of means alone reads 39)
    spiky = batch_rows()
    dots = iter([0.5, -0.4, 0.6, -0.5, 0.02, 0.01, -0.03, 0.05, 0.0, 0.0])      # mean 0.03, se 0.14
    for r in spiky:
        if "grad_dot" in r:
            r.update(grad_dot=next(dots), grad_sq=1.2)
    assert detect(make_ev(spiky, recipe=RECIPE), THRESHOLDS, KNOWN) is None
    point = dataclasses.replace(THRESHOLDS, batch_signal_se=0.0)            # the ratio of means alone would fire
    assert detect(make_ev(spiky, recipe=RECIPE), point, KNOWN) is not None
    # labels the task's check rejects add noise of their own: not this finding's
    noisy = [dict(r, label_ok=0.6) for r in batch_rows()]
    assert detect(make_ev(noisy, recipe=RECIPE), THRESHOLDS, KNOWN) is None
    rising = batch_rows()
    for i, r in enumerate(r for r in rising if "heldout_acc" in r):
        r["heldout_acc"] = 0.1 * i
    assert detect(make_ev(rising, recipe=RECIPE), THRESHOLDS, KNOWN) is None
    assert detect(make_ev(batch_rows(held=0.96), recipe=RECIPE), THRESHOLDS, KNOWN) is None     # target 0.95
    few = batch_rows(n=(THRESHOLDS.batch_noise_rows - 1) * NOISE_EVERY)      # one measurement short
    assert detect(make_ev(few, recipe=RECIPE), THRESHOLDS, KNOWN) is None
    assert detect(make_ev(batch_rows(), recipe=dict(RECIPE, algorithm="grpo")), THRESHOLDS, KNOWN) is None
    rows = batch_rows()
    after = dataclasses.replace(KNOWN, settled_since=rows[-30]["time"])      # too few since the change
    assert detect(make_ev(rows, recipe=RECIPE), THRESHOLDS, after) is None


def test_the_fix_raises_the_batch_and_the_search_stays_quiet():
    rows = batch_rows()
    for r in rows:
        r["loss"] = 2.0                               # flat: not_learning fires too
    c = ctx(recipe={"algorithm": "sft", "lr": 3e-3, "batch_size": 2, "kl_coef": 0.0, "group_size": 8})
    ev = make_ev(rows, recipe=copy.deepcopy(c.recipe))
    found = {d.name for d in Diagnostics().diagnose(ev, c)}
    assert {"small_batch", "not_learning"} <= found, found
    (iv,) = Diagnostics().builtin(ev, c)
    assert iv.kind == K.RECIPE_EDIT and iv.diagnosis.name == "small_batch"
    assert iv.changes == {"recipe.batch_size": 64}
    assert Explorer().builtin(ev, c) == []
