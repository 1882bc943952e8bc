"""The goal's words: which task a goal's sentence asks for, and at what difficulty.

    from swarm.words import understand
    understand("a policy that sorts lists of 5 digits with >= 90% exact match", run_task=None)
    # Understood(spec=TaskSpec(name='sort', options={}, difficulty=5, ...), source='words', ...)

The task comes from `run.task` when the goal writes it, else from the sentence. Without an LLM the
sentence is read by this documented, deterministic matcher over the task registry
(trainer/tasks: each family declares `names`, describing `words` and `difficulty_patterns`):

1. The sentence is lowercased, number words up to twelve become digits ("five" -> "5"), and it is
   split into words of letters and digits ("3-digit" -> "3", "digit").
2. A family is a candidate when one of its names appears as a word or, for a phrase ("count
   down"), as consecutive words. Its score is the number of words its names cover ("countdown
   game" covers two). A reasoning-gym dataset is a candidate only when the sentence names reasoning-gym
   ("reasoning gym", "reasoning-gym", "rg") and the dataset ("basic arithmetic"), or writes the
   dataset's id itself ("basic_arithmetic"); its score counts both names. (reasoning-gym has its
   own countdown and sorting datasets: the built-in families are what a plain word means.)
3. The best score wins. No candidate, or two with the best score, is a refusal (`Refused`): one
   line saying what was understood and what to write. Describing words never pick a task: when
   nothing is named, the families whose describing words the sentence uses are suggested.
4. The difficulty is read with the winner's `difficulty_patterns` ("3-digit numbers", "lists of
   5 digits"). All matches must agree; several different values are not guessed (the difficulty is
   then left to the plan, and a note says so); a value outside the family's range is a refusal.
   Task options (countdown's max_number, the code task's sandbox) are never read from words: the
   family lists them in `unread_options` and a note says their defaults are used.

When `run.task` is written and the sentence names another family (or another reasoning-gym
dataset), that is a refusal too: the user's two statements disagree and neither silently wins.
The result is a plain value (`Understood | Refused`), so `Goal.load` refuses and `Goal.parse`
records; the CLI prints a refusal as one line and exits 2.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal

NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())}
RG_NAMES = ("reasoning gym", "reasoninggym", "rg")   # words that name the reasoning-gym family
SHOWN_CHARS = 60                                      # of the sentence, in a refusal


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """A typed task: the family, its options and the difficulty the goal asks for (None: not
    stated; the plan picks it). `said` is what in the sentence named it; `notes` what was not read."""

    name: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    difficulty: int | None = None
    said: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"said": list(self.said), "notes": list(self.notes)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "TaskSpec":
        return cls(d["name"], dict(d.get("options") or {}), d.get("difficulty"), tuple(d.get("said") or ()),
                   tuple(d.get("notes") or ()))


@dataclasses.dataclass(frozen=True)
class Understood:
    """The task to train. `source`: 'run' when the goal writes run.task (the sentence agrees or
    names no task), 'words' when it comes from the sentence alone."""

    spec: TaskSpec
    source: Literal["run", "words"]


@dataclasses.dataclass(frozen=True)
class Refused:
    """The goal cannot be understood: `line` says what was understood and what to write."""

    line: str


@dataclasses.dataclass(frozen=True)
class _Candidate:
    name: str
    options: dict[str, Any]
    score: int
    said: tuple[str, ...]


def normalise(sentence: str) -> list[str]:
    """Lowercased words of letters and digits, number words up to twelve as digits."""
    return [NUMBER_WORDS.get(w, w) for w in re.findall(r"[a-z0-9]+", sentence.lower())]


def _phrase_hits(tokens: list[str], phrases: tuple[str, ...]) -> list[str]:
    """The phrases of `phrases` that occur in `tokens` as consecutive words."""
    hits = []
    for phrase in phrases:
        words = normalise(phrase)
        n = len(words)
        if n and any(tokens[i:i + n] == words for i in range(len(tokens) - n + 1)):
            hits.append(phrase)
    return hits


def _covered(hits: list[str]) -> int:
    """Words covered by the hits, a phrase inside a longer hit counted once ("countdown game")."""
    longest = [h for h in hits if not any(h != o and f" {h} " in f" {o} " for o in hits)]
    return sum(len(normalise(h)) for h in longest)


def _families() -> dict[str, Any]:
    from trainer.tasks import TASKS

    return dict(TASKS)


def candidates(sentence: str) -> list[_Candidate]:
    """Every family (and reasoning-gym dataset) the sentence names, with its score."""
    tokens = normalise(sentence)
    found: list[_Candidate] = []
    for name, cls in sorted(_families().items()):
        if name == "rg":
            found += _rg_candidates(sentence, tokens, cls)
            continue
        hits = _phrase_hits(tokens, cls.names)
        if hits:
            found.append(_Candidate(name, {}, _covered(hits), tuple(hits)))
    return found


def _rg_candidates(sentence: str, tokens: list[str], cls: Any) -> list[_Candidate]:
    family = _phrase_hits(tokens, RG_NAMES)
    raw_ids = set(re.findall(r"\b[a-z0-9]+(?:_[a-z0-9]+)+\b", sentence.lower()))
    if not family and not raw_ids:
        return []   # reasoning-gym is imported (about a second) only when the sentence names it
    try:
        datasets = cls.dataset_names()
    except ImportError:
        return []
    found = []
    for dataset, (ident, words) in datasets.items():
        if ident in raw_ids:
            hits = [ident]
        elif family:
            hits = _phrase_hits(tokens, (words,))
        else:
            continue
        if hits:
            found.append(_Candidate("rg", {"dataset": dataset}, _covered(family) + len(normalise(words)),
                                    tuple(family + hits)))
    if family and not found:   # the family without a dataset: a candidate the caller refuses
        found.append(_Candidate("rg", {}, _covered(family), tuple(family)))
    return found


def _shown(sentence: str) -> str:
    s = " ".join(sentence.split())
    return repr(s if len(s) <= SHOWN_CHARS else s[:SHOWN_CHARS - 1] + "…")


def _label(c: _Candidate) -> str:
    return c.name + (f" ({c.options['dataset']})" if c.options.get("dataset") else "")


def _how_to_name() -> str:
    shown = []
    for name, cls in sorted(_families().items()):
        shown.append("rg ('reasoning-gym DATASET')" if name == "rg" else f"{name} ({', '.join(map(repr, cls.names[:2]))})")
    return ", ".join(shown)


def suggested(sentence: str) -> list[str]:
    """Families whose describing words the sentence uses (most first): a hint, never a choice."""
    tokens = set(normalise(sentence))
    counts = {name: len(tokens & {normalise(w)[0] for w in cls.words}) for name, cls in _families().items()}
    return [n for n, k in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if k]


def numbered(sentence: str) -> str:
    """The sentence lowercased, its whitespace single spaces, number words up to twelve as digits
    ("a five-digit number" -> "a 5-digit number"): the text `difficulty_patterns` read."""
    text = " ".join(sentence.lower().split())
    return re.sub(r"\b(" + "|".join(NUMBER_WORDS) + r")\b", lambda m: NUMBER_WORDS[m.group(1)], text)


def read_difficulty(sentence: str, cls: Any) -> tuple[int | None, tuple[str, ...]]:
    """The difficulty the sentence states for family `cls`: None when it states none, or several
    that differ (then with a note saying so)."""
    text = numbered(sentence)
    values = sorted({int(m) for p in cls.difficulty_patterns for m in re.findall(p, text)})
    if len(values) > 1:
        return None, (f"the sentence states several difficulties ({', '.join(map(str, values))}): none is read",)
    return (values[0] if values else None), ()


def understand(sentence: str, run_task: dict[str, Any] | None) -> Understood | Refused:
    """The task a goal asks for: `run_task` is the goal's `run.task` as written (None: not written)."""
    found = candidates(sentence)
    best = max((c.score for c in found), default=None)
    top = [c for c in found if c.score == best]
    if run_task is not None:
        options = run_task.get("options")   # malformed ones are the goal's own check to name
        written = {"name": str(run_task.get("name", "addition")), "options": dict(options) if isinstance(options, dict) else {}}
        return _against_run(sentence, written, found, top)
    if not top:
        hint = suggested(sentence)
        maybe = f" (its words suggest {' or '.join(hint[:3])})" if hint else ""
        return Refused(f"invalid goal: goal={_shown(sentence)}: names no task{maybe}; name one in the sentence — "
                       f"{_how_to_name()} — or write run.task: {{name: ...}}")
    if len(top) > 1:
        names = " and ".join(f"{_label(c)} ({', '.join(repr(s) for s in c.said)})" for c in top)
        either = " or ".join(f"{{name: {c.name}}}" for c in top)
        return Refused(f"invalid goal: goal={_shown(sentence)}: names {names} equally; write run.task: {either}, "
                       "or reword the goal to name one task")
    c = top[0]
    if c.name == "rg" and not c.options.get("dataset"):
        return Refused(f"invalid goal: goal={_shown(sentence)}: names reasoning-gym but no dataset of it; name one "
                       "(e.g. 'reasoning-gym basic_arithmetic') or write run.task: {name: rg, options: {dataset: ...}}")
    return _with_difficulty(sentence, TaskSpec(c.name, dict(c.options), None, c.said), "words")


