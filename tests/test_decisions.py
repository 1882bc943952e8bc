"""The decision model (swarm/decisions.py) on tables of inputs: plan, decide, judge, risk, waste."""
from __future__ import annotations

import pytest

from agents.domain import Diagnosis, Intervention, InterventionKind as K, Outcome, Risk
from swarm.decisions import (ArmScore, Backtest, BacktestSpec, Extend, Facts, Look, Pair, Refuse, Rejected,
                             Rule, Skip, Validated, assign_risk, decide, outlook, plan, smaller_step,
                             schedule, worth_verifying, corroborated_by,
                             PERSIST_WITHIN, Sighting, persistence)
from swarm.judging import Control, Kept, Pending, RolledBack, Window, judge, wasted
from agents.progress import progress_since

SPEC = BacktestSpec(horizon_steps=40, seeds=(0, 1))


def iv(kind=K.RECIPE_EDIT, changes=None, diagnosis="loss_spike", risk=Risk.LOW):
    d = Diagnosis(name=diagnosis, summary="s", operator="o", policy="builtin")
    return Intervention(kind=kind, changes=changes or {}, diagnosis=d, rationale="r", operator="o", policy="builtin", risk=risk)


def facts(findings=(), risk=Risk.MEDIUM, **kw):
    return Facts(findings=frozenset(findings), risk=risk, spec=SPEC, **kw)


# ---- plan -------------------------------------------------------------------------------------

@pytest.mark.parametrize("proposal, f, want", [
    # a restart only for a job the detectors find dead or stale
    (iv(K.RESTART, diagnosis="crashed_job"), facts({"crashed_job"}), Skip),
    (iv(K.RESTART, diagnosis="stale_heartbeat"), facts({"stale_heartbeat"}), Skip),
    (iv(K.RESTART, diagnosis="stale_heartbeat"), facts(), Refuse),
    (iv(K.RESTART, diagnosis="crashed_job"), facts({"loss_spike"}), Refuse),
    (iv(K.RESTART, diagnosis="input_bound"), facts({"input_bound"}), Skip),      # a slow worker: no field, no weight moved
    (iv(K.RESTART, diagnosis="input_bound"), facts({"throughput_drop"}), Refuse),  # slower steps alone: contention too
    (iv(K.RESTART, diagnosis="plateau"), facts({"input_bound", "plateau"}), Refuse),   # a restart answers only its own finding
    (iv(K.RESTART, diagnosis="crashed_job"), facts({"input_bound"}), Refuse),
    (iv(K.RESTART, {"recipe.batch_size": 32}, diagnosis="out_of_memory"), facts({"crashed_job", "out_of_memory"}), Skip),
    # a divergence rollback skips the backtest only when a divergence is confirmed and the change is not high risk
    (iv(K.ROLLBACK, {"recipe.lr": 3e-3}), facts({"loss_spike"}), Skip),                  # back to the goal's lr
    (iv(K.ROLLBACK, {"recipe.lr": 3e-3}), facts({"nonfinite_loss"}), Skip),
    (iv(K.ROLLBACK), facts({"grad_norm_explosion"}), Skip),
    (iv(K.ROLLBACK, {"recipe.lr": 3e-4}), facts({"loss_spike"}, restores=False), Backtest),  # a new lr is a guess to test
    (iv(K.ROLLBACK, {"recipe.lr": 10}), facts(), Backtest),                       # false claim
    (iv(K.ROLLBACK, {"recipe.lr": 10}), facts({"loss_spike"}, risk=Risk.HIGH), Backtest),
    (iv(K.ROLLBACK, {"harness.template": "{question}="}, diagnosis="template_mismatch"), facts({"template_mismatch"}), Backtest),
    # a fix for a departure of the live config from what the controller set, going back to the goal's
    # values, skips only with that departure confirmed now
    (iv(K.ROLLBACK, {"recipe.lr": 3e-4}, "lr_drift"), facts({"lr_drift"}), Skip),
    (iv(K.HARNESS_EDIT, {"harness.sampling.temperature": 1.0}, "harness_drift"), facts({"harness_drift"}), Skip),
    (iv(K.ROLLBACK, {"recipe.lr": 3e-4}, "lr_drift"), facts(), Backtest),                          # claimed only
    (iv(K.ROLLBACK, {"recipe.lr": 3e-4}, "lr_drift"), facts({"harness_drift"}), Backtest),         # another departure
    (iv(K.ROLLBACK, {"recipe.lr": 1e-3}, "lr_drift"), facts({"lr_drift"}, restores=False, reverts=False), Backtest),   # a new lr
    # a departure's fix goes back to what the controller set (an applied fix's value, not the
    # goal's); a divergence rollback skips only going back to the goal's values
    (iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 9}, "harness_drift"), facts({"harness_drift"}, restores=False), Skip),
    (iv(K.ROLLBACK, {"recipe.lr": 3e-4}, "loss_spike"), facts({"loss_spike"}, reverts=False), Skip),
    (iv(K.HARNESS_EDIT, {"harness.sampling.temperature": 1.0}, "harness_drift"), facts({"harness_drift"}, risk=Risk.HIGH), Backtest),
        # the detectors find the lr left the recipe: setting the goal's lr again skips, whatever it claims
        (iv(K.RECIPE_EDIT, {"recipe.lr": 3e-4}, "not_learning"), facts({"not_learning", "lr_drift"}), Skip),
        (iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 8}, "truncation"), facts({"truncation", "harness_drift"}), Skip),
        (iv(K.RECIPE_EDIT, {"recipe.batch_size": 32}, "recipe_drift"), facts({"recipe_drift"}), Skip),
        (iv(K.RECIPE_EDIT, {"recipe.batch_size": 32}, "plateau"), facts({"lr_drift"}), Backtest),      # the lr left, not this
        (iv(K.ROLLBACK, {"recipe.lr": 3e-4, "harness.template": "Q"}, "lr_drift"), facts({"lr_drift"}), Backtest),  # half covered
        (iv(K.ROLLBACK, {}, "lr_drift"), facts({"lr_drift", "recipe_drift"}), Backtest),                  # sets nothing back
    # validity and no-ops come first, whatever the claim
    (iv(K.RESTART, diagnosis="crashed_job"), facts({"crashed_job"}, invalid="x"), Refuse),
    (iv(K.DATA_CHANGE, {"harness.curriculum.start": 0}), facts({"too_hard_curriculum"}, invalid="difficulty=0 outside [1, 8]"), Refuse),
    (iv(K.HARNESS_EDIT, {"harness.template": "{question}="}), facts(noop="already live"), Refuse),
    # a trusted skill's fix skips only with its diagnosis confirmed now
    (iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 8}, "truncation"), facts({"truncation"}, trusted="won 3"), Skip),
    (iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 8}, "truncation"), facts(trusted="won 3"), Backtest),
    (iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 8}, "truncation"), facts({"truncation"}), Backtest),
    # a fix retried after gains too small to tell: backtested (over longer horizons) until they run out
    (iv(K.DATA_CHANGE, {"harness.curriculum.start": 1}, "too_hard_curriculum"), facts(tries_without_gain=2), Backtest),
    (iv(K.DATA_CHANGE, {"harness.curriculum.start": 1}, "too_hard_curriculum"), facts(tries_without_gain=3), Refuse),
])
def test_plan(proposal, f, want):
    got = plan(proposal, f)
    assert isinstance(got, want), got
    assert isinstance(got, Refuse) and got.exhausted == (f.tries_without_gain > 2) or not isinstance(got, Refuse)
    if isinstance(got, Backtest):
        assert got.spec == SPEC
    else:
        assert got.reason


