"""Scenarios: seeded, deterministic failing runs, and the suite folders that hold them.

A scenario is a goal file (the same format as `examples/goals/*.yaml`) plus a `scenario:` header
saying where it came from, which faults it carries and whether the baselines' search space can
express their fix. `generate(seed)` draws one: a task family and difficulty the built-in model learns
in a minute or two on 2 cores, and 0-2 faults of one origin composed from the trainer's generic
perturbation mechanisms (`trainer/perturb.py`: an override of a recipe/harness field, written into
the goal's own config or changed at a step; label noise, a changed format, harder problems or
duplicated examples in the data pipeline; SIGKILL, a stall, a corrupt newest checkpoint, a slow
worker or an out-of-memory death on the machine), each with its onset step and magnitude drawn from
a range. The same seed always gives the same scenario (a `random.Random` seeded with a string,
independent of `PYTHONHASHSEED` and of the platform).

A suite is a folder of YAML files. Plain goal files (no `scenario:` header) load as scenarios too, so
`examples/goals/` is a suite as it stands.

    python -m swarmbench.scenarios benchmarks/suites/dev --seeds 0-39     # (re)write a suite folder
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import pathlib
import random
from typing import Any, Callable

import yaml

from trainer.config import ConfigError, load_yaml

GENERATOR_VERSION = 5
# Where a fault comes from (v5). `config`: its values are the goal's own starting config (no
# perturbation: nothing to go back to); `drift`: a live config changed at a step (a person or a
# script); `data`: the data stream changes with no config change; `infra`: the machine, the process
# or its files fail. Drawn per scenario and kept in the private header only: the swarm is never told.
ORIGINS = ("config", "drift", "data", "infra")
ADDITION_CHARSET = "0123456789+-*=\n "

_SWARM = {"observe_every_s": 2, "observe_quiet_s": 4, "min_steps_between_interventions": 50,
          "evaluate_window_steps": 100,
          "backtest": {"horizon_steps": 40, "seeds": [0, 1], "alpha": 0.2, "eval_size": 200}}
_MODEL = {"kind": "builtin", "d_model": 96, "n_layers": 3, "n_heads": 4, "max_seq_len": 24}
_SFT = {"algorithm": "sft", "lr": 0.003, "schedule": "constant", "warmup_steps": 0, "batch_size": 64,
        "eval_interval": 50, "eval_size": 200}


@dataclasses.dataclass(frozen=True)
class Family:
    """A task the built-in model learns in a minute or two on 2 cores (the example goals' sizes)."""

    name: str
    goal: str
    threshold: float
    run: dict[str, Any]
    steps: int
    question_len: int          # characters of a question at the base difficulty (template faults)
    answer_len: int            # characters of an answer (max_new_tokens faults)
    healthy_steps: int         # steps a healthy run needs to the target (measured): onsets are drawn before it
    grpo: bool = False
    max_difficulty: int = 12
    warmup_steps: int = 0      # SFT warm-up steps of a GRPO family: rollout faults start after it
    min_difficulty: int = 1    # the task's easiest difficulty (how far a lower curriculum start can go)

    def onset(self, rng: random.Random, lo: float, hi: float, *, after_warmup: bool = False, min_step: int = 0) -> int:
        """A step drawn at `lo`..`hi` of the way from the start (or the end of the SFT warm-up) to the
        step a healthy run reaches the target: a fault drawn later than that could never matter."""
        a = self.warmup_steps if after_warmup else 0
        return max(min_step, _onset(rng, int(a + lo * (self.healthy_steps - a)), int(a + hi * (self.healthy_steps - a))))


def _run(task: str, start: int, *, charset: str | None = None, reverse: bool = False, mnt: int = 5,
         recipe: dict[str, Any] | None = None, reward: dict[str, Any] | None = None,
         options: dict[str, Any] | None = None, seq_len: int | None = None) -> dict[str, Any]:
    model = dict(_MODEL, **({"charset": charset} if charset else {}), **({"max_seq_len": seq_len} if seq_len else {}))
    harness: dict[str, Any] = {"template": "{question}=", "answer": {"stop": "\n", **({"reverse_digits": True} if reverse else {})},
                               "sampling": {"temperature": 1.0, "max_new_tokens": mnt}, "curriculum": {"start": start}}
    if reward:
        harness["reward"] = reward
    return {"seed": 0, "task": {"name": task, **({"options": options} if options else {})}, "model": model, "harness": harness, "recipe": recipe or dict(_SFT),
            "checkpoint": {"interval": 50, "keep_last": 20}, "samples_per_step": 4, "threads": 1}


FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("addition2", "a policy that adds 2-digit numbers with >= 90% held-out exact match", 0.9,
           _run("addition", 2, charset=ADDITION_CHARSET, reverse=True), 3000, question_len=5, answer_len=3,
           healthy_steps=500),
    Family("sort4", "a policy that sorts 4-digit sequences with >= 90% held-out exact match", 0.9,
           _run("sort", 4), 3000, question_len=4, answer_len=4, healthy_steps=175, min_difficulty=2),
    Family("reverse7", "a policy that reverses 7-digit sequences with >= 90% held-out exact match", 0.9,
           _run("reverse", 7, mnt=8, seq_len=28), 3000, question_len=7, answer_len=7, healthy_steps=150,
           min_difficulty=2),
    Family("sort3_grpo", "a policy that sorts 3-digit sequences with >= 85% held-out exact match (SFT warm-up, then GRPO)",
           0.85, _run("sort", 3, mnt=4, reward={"kind": "partial"},
                      recipe={"algorithm": "grpo", "sft_warmup_steps": 90, "sft_warmup_batch_size": 128, "lr": 0.0003,
                              "schedule": "constant", "warmup_steps": 0, "batch_size": 16, "eval_interval": 25,
                              "eval_size": 200, "group_size": 8}),
           1000, question_len=3, answer_len=3, healthy_steps=300, grpo=True, warmup_steps=90, min_difficulty=2),
    # countdown with two numbers ("25 4->21" -> "25-4"): any expression that uses them and hits the target
    # (max_seq_len: room for the hardest difficulty a curriculum fault can set — prompt, SFT target,
    # <bos> and <eos> — with a margin where the length varies between examples)
    Family("countdown2", "a policy that solves 2-number countdown puzzles with >= 80% held-out success", 0.8,
           _run("countdown", 2, mnt=8, seq_len=64), 3000, question_len=8, answer_len=5, healthy_steps=550, max_difficulty=6,
           min_difficulty=2),
    # a reasoning-gym dataset at its first curriculum level ("Calculate 2 * -3." -> "-6"), answers written reversed
    Family("rg_arith", "a policy that solves reasoning-gym basic_arithmetic (level 1) with >= 80% held-out exact match", 0.8,
           _run("rg", 1, reverse=True, mnt=5, options={"dataset": "basic_arithmetic"}, seq_len=112), 3000,
           question_len=16, answer_len=2, healthy_steps=550, max_difficulty=5),
]}
# Not a family: the `code` task. At difficulty 1 (one pipeline stage, prompts of ~250 characters) the
# built-in model reached 0.27 held-out after 655 steps and 600 worker-CPU-s on 2 cores (the addition
# family reaches 0.9 in ~20): a scenario's budget would be hours, not minutes.