def _against_run(sentence: str, written: dict[str, Any], found: list[_Candidate],
                 top: list[_Candidate]) -> Understood | Refused:
    """run.task is written: the sentence may name nothing, or name the same task; else a refusal."""
    name, options = written["name"], written["options"]

    def agrees(c: _Candidate) -> bool:
        if c.name != name:
            return False
        return c.name != "rg" or not c.options.get("dataset") or c.options["dataset"] == options.get("dataset")

    if top and not any(agrees(c) for c in top):
        said = " and ".join(f"{_label(c)} ({', '.join(repr(s) for s in c.said)})" for c in top)
        written_label = name + (f" ({options['dataset']})" if name == "rg" and options.get("dataset") else "")
        return Refused(f"invalid goal: goal={_shown(sentence)} names {said}, but run.task is {written_label}: make them "
                       f"agree (drop run.task to train what the sentence says, or reword the goal)")
    said = next((c.said for c in top if agrees(c)), ())
    spec = TaskSpec(name, options, None, said)
    if not said:   # the sentence names no task: nothing in it is read as this task's difficulty
        return Understood(spec, "run")
    return _with_difficulty(sentence, spec, "run")


def _with_difficulty(sentence: str, spec: TaskSpec, source: Literal["run", "words"]) -> Understood | Refused:
    from trainer.tasks import make_task

    families = _families()
    if spec.name not in families:   # an unknown run.task.name: the goal's own check names it
        return Understood(spec, source)
    cls = families[spec.name]
    difficulty, notes = read_difficulty(sentence, cls)
    lo, hi = cls.min_difficulty, cls.max_difficulty
    if spec.name == "rg" and difficulty is not None:
        try:
            lo, hi = 1, make_task("rg", **spec.options).max_difficulty
        except (ValueError, TypeError):
            pass   # the goal's own check names the bad option
    if difficulty is not None and not lo <= difficulty <= hi:
        label = cls.difficulty_label.format(d=difficulty)
        return Refused(f"invalid goal: goal={_shown(sentence)} asks for {spec.name} at {label}; {spec.name} takes "
                       f"{lo}..{hi} ({cls.difficulty_label.format(d='N')}): reword the goal or write "
                       "run.harness.curriculum.start")
    unread = tuple(o for o in cls.unread_options if o not in spec.options)
    if unread:
        notes += (f"{', '.join(unread)} not read from the words: the task's defaults",)
    return Understood(dataclasses.replace(spec, difficulty=difficulty, notes=spec.notes + notes), source)