def test_an_invalid_change_names_the_trainers_reason():
    got = plan(iv(K.DATA_CHANGE, {"harness.curriculum.start": 0}), facts(invalid="difficulty=0 outside [1, 8]"))
    assert isinstance(got, Refuse) and "difficulty=0 outside [1, 8]" in got.reason


# ---- risk -------------------------------------------------------------------------------------

CUR = {"recipe.lr": 0.003, "recipe.batch_size": 64, "harness.sampling.max_new_tokens": 5, "harness.curriculum.start": 8,
       "harness.reward.verifier": "task", "recipe.algorithm": "sft", "harness.sampling.temperature": 0.05}
START = {"recipe.lr": 0.003, "harness.sampling.max_new_tokens": 5, "harness.curriculum.start": 2,
         "harness.reward.verifier": "task", "recipe.algorithm": "sft", "harness.sampling.temperature": 1.0}


@pytest.mark.parametrize("proposal, want", [
    (iv(K.RESTART, diagnosis="crashed_job", risk=Risk.HIGH), Risk.LOW),
    (iv(K.RESTART, {"recipe.batch_size": 32}, diagnosis="out_of_memory"), Risk.MEDIUM),   # rated as the change
    (iv(K.RESTART, {"recipe.lr": 10}, diagnosis="out_of_memory"), Risk.HIGH),
    (iv(K.ROLLBACK, {"recipe.lr": 10}, risk=Risk.LOW), Risk.HIGH),                 # 3333× up: the proposer's "low" is ignored
    (iv(K.RECIPE_EDIT, {"recipe.lr": 0.0003}), Risk.MEDIUM),                       # 10× down
    (iv(K.RECIPE_EDIT, {"recipe.lr": 1e-8}), Risk.HIGH),                           # 300000× down
    (iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 12}), Risk.MEDIUM),    # 2.4× up
    (iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 4096}), Risk.HIGH),
    (iv(K.HARNESS_EDIT, {"harness.sampling.temperature": 1.0}), Risk.MEDIUM),      # back to the goal's value: 20× up, restored
    (iv(K.HARNESS_EDIT, {"harness.reward.verifier": "digits_any_order"}), Risk.HIGH),
    (iv(K.HARNESS_EDIT, {"harness.reward.verifier": "task"}), Risk.MEDIUM),
    (iv(K.DATA_CHANGE, {"harness.curriculum.start": 2, "harness.curriculum.end": 2}), Risk.LOW),
    (iv(K.DATA_CHANGE, {"harness.curriculum.start": 7, "harness.curriculum.ramp_steps": 160}), Risk.LOW),
    (iv(K.DATA_CHANGE, {"harness.curriculum.start": 9}), Risk.MEDIUM),                # harder than now
    (iv(K.DATA_CHANGE, {"harness.filters.as_of_step": 40}), Risk.LOW),               # the source's revision: no value in force
    (iv(K.ROLLBACK, {"harness.filters.as_of_step": 40}), Risk.MEDIUM),
    (iv(K.DISTILL, {"recipe.algorithm": "distill"}), Risk.MEDIUM),
    (iv(K.RECIPE_EDIT, {"recipe.algorithm": "grpo"}), Risk.HIGH),
    (iv(K.RECIPE_EDIT, {"recipe.warmup_steps": 10}), Risk.HIGH),                   # no value in force to compare with
])
def test_risk_is_assigned_from_the_change(proposal, want):
    risk, why, cause = assign_risk(proposal, CUR, START)
    assert risk == want, why
    assert why and (cause != "") == (risk == Risk.HIGH)


@pytest.mark.parametrize("pin, want", [(20, Risk.LOW), (40, Risk.LOW), (80, Risk.MEDIUM), (None, Risk.MEDIUM)])
def test_a_later_revision_of_the_data_source_than_the_one_pinned_is_not_low(pin, want):
    """An earlier revision reads data from before the one in force; a later one, or unpinning, reads
    data the pin kept out."""
    proposal = iv(K.DATA_CHANGE, {"harness.filters.as_of_step": pin})
    assert assign_risk(proposal, {**CUR, "harness.filters.as_of_step": 40}, START).risk == want