# ---- fault mechanisms ---------------------------------------------------------------------------
# Each builder draws onset and magnitude from its ranges and returns (perturbations, description).
# `fix_in_space`: whether the baselines' search space (lr, temperature, max_new_tokens, curriculum
# start, kl_coef) can express the fix; where it cannot, what would.

Builder = Callable[[random.Random, Family], tuple[list[dict[str, Any]], dict[str, Any]]]


def _onset(rng: random.Random, lo: int, hi: int, every: int = 10) -> int:
    return rng.randrange(lo // every, hi // every + 1) * every


def _loguniform(rng: random.Random, lo: float, hi: float) -> float:
    return float(f"{math.exp(rng.uniform(math.log(lo), math.log(hi))):.3g}")


def _override(at: int, fields: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"kind": "override", "at_step": at, "set": fields}]


def f_lr_scale(rng: random.Random, fam: Family) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    base = fam.run["recipe"]["lr"]
    k = _loguniform(rng, 20, 150) if rng.random() < 0.6 else _loguniform(rng, 0.003, 0.03)
    lr = min(10.0, float(f"{base * k:.3g}"))
    at = fam.onset(rng, 0.1, 0.6)
    return _override(at, {"recipe.lr": lr}), {"mechanism": "override", "what": f"recipe.lr x{k:g} -> {lr:g}", "at_step": at,
                                               "fix_in_space": "yes (lr)"}


