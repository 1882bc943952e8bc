"""Task interface: procedural, verifiable task families.

A task family generates `Example`s deterministically from (split, index, difficulty), so any
example can be regenerated from its cursor on resume. Train and held-out splits are drawn from
disjoint seed streams and, because small difficulties have small question spaces (there are only
100 one-digit additions), they are also partitioned by content: a question belongs to the held-out
split iff a hash of its text falls in the held-out bucket (`HELDOUT_FRACTION`), and each split
redraws until it gets one of its own. So no held-out question is ever trained on. A verifier scores
a completion with a reward in [0, 1] and a `Verdict`.

How an answer is pulled out of a completion belongs to the harness (answer format); the task only
compares a parsed answer with the ground truth. `Task.verify` is the one entry point the trainer
calls: it receives the raw completion, whether generation hit the token limit, and the extractor
the harness chose.
"""
from __future__ import annotations

import abc
import dataclasses
import enum
import hashlib
import random
from typing import Any, Callable, ClassVar


class Verdict(str, enum.Enum):
    CORRECT = "correct"
    WRONG = "wrong"
    MALFORMED = "malformed"   # no answer could be extracted / answer not in the expected form
    TRUNCATED = "truncated"   # generation hit max_new_tokens before the answer was closed


class Split(str, enum.Enum):
    TRAIN = "train"
    HELDOUT = "heldout"


@dataclasses.dataclass(frozen=True)
class Example:
    """One problem. `question` is the bare problem text the harness template wraps; `answer` is
    the canonical answer string; `solution` is the target completion body used for SFT (defaults
    to the answer); `meta` carries what the verifier needs (e.g. countdown numbers)."""

    uid: str
    question: str
    answer: str
    solution: str | None = None
    difficulty: int = 1
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    reward: float
    verdict: Verdict
    parsed: str | None = None
    detail: str = ""

    def __post_init__(self) -> None:
        assert 0.0 <= self.reward <= 1.0, f"reward {self.reward} outside [0, 1]"


Extractor = Callable[[str], "str | None"]


# Share of the question space reserved for held-out evaluation, and how many redraws a split may
# take to land in its own part (at 1/8, failing 2000 held-out draws has odds of about 1e-116; it
# happens only when the question space at that difficulty has no held-out question at all).
HELDOUT_FRACTION = 1 / 8
MAX_DRAWS = 2000


def _split_seed(name: str, split: Split, index: int, difficulty: int, seed: int, draw: int = 0) -> int:
    key = f"{name}|{split.value}|{difficulty}|{seed}|{index}" + (f"|{draw}" if draw else "")
    h = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(h[:8], "little")


def heldout_question(question: str) -> bool:
    """Whether `question` belongs to the held-out part of its task's question space."""
    h = hashlib.sha256(question.encode()).digest()
    return int.from_bytes(h[:8], "little") < HELDOUT_FRACTION * 2**64