# the goal's own starting config is the fault: nothing to go back to, so the model must stand on
# what can be undone and what was measured, not on "back to the start"
BAD_START = {"recipe.lr": 0.09, "recipe.batch_size": 3, "recipe.group_size": 4, "harness.sampling.temperature": 0.05, "harness.sampling.max_new_tokens": 3,
             "harness.reward.verifier": "digits_any_order", "harness.reward.format_bonus": 0.0, "recipe.algorithm": "grpo"}


@pytest.mark.parametrize("changes, validated_on, want, cause", [
    # a large move: high until a gain on held-out behaviour was measured, then reversible by the judge
    ({"harness.sampling.temperature": 1.0}, None, Risk.HIGH, "size"),
    ({"harness.sampling.temperature": 1.0}, "target", Risk.MEDIUM, ""),
    ({"harness.sampling.max_new_tokens": 16}, "held-out format failures", Risk.MEDIUM, ""),
    ({"harness.sampling.temperature": 1.0}, "training pass rate", Risk.HIGH, "size"),   # a training statistic only
    ({"harness.sampling.temperature": 1.0}, "SFT training loss", Risk.HIGH, "size"),
    ({"recipe.lr": 0.003}, None, Risk.MEDIUM, ""),                                       # 30× down: not large
    # more samples per update: the same expected update with less noise, its memory shown by its arm
    ({"recipe.batch_size": 96}, "SFT training loss", Risk.MEDIUM, ""),                  # 32× up
    ({"recipe.group_size": 32}, "training pass rate", Risk.HIGH, "size"),              # changes GRPO's advantages
    ({"recipe.batch_size": 96}, None, Risk.HIGH, "size"),                                # before any backtest
    ({"recipe.batch_size": 1}, "SFT training loss", Risk.MEDIUM, ""),                    # 3× down: not large
    # the objective: towards the task's own scoring is not a new objective; away from it is, measured or not
    ({"harness.reward.verifier": "task"}, None, Risk.MEDIUM, ""),
    ({"harness.reward.format_bonus": 0.3}, "target", Risk.HIGH, "objective"),
    ({"recipe.algorithm": "sft"}, "target", Risk.HIGH, "objective"),
    ({"recipe.algorithm": "distill"}, None, Risk.MEDIUM, ""),
])
def test_risk_of_fixing_a_wrong_starting_config(changes, validated_on, want, cause):
    got = assign_risk(iv(K.HARNESS_EDIT, changes), BAD_START, BAD_START, validated_on=validated_on)
    assert (got.risk, got.cause) == (want, cause), got.why


@pytest.mark.parametrize("algorithm, validated_on, want", [
    ("sft", "training pass rate", Risk.MEDIUM),     # no SFT update reads what the policy writes when sampled
    ("sft", "SFT training loss", Risk.MEDIUM),
    ("sft", None, Risk.HIGH),                      # before a backtest: its cost (evals, samples) not seen yet
    ("grpo", "training pass rate", Risk.HIGH),     # GRPO updates on what it samples
    ("distill", "training pass rate", Risk.HIGH),  # distillation trains on its verified samples
    (None, "training pass rate", Risk.HIGH),
])
def test_a_large_move_of_a_field_the_updates_never_read_is_not_high_once_validated(algorithm, validated_on, want):
    """An answer limit of 1 raised to 7 (7x) where the task's answers need 5 tokens: under SFT the
    updates train on the targets whole, so the limit changes what the evals and samples show, which
    the judge measures and undoes, and nothing in the weights."""
    proposal = iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 7})
    got = assign_risk(proposal, {"harness.sampling.max_new_tokens": 1}, {"harness.sampling.max_new_tokens": 1},
                      validated_on=validated_on, algorithm=algorithm)
    assert got.risk == want, got.why
    assert (got.cause == "size") == (want == Risk.HIGH)
    # the same move carried by a switch to distillation, which trains on the samples: read as the change trains
    both = iv(K.DISTILL, {"recipe.algorithm": "distill", "harness.sampling.max_new_tokens": 7})
    got = assign_risk(both, {"harness.sampling.max_new_tokens": 1, "recipe.algorithm": algorithm},
                      {"harness.sampling.max_new_tokens": 1}, validated_on=validated_on, algorithm=algorithm)
    assert (got.risk, got.cause) == (Risk.HIGH, "size"), got.why


@pytest.mark.parametrize("changes, current, want", [
    ({"harness.sampling.temperature": 1.0}, {"harness.sampling.temperature": 0.05}, {"harness.sampling.temperature": 0.15}),
    ({"harness.sampling.max_new_tokens": 64}, {"harness.sampling.max_new_tokens": 5}, {"harness.sampling.max_new_tokens": 15}),
    ({"recipe.lr": 1e-9}, {"recipe.lr": 0.01}, {"recipe.lr": 1e-5}),
    ({"recipe.lr": 1e-3, "harness.sampling.temperature": 1.0}, {"recipe.lr": 3e-3, "harness.sampling.temperature": 0.1},
     {"recipe.lr": 1e-3, "harness.sampling.temperature": 0.3}),     # only the field that moves too far is cut
    ({"recipe.lr": 1e-3}, {"recipe.lr": 3e-3}, None),                # nothing too large: no smaller step
    ({"harness.reward.verifier": "task"}, {"harness.reward.verifier": "digits_any_order"}, None),
])
def test_smaller_step_cuts_each_large_move_to_the_bound(changes, current, want):
    got = smaller_step(changes, current)
    assert got == want
    if got is not None:
        assert assign_risk(iv(K.HARNESS_EDIT, got), current, {}).risk != Risk.HIGH


# ---- decide -----------------------------------------------------------------------------------

def arm(t, ff=None, loss=None, loss_se=None, pr=None, pr_se=None):
    return ArmScore(target=t, format_fail=ff, loss=loss, loss_se=loss_se, pass_rate=pr, pass_se=pr_se)


