"""Harness and data detectors: a broken prompt template, a curriculum too hard to learn, a sampling
temperature too low, noisy labels, a run that does not learn. Registered in `agents.detection.DETECTORS`
like the metric and job detectors (`agents/__init__.py` imports both modules), with the same contract: pure
functions over Evidence that read the shape of sample text, never copy it.
"""
from __future__ import annotations

import math
import statistics
from typing import Any

from agents.detection import (NOTHING, THRESHOLDS, Known, Thresholds, algorithm, column, current_rows, detector,
                              eval_difficulty, is_finite, known_template, loss_halves, make_diagnosis, mean_of,
                              median_of, to_float)
from agents.domain import Diagnosis
from agents.evidence import Evidence


def _last_version_change(rows: list[dict[str, Any]]) -> int | None:
    """Index of the first row of the current harness version, if the version changed in `rows`."""
    for i in range(len(rows) - 1, 0, -1):
        a, b = rows[i - 1].get("harness_version"), rows[i].get("harness_version")
        if a is not None and b is not None and a != b:
            return i
    return None


def _renders(tmpl: str, prompt: str, question: Any) -> bool:
    """Does `prompt` look like `tmpl` applied to a question? Exactly, when the sample carries the
    question it was rendered from; else by the template's fixed text before and after it."""
    if isinstance(question, str):
        try:
            return prompt == tmpl.format(question=question)
        except (KeyError, IndexError, ValueError):
            return False
    prefix, suffix = tmpl.split("{question}", 1)
    return prompt.startswith(prefix) and prompt.endswith(suffix)


