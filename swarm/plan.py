"""The plan: the starting run config a goal did not write, each value with where it came from.

    from swarm.plan import make_plan
    plan = make_plan(understood, goal.run)      # understood: swarm.words.understand(...)
    plan.run(goal.run)                           # the run dict to train: the goal's fields + the plan's
    plan.to_json()                               # the record the controller makes the run's first PR

A field the goal writes under `run:` is `user` and is never changed here (`Plan.choose` refuses to
replace one). The rest is chosen, in this order of sources:
- `words`: what the goal's sentence says (the task, its difficulty; swarm/words.py);
- `task`: the task family's own facts (trainer/tasks): the longest question and answer at its
  highest difficulty give `harness.sampling.max_new_tokens` and `model.max_seq_len` (a curriculum
  or an intervention may raise the difficulty later, and a cut-off answer is never right); its
  alphabet gives `model.charset`; its difficulty range and default the curriculum; a family whose
  answers are free text brings its answer format, template and prompt-length filter, and arithmetic
  its answers written lowest digit first (`reverse_digits`, the order the carry is worked out in);
- `default`: RunConfig's own default;
- `pilot`: a short successive-halving pilot over model size × lr (swarm/pilot.py, `swarm plan
  --pilot`) whose winner replaces `default` choices through `Plan.choose`, with its evidence, and
  whose last checkpoint starts the run (`fork_from`, `fork_mode: full`: the run goes on from the
  winner's weights, optimiser state and step) unless a field the goal writes differs from what the
  winner trained;
- `memory`: the model size and lr of a past planned run on the same task family that reached its
  target (swarm/plan_memory.py), through `Plan.choose` as well; a run that has them runs no pilot.

This round the plan is what trains only when the task comes from the words (`Plan.applied`): a goal
that writes `run.task` is a complete starting config as before, and its plan records its own
fields (`user`) and RunConfig's defaults, nothing else. A planned run starts with the pilot when
the plan fills the model size or lr (swarm/pilot.py `plan_run`), records the plan in its
`.swarm/plan.json` and opens it as its first PR, merged (swarm/plan_pr.py).

Deviations: lengths are characters. For the built-in character tokenizer that is tokens; for a
Hugging Face model the plan leaves max_seq_len and charset to the model and a character count
is, for most tokenizers, an overestimate of the tokens.
"""
from __future__ import annotations

import copy
import dataclasses
import enum
import json
import math
from typing import Any, Literal

from swarm.words import TaskSpec, Understood
from trainer.config import RunConfig, get_dotted, put_dotted

PLAN_VERSION = 1
ANSWER_SLACK = 1        # tokens beyond the longest answer: one stray character before the stop
SEQ_ROUND = 8           # max_seq_len is rounded up to a multiple of this
MAX_NEW_TOKENS_MAX = 4096


class Source(str, enum.Enum):
    USER = "user"          # written in the goal's run:
    WORDS = "words"        # read from the goal's sentence
    TASK = "task"          # the task family's own facts
    DEFAULT = "default"    # RunConfig's default
    MEMORY = "memory"      # past runs on similar tasks (later)
    PILOT = "pilot"        # a short pilot within a share of the budget (swarm/pilot.py)


@dataclasses.dataclass(frozen=True)
class Choice:
    """One run field: its value, where it came from, why, and the facts it was chosen from."""

    field: str                      # dotted RunConfig path, e.g. "harness.sampling.max_new_tokens"
    value: Any
    source: Source
    why: str = ""
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "value": self.value, "source": self.source.value, "why": self.why,
                "evidence": self.evidence}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Choice":
        return cls(d["field"], d["value"], Source(d["source"]), d.get("why", ""), dict(d.get("evidence") or {}))