def pairs(cand, ctrl, **kw):
    return [Pair(i, arm(c, **kw.get("c", {})), arm(k, **kw.get("k", {}))) for i, (c, k) in enumerate(zip(cand, ctrl))]


RULE = Rule(alpha=0.2, eval_size=200)


@pytest.mark.parametrize("name, ps, rule, want", [
    ("exact tie at zero", pairs([0.0, 0.0], [0.0, 0.0]), RULE, Rejected),
    ("tie at a high value", pairs([0.6, 0.6], [0.6, 0.6]), RULE, Rejected),
    ("no effect, noise both ways", pairs([0.41, 0.39], [0.40, 0.40]), RULE, Rejected),
    ("noisy small gains [0.05, 0.01]", pairs([0.55, 0.51], [0.50, 0.50]), RULE, Rejected),
    ("a harmful change", pairs([0.1, 0.12], [0.6, 0.58]), RULE, Rejected),
    ("a large gain", pairs([0.6, 0.62], [0.1, 0.12]), RULE, Validated),
    ("one seed, large gain", pairs([0.6], [0.1]), RULE, Validated),
    ("one seed, small gain", pairs([0.53], [0.5]), RULE, Rejected),
    ("one seed, a gain binomial noise alone would pass", pairs([0.56], [0.5]), RULE, Rejected),
    ("one seed, unclear, a seed left", pairs([0.58], [0.5]), Rule(eval_size=200, looks=2, look=1), Extend),
    ("one seed, clear harm, a seed left", pairs([0.2], [0.5]), Rule(eval_size=200, looks=2, look=1), Rejected),
    ("one seed, a little lower, a seed left", pairs([0.49], [0.5]), Rule(eval_size=200, looks=2, look=1), Extend),
    ("a little lower at the last look", pairs([0.49, 0.485], [0.5, 0.5]), Rule(eval_size=200, looks=2, look=2), Rejected),
    ("zero variance small gains", pairs([0.51, 0.51], [0.5, 0.5]), RULE, Rejected),
    ("zero variance large gains", pairs([0.8, 0.8], [0.5, 0.5]), RULE, Validated),
    ("a crashed control says nothing", pairs([0.6, 0.6], [None, None]), RULE, Rejected),
    ("inconclusive with a look left", pairs([0.02, 0.0], [0.0, 0.0]), Rule(eval_size=200, looks=2, look=1), Extend),
    ("inconclusive at the last look", pairs([0.02, 0.0], [0.0, 0.0]), Rule(eval_size=200, looks=2, look=2), Rejected),
])
def test_decide_on_the_target(name, ps, rule, want):
    got = decide(ps, rule)
    assert isinstance(got, want), (name, got)


def test_a_crashed_candidate_counts_as_worst():
    got = decide(pairs([None, None], [0.5, 0.5]), RULE)
    assert isinstance(got, Rejected) and "credibly worse" in got.reason


def test_one_seed_with_zero_spread_is_never_certain():
    got = decide(pairs([0.01], [0.0]), RULE)        # 2 of 200 vs 0 of 200 on one seed
    assert isinstance(got, Rejected)
    t = got.signals[0]
    assert 0.0 < t.p_gain < 1.0 and t.se > 0
    t = decide(pairs([0.03], [0.0]), RULE).signals[0]   # 6 vs 0: likely, not certain
    assert 0.0 < t.p_gain < 1.0 and t.se > 0


def test_secondary_signals_in_order():
    # the target ties at zero; the format-failure rate drops a lot: validated on it, and says so
    ps = pairs([0.0, 0.0], [0.0, 0.0], c={"ff": 0.1}, k={"ff": 0.9})
    got = decide(ps, RULE)
    assert isinstance(got, Validated) and got.signal.name == "held-out format failures"
    assert got.level == pytest.approx(1 - 0.2 / 2)
    # a lower SFT loss (same targets) decides when the format failures tie
    ps = pairs([0.0, 0.0], [0.0, 0.0], c={"ff": 0.0, "loss": 0.5, "loss_se": 0.01}, k={"ff": 0.0, "loss": 0.8, "loss_se": 0.01})
    got = decide(ps, Rule(eval_size=200, losses_compare=True))
    assert isinstance(got, Validated) and got.signal.name == "SFT training loss"
    # the same loss numbers do not count when the arms' losses do not compare
    assert isinstance(decide(ps, Rule(eval_size=200)), Rejected)
    # a secondary signal does not outweigh a target lower by more than one example on average
    ps = pairs([0.3, 0.3], [0.33, 0.33], c={"ff": 0.1}, k={"ff": 0.9})
    got = decide(ps, RULE)
    assert isinstance(got, Rejected) and "target lower" in got.reason
    # a credibly worse secondary signal rejects
    ps = pairs([0.0, 0.0], [0.0, 0.0], c={"ff": 0.9}, k={"ff": 0.1})
    assert isinstance(decide(ps, RULE), Rejected)


def test_more_signals_and_looks_raise_the_bar():
    ps = pairs([0.0, 0.0], [0.0, 0.0], c={"ff": 0.1, "loss": 0.5, "loss_se": 0.01, "pr": 0.2, "pr_se": 0.01},
               k={"ff": 0.9, "loss": 0.8, "loss_se": 0.01, "pr": 0.1, "pr_se": 0.01})
    got = decide(ps, Rule(alpha=0.2, eval_size=200, losses_compare=True, same_data=True, looks=2))
    assert isinstance(got, Validated) and got.level == pytest.approx(1 - 0.2 / 8)