@detector("template_mismatch")
def template_mismatch(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The prompt template is broken. Three signatures: (a) recent samples' prompts do not contain
    the question they were rendered from; (b) they are not the
    template the controller knows applied to the sample's question (e.g. the '=' after the
    question is gone, or part of the question is cut off; samples without a question are checked
    for the template's fixed text before and after the question); (c) the malformed rate jumped
    right after a harness_version change in the metrics. Prompts and questions are only compared;
    their text never leaves this function."""
    rows = ev.metrics
    ch = _last_version_change(rows)
    seg = max((int(s.get("segment", 0)) for s in ev.samples), default=0)
    since = int(rows[ch].get("step", 0)) - 1 if ch is not None else -1
    # (a) prompts that do not carry their question whole: whatever the template, the policy cannot
    # answer what it was not shown (a format spec or a prompt limit that cuts the question, a field
    # left out); read from samples that carry the question they were rendered from
    asked = [s for s in ev.samples if isinstance(s.get("prompt"), str) and isinstance(s.get("question"), str)
             and s["question"] and int(s.get("segment", 0)) == seg and int(s.get("step", 0)) >= since]
    if len(asked) >= th.template_min_samples:
        lost = [s for s in asked if s["question"] not in s["prompt"]]
        frac = len(lost) / len(asked)
        if frac >= th.template_mismatch:
            return make_diagnosis(ev, "template_mismatch",
                                  f"{frac:.0%} of recent prompts do not contain their question whole",
                                  "critical",
                                  {"mode": "question_lost", "mismatch_fraction": frac, "samples_checked": len(asked),
                                   "mean_prompt_len": mean_of([len(s["prompt"]) for s in lost]),
                                   "mean_question_len": mean_of([len(s["question"]) for s in lost]),
                                   "first_bad_step": min(int(s.get("step", 0)) for s in lost),
                                   "harness_changed_at_step": int(rows[ch].get("step", 0)) if ch is not None else None,
                                   "threshold": th.template_mismatch})
    tmpl = known_template(ev, known)
    if tmpl and "{question}" in tmpl:
        recent = [s for s in ev.samples if isinstance(s.get("prompt"), str)
                  and int(s.get("segment", 0)) == seg and int(s.get("step", 0)) >= since]
        if len(recent) >= th.template_min_samples:
            bad = [s for s in recent if not _renders(tmpl, s["prompt"], s.get("question"))]
            frac = len(bad) / len(recent)
            if frac >= th.template_mismatch:
                prefix, suffix = tmpl.split("{question}", 1)
                exact = sum(isinstance(s.get("question"), str) for s in recent)
                return make_diagnosis(ev, "template_mismatch",
                                      f"{frac:.0%} of recent prompts are not the known template applied to their question",
                                      "critical",
                                      {"mode": "prompt_shape", "mismatch_fraction": frac, "samples_checked": len(recent),
                                       "checked_against_question": exact,
                                       "expected_prefix_len": len(prefix), "expected_suffix_len": len(suffix),
                                       "mean_prompt_len": mean_of([len(s["prompt"]) for s in recent]),
                                       "first_bad_step": min(int(s.get("step", 0)) for s in bad),
                                       # the step the live harness changed, when the metrics show it (a
                                       # template broken from the start has no such step)
                                       "harness_changed_at_step": int(rows[ch].get("step", 0)) if ch is not None else None,
                                       "threshold": th.template_mismatch})
    if ch is not None and len(rows) - ch >= th.recent // 2 + 1 and ch >= 2:
        _, before = column(rows[max(0, ch - th.trailing) : ch], "malformed_rate")
        _, after = column(rows[ch:], "malformed_rate")
        if before and after and mean_of(after) - mean_of(before) >= th.malformed_jump:
            return make_diagnosis(ev, "template_mismatch",
                                  f"malformed rate rose from {mean_of(before):.0%} to {mean_of(after):.0%} right after the harness changed at step {rows[ch].get('step')}",
                                  "critical",
                                  {"mode": "malformed_after_harness_change", "change_step": rows[ch].get("step"),
                                   "malformed_before": before[-10:], "malformed_after": after[-10:],
                                   "threshold_jump": th.malformed_jump})
    return None


@detector("too_hard_curriculum")
def too_hard_curriculum(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """Nothing is solved (train pass rate ≤ `too_hard_pass_max`, held-out ≤ `too_hard_heldout_max`)
    while training runs at a difficulty above the eval difficulty, or right after the difficulty
    jumped by ≥ `too_hard_jump`: no reward signal, SFT targets far beyond the model. Critical: with
    nothing solved there is no learning signal at all, so the run cannot reach its target without a
    fix (as with a broken template); its fix shows on held-out only once the model learns again, so
    it gets the backtest's longer look when the first ones are unclear."""
    rows = ev.metrics
    if len(rows) < th.min_rows:
        return None
    _, pr = column(rows[-th.recent :], "pass_rate")
    if not pr or mean_of(pr) > th.too_hard_pass_max:
        return None
    held = ev.latest_eval("heldout_acc")
    if held is not None and held > th.too_hard_heldout_max:
        return None
    _, diffs = column(rows[-(th.trailing + th.recent) :], "difficulty")
    if not diffs:
        return None
    d_now = int(diffs[-1])
    d_eval = eval_difficulty(ev, known)
    jumped = d_now - int(min(diffs)) >= th.too_hard_jump and int(diffs[0]) < d_now
    if d_eval is not None and d_now > d_eval:
        mode = "above_eval"
    elif jumped:
        mode = "jumped"
    else:
        return None
    return make_diagnosis(ev, "too_hard_curriculum",
                          f"pass rate {mean_of(pr):.2f} at training difficulty {d_now} (eval difficulty {d_eval}, held-out {held})",
                          "critical", {"mode": mode, "train_difficulty": d_now, "eval_difficulty": d_eval,
                           "window_min_difficulty": int(min(diffs)), "pass_rate_recent": pr, "heldout_acc": held,
                           "threshold_pass": th.too_hard_pass_max, "threshold_heldout": th.too_hard_heldout_max})


@detector("low_temperature")
def low_temperature(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """GRPO/distill: in most groups the policy fails, the completions sampled for one prompt are
    identical (or entropy ≈ 0 with reward_std 0): sampling is (near) greedy, so a failing group
    has no variance and no advantage. Groups the policy solves may well agree; they do not count.
    Compares completions for equality only."""
    if algorithm(ev) not in ("grpo", "distill"):
        return None
    seg = max((int(s.get("segment", 0)) for s in ev.samples), default=0)
    groups: dict[tuple[int, str], list[tuple[str, bool]]] = {}
    for s in ev.samples:
        if int(s.get("segment", 0)) == seg and isinstance(s.get("completion"), str):
            groups.setdefault((int(s.get("step", 0)), str(s.get("uid", ""))), []).append(
                (s["completion"], s.get("verdict") == "correct"))
    multi = [g for g in groups.values() if len(g) >= 2 and not all(ok for _, ok in g)]  # failing groups
    identical = sum(len({c for c, _ in g}) == 1 for g in multi)
    rows = current_rows(ev)[-th.recent :]
    (_, pr), (_, ent), (_, rstd) = (column(rows, k) for k in ("pass_rate", "entropy", "reward_std"))
    passing = mean_of(pr) if pr else 0.0
    if passing >= th.low_temp_pass_max:
        return None
    frac = identical / len(multi) if multi else 0.0
    by_groups = len(multi) >= th.low_temp_min_groups and frac >= th.low_temp_identical
    by_entropy = bool(ent) and bool(rstd) and mean_of(ent) < th.entropy_min and max(rstd) == 0.0
    if not (by_groups or by_entropy):
        return None
    return make_diagnosis(ev, "low_temperature",
                          f"{identical} of {len(multi)} failing sampled groups are identical completions (pass rate {passing:.2f})",
                          "warning", {"identical_groups": identical, "groups": len(multi), "identical_fraction": frac,
                           "pass_rate_recent": passing, "entropy_recent": ent, "reward_std_recent": rstd,
                           "threshold_identical": th.low_temp_identical, "threshold_min_groups": th.low_temp_min_groups})


@detector("label_noise")
def label_noise(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """SFT whose targets disagree with right answers, seen either way the evidence allows (no
    token-level accuracy is logged), while the policy's own greedy answers are right a fair share of
    the time (pass rate or held-out ≥ `label_noise_pass_min`):
    - **the targets changed** (`labels_changed`): the loss of the latest `label_noise_rows` rows is
      at least `label_shift_ratio`× (and `label_shift_abs` above) the lowest median of as many
      earlier rows of the same segment, difficulty, harness and recipe version, while held-out
      accuracy is no more than `departure_harm` below its value then. Same data, same config, same
      answers, a loss that rose and stays up: what the policy is trained towards is not what it
      answers. (A curriculum step, a harness or recipe edit, a rollback each start a new level to
      compare with; a loss that rose because the policy got worse fails the accuracy check.) The
      evidence names the step whose data the first row at the raised level trained on, counted
      from the low block's start (`good_before_step`): the data before it was as in that block.
    - **a high flat floor**: the loss sits flat at ≥ `label_noise_floor` nats/token (<
      `label_noise_rel` relative improvement over `label_noise_rows` rows) and held-out accuracy
      has stopped improving over the last `label_noise_heldout_evals` evals (a healthy run whose
      loss pauses while accuracy still climbs is not noisy), and not credibly below the policy's
      loss on the task's own answers to the held-out questions (`answer_loss`, where evals write it
      at the training difficulty; a run that writes it waits for an eval of the current segment and
      harness version): labels noisy from the start. A policy that fits its training
      targets credibly better than the task's answers has not carried what it learnt to new
      questions (a slow learner, a memorised pool) or has learnt a systematic error of its labels:
      the floor cannot tell these apart, so it names none of them (`labels_fail_check` names the
      last where the task checks its labels).
    Where the trainer checks its labels (`label_ok`, `labels_fail_check`) and the task's verifier
    accepts at least `label_ok_min` of the newest `recent` rows' labels, the labels are right: a
    high loss has another cause (a memorised pool, questions the policy reads wrongly), and no
    finding is made."""
    if algorithm(ev) != "sft":
        return None
    _, checked = column(current_rows(ev)[-th.recent :], "label_ok", skip_eval=True, finite=True)
    if checked and mean_of(checked) >= th.label_ok_min:
        return None
    _, pr = column(ev.metrics[-th.label_noise_rows :], "pass_rate")
    held = ev.latest_eval("heldout_acc")
    right = max(mean_of(pr) if pr else 0.0, held or 0.0)
    if right < th.label_noise_pass_min:
        return None
    shift = labels_changed(ev, th)
    if shift is not None:
        return make_diagnosis(ev, "label_noise",
                              f"SFT loss rose to {shift['loss_now']:.3g} nats/token from {shift['loss_low']:.3g} on the same "
                              f"data and config while the policy answers {right:.0%} correctly: the targets changed",
                              "warning", dict(shift, heldout_acc=held, pass_rate_recent=pr[-th.recent :],
                                              good_before_step=shift["rose_at_step"] - 1,
                                              threshold_ratio=th.label_shift_ratio, threshold_abs=th.label_shift_abs,
                                              threshold_pass=th.label_noise_pass_min))
    halves = loss_halves(ev, th.label_noise_rows)
    if halves is None:
        return None
    loss, a, b, rel = halves
    evals = [v for v in (to_float(r.get("heldout_acc")) for r in ev.evals) if is_finite(v)]
    k = th.label_noise_heldout_evals
    stalled = len(evals) > k and max(evals[-k:]) - max(evals[:-k]) < th.plateau_min_delta
    answers = answer_loss(ev, known, th, loss[len(loss) // 2 :])
    fits = answers is not None and answers["fits"] is not False     # fits the answers, or no eval to tell yet
    if b >= th.label_noise_floor and rel < th.label_noise_rel and stalled and not fits:
        return make_diagnosis(ev, "label_noise",
                              f"SFT loss flat at {b:.3g} nats/token while the policy answers {right:.0%} correctly: targets disagree with right answers",
                              "warning",
                              {"loss_first_half_median": a, "loss_second_half_median": b, "relative_improvement": rel,
                               "pass_rate_recent": pr[-th.recent :], "heldout_acc": held,
                               "heldout_loss": answers and answers["heldout_loss"],
                               "threshold_floor": th.label_noise_floor, "threshold_rel": th.label_noise_rel,
                               "threshold_pass": th.label_noise_pass_min})
    return None


def answer_loss(ev: Evidence, known: Known, th: Thresholds, floor: list[float]) -> dict[str, Any] | None:
    """The policy's loss on the task's own answers to the held-out questions (`heldout_loss`) at the
    newest eval of the current segment and harness version, where the training rows of the floor
    (`floor`: their latest losses) train at the difficulty held-out evals run at, so both losses are
    of the same answers rendered alike. None where they are of other answers (another difficulty) or
    the run writes no such loss. `fits`: the training floor lies more than `label_answers_z`
    standard errors (the eval's and the floor's) below it — the policy fits its targets better than
    the task's answers; None while the run writes the loss but no eval of these rows has yet (a
    segment or a harness version just begun): nothing to compare with until the next one."""
    rows = current_rows(ev)
    if not rows or not floor or not any(is_finite(to_float(r.get("heldout_loss"))) for r in ev.evals):
        return None
    ed = eval_difficulty(ev, known)
    if ed is not None and any(r.get("difficulty") not in (None, ed) for r in rows[-len(floor):]):
        return None
    seg, hv = rows[-1].get("segment", 0), rows[-1].get("harness_version")
    row = next((r for r in reversed(ev.evals) if r.get("segment", 0) == seg and r.get("harness_version") == hv
                and is_finite(to_float(r.get("heldout_loss")))), None)
    if row is None:
        return {"heldout_loss": None, "se": None, "fits": None}
    h, h_se = float(row["heldout_loss"]), to_float(row.get("heldout_loss_se"))
    b = median_of(floor)
    spread = statistics.stdev(floor) if len(floor) > 1 else 0.0
    se = math.sqrt((h_se if is_finite(h_se) else 0.0) ** 2 + spread ** 2 / len(floor))
    return {"heldout_loss": h, "se": se, "fits": b + th.label_answers_z * se < h}


@detector("labels_fail_check")
def labels_fail_check(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """SFT labels the task's own verifier rejects: the mean `label_ok` (the share of a step's labels
    that, written as the harness writes a target and read back as it reads a completion, the
    task's verifier accepts against the answer it works out from the question) over the last
    `recent` rows of the current SFT training is below `label_ok_min`. Right labels pass every
    time; a data source that corrupts some of them, or writes them in another format, does not.
    With the label check filter on, the finding is reported (info): the step trains on those that
    pass. A trainer that does not check its labels (a foreign one, a task verified in a sandbox or
    whose answers only the data holds) gives nothing to read. Where labels passed before, the
    evidence names the first step whose labels failed (`good_before_step`)."""
    if algorithm(ev) != "sft":
        return None
    steps, ok = column(current_rows(ev), "label_ok", skip_eval=True, finite=True)
    if len(ok) < th.recent:
        return None
    now = mean_of(ok[-th.recent:])
    if now >= th.label_ok_min:
        return None
    # the onset: the first row of the newest run of rows below the bound (within the recent window
    # at the latest: a passing newest row leaves the mean below it)
    i = len(ok) - th.recent
    while i > 0 and ok[i - 1] < th.label_ok_min:
        i -= 1
    while ok[i] >= th.label_ok_min:
        i += 1
    before = mean_of(ok[max(0, i - th.trailing):i]) if i else None
    filtered = bool(((ev.harness or {}).get("filters") or {}).get("check_labels"))
    return make_diagnosis(
        ev, "labels_fail_check", f"{1 - now:.0%} of recent SFT labels fail the task's own check"
        + (f" (from {1 - before:.0%} before step {steps[i]})" if before is not None else " since the first checked step")
        + ("; the label check filter trains on those that pass" if filtered else ""),
        "info" if filtered else "warning",
        {"label_ok_recent": ok[-th.recent:], "label_ok_mean": now, "label_ok_before": before,
         "onset_step": steps[i], "filter_on": filtered, "threshold_label_ok": th.label_ok_min,
         # row s is the update on step s - 1's data: the first step whose labels went wrong
         **({"good_before_step": steps[i] - 1} if before is not None else {})})


def labels_changed(ev: Evidence, th: Thresholds) -> dict[str, Any] | None:
    """The loss's rise on unchanged data and config (`label_noise` above): the median loss of the
    latest `label_noise_rows` rows against the lowest median of as many earlier rows of the same
    segment, difficulty, harness and recipe version (consecutive blocks, newest aligned), with the
    held-out accuracy then and now; None when it did not rise that far, accuracy fell, or no
    earlier block is comparable."""
    n = th.label_noise_rows

    def key(r: dict[str, Any]) -> tuple:
        return r.get("segment"), r.get("difficulty"), r.get("harness_version"), r.get("recipe_version")

    rows = [r for r in current_rows(ev) if not r.get("final") and not r.get("skipped") and is_finite(to_float(r.get("loss")))]
    if len(rows) < 2 * n or len({key(r) for r in rows[-n:]}) != 1:
        return None
    k = key(rows[-1])
    now = median_of([float(r["loss"]) for r in rows[-n:]])
    starts = range(len(rows) - 2 * n, -1, -n)       # consecutive blocks before the newest, newest aligned
    low = min(((median_of([float(r["loss"]) for r in rows[i : i + n]]), int(rows[i + n - 1]["step"]), i) for i in starts
               if all(key(r) == k for r in rows[i : i + n])), default=None)
    if low is None or not (now >= th.label_shift_ratio * low[0] and now - low[0] >= th.label_shift_abs):
        return None
    # where it rose: the first row from the low block's start at the bound (a change in the block's
    # second half leaves its median low), so the data before that row's step was as in the low block
    bound = max(th.label_shift_ratio * low[0], low[0] + th.label_shift_abs)
    rose = next((int(r["step"]) for r in rows[low[2]:] if float(r["loss"]) >= bound), low[1] + 1)
    then = [to_float(r.get("heldout_acc")) for r in ev.evals if int(r.get("step", 0)) <= low[1]]
    then = [v for v in then if is_finite(v)]
    acc_now = ev.latest_eval("heldout_acc")
    if then and acc_now is not None and acc_now < then[-1] - th.departure_harm:
        return None
    return {"loss_now": now, "loss_low": low[0], "low_at_step": low[1], "rose_at_step": rose,
            "heldout_then": then[-1] if then else None, "rows": n, "difficulty": k[1]}


@detector("harder_data")
def harder_data(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The training questions got longer while the difficulty the curriculum asks for, the harness
    and the recipe stayed the same (one segment), and the train pass rate fell with them: the data
    stream draws harder problems than the curriculum says (a shifted source, a sampler changed
    upstream). Block against block of `shift_rows` steps with samples: the newest block's median
    question length at least `shift_len_ratio`x the shortest earlier block's of the same config, and
    its median pass rate at least `shift_pass_drop` below that block's. The lengths are the rows' mean
    of each step's batch (`question_chars`) where the trainer logs it, else the sampled questions'. A shift before anything was
    learnt has no fall to show and may have no earlier block: where the controller knows the task's
    own question lengths (`known.question_chars`), the newest block is also held against the task's
    length at the difficulty asked for — at least `shift_len_ratio`x it, and nearest the length of
    a higher difficulty. Where the questions were shorter at the segment's first sampled steps, the
    evidence names the first step whose data may have changed (`good_before_step`: the first of
    `shift_rows` steps whose median length is that much longer, at or before the change)."""
    rows = [r for r in current_rows(ev) if not r.get("final") and isinstance(r.get("step"), int)]
    if not rows:
        return None

    def key(r: dict[str, Any]) -> tuple:
        return r.get("segment", 0), r.get("difficulty"), r.get("harness_version"), r.get("recipe_version")

    k, n = key(rows[-1]), th.shift_rows
    by_step = {r["step"]: r for r in rows if key(r) == k}
    # keyed by the step whose data it is: row s + 1 is the update on step s's batch, and the samples
    # written at step s come from it. The rows' per-step mean covers every step of the metrics'
    # window; the sampled questions, where a trainer does not log it, only the newest few hundred
    lengths: dict[int, list[float]] = {s - 1: [float(r["question_chars"])] for s, r in by_step.items()
                                       if is_finite(to_float(r.get("question_chars")))}
    batch_means = len(lengths) >= n
    if not batch_means:
        lengths = {}
        for q in ev.questions:
            s = q.get("step")
            if isinstance(s, int) and isinstance(q.get("question"), str) and int(q.get("segment") or 0) == k[0] \
                    and s + 1 in by_step:
                lengths.setdefault(s, []).append(len(q["question"]))
    steps = sorted(lengths)
    if len(steps) < n:
        return None

    def block(ss: list[int]) -> tuple[float, float | None]:
        pr = [to_float(by_step[s + 1].get("pass_rate")) for s in ss]
        pr = [x for x in pr if x is not None and math.isfinite(x)]
        return median_of([x for s in ss for x in lengths[s]]), (median_of(pr) if pr else None)

    def rose_from(ref: float, after: int) -> dict[str, int]:
        # the first window (from index `after`) of `n` steps whose median length is shift_len_ratio x
        # `ref`: one half across the change is already that long, so the change is in it or before.
        # A step's batch mean is exact enough to name the window's first step at the bound, each step
        # before it below; a few sampled questions are not, and the window's first step is named.
        # Only a step with one of the stream's own before it: long from the first is no change seen
        bound = th.shift_len_ratio * ref
        for j in range(after, len(steps) - n + 1):
            if median_of([x for s in steps[j : j + n] for x in lengths[s]]) >= bound:
                i = next(i for i in range(j, j + n) if lengths[steps[i]][0] >= bound) if batch_means else j
                return {"good_before_step": steps[i]} if i > 0 else {}
        return {}

    now_len, now_pass = block(steps[-n:])
    if len(steps) >= 2 * n:
        earlier = [(block(steps[i : i + n]), i) for i in range(0, len(steps) - 2 * n + 1, n)]
        (then_len, then_pass), at = min(earlier, key=lambda b: b[0][0])
        if now_pass is not None and then_pass is not None and now_len >= th.shift_len_ratio * then_len \
                and then_pass - now_pass >= th.shift_pass_drop:
            return make_diagnosis(ev, "harder_data",
                                  f"training questions grew from {then_len:.3g} to {now_len:.3g} characters at difficulty "
                                  f"{k[1]} with the config unchanged, and the train pass rate fell from {then_pass:.2f} to "
                                  f"{now_pass:.2f}: the data stream draws harder problems than the curriculum asks for",
                                  "warning",
                                  {"difficulty": k[1], "question_chars_then": then_len, "question_chars_now": now_len,
                                   "pass_rate_then": then_pass, "pass_rate_now": now_pass, "steps_per_block": n,
                                   "threshold_len_ratio": th.shift_len_ratio, "threshold_pass_drop": th.shift_pass_drop,
                                   **rose_from(then_len, at)})
    task, asked = known.question_chars or {}, k[1]
    if not (isinstance(asked, int) and task.get(asked, 0) > 0 and now_len >= th.shift_len_ratio * task[asked]):
        return None
    drawn = min(task, key=lambda x: (abs(task[x] - now_len), x))
    if drawn <= asked:
        return None
    return make_diagnosis(ev, "harder_data",
                          f"training questions are {now_len:.3g} characters long (median of the last {n} steps) at "
                          f"difficulty {asked}, where the task's own are {task[asked]:.3g}: as long as its difficulty "
                          f"{drawn}. The data stream draws harder problems than the curriculum asks for", "warning",
                          {"difficulty": asked, "question_chars_now": now_len, "task_question_chars": task[asked],
                           "nearest_task_difficulty": drawn, "pass_rate_now": now_pass, "steps_per_block": n,
                           "threshold_len_ratio": th.shift_len_ratio, **rose_from(task[asked], 0)})


def _sampled(ev: Evidence, field: str) -> dict[int, set[str]]:
    """The distinct `field` texts (question, completion) of each sampled step of the newest segment
    of `ev.questions` (a GRPO group's completions share one question: counted once)."""
    seg = max((int(q.get("segment") or 0) for q in ev.questions), default=0)
    per_step: dict[int, set[str]] = {}
    for q in ev.questions:
        if int(q.get("segment") or 0) == seg and isinstance(q.get(field), str) and isinstance(q.get("step"), int):
            per_step.setdefault(q["step"], set()).add(q[field])
    return per_step


def _foreign(per_step: dict[int, set[str]], alphabet: set[str], th: Thresholds) -> dict[str, Any] | None:
    """Texts written in characters outside `alphabet`: of the distinct texts of the newest
    `shift_rows` sampled steps, at least `format_share` carry such a character, and so do the newest
    step's. The share, the characters, and where the segment's earlier sampled steps were in the
    alphabet, the first step of the newest stretch that is not (`good_before_step`), where that
    stretch is at least half a window long: a stream that alternates has no step to go back to.
    None otherwise."""
    steps, n = sorted(per_step), th.shift_rows
    if not alphabet or len(steps) < n:
        return None

    def odd(ss: list[int]) -> float:
        texts = [t for s in ss for t in per_step[s]]
        return sum(not set(t) <= alphabet for t in texts) / len(texts)

    share = odd(steps[-n:])
    # the newest sampled step in the alphabet: the source writes it again (a pin in force while the
    # window still holds the older texts)
    if share < th.format_share or odd(steps[-1:]) < th.format_share:
        return None
    i = len(steps)
    while i > 0 and odd([steps[i - 1]]) >= th.format_share:
        i -= 1
    return {"share": share, "chars": "".join(sorted({c for s in steps[-n:] for t in per_step[s] for c in t} - alphabet)),
            **({"good_before_step": steps[i]} if i > 0 and len(steps) - i >= n // 2 else {})}


@detector("question_format")
def question_format(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The training questions are written in another format than the task's own: of the distinct
    questions sampled over the newest `shift_rows` sampled steps of the current segment, at least
    `format_share` carry a character none of the task's own training questions uses at any
    difficulty (`known.question_alphabet`, measured from the task by the controller). A changed
    export or parser rewrites every question it hands over (a prefix, a delimiter, a spacing, a
    markup); a character the task's probes missed shows in a few. Where the segment's earlier sampled
    steps had their questions in the task's own characters, the evidence names the first step of the
    newest stretch that has not, where that stretch is at least half a window long
    (`good_before_step`): the data changed there, and its source can be read as it was before (a
    warning). No such step in the evidence: reported (info, `info_without_onset`), unless an earlier
    look named one (`Deciding.with_onsets` keeps it, and the finding is a warning again). The newest sampled step in
    the task's own characters: nothing (the source writes them again)."""
    found = _foreign(_sampled(ev, "question"), set(known.question_alphabet or ""), th)
    if found is None:
        return None
    onset = {k: found[k] for k in ("good_before_step",) if k in found}
    since = f" since step {onset['good_before_step']}" if onset else ""
    return make_diagnosis(ev, "question_format",
                          f"{found['share']:.0%} of the training questions sampled over the last {th.shift_rows} steps carry "
                          f"characters the task's own questions never use ({found['chars']!r}){since}: the data source "
                          "writes its questions in another format", "warning" if onset else "info",
                          {"odd_share": found["share"], "new_chars": found["chars"], "steps": th.shift_rows,
                           "threshold_share": th.format_share, **(onset or {"info_without_onset": True})})


@detector("answer_format")
def answer_format(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The SFT labels are written in another format than the task's answers, seen in what the
    policy learnt from them: of the distinct completions sampled over the newest `shift_rows`
    sampled steps of the current segment, at least `format_share` carry a character that no answer
    of the task (`known.answer_alphabet`, measured from the task by the controller) nor the live
    harness's answer prefix and stop use, and the segment's earlier sampled steps were written in
    those characters. A policy imitates its labels: a data source that writes them with a prefix, a
    delimiter or a spacing is written back by the policy within steps, which the task's scorer then
    rejects. The policy writes them back some steps after they changed: where the SFT loss jumped
    (`spike_ratio` × the rows before) within `scan` rows before the first step of the newest stretch
    written otherwise, the evidence names the step of the jump (`good_before_step`: unfamiliar
    targets raise the loss at once), and the steps since learnt them (a warning). With no jump, or
    a policy that never wrote in the task's characters (an untrained one writes any of its
    alphabet), no step is named: reported (info, `info_without_onset`), unless an earlier look
    named one (`Deciding.with_onsets` keeps it once the samples have moved past the change). SFT
    only: an RL policy explores, and distillation reads no label."""
    if algorithm(ev) != "sft" or not known.answer_alphabet:
        return None
    fmt = (ev.harness or {}).get("answer") or {}
    alphabet = set(known.answer_alphabet) | set(str(fmt.get("prefix") or "")) | set(str(fmt.get("stop") or ""))
    found = _foreign(_sampled(ev, "completion"), alphabet, th)
    if found is None:
        return None
    written, ratio, onset = found.get("good_before_step"), 0.0, None
    if written is not None:
        # the policy writes a new format back some steps after its labels changed; where they
        # changed, the loss jumped (unfamiliar targets): the largest jump over the `scan` rows up
        # to the completions' change (a sample of step k is written after step k's update, row
        # k + 1), if it is one (`spike_ratio` × the median of the `recent` rows before it), names
        # the first step whose labels changed (row s is the update on step s - 1's data)
        rows = [r for r in current_rows(ev) if not r.get("skipped") and is_finite(to_float(r.get("loss")))
                and int(r.get("step", 0)) <= written + 1]
        jumps = [(float(rows[k]["loss"]) / base, int(rows[k]["step"]) - 1)
                 for k in range(max(th.recent, len(rows) - th.scan), len(rows))
                 if (base := median_of([float(r["loss"]) for r in rows[k - th.recent:k]])) > 0]
        ratio, jumped = max(jumps, default=(0.0, None))
        onset = jumped if jumped is not None and ratio >= th.spike_ratio and jumped >= 1 else None
    since = (f" since step {written}, after the loss jumped {ratio:.1f}x at step {onset + 1}" if onset is not None
             else f" since step {written}, with no jump of the loss to say when the labels changed" if written is not None
             else "")
    return make_diagnosis(ev, "answer_format",
                          f"{found['share']:.0%} of the policy's completions sampled over the last {th.shift_rows} steps carry "
                          f"characters the task's answers never use ({found['chars']!r}){since}: the labels it trains on are "
                          "written in another format", "warning" if onset is not None else "info",
                          {"odd_share": found["share"], "new_chars": found["chars"], "steps": th.shift_rows,
                           "threshold_share": th.format_share, "written_since_step": written,
                           "loss_jump": ratio if onset is not None else None,
                           **({"good_before_step": onset} if onset is not None else {"info_without_onset": True})})


@detector("repeated_examples")
def repeated_examples(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The training stream repeats itself: of the newest `repeat_window` questions sampled in the
    current segment (each step's distinct questions: the completions of a GRPO group share one), at
    least `repeat_share` were already sampled at an earlier step of the window.
    A stream drawn from a large question space almost never repeats within a few hundred samples;
    one stuck on a small pool (a duplicated shard, a loader that restarts its file) repeats most, and
    the policy memorises the pool instead of the task. Only while the harness does not dedupe.
    Where the segment's sampled steps went from questions sampled at no other step to questions
    that recur, the evidence names the step the stream began to repeat (`good_before_step`,
    `repeat_onset`): the data changed there, and its source can be read as it was before. A stream
    that repeated from its first sampled step names none."""
    if ((ev.harness or {}).get("filters") or {}).get("dedupe"):
        return None
    per_step = _sampled(ev, "question")
    items = [q for step in sorted(per_step) for q in sorted(per_step[step])][-th.repeat_window:]
    if len(items) < th.repeat_window:
        return None
    seen: set[str] = set()
    repeats = 0
    for q in items:
        repeats += q in seen
        seen.add(q)
    share = repeats / len(items)
    if share < th.repeat_share:
        return None
    began = repeat_onset(per_step, th.repeat_share, th.shift_rows // 2)
    since = f" since step {began}" if began is not None else ""
    return make_diagnosis(ev, "repeated_examples",
                          f"{repeats} of the last {len(items)} sampled training questions were sampled before "
                          f"({len(seen)} distinct){since}: the data stream repeats a small pool", "warning",
                          {"questions": len(items), "distinct": len(seen), "repeated_share": share,
                           "threshold_share": th.repeat_share, "window": th.repeat_window,
                           **({"good_before_step": began} if began is not None else {})})


LEAN = 2   # steps a repeating stream's onset may be named before its change point (never after)


def repeat_onset(per_step: dict[int, set[str]], share: float, least: int) -> int | None:
    """The sampled step a stream began to repeat at: each step scores the share of its distinct
    questions sampled at some other step too, and the onset is the step from which the scores,
    less `share`, sum the most (the change point of a shift in their mean), or the earliest of the
    LEAN steps before it whose sum comes within one step's range (1) of that. Named only where at
    least `least` sampled steps come before it and they score below `share` on average: questions
    that recurred throughout show no step they began at."""
    steps = sorted(per_step)
    count: dict[str, int] = {}
    for s in steps:
        for q in per_step[s]:
            count[q] = count.get(q, 0) + 1
    score = [sum(count[q] > 1 for q in per_step[s]) / len(per_step[s]) - share for s in steps]
    tails, tail = [], 0.0
    for i in range(len(steps) - 1, -1, -1):
        tail += score[i]
        tails.append(tail)
    tails.reverse()               # tails[i]: the sum of the scores from step i on
    if not tails:
        return None
    best = max(tails)
    top = tails.index(best)
    if top < least or sum(score[:top]) >= 0:
        return None
    # up to LEAN steps earlier, the earliest whose sum is within one step's score range of the
    # best: a first pool step that drew fresh questions must not move the onset past it (a pin
    # after the change reads the changed source); a step early reads the source a step sooner
    return steps[next(i for i in range(max(0, top - LEAN), top + 1) if tails[i] >= best - 1.0)]


def comparable_tail(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest rows whose losses compare with each other: of the latest segment (a rollback or
    resume restarts the weights' history) and at the latest training difficulty (a curriculum that
    moves changes what the loss is measured on: during a ramp it may rise while the run learns)."""
    rows = [r for r in rows if "loss" in r]   # training rows (an eval row carries no loss or difficulty)
    if not rows:
        return []
    last = rows[-1]
    i = len(rows)
    while i > 0 and rows[i - 1].get("segment") == last.get("segment") and rows[i - 1].get("difficulty") == last.get("difficulty"):
        i -= 1
    return rows[i:]


@detector("not_learning")
def not_learning(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The run is not learning at all: over at least `not_learning_rows` steps whose losses compare
    (`comparable_tail`: one segment, one training difficulty; the newest `not_learning_rows` of them
    where the loss rose `spike_ratio`× above its first row's, a blow-up it fell back from) the loss's recent median is within
    `not_learning_rel` of its median at their start, and held-out accuracy is
    still ≤ `not_learning_heldout_max`. With no spike to roll back to, the usual cause is a
    learning rate far too high (Adam bouncing) or far too low; the evidence carries the lr. SFT and
    distill only (a warm-up's SFT rows apart from the GRPO after it): the GRPO surrogate sits near 0."""
    if algorithm(ev) not in ("sft", "distill"):
        return None
    rows = comparable_tail(current_rows(ev))
    steps, loss = column(rows, "loss", skip_skipped=True, finite=True)
    if len(loss) < th.not_learning_rows:
        return None
    # held-out accuracy measured in this segment: an eval from before a harness change (e.g. the
    # truncation just fixed) says nothing about whether the run learns now
    seg_start, seg = (steps[0] if steps else 0), rows[-1].get("segment")
    # a loss that rose above where it started (a blow-up of its first steps, an lr far too high)
    # and fell back from there: that fall is no learning, so the newest rows alone are judged
    if max(loss) >= th.spike_ratio * loss[0] and max(loss) - loss[0] >= th.spike_abs:
        loss = loss[-th.not_learning_rows:]
    n = max(5, th.not_learning_rows // 5)
    first, last = median_of(loss[:n]), median_of(loss[-n:])
    rel = (first - last) / max(abs(first), 1e-12)
    held = next((float(r["heldout_acc"]) for r in reversed(ev.evals) if r.get("step", -1) >= seg_start
                 and r.get("segment", seg) == seg
                 and isinstance(r.get("heldout_acc"), (int, float)) and math.isfinite(r["heldout_acc"])), None)
    if held is None:
        return None
    if rel < th.not_learning_rel and held <= th.not_learning_heldout_max:
        _, lr = column(rows, "lr")
        return make_diagnosis(ev, "not_learning",
                              f"loss {first:.3g} → {last:.3g} over {len(loss)} steps and held-out {held}: the run is not learning",
                              "warning",
                              {"loss_start_median": first, "loss_recent_median": last, "relative_improvement": rel,
                               "heldout_acc": held, "lr_now": lr[-1] if lr else None, "rows": len(loss),
                               "threshold_rel": th.not_learning_rel, "threshold_heldout": th.not_learning_heldout_max})
    return None