def f_temperature(rng: random.Random, fam: Family) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    t = round(rng.uniform(0.01, 0.1), 3) if rng.random() < 0.6 else round(rng.uniform(2.5, 4.0), 2)
    at = fam.onset(rng, 0.0, 0.5, after_warmup=True)
    return _override(at, {"harness.sampling.temperature": t}), {
        "mechanism": "override", "what": f"harness.sampling.temperature -> {t:g}", "at_step": at, "fix_in_space": "yes (temperature)"}


def f_max_new_tokens(rng: random.Random, fam: Family) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    n = rng.randint(1, fam.answer_len - 1)
    at = fam.onset(rng, 0.0, 0.6)
    return _override(at, {"harness.sampling.max_new_tokens": n}), {
        "mechanism": "override", "what": f"harness.sampling.max_new_tokens -> {n}", "at_step": at,
        "fix_in_space": "yes (max_new_tokens)"}


def f_template(rng: random.Random, fam: Family) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    kind = rng.choice(["truncate", "separator", "pad", "doubled"])
    if kind == "truncate":          # a format spec on the placeholder: only the first N characters
        tpl = "{question:.%d}=" % rng.randint(1, fam.question_len - 1)
    elif kind == "separator":       # the answer cue changed (characters the addition charset has)
        tpl = "{question}" + rng.choice(["-", "+", "*", " ", "=="])
    elif kind == "pad":             # right-aligned in a wider field: the question moves
        tpl = "{question:>%d}=" % rng.randint(fam.question_len + 3, fam.question_len + 8)
    else:
        tpl = "{question}={question}="
    at = fam.onset(rng, 0.0, 0.6)
    return _override(at, {"harness.template": tpl}), {
        "mechanism": "override", "what": f"harness.template ({kind}) -> {tpl!r}", "at_step": at, "fix_in_space": "no (template)"}


def f_verifier(rng: random.Random, fam: Family) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    at = fam.onset(rng, 0.0, 0.5, after_warmup=True)
    return _override(at, {"harness.reward.verifier": "digits_any_order"}), {
        "mechanism": "override", "what": "harness.reward.verifier -> digits_any_order", "at_step": at,
        "fix_in_space": "no (verifier)"}


CURRICULUM_JUMP = (2, 4)    # a curriculum fault moves the difficulty this many levels up (capped at the family's max)


def hardest(fam: Family) -> int:
    """The hardest difficulty a curriculum fault can set on the family."""
    return min(fam.max_difficulty, fam.run["harness"]["curriculum"]["start"] + CURRICULUM_JUMP[1])


def f_curriculum(rng: random.Random, fam: Family) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    d = min(fam.max_difficulty, fam.run["harness"]["curriculum"]["start"] + rng.randint(*CURRICULUM_JUMP))
    at = fam.onset(rng, 0.0, 0.6)
    return _override(at, {"harness.curriculum.start": d, "harness.curriculum.end": d}), {
        "mechanism": "override", "what": f"harness.curriculum start=end -> {d}", "at_step": at,
        "fix_in_space": "yes (curriculum start: no ramp, so the end the fault also sets is not used)"}


def f_recipe_field(rng: random.Random, fam: Family) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    at = fam.onset(rng, 0.1, 0.6)
    if rng.random() < 0.5 or fam.grpo:
        wd = round(rng.uniform(2.0, 10.0), 2)
        fields, what = {"recipe.weight_decay": wd}, f"recipe.weight_decay -> {wd:g}"
    else:
        bs = rng.randint(2, 6)
        fields, what = {"recipe.batch_size": bs}, f"recipe.batch_size -> {bs}"
    return _override(at, fields), {"mechanism": "override", "what": what, "at_step": at, "fix_in_space": "no (" + what.split(" ")[0] + ")"}