# ---- judge ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, w, c, want, undo", [
    ("credible gain", Window(K.HARNESS_EDIT, 0.6, 100, 100), Control(0.1, 0.02, "backtest control"), Kept, None),
    ("no effect 0.0 → 0.0", Window(K.ROLLBACK, 0.0, 100, 100), Control(0.0, None, "before applying"), RolledBack, False),
    ("small noisy gain", Window(K.HARNESS_EDIT, 0.01, 100, 100), Control(0.0, 0.005, "backtest control"), RolledBack, False),
    ("harm", Window(K.ROLLBACK, 0.0, 100, 100), Control(0.74, None, "before applying"), RolledBack, True),
    # a fall while faults named before the change, which it does not answer, still hold the run:
    # a loss, left in force (their fixes go on); a gain is a gain whatever else holds the run
    ("harm with faults it does not answer", Window(K.DATA_CHANGE, 0.0, 100, 100, confounded=("harder_data",)),
     Control(0.3, 0.03, "candidate arms"), RolledBack, False),
    ("the same before the last look", Window(K.DATA_CHANGE, 0.0, 100, 100, confounded=("harder_data",), last_look=False),
     Control(0.3, 0.03, "candidate arms"), Pending, None),
    ("no noise, below, with such faults", Window(K.ROLLBACK, 0.0, 100, 100, confounded=("label_noise",)),
     Control(0.74, None, "before applying"), RolledBack, False),
    ("gain with such faults", Window(K.HARNESS_EDIT, 0.6, 100, 100, confounded=("harder_data",)),
     Control(0.1, 0.02, "backtest control"), Kept, None),
    ("no eval after", Window(K.RECIPE_EDIT, None, 100, 100), Control(0.5, None, "before applying"), RolledBack, False),
    ("restart that trained", Window(K.RESTART, None, 120, 100), Control(None, None, "a dead job"), Kept, None),
    ("restart that did not", Window(K.RESTART, None, 3, 100), Control(None, None, "a dead job"), RolledBack, False),
    # a slow job trains too: its restart is judged on its pace, not on steps
    ("slow worker restart, faster", Window(K.RESTART, None, 120, 100, pace_before=1.2, pace_after=0.3),
     Control(None, None, "a slow job"), Kept, None),
    ("slow worker restart, as slow", Window(K.RESTART, None, 120, 100, pace_before=1.2, pace_after=1.1),
     Control(None, None, "a slow job"), RolledBack, False),
])
def test_judge(name, w, c, want, undo):
    got = judge(w, c)
    assert isinstance(got, want), (name, got)
    if undo is not None:
        assert got.undo is undo


def test_judge_waits_for_a_later_window_while_inconclusive():
    w = Window(K.HARNESS_EDIT, 0.0, 100, 100, look=1, last_look=False)
    assert isinstance(judge(w, Control(0.0, 0.005, "backtest control")), Pending)
    # credible harm is undone at once, without waiting
    got = judge(Window(K.ROLLBACK, 0.0, 100, 100, look=1, last_look=False), Control(0.74, 0.03, "before applying"))
    assert isinstance(got, RolledBack) and got.undo
    # each later look needs more evidence (alpha / 2^look): 4 of 200 vs 0 is kept at the first, not the third
    assert isinstance(judge(Window(K.HARNESS_EDIT, 0.02, 100, 100, look=1), Control(0.0, 0.005, "c")), RolledBack)
    assert isinstance(judge(Window(K.HARNESS_EDIT, 0.03, 100, 100, look=1), Control(0.0, 0.005, "c")), Kept)
    assert isinstance(judge(Window(K.HARNESS_EDIT, 0.03, 100, 100, look=3, last_look=False), Control(0.0, 0.005, "c")), Pending)
    assert isinstance(judge(Window(K.RESTART, None, 20, 100, look=1, last_look=False), Control(None, None, "dead")), Pending)
    assert isinstance(judge(Window(K.RESTART, None, 20, 100, look=1, last_look=False, pace_before=1.2, pace_after=0.3),
                            Control(None, None, "slow")), Pending)
    # a restarted slow job that trained no step by the end of the run: no gain, judged
    got = judge(Window(K.RESTART, None, 0, 100, look=2, last_look=True, pace_before=1.2, pace_after=None), Control(None, None, "slow"))
    assert isinstance(got, RolledBack) and not got.undo


def test_a_fall_credible_only_at_alpha_is_undone_when_the_next_look_finds_it_too():
    """One eval's dip below the control is no reason to undo: a fall credible at 1 - alpha (here
    P(harm) about 0.87) waits one look and is undone when that look finds it credibly worse too; a
    fall credible at 1 - alpha/4 is undone at once, and so is any credible fall at the last look."""
    ctl = Control(0.5, 0.035, "before applying")
    first = judge(Window(K.DATA_CHANGE, 0.44, 100, 100, look=1, last_look=False), ctl)
    assert isinstance(first, Pending) and first.fell and "P(harm) = 0.8" in first.reason, first
    again = judge(Window(K.DATA_CHANGE, 0.44, 100, 100, look=2, last_look=False, fell=True), ctl)
    assert isinstance(again, RolledBack) and again.undo and "two looks" in again.reason, again
    back = judge(Window(K.DATA_CHANGE, 0.5, 100, 100, look=2, last_look=False, fell=True), ctl)
    assert isinstance(back, Pending) and not back.fell, back     # the dip did not last: no fall carried on
    last = judge(Window(K.DATA_CHANGE, 0.44, 100, 100, look=1, last_look=True), ctl)
    assert isinstance(last, RolledBack) and last.undo
    steep = judge(Window(K.DATA_CHANGE, 0.38, 100, 100, look=1, last_look=False), ctl)
    assert isinstance(steep, RolledBack) and steep.undo, steep
    # a fall faults it does not answer explain is held, not confirmed into an undo, nor counted as a first fall
    held = judge(Window(K.DATA_CHANGE, 0.44, 100, 100, look=2, last_look=False, fell=True, confounded=("harder_data",)), ctl)
    assert isinstance(held, Pending), held
    first = judge(Window(K.DATA_CHANGE, 0.44, 100, 100, look=1, last_look=False, confounded=("harder_data",)), ctl)
    assert isinstance(first, Pending) and not first.fell, first