# ---- the LLM path ------------------------------------------------------------------------------
# With an LLM configured, the lead may read the sentence through one validated tool call instead of
# the matcher: the arguments are checked against the registry (a family, a dataset it has, a
# difficulty in its range) inside the schema, so a wrong reply goes back to the model with the
# error (LLMPolicy.ask's retries), and a model that never answers validly leaves the matcher to read
# the sentence. The model's reply is data: it names a registered family or nothing.
TASK_TOOL = "task_spec"
TASK_TOOL_HELP = ("The task the goal's sentence asks a policy to learn: one family of the registry (or 'none' when the "
                  "sentence names no task), the reasoning-gym dataset for family 'rg', and the difficulty the sentence "
                  "states (null when it states none).")


def _family_lines() -> str:
    lines = []
    for name, cls in sorted(_families().items()):
        rng = "levels per dataset" if name == "rg" else f"{cls.min_difficulty}..{cls.max_difficulty}"
        lines.append(f"- {name}: named by {', '.join(cls.names[:4])}; difficulty {rng} "
                     f"({cls.difficulty_label.format(d='N')})")
    return "\n".join(lines)


def task_spec_args() -> type:
    """The tool's arguments: a pydantic model whose validators check them against the registry."""
    from pydantic import BaseModel, ConfigDict, Field, model_validator

    class TaskSpecArgs(BaseModel):
        model_config = ConfigDict(extra="forbid")
        task: str = Field(..., description="a family name of the registry, or 'none'")
        dataset: str | None = Field(None, description="family 'rg' only: the reasoning-gym dataset id")
        difficulty: int | None = Field(None, description="the difficulty the sentence states; null when none")
        reason: str = Field("", max_length=300, description="the words of the sentence that name the task")

        @model_validator(mode="after")
        def _registered(self) -> "TaskSpecArgs":
            families = _families()
            if self.task == "none":
                return self
            if self.task not in families:
                raise ValueError(f"task={self.task!r}: not a family; known: {', '.join(sorted(families))}, none")
            if (self.task == "rg") != (self.dataset is not None):
                raise ValueError("dataset is given for task 'rg' and only for it")
            lo, hi = families[self.task].min_difficulty, families[self.task].max_difficulty
            if self.task == "rg":
                from trainer.tasks import make_task

                if self.dataset not in families["rg"].dataset_names():
                    raise ValueError(f"dataset={self.dataset!r}: not a reasoning-gym dataset")
                lo, hi = 1, make_task("rg", dataset=self.dataset).max_difficulty
            if self.difficulty is not None and not lo <= self.difficulty <= hi:
                raise ValueError(f"difficulty={self.difficulty}: {self.task} takes {lo}..{hi}")
            return self

    return TaskSpecArgs