@dataclasses.dataclass(frozen=True)
class Plan:
    """The chosen starting config. `applied`: whether `run()` fills the goal's run with it (the
    task came from the words) or only records it."""

    goal: str
    task: TaskSpec
    task_from: Literal["run", "words"]
    choices: tuple[Choice, ...]
    applied: bool
    notes: tuple[str, ...] = ()
    version: int = PLAN_VERSION

    def get(self, field: str) -> Choice:
        for c in self.choices:
            if c.field == field:
                return c
        raise KeyError(field)

    def choose(self, choice: Choice) -> "Plan":
        """A plan with `choice` in place of the field's current one (memory, the pilot). A field the
        goal writes stays the goal's: replacing it is a ValueError."""
        old = {c.field: c for c in self.choices}.get(choice.field)
        if old is not None and old.source is Source.USER and choice.source is not Source.USER:
            raise ValueError(f"plan: {choice.field} is written in the goal ({old.value!r}); a plan never changes it")
        kept = tuple(c for c in self.choices if c.field != choice.field)
        return dataclasses.replace(self, choices=kept + (choice,))

    def run(self, run: dict[str, Any]) -> dict[str, Any]:
        """The run dict to train: `run` (the goal's, unchanged) with every chosen field that is not
        the user's put in, when the plan is applied; else `run` itself."""
        out = copy.deepcopy(run)
        if not self.applied:
            return out
        for c in self.choices:
            if c.source is Source.USER or c.source is Source.DEFAULT:
                continue
            assert not get_dotted(run, c.field)[0], f"plan: {c.field} is written in the goal but chosen as {c.source}"
            put_dotted(out, c.field, copy.deepcopy(c.value))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "goal": self.goal, "task": self.task.to_json(), "task_from": self.task_from,
                "applied": self.applied, "choices": [c.to_json() for c in self.choices], "notes": list(self.notes)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Plan":
        return cls(d["goal"], TaskSpec.from_json(d["task"]), d["task_from"],
                   tuple(Choice.from_json(c) for c in d["choices"]), bool(d["applied"]), tuple(d.get("notes") or ()),
                   int(d.get("version", PLAN_VERSION)))

    def summary(self) -> list[str]:
        """Compact lines for `swarm validate`: the fields grouped by source, then the notes."""
        lines = []
        order = [Source.USER, Source.WORDS, Source.TASK, Source.MEMORY, Source.PILOT, Source.DEFAULT]
        heads = {Source.USER: "written", Source.WORDS: "from the words", Source.TASK: "from the task",
                 Source.MEMORY: "from memory", Source.PILOT: "from the pilot", Source.DEFAULT: "defaults"}
        for src in order:   # defaults in brief: they are RunConfig's, documented in docs/configuration.md
            limit = 16 if src is Source.DEFAULT else 40
            shown = [f"{c.field}={_short(c.value, limit)}" for c in self.choices if c.source is src]
            if shown:
                lines.append(f"  {heads[src]}: " + ", ".join(shown))
        lines += [f"  note: {n}" for n in self.notes if self.applied or not n.startswith("run.task is written")]
        return lines


def _short(value: Any, limit: int = 40) -> str:
    if isinstance(value, dict) and isinstance(value.get("name"), str) and set(value) <= {"name", "options"}:
        opts = ", ".join(f"{k}={v}" for k, v in (value.get("options") or {}).items())   # a task: sort, rg(dataset=…)
        value = value["name"] + (f"({opts})" if opts else "")
        return value if len(value) <= limit else value[:limit - 1] + "…"
    s = json.dumps(value, ensure_ascii=True) if not isinstance(value, (int, float)) or isinstance(value, bool) else repr(value)
    return s if len(s) <= limit else s[:limit - 1] + "…"


# The fields a plan records, beyond the task's (a pilot or memory adds its own through `choose`).
DEFAULT_FIELDS = ("model.d_model", "model.n_layers", "model.n_heads", "recipe.algorithm", "recipe.lr",
                  "recipe.batch_size", "threads")