def test_judge_reads_the_answer_loss_a_change_was_validated_on_beside_the_target():
    """A run leaving the floor shows in the answers' likelihood before exact match: a credible drop
    of the held-out answer loss against the backtest's control arms at the same steps from the fork
    keeps the change while the target has not moved; a target lower within its noise only at the
    last look; a target credibly worse is undone whatever the loss says; and the error rate is
    split between the two signals."""
    from swarm.judging import AnswerLoss, answer_loss

    floor, ctl = Control(0.0, 0.005, "backtest control"), Control(0.05, 0.015, "backtest control")
    fell, flat = AnswerLoss(0.8, 0.02, 2.0, 0.02), AnswerLoss(1.98, 0.02, 2.0, 0.02)
    got = judge(Window(K.RECIPE_EDIT, 0.0, 100, 100, look=1, last_look=False, loss=fell), floor)
    assert isinstance(got, Kept) and "answer loss" in got.reason, got
    assert isinstance(judge(Window(K.RECIPE_EDIT, 0.0, 100, 100, look=1, last_look=False, loss=flat), floor), Pending)
    assert isinstance(judge(Window(K.RECIPE_EDIT, 0.0, 100, 100, look=1, last_look=False), floor), Pending)
    lower = Window(K.RECIPE_EDIT, 0.03, 100, 100, look=1, last_look=False, loss=fell)   # 0.05 → 0.03, not credibly
    assert isinstance(judge(lower, ctl), Pending)
    assert isinstance(judge(Window(K.RECIPE_EDIT, 0.03, 100, 100, look=2, last_look=True, loss=fell), ctl), Kept)
    worse = judge(Window(K.RECIPE_EDIT, 0.0, 100, 100, look=1, loss=fell), Control(0.3, 0.03, "backtest control"))
    assert isinstance(worse, RolledBack) and worse.undo
    # with the loss measured, the target alone needs alpha/2: 5 of 200 vs 0 (P(gain) 0.94) is kept
    # without it, not with a flat loss
    assert isinstance(judge(Window(K.RECIPE_EDIT, 0.025, 100, 100, look=1), floor), Kept)
    assert not isinstance(judge(Window(K.RECIPE_EDIT, 0.025, 100, 100, look=1, loss=flat), floor), Kept)
    # the spread between seeds counts: a drop of 2% of a loss of 2 is no gain, however small the evals' noise
    assert answer_loss(AnswerLoss(1.96, 0.001, 2.0, 0.001))[1] < 0.6
    assert answer_loss(None) is None and answer_loss(AnswerLoss(float("nan"), 0.1, 2.0, 0.1)) is None


def test_waste():
    assert wasted("rejected", Outcome(backtest_cpu_s=12.0)).total == 12.0
    assert wasted("rolled_back", Outcome(backtest_cpu_s=5.0, window_cpu_s=7.0, undone=True)).total == 12.0
    assert wasted("rolled_back", Outcome(backtest_cpu_s=5.0, window_cpu_s=7.0, undone=False)).total == 5.0
    assert wasted("kept", Outcome(backtest_cpu_s=5.0)).total == 0.0


# ---- worth verifying? ---------------------------------------------------------------------------

def test_outlook_projects_the_latest_trend_to_the_threshold():
    o = outlook([(50, 0.2), (100, 0.4), (150, 0.6)], 0.9, True)
    assert o.slope == pytest.approx(0.004) and o.steps_to_target == pytest.approx(75.0) and o.evals == 3
    assert outlook([(0, 0.0), (50, 0.2), (100, 0.4), (150, 0.6), (200, 0.8)], 0.9, True).evals == 4   # the last 4
    assert outlook([(50, 0.5), (100, 0.5)], 0.9, True).steps_to_target is None          # flat: no projection
    assert outlook([(50, 0.5), (100, 0.3)], 0.9, True).steps_to_target is None          # falling
    assert outlook([(100, 0.3)], 0.9, True).steps_to_target is None                     # one eval
    assert outlook([(50, 0.95), (100, 0.92)], 0.9, True).steps_to_target is None        # there, but falling
    low = outlook([(50, 2.0), (100, 1.5)], 1.0, False)                                  # a loss to bring below 1.0
    assert low.steps_to_target == pytest.approx(50.0)


@pytest.mark.parametrize("proposal, findings, evals, want_held", [
    (iv(K.ROLLBACK, {"recipe.lr": 3e-3}), {"loss_spike"}, [(50, 0.5), (100, 0.7)], True),     # 2 of the target away
    (iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 8}, "truncation"), {"truncation"},
     [(50, 0.5), (100, 0.7)], True),
    (iv(K.ROLLBACK, {"recipe.lr": 3e-3}), {"loss_spike"}, [(50, 0.1), (100, 0.2)], False),    # 700 steps away
    (iv(K.ROLLBACK, {"recipe.lr": 3e-3}), {"loss_spike"}, [(50, 0.7), (100, 0.5)], False),    # turned down
    (iv(K.ROLLBACK, {"recipe.lr": 3e-3}, "nonfinite_loss"), {"nonfinite_loss"}, [(50, 0.5), (100, 0.7)], False),
    (iv(K.RESTART, diagnosis="crashed_job"), {"crashed_job"}, [(50, 0.5), (100, 0.7)], False),
    (iv(K.RESTART, diagnosis="stale_heartbeat"), set(), [(50, 0.5), (100, 0.7)], False),
    (iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 8}, "truncation"), {"truncation", "stale_heartbeat"},
     [(50, 0.5), (100, 0.7)], False),
])
def test_a_fix_waits_only_while_the_run_is_on_course_for_less_than_verifying_it(proposal, findings, evals, want_held):
    # the target 0.9; verifying: 2 arms x 2 seeds x 40 steps = 160 steps
    why = worth_verifying(proposal, frozenset(findings), outlook(evals, 0.9, True), verify_steps=160)
    assert (why is not None) == want_held, why
    if want_held:
        assert "cannot pay for itself" in why and "160 steps" in why