def understand_by_llm(sentence: str, run_task: dict[str, Any] | None, ask: Any) -> Understood | Refused:
    """`understand` with the sentence read by an LLM: `ask` is `agents.llm.LLMPolicy.ask`. When the
    model gives no valid answer, the matcher reads the sentence and a note says why."""
    system = ("You turn a training goal's sentence into a typed task spec by calling the tool once. The task "
              "families:\n" + _family_lines() + "\nName a family only when the sentence asks for it; otherwise 'none'.")
    args, why = ask("lead", system, f"The goal's sentence: {sentence}", TASK_TOOL, TASK_TOOL_HELP, task_spec_args())
    if args is None:
        out = understand(sentence, run_task)
        if isinstance(out, Understood):
            note = f"the LLM gave no task spec ({why}): read by the matcher"
            return dataclasses.replace(out, spec=dataclasses.replace(out.spec, notes=out.spec.notes + (note,)))
        return out
    said = (f"llm: {args.reason}" if args.reason else "llm",)
    if args.task == "none":
        if run_task is not None:
            return understand(sentence, run_task)   # run.task says; the matcher still checks for disagreement
        return Refused(f"invalid goal: goal={_shown(sentence)}: the LLM read no task in it ({args.reason or 'no reason'}); "
                       f"name one — {_how_to_name()} — or write run.task: {{name: ...}}")
    options = {"dataset": args.dataset} if args.task == "rg" else {}
    cls = _families()[args.task]
    notes = (f"{', '.join(cls.unread_options)} not read from the words: the task's defaults",) if cls.unread_options else ()
    spec = TaskSpec(args.task, options, args.difficulty, said, notes)
    if run_task is None:
        return Understood(spec, "words")
    name = str(run_task.get("name", "addition"))
    written = run_task.get("options") if isinstance(run_task.get("options"), dict) else {}
    if name != args.task or (name == "rg" and written.get("dataset") != args.dataset):
        label = args.task + (f" ({args.dataset})" if args.dataset else "")
        return Refused(f"invalid goal: goal={_shown(sentence)} asks for {label} (read by the LLM), but run.task is "
                       f"{name}: make them agree (drop run.task to train what the sentence says, or reword the goal)")
    return Understood(dataclasses.replace(spec, options=dict(written)), "run")