def make_plan(understood: Understood, run: dict[str, Any], goal: str = "") -> Plan:
    """The plan for a goal whose task is `understood` and whose `run:` is `run` (as written)."""
    from trainer.tasks import make_task

    spec, applied = understood.spec, understood.source == "words"
    defaults = RunConfig().model_dump(mode="json")
    written = lambda f: get_dotted(run, f)[0]   # noqa: E731
    choices: list[Choice] = []
    notes: list[str] = list(spec.notes)

    def user_or(field: str, value: Any, source: Source, why: str, evidence: dict[str, Any] | None = None) -> Any:
        """The goal's value when written, else (value, source); the value in effect is returned."""
        if written(field):
            value = get_dotted(run, field)[1]
            choices.append(Choice(field, value, Source.USER, "written in the goal"))
            return value
        if not applied and source is not Source.DEFAULT:   # recorded as what runs: the default
            value, source, why, evidence = get_dotted(defaults, field)[1], Source.DEFAULT, "RunConfig default", None
        choices.append(Choice(field, value, source, why, evidence or {}))
        return value

    said = ", ".join(repr(s) for s in spec.said)
    if written("task"):
        choices.append(Choice("task", get_dotted(run, "task")[1], Source.USER, "written in the goal"))
    else:
        choices.append(Choice("task", {"name": spec.name, "options": dict(spec.options)}, Source.WORDS,
                              f"the sentence names it ({said})"))
    task = make_task(spec.name, **spec.options)
    kind = (get_dotted(run, "model.kind")[1] if written("model.kind") else "builtin")
    lo, hi = task.min_difficulty, task.max_difficulty

    # the difficulty the goal asks for: trained at it and evaluated at it (eval = curriculum end or start)
    if spec.difficulty is not None:
        difficulty = user_or("harness.curriculum.start", spec.difficulty, Source.WORDS,
                             f"the sentence asks for {task.difficulty_label.format(d=spec.difficulty)}")
    else:
        d = task.default_difficulty_clamped()
        difficulty = user_or("harness.curriculum.start", d, Source.TASK,
                             f"the sentence states no difficulty: the task's default ({lo}..{hi})",
                             {"min_difficulty": lo, "max_difficulty": hi})
    if spec.difficulty is not None and difficulty != spec.difficulty:
        notes.append(f"the sentence asks for {task.difficulty_label.format(d=spec.difficulty)}; "
                     f"harness.curriculum.start={difficulty} ({choices[-1].source.value}) is what trains")

    answer_fmt = dict(task.answer_format or {})
    if written("harness.answer"):
        answer = {**defaults["harness"]["answer"], **get_dotted(run, "harness.answer")[1]}
        choices.append(Choice("harness.answer", get_dotted(run, "harness.answer")[1], Source.USER, "written in the goal"))
    elif answer_fmt:
        answer = {**defaults["harness"]["answer"], **user_or(
            "harness.answer", answer_fmt, Source.TASK, task.answer_format_why)}
    else:
        answer = user_or("harness.answer", defaults["harness"]["answer"], Source.DEFAULT, "the answer is one word")
    template = user_or("harness.template", task.template or defaults["harness"]["template"],
                       Source.TASK if task.template else Source.DEFAULT,
                       "the question is text: the answer starts on a new line" if task.template else "RunConfig default")

    # measured or derived at the highest difficulty; not needed (and for some families slow) when
    # the plan only records a run as written
    q_chars, a_chars = task.max_lengths(hi) if applied else (0, 0)
    prompt_chars = len(template.format(question="")) + q_chars
    prefix, stop = answer.get("prefix") or "", answer.get("stop")
    completion = len(prefix) + a_chars + (len(stop) if stop else 1)   # the stop, or the end-of-sequence token
    facts = {"difficulty": hi, "max_question_chars": q_chars, "max_answer_chars": a_chars}
    want = completion + ANSWER_SLACK
    if want > MAX_NEW_TOKENS_MAX:
        notes.append(f"the longest answer at {task.difficulty_label.format(d=hi)} needs {want} tokens: "
                     f"max_new_tokens is capped at {MAX_NEW_TOKENS_MAX}")
        want = MAX_NEW_TOKENS_MAX
    max_new = user_or("harness.sampling.max_new_tokens", want, Source.TASK,
                      f"the longest answer at the task's highest difficulty ({task.difficulty_label.format(d=hi)}) "
                      "with its delimiters, and a token of slack", facts)
    if prompt_chars > defaults["harness"]["filters"]["max_prompt_chars"]:
        user_or("harness.filters.max_prompt_chars", prompt_chars, Source.TASK,
                "the longest prompt at the task's highest difficulty: a shorter limit skips examples", facts)
    if kind == "builtin":
        seq = int(math.ceil((1 + prompt_chars + max_new) / SEQ_ROUND) * SEQ_ROUND)   # <bos> + prompt + completion
        user_or("model.max_seq_len", seq, Source.TASK,
                "the longest prompt and completion at the task's highest difficulty", facts)
        if task.charset:
            chars = set(task.charset) | set(template.replace("{question}", "")) | set(prefix) | set(stop or "")
            charset = "".join(sorted(chars))
            user_or("model.charset", charset, Source.TASK, "the characters the task and harness write")
        else:
            user_or("model.charset", None, Source.DEFAULT, "free text: every character the built-in families write")
    for field in DEFAULT_FIELDS:
        user_or(field, get_dotted(defaults, field)[1], Source.DEFAULT, "RunConfig default")
    if not applied:
        notes.append("run.task is written: the goal's run is its starting config as written (defaults for the rest)")
    return Plan(goal, spec, understood.source, tuple(choices), applied, tuple(notes))


def validated_lines(goal: Any, plan: Plan | None = None) -> list[str]:
    """What `swarm validate` prints for a goal that passed (`swarm.goal.Goal`): the task as
    understood, the target, then the plan's fields by source (`plan`: this one instead of the
    goal's own, e.g. with the pilot's choices)."""
    from trainer.tasks import TASKS

    t = goal.target
    if goal.entrypoint is not None:   # the user's own script: no task or trainer config of ours to plan
        return [f"ok: script {goal.entrypoint.script}, target {t.metric} {t.op} {t.threshold:g}"]
    cfg = goal.run_config("check", "runs")
    cls = TASKS.get(cfg.task.name)
    d = cfg.harness.curriculum.end or cfg.harness.curriculum.start   # the difficulty it is evaluated at
    what = [str(cfg.task.options["dataset"])] if cfg.task.name == "rg" and cfg.task.options.get("dataset") else []
    if cls is not None:
        what.append(cls.difficulty_label.format(d=d))
    lines = [f"ok: {cfg.task.name} task ({', '.join(what)}), target {t.metric} {t.op} {t.threshold:g}"]
    plan = plan if plan is not None else goal.plan()
    if plan is not None:
        lines.append("plan (the task comes from the words: these fields train):" if plan.applied
                     else "plan (run.task is written: the run as written, defaults for the rest):")
        lines += plan.summary()
    return lines