def test_an_outlook_is_stretched_as_the_suites_projections_came_true():
    """Near the target a straight line is optimistic (the runs needed a median OUTLOOK_SLACK x the
    projection): a fix is held only when the stretched projection is shorter than verifying it and
    within the budget."""
    from swarm.decisions import OUTLOOK_SLACK
    fix = iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 8}, "truncation")
    view = outlook([(50, 0.5), (100, 0.76)], 0.9, True)                     # ~27 steps projected
    assert view.steps_to_target == pytest.approx(26.9, abs=0.1)
    held = worth_verifying(fix, frozenset({"truncation"}), view, verify_steps=80)
    assert held is not None and f"~{26.9 * OUTLOOK_SLACK:.0f}" in held                 # 65 < 80: held
    assert worth_verifying(fix, frozenset({"truncation"}), view, verify_steps=60) is None       # 27 < 60, but 65 is not
    assert worth_verifying(fix, frozenset({"truncation"}), view, verify_steps=80, steps_left=50) is None   # 65 > 50 left


def test_on_course_means_there_within_the_budget():
    """A trend that reaches the target only after the budget runs out holds no fix back."""
    fix = iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 8}, "truncation")
    view = outlook([(50, 0.5), (100, 0.7)], 0.9, True)                      # there in ~50 steps
    assert worth_verifying(fix, frozenset({"truncation"}), view, verify_steps=160, steps_left=400) is not None
    assert worth_verifying(fix, frozenset({"truncation"}), view, verify_steps=160, steps_left=30) is None
    assert worth_verifying(fix, frozenset({"truncation"}), view, verify_steps=160, steps_left=0) is None


def test_with_no_trend_yet_a_fix_waits_for_the_next_eval_when_it_comes_sooner_than_verifying_would_end():
    fix = iv(K.ROLLBACK, {"recipe.lr": 3e-3})
    one = outlook([(50, 0.3)], 0.9, True)
    why = worth_verifying(fix, frozenset({"loss_spike"}), one, verify_steps=160, next_eval_in=45)
    assert why is not None and "next eval, due in 45 steps" in why
    assert worth_verifying(fix, frozenset({"loss_spike"}), one, verify_steps=160, next_eval_in=200) is None
    assert worth_verifying(fix, frozenset({"loss_spike"}), one, verify_steps=160) is None          # no eval schedule
    assert worth_verifying(fix, frozenset({"nonfinite_loss"}), one, verify_steps=160, next_eval_in=10) is None
    assert worth_verifying(iv(K.RESTART, diagnosis="crashed_job"), frozenset({"crashed_job"}), one, 160, 10) is None
    falling = outlook([(50, 0.5), (100, 0.3)], 0.9, True)                                      # a trend: act now
    assert worth_verifying(fix, frozenset({"loss_spike"}), falling, verify_steps=160, next_eval_in=10) is None


def test_a_fix_that_skips_its_backtest_waits_for_a_value_to_be_judged_against():
    """A trusted fix applied before the run's first eval would be judged against nothing, and a fix
    that worked would count as a loss: it waits for the next eval (a backtested one brings its
    control arms, and does not wait for that)."""
    from swarm.decisions import TASK_FACT
    fix = iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 8}, "truncation")
    none = outlook([], 0.9, True)
    why = worth_verifying(fix, frozenset({"truncation"}), none, 0, next_eval_in=23, corroborated=TASK_FACT, measured=False)
    assert why is not None and "due in 23 steps" in why
    assert worth_verifying(fix, frozenset({"truncation"}), none, 0, next_eval_in=23, corroborated=TASK_FACT) is None
    assert worth_verifying(fix, frozenset({"truncation"}), none, 80, next_eval_in=23, corroborated=TASK_FACT,
                           measured=False) is None
    assert worth_verifying(fix, frozenset({"truncation"}), none, 0, corroborated=TASK_FACT, measured=False) is None


@pytest.mark.parametrize("held_for, want_held", [
    ((1, 0), True),        # first look
    ((1, 40), True),       # one look (a fast run: many steps between looks, still one look)
    ((3, 2), True),        # three looks over two steps: the same rows read again
    ((2, 5), False),       # a second look over rows the first did not read
    (None, False),         # its diagnosis is no current finding (e.g. a claim): the backtest decides
])
def test_a_fix_for_a_finding_seen_on_one_look_waits_for_the_next(held_for, want_held):
    fix = iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 8}, "truncation")
    far = outlook([(50, 0.1), (100, 0.1)], 0.9, True)                  # far from the target: worth verifying
    why = worth_verifying(fix, frozenset({"truncation"}), far, verify_steps=160, held_for=held_for)
    assert (why is not None) == want_held, why
    if want_held:
        assert why.startswith("truncation seen on") and "one look" in why
    # never for a restart of a dead job, nor a run whose loss is not finite
    assert worth_verifying(iv(K.RESTART, diagnosis="crashed_job"), frozenset({"crashed_job"}), far, 160, held_for=(1, 0)) is None
    assert worth_verifying(iv(K.ROLLBACK, {"recipe.lr": 3e-3}, "nonfinite_loss"), frozenset({"nonfinite_loss"}), far, 160,
                           held_for=(1, 0)) is None