def f_kill(rng: random.Random, fam: Family) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    at = fam.onset(rng, 0.3, 0.9, min_step=60)    # after the first checkpoint (interval 50)
    return [{"kind": "kill", "at_step": at}], {"mechanism": "kill", "what": "SIGKILL", "at_step": at,
                                                "fix_in_space": "restart (Tune retries a failed trial from its checkpoint)"}


def f_stall(rng: random.Random, fam: Family) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    at = fam.onset(rng, 0.3, 0.9, min_step=60)
    s = float(rng.randrange(900, 1800, 60))
    return [{"kind": "stall", "at_step": at, "seconds": s}], {"mechanism": "stall", "what": f"hang {s:.0f} s", "at_step": at,
                                                              "fix_in_space": "no (a hung trial is not retried)"}


def f_label_noise(rng: random.Random, fam: Family) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    frac = round(rng.uniform(0.3, 0.7), 2)
    noise = rng.choice(["random_char", "off_by_one"])
    at = fam.onset(rng, 0.0, 0.5)
    return [{"kind": "label_noise", "at_step": at, "fraction": frac, "noise": noise}], {
        "mechanism": "label_noise", "what": f"{frac:g} of SFT labels ({noise})", "at_step": at, "fix_in_space": "no (data)"}


def f_data_format(rng: random.Random, fam: Family) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    # GRPO learns from its prompts, SFT from its targets as well: the answer styles change SFT targets only
    styles = ["question_prefix", "question_spaced"]
    if not fam.grpo:
        styles = ["answer_prefix", "answer_spaced", "answer_reversed"] + styles
    style = rng.choice(styles)
    at = fam.onset(rng, 0.0, 0.6, after_warmup=True)
    # the harness extracts what it renders, so no setting of it turns a changed label back; only a
    # parser that skips the prefix reads the intended answer
    how = "an answer regex that skips the '=' reads it" if style == "answer_prefix" else "the data must be fixed"
    return [{"kind": "data_format", "at_step": at, "style": style}], {
        "mechanism": "data_format", "what": f"examples written differently ({style})", "at_step": at,
        "fix_in_space": f"no (data: {how})"}


def f_data_shift(rng: random.Random, fam: Family) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    start = fam.run["harness"]["curriculum"]["start"]
    levels = min(fam.max_difficulty, start + rng.randint(*CURRICULUM_JUMP)) - start
    at = fam.onset(rng, 0.0, 0.6)
    lo = fam.min_difficulty
    fix = (f"yes (curriculum start {start - levels}: the stream draws {levels} above it)" if start - levels >= lo
           else f"no (the curriculum start stops at {lo}: the stream draws at {lo + levels} or above)")
    return [{"kind": "data_shift", "at_step": at, "levels": levels}], {
        "mechanism": "data_shift", "what": f"training problems {levels} levels harder than the curriculum's", "at_step": at,
        "fix_in_space": fix}


def f_duplicates(rng: random.Random, fam: Family) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    pool = rng.choice([8, 16, 32])
    frac = round(rng.uniform(0.9, 0.98), 2)
    at = fam.onset(rng, 0.0, 0.5, after_warmup=True)
    return [{"kind": "duplicates", "at_step": at, "pool": pool, "fraction": frac}], {
        "mechanism": "duplicates", "what": f"{frac:g} of the stream from a pool of {pool} examples", "at_step": at,
        "fix_in_space": "no (data: harness.filters.dedupe drops the repeats)"}


def f_slow_worker(rng: random.Random, fam: Family) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    s = _loguniform(rng, 0.5, 3.0)
    at = fam.onset(rng, 0.1, 0.6)
    return [{"kind": "slow_worker", "at_step": at, "seconds": s}], {
        "mechanism": "slow_worker", "what": f"every step {s:g} s slower", "at_step": at,
        "fix_in_space": "no (a slow trial is not restarted; a restarted job is not slow)"}