class Task(abc.ABC):
    """A task family. Subclasses set `name`, implement `make` and `check`.

    `difficulty` is an integer knob >= 1 whose meaning is task-specific (digits for arithmetic,
    number count for countdown, list length for sorting).
    """

    name: ClassVar[str]
    min_difficulty: ClassVar[int] = 1
    max_difficulty: ClassVar[int] = 10

    # What a goal's sentence may say about the family (read by swarm/words.py, never by training).
    # `names`: words or phrases that name it, each inflection written out ("adds", "adding");
    # `words`: describing words that break a tie between families a name picks; `difficulty_patterns`:
    # regexes with one group, over the lowercased sentence (number words as digits), that read the
    # difficulty it states ("3-digit numbers"); `difficulty_label`: how a difficulty reads ("{d} digits").
    names: ClassVar[tuple[str, ...]] = ()
    words: ClassVar[tuple[str, ...]] = ()
    difficulty_patterns: ClassVar[tuple[str, ...]] = (r"\bdifficulty (?:of )?(\d+)\b", r"\blevel (\d+)\b")
    difficulty_label: ClassVar[str] = "difficulty {d}"
    # Facts a plan is made from (swarm/plan.py): the difficulty when the goal states none; the
    # options its words never set (said so in the plan); an answer format when the one-word default
    # does not suit the answer (AnswerFormat fields), why (`answer_format_why`), and the prompt
    # template that goes with it.
    default_difficulty: ClassVar[int] = 3
    unread_options: ClassVar[tuple[str, ...]] = ()
    answer_format: ClassVar[dict[str, Any] | None] = None
    answer_format_why: ClassVar[str] = "the answers are free text: a delimited answer, not one word"
    template: ClassVar[str | None] = None
    length_probes: ClassVar[int] = 64   # examples per split generated when lengths are measured, not derived
    charset: ClassVar[str] = ""         # every character questions and answers use; "" = free text
    # the verifier accepts no answer shorter than an example's own `answer` (one right answer, written
    # at its shortest): an answer limit below that length cuts every right answer, a fact of the task
    answer_is_shortest: ClassVar[bool] = False

    def max_lengths(self, difficulty: int) -> tuple[int, int]:
        """(question, answer) length bounds in characters at `difficulty`; the answer is the longer of
        `answer` and `solution` (the SFT target). Families whose lengths follow from the difficulty
        override this with the exact bound; here they are measured on `length_probes` examples of
        each split and given a margin (x1.5 + 8): a bound that holds for what was seen, not a proof."""
        q = a = 0
        for split in Split:
            for i in range(self.length_probes):
                try:
                    ex = self.example(split, i, difficulty)
                except ValueError:   # a split with no question at this difficulty
                    break
                q = max(q, len(ex.question))
                a = max(a, len(ex.answer), len(ex.solution or ""))
        return (q * 3 + 1) // 2 + 8, (a * 3 + 1) // 2 + 8

    def default_difficulty_clamped(self) -> int:
        return min(max(self.default_difficulty, self.min_difficulty), self.max_difficulty)

    def __init__(self, seed: int = 0, **options: Any) -> None:
        if options:
            raise ValueError(f"task {self.name!r}: unknown options {sorted(options)}")
        self.seed = seed
        self._rng = random.Random()

    def check_difficulty(self, difficulty: int) -> int:
        if not (self.min_difficulty <= difficulty <= self.max_difficulty):
            raise ValueError(
                f"task {self.name!r}: difficulty={difficulty} outside "
                f"[{self.min_difficulty}, {self.max_difficulty}]"
            )
        return difficulty

    def example(self, split: Split | str, index: int, difficulty: int) -> Example:
        split = Split(split)
        self.check_difficulty(difficulty)
        want_heldout = split is Split.HELDOUT
        rng = self._rng   # re-seeded per draw: the same stream as a fresh random.Random(seed), no allocation
        for draw in range(MAX_DRAWS):
            rng.seed(_split_seed(self.name, split, index, difficulty, self.seed, draw))
            ex = self.make(rng, difficulty)
            if heldout_question(ex.question) == want_heldout:
                uid = f"{self.name}/{split.value}/d{difficulty}/{index}"
                return Example(uid, ex.question, ex.answer, ex.solution, difficulty, ex.meta)
        raise ValueError(
            f"task {self.name!r}: no {split.value} question found at difficulty={difficulty} in "
            f"{MAX_DRAWS} draws; the question space there is too small to split"
        )

    @abc.abstractmethod
    def make(self, rng: random.Random, difficulty: int) -> Example:
        """Generate one example from `rng` (uid/difficulty are filled in by `example`)."""

    @abc.abstractmethod
    def check(self, parsed: str, example: Example) -> VerifyResult:
        """Score a parsed (extracted, stripped) answer against the example."""

    def reference(self, example: Example) -> Example | None:
        """`example` with its answer worked out again from the problem as the question states it,
        so that `check` against it does not read the stored answer: what a label is checked
        against (`harness.filters.labels_verify`), since a data source that gets a label wrong
        may get the stored answer wrong with it. None (the default) when the task cannot work it
        out (the stored answer is all there is) or the question is not in the task's form."""
        return None

    def partial_credit(self, parsed: str, example: Example) -> float:
        """Graded credit in [0, 1] for a parsed answer (used when `reward.kind` is `partial`).
        Families with a natural notion of closeness override this; the default is exact."""
        return 1.0 if self.check(parsed.strip(), example).verdict is Verdict.CORRECT else 0.0

    def verify(self, completion: str, example: Example, extract: Extractor, truncated: bool = False) -> VerifyResult:
        parsed = extract(completion)
        if parsed is None:
            verdict = Verdict.TRUNCATED if truncated else Verdict.MALFORMED
            return VerifyResult(0.0, verdict, None, "no answer found in completion")
        return self.check(parsed.strip(), example)


TASKS: dict[str, type[Task]] = {}


def register_task(cls: type[Task]) -> type[Task]:
    if cls.name in TASKS:
        raise ValueError(f"task {cls.name!r} registered twice")
    TASKS[cls.name] = cls
    return cls


def make_task(name: str, seed: int = 0, **options: Any) -> Task:
    from trainer import tasks as _  # noqa: F401  (imports the built-in families)

    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))}")
    return TASKS[name](seed=seed, **options)