def test_a_finding_holds_on_looks_that_saw_it_in_a_row_or_not():
    """Persistence counts the looks of the current timeline's last PERSIST_WITHIN that saw the
    finding: a look that missed it (a noisy detector) does not start the count over; a change
    applied since (its time) does, and so do looks too long ago."""
    t = [Sighting(n, n * 40, 100.0 + n) for n in range(1, 30)]
    seen = [t[0], t[3], t[6]]                                   # every third look saw it
    assert persistence(seen[:1], t[0], since=0.0) == (1, 0)     # first look: it waits
    assert persistence(seen[:2], t[3], since=0.0) == (2, 120)   # a miss between: still two looks
    assert persistence(seen, t[6], since=0.0) == (3, 240)
    assert persistence(seen, t[6], since=t[5].time) == (1, 0)   # a change applied since: counted afresh
    assert persistence(seen, t[6 + PERSIST_WITHIN], since=0.0) is None    # all older than the window
    assert persistence(seen, t[3 + PERSIST_WITHIN], since=0.0) == (1, 280)   # only the newest is in it
    assert persistence([], t[6], since=0.0) is None
    # the same counts through worth_verifying: two looks with a miss between act, one does not
    fix = iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 8}, "truncation")
    far = outlook([(50, 0.1), (100, 0.1)], 0.9, True)
    assert worth_verifying(fix, frozenset({"truncation"}), far, 160, held_for=persistence(seen[:2], t[3], 0.0)) is None
    assert worth_verifying(fix, frozenset({"truncation"}), far, 160, held_for=persistence(seen[:1], t[3], 0.0)) is not None


@pytest.mark.parametrize("evals, ckpt, higher, want", [
    ([(0, 50, 0.3), (0, 100, 0.5), (0, 150, 0.4)], 50, True, pytest.approx(0.2)),   # best since vs the checkpoint's
    ([(0, 100, 0.0), (0, 150, 0.0)], 0, True, 0.0),                                  # none at the start: the first since
    ([(0, 50, 0.3), (1, 100, 0.9), (2, 100, 0.35)], 50, True, pytest.approx(0.05)),  # the newest segment only
    ([(0, 50, 2.0), (0, 100, 1.5)], 50, False, pytest.approx(0.5)),                  # a loss target: lower is progress
    ([(0, 50, 0.3)], 50, True, None),                                                # nothing since
    ([], 50, True, None),
])
def test_progress_since_a_checkpoint(evals, ckpt, higher, want):
    assert progress_since(evals, ckpt, higher) == want


def finding(name, **evidence):
    return Diagnosis(name=name, summary="s", operator="o", policy="builtin", evidence=evidence, step=evidence.pop("step", 100))


@pytest.mark.parametrize("findings, onset, want", [
    ([finding("harness_drift", since_step=60)], 80, "harness_drift"),     # the harness changed, then answers were cut
    ([finding("recipe_drift", since_step=60)], 60, "recipe_drift"),
    ([finding("harness_drift", since_step=90)], 80, None),                # the cut came first: not explained by it
    ([finding("loss_spike", onset_step=50)], 80, None),                   # not a departure
    ([], 80, None),                                                       # a healthy run: nothing changed
])
def test_a_finding_after_a_config_change_nobody_commanded_needs_no_second_look(findings, onset, want):
    fix = iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 8}, "truncation")
    fix = fix.model_copy(update={"diagnosis": fix.diagnosis.model_copy(update={"evidence": {"onset_step": onset}})})
    assert corroborated_by(fix.diagnosis, findings) == want
    far = outlook([(50, 0.1), (100, 0.1)], 0.9, True)
    why = worth_verifying(fix, frozenset({"truncation"}), far, verify_steps=160, held_for=(1, 0),
                          corroborated=corroborated_by(fix.diagnosis, findings))
    assert (why is None) == (want is not None), why
    # a departure finding corroborates itself; its fix restores what was set
    assert corroborated_by(finding("recipe_drift", since_step=10), []) == "recipe_drift"


@pytest.mark.parametrize("seeds, critical, factor, want", [
    ((0, 1), False, 4, (Look((0,)), Look((0, 1)))),
    ((0, 1), True, 4, (Look((0,)), Look((0, 1)), Look((0, 1), 4))),
    ((0, 1), True, 1, (Look((0,)), Look((0, 1)))),
    ((5,), True, 3, (Look((5,)), Look((5,), 3))),
    ((0, 1, 2), False, 4, (Look((0,)), Look((0, 1)), Look((0, 1, 2)))),
])
def test_a_backtest_looks_at_one_seed_first_then_adds_one_per_look(seeds, critical, factor, want):
    assert schedule(seeds, critical, factor) == want


@pytest.mark.parametrize("before, want", [(0, 40), (1, 80), (2, 160), (5, 160), (-1, 40)])
def test_a_fix_retried_after_inconclusive_gains_gets_a_longer_horizon(before, want):
    from swarm.decisions import retry_horizon

    assert retry_horizon(40, before) == want


def test_an_arm_step_costs_what_this_runs_backtests_measured_in_live_steps():
    """Verifying a fix costs its arms' steps, each at what the run's finished backtests paid per
    arm-step (start, fork and evaluation included) over the live job's CPU per step; never less
    than one live step, and one until both are measured."""
    from types import SimpleNamespace as B

    from swarm.decisions import arm_step_cost

    bts = [B(cpu_s=45.0, seeds=[0], horizon_steps=60), B(cpu_s=90.0, seeds=[0, 1], horizon_steps=60), None,
           B(cpu_s=None, seeds=[0], horizon_steps=60)]
    # 45 / 120 = 0.375 CPU-s an arm-step, both measured; the live job 0.176 a step: 2.13 live steps
    assert arm_step_cost(bts, live_cpu_s=17.6, live_step=100) == pytest.approx(0.375 / 0.176)
    assert arm_step_cost(bts, live_cpu_s=100.0, live_step=100) == 1.0          # arms cheaper: never below one
    assert arm_step_cost([], live_cpu_s=17.6, live_step=100) == 1.0
    assert arm_step_cost(bts, live_cpu_s=0.0, live_step=0) == 1.0


def test_the_live_segment_counts_from_the_step_its_process_started_at_zero_included():
    from swarm.decisions import segment_steps

    assert segment_steps({"step": 120, "since_step": 0}) == 120       # a fresh run: 0 is a start, not "unknown"
    assert segment_steps({"step": 300, "since_step": 224}) == 76      # a run that went on from a pilot's step
    assert segment_steps({"step": 120}) == 0                          # a heartbeat that does not say