def f_oom(rng: random.Random, fam: Family) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    bs = fam.run["recipe"]["batch_size"]
    limit = rng.randint(max(8, bs // 4), max(8, 3 * bs // 4))    # 8: the smallest batch a search may set (TUNABLE)
    at = fam.onset(rng, 0.3, 0.9, min_step=60, after_warmup=True)
    return [{"kind": "oom", "at_step": at, "max_batch_size": limit}], {
        "mechanism": "oom", "what": f"out of memory while recipe.batch_size > {limit}", "at_step": at,
        "fix_in_space": "no (recipe.batch_size; a retried trial dies again)"}


def f_corrupt_checkpoint(rng: random.Random, fam: Family) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    at = fam.onset(rng, 0.3, 0.9, min_step=60)
    return [{"kind": "corrupt_checkpoint", "at_step": at}], {"mechanism": "corrupt_checkpoint", "what": "newest checkpoint damaged",
                                                             "at_step": at, "fix_in_space": "n/a (harmless without a restart)"}


# (name, builder, applies to family) — GRPO-only faults act on rollouts; label noise on SFT labels;
# a GRPO family's data format changes its prompts (the format of its SFT warm-up's targets is over
# before the faults start)
MECHANISMS: list[tuple[str, Builder, Callable[[Family], bool]]] = [
    ("lr_scale", f_lr_scale, lambda f: True),
    ("temperature", f_temperature, lambda f: f.grpo),
    ("max_new_tokens", f_max_new_tokens, lambda f: True),
    ("template", f_template, lambda f: True),
    ("verifier", f_verifier, lambda f: f.grpo),
    ("curriculum", f_curriculum, lambda f: True),
    ("recipe_field", f_recipe_field, lambda f: True),
    ("kill", f_kill, lambda f: True),
    ("stall", f_stall, lambda f: True),
    ("label_noise", f_label_noise, lambda f: not f.grpo),
    ("corrupt_checkpoint", f_corrupt_checkpoint, lambda f: True),
    ("data_format", f_data_format, lambda f: True),
    ("data_shift", f_data_shift, lambda f: True),
    ("duplicates", f_duplicates, lambda f: True),
    ("slow_worker", f_slow_worker, lambda f: True),
    ("oom", f_oom, lambda f: True),
]


# The origins each mechanism has. An override is the user's own config at step 0, or a drift at a
# step. Two overrides have a data counterpart, drawn as their own mechanisms: a template changed in
# the data pipeline is `data_format` (its question styles), a curriculum made harder there is
# `data_shift` — the same effect on the examples, with no harness version to go back to.
MECHANISM_ORIGINS: dict[str, tuple[str, ...]] = {
    **{m: ("config", "drift") for m in ("lr_scale", "temperature", "max_new_tokens", "template", "verifier",
                                         "curriculum", "recipe_field")},
    **{m: ("data",) for m in ("label_noise", "data_format", "data_shift", "duplicates")},
    **{m: ("infra",) for m in ("kill", "stall", "corrupt_checkpoint", "slow_worker", "oom")}}
# Faults not drawn together: both lengthen the examples past what the family's model was sized for
# (the hardest difficulty a curriculum fault can set, in the format the harness writes).
LENGTHEN = frozenset({"data_shift", "data_format"})
RESTARTS = ("kill", "oom")    # faults that end the job: a restart reads the newest good checkpoint


def _set_in(run: dict[str, Any], dotted: str, value: Any) -> None:
    section, *path = dotted.split(".")
    node = run.setdefault(section, {})
    for k in path[:-1]:
        node = node.setdefault(k, {})
    node[path[-1]] = value


def as_config(run: dict[str, Any], perts: list[dict[str, Any]], faults: list[dict[str, Any]]) -> None:
    """Write the overrides' values into the goal's own starting config (in place) and mark the faults
    so. A curriculum fault keeps the held-out difficulty the family evaluates at (the starting
    config's `end` is the eval difficulty: the fault is training at a harder one, not another target)."""
    base_start = run["harness"]["curriculum"]["start"]
    for p in perts:
        for k, v in p["set"].items():
            if k == "harness.curriculum.end":
                v = run["harness"]["curriculum"].get("end") or base_start
            _set_in(run, k, v)
    for f in faults:
        what = (f"harness.curriculum.start -> {run['harness']['curriculum']['start']} (held out at "
                f"{run['harness']['curriculum']['end']})" if f["name"] == "curriculum" else f["what"])
        f.update(origin="config", at_step=0, what=what + " (the goal's own starting config)")


def generate(seed: int) -> dict[str, Any]:
    """The scenario for `seed`: a dict with `scenario` (header) and the goal file's fields. The
    header's `origin` and `healthy_run` (the family's run without a config fault, the oracle's)
    stay out of what any method sees."""
    rng = random.Random(f"swarmlab-bench-v{GENERATOR_VERSION}-{seed}")
    n = rng.choices([0, 1, 2], weights=[0.15, 0.5, 0.35])[0]
    origin = rng.choice(ORIGINS) if n else "none"
    fams = [f for f in sorted(FAMILIES) if not n
            or any(m[2](FAMILIES[f]) and origin in MECHANISM_ORIGINS[m[0]] for m in MECHANISMS)]
    fam = FAMILIES[rng.choice(fams)]
    usable = [m for m in MECHANISMS if m[2](fam) and (not n or origin in MECHANISM_ORIGINS[m[0]])]
    n = min(n, len(usable))
    perts: list[dict[str, Any]] = []
    faults: list[dict[str, Any]] = []
    fields: set[str] = set()
    for name, build, _ in rng.sample(usable, n):
        p, meta = build(rng, fam)
        keys = {k for q in p for k in q.get("set", {})} | ({"example length"} if name in LENGTHEN else set())
        if keys & fields:                      # two faults on one field: the later one would hide the first
            continue
        fields |= keys
        perts += p
        faults.append({"name": name, **meta, "origin": origin})
    # a corrupt checkpoint only matters to a run that restarts: put it before a kill or an OOM when both are drawn
    kills = [p for p in perts if p["kind"] in RESTARTS]
    for p in perts:
        if p["kind"] == "corrupt_checkpoint" and kills and p["at_step"] >= kills[0]["at_step"]:
            p["at_step"] = max(50, kills[0]["at_step"] - 20)
            next(f for f in faults if f["name"] == "corrupt_checkpoint")["at_step"] = p["at_step"]
    label = "+".join(f["name"] for f in faults) or "none"
    goal: dict[str, Any] = {
        "goal": fam.goal + ", on 2 CPU cores",
        "target": {"metric": "heldout_acc", "op": ">=", "threshold": fam.threshold},
        "run": copy.deepcopy(fam.run),
        "budget": {"wall_s": 900, "steps": fam.steps, "worker_cpu_s": 1800, "llm_usd": 0.0},
        "approval": {"auto": ["low", "medium"]},
        "llm": {"model": None},
        "swarm": copy.deepcopy(_SWARM),
    }
    if origin == "config":
        as_config(goal["run"], perts, faults)
        perts = []
    if perts:
        goal["perturbations"] = perts
    return {"scenario": {"name": f"g{seed:04d}-{fam.name}-{label}", "seed": seed, "generator_version": GENERATOR_VERSION,
                         "family": fam.name, "origin": origin, "faults": faults,
                         **({"healthy_run": copy.deepcopy(fam.run)} if origin == "config" else {})}, **goal}


# ---- suites -----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    goal: dict[str, Any]             # a goal file's fields (perturbations included)
    faults: list[dict[str, Any]]
    path: str
    family: str | None = None
    origin: str | None = None                       # v5: config | drift | data | infra | none (private)
    healthy_run: dict[str, Any] | None = None       # a config-origin fault's run without it (the oracle's)

    @property
    def content_hash(self) -> str:
        """What the scenario runs (its goal, faults included), independent of comments and key order."""
        return hashlib.sha256(json.dumps(self.goal, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]

    @property
    def fix_in_space(self) -> str:
        if not self.faults:
            return "n/a (no fault)"
        return "; ".join(f"{f['name']}: {f.get('fix_in_space', '?')}" for f in self.faults)

    def healthy_goal(self) -> dict[str, Any]:
        g = copy.deepcopy(self.goal)
        g.pop("perturbations", None)
        if self.healthy_run is not None:
            g["run"] = copy.deepcopy(self.healthy_run)
        return g


def scenario_from_data(data: Any, path: str) -> Scenario:
    """A scenario file (`scenario:` header + goal fields) or a plain goal file, validated as a goal."""
    from swarm.goal import Goal

    if not isinstance(data, dict):
        raise ConfigError(f"scenario {path!r}: must be a mapping, got {type(data).__name__}")
    data = dict(data)
    head = data.pop("scenario", None)
    if head is not None and not isinstance(head, dict):
        raise ConfigError(f"scenario {path!r}: scenario= must be a mapping, got {type(head).__name__}")
    try:
        Goal.parse(data)
    except ConfigError as e:
        raise ConfigError(f"scenario {path!r}: {e}") from None
    head = head or {}
    name = str(head.get("name") or pathlib.Path(path).stem)
    faults = head.get("faults")
    if faults is None:   # a plain goal file: describe its perturbations as they are
        faults = [{"name": p.get("shortcut") or p.get("kind"), "mechanism": p.get("kind") or p.get("shortcut"),
                   "what": json.dumps({k: v for k, v in p.items() if k not in ("at_step",)}, sort_keys=True),
                   "at_step": p.get("at_step", 0), "fix_in_space": "?"} for p in data.get("perturbations") or []]
    return Scenario(name=name, goal=data, faults=list(faults), path=path, family=head.get("family"),
                    origin=head.get("origin"), healthy_run=head.get("healthy_run"))


def load_suite(folder: str | pathlib.Path) -> list[Scenario]:
    """Every `*.yaml` in `folder`, sorted by file name; a bad file is a ConfigError naming it."""
    d = pathlib.Path(folder)
    if not d.is_dir():
        raise ConfigError(f"suite {str(d)!r} is not a folder")
    out = [scenario_from_data(load_yaml(p, "scenario file"), str(p)) for p in sorted(d.glob("*.yaml"))]
    if not out:
        raise ConfigError(f"suite {str(d)!r} holds no *.yaml scenario")
    names = [s.name for s in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"suite {str(d)!r}: scenario names used twice: {', '.join(dup)}")
    return out


def write_suite(folder: str | pathlib.Path, seeds: list[int]) -> list[pathlib.Path]:
    d = pathlib.Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in seeds:
        sc = generate(s)
        p = d / f"{sc['scenario']['name']}.yaml"
        head = (f"# Generated by `python -m swarmbench.scenarios {d} --seeds {s}` (generator v{GENERATOR_VERSION}).\n"
                "# The perturbations are handed to the trainer only; no operator, prompt, report or memory sees them.\n")
        p.write_text(head + yaml.safe_dump(sc, sort_keys=False, width=120))
        paths.append(p)
    return paths


def parse_seeds(spec: list[str]) -> list[int]:
    """`0 1 5-9` → [0, 1, 5, 6, 7, 8, 9]."""
    out: list[int] = []
    for part in spec:
        for tok in str(part).split(","):
            tok = tok.strip()
            if not tok:
                continue
            try:
                if "-" in tok[1:]:
                    a, b = tok.split("-", 1) if not tok.startswith("-") else (tok, tok)
                    out += list(range(int(a), int(b) + 1))
                else:
                    out.append(int(tok))
            except ValueError:
                raise ConfigError(f"seeds: {tok!r} is not an integer or a range like 3-7") from None
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="write generated scenarios into a suite folder")
    ap.add_argument("folder")
    ap.add_argument("--seeds", nargs="+", required=True, help="seeds or ranges, e.g. 0-39")
    a = ap.parse_args(argv)
    for p in write_suite(a.folder, parse_seeds(a.seeds)):
        print(p)


if __name__ == "__main__":
    main()
