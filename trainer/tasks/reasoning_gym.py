"""Adapter exposing the `reasoning-gym` package's procedural datasets as one task family, `rg`.

    make_task("rg", dataset="basic_arithmetic")               # curriculum-driven difficulty
    make_task("rg", dataset="basic_arithmetic", max_terms=3)  # extra options go to the dataset config

Every example comes from a fresh dataset of size 1 whose seed is drawn from the example's own
random stream, so train and held-out examples come from different seeds (and, like every family,
from disjoint parts of the question space; see `trainer.tasks.base`). The verdict comes from the
dataset's own `score_answer(answer, entry)`: a score of 1 is CORRECT, anything less is WRONG with
reward 0 under the exact reward, and the score itself is the partial credit. A scorer that raises
makes the answer MALFORMED (the error becomes data, in `detail`).

Difficulty: when the dataset registers a reasoning-gym curriculum, difficulty d puts every
curriculum attribute at level d-1 (clipped to that attribute's last level), and a range attribute
spans levels 0..d-1 (reasoning-gym's own "inclusive" mode; its "upper_bound" mode, one level's
segment alone, makes a dozen generators fail or hang on degenerate ranges). `max_difficulty` is the
number of levels of the longest attribute, cut at the first level whose config the dataset rejects
(upstream curricula that outrun their own limits: caesar_cipher stops at 2, knight_swap and
modulo_grid at 1). Without a curriculum only difficulty 1 exists. Options given by the user
override the curriculum's value for the same config field at every difficulty.

Deviations: a dataset is constructed per example (a few datasets load word lists or grids at
construction, up to ~0.3 s each); datasets without a single oracle answer (boxnet, graph_color,
rubiks_cube, rush_hour) give an empty `answer` and no `solution`. A question space too small to
split (tower_of_hanoi and propositional_logic at difficulty 1 have 6 and 4 questions) has no
held-out examples: asking for one raises ValueError. Some generators are slow at their top levels
(jugs, sokoban, zebra_puzzles take seconds per example); `composite` needs its `datasets` option.
Answers are free text with spaces and newlines, so the harness needs a delimited answer format,
not the one-word default.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import random
from typing import Any, ClassVar

from trainer.tasks.base import Example, Task, Verdict, VerifyResult, register_task

_RESERVED = ("seed", "size")  # owned by the adapter
RANGE_MODE = "inclusive"  # how a curriculum level becomes a config range (see the docstring)


def _registry() -> tuple[dict[str, Any], dict[str, Any]]:
    import reasoning_gym  # noqa: F401  (registers the datasets; ~1 s, so only when used)
    from reasoning_gym.factory import CURRICULA, DATASETS

    return DATASETS, CURRICULA


@register_task
class ReasoningGym(Task):
    name = "rg"
    min_difficulty = 1
    max_difficulty = 1  # per instance, from the dataset's curriculum
    charset: ClassVar[str] = ""  # free text: use the model's own tokenizer
    # the family's names; each dataset is named by its id ("basic_arithmetic") and that id's words
    # ("basic arithmetic"): `dataset_names()`
    names = ("reasoning gym", "reasoninggym", "rg")
    words = ("puzzle", "puzzles", "dataset", "reasoning")
    difficulty_label = "level {d}"
    answer_format = {"prefix": "<answer>", "regex": "<answer>(.*?)(?:</answer>|\\Z)", "stop": None}
    template = "{question}\n"
    default_difficulty = 1
    length_probes = 16     # a few generators take seconds per example at their top levels

    def __init__(self, seed: int = 0, dataset: str | None = None, **config: Any) -> None:
        super().__init__(seed=seed)
        datasets, curricula = _registry()
        if not dataset:
            raise ValueError("task 'rg': option 'dataset' is required, e.g. dataset='basic_arithmetic'")
        if dataset not in datasets:
            near = difflib.get_close_matches(dataset, list(datasets), n=3)
            hint = f"did you mean {', '.join(near)}? " if near else ""
            raise ValueError(
                f"task 'rg': unknown reasoning-gym dataset {dataset!r}; {hint}"
                f"known include {', '.join(sorted(datasets)[:8])}, ... ({len(datasets)} in all)"
            )
        _, config_cls = datasets[dataset]
        fields = {f.name for f in dataclasses.fields(config_cls)}
        for key in sorted(config):
            if key in _RESERVED:
                raise ValueError(f"task 'rg': option {key!r} is set by the adapter, not by the user")
            if key not in fields:
                raise ValueError(
                    f"task 'rg': dataset {dataset!r} has no config field {key!r}; "
                    f"fields: {', '.join(sorted(fields - set(_RESERVED)))}"
                )
        self.dataset = dataset
        self.config = dict(config)
        self._create(self.config, "with the options given")  # the user's options alone must work
        self._levels = self._usable_levels(curricula.get(dataset))
        self.max_difficulty = len(self._levels)  # type: ignore[misc]
        self._scorers: dict[int, Any] = {}

    @staticmethod
    def dataset_names() -> dict[str, tuple[str, ...]]:
        """What names each reasoning-gym dataset in a goal's sentence: its id and the id's words."""
        datasets, _ = _registry()
        return {d: (d, d.replace("_", " ")) for d in sorted(datasets)}

    def knobs(self, difficulty: int) -> dict[str, Any]:
        """The dataset config fields for `difficulty` (curriculum values, then the user's options)."""
        self.check_difficulty(difficulty)
        return dict(self._levels[difficulty - 1])

    def _usable_levels(self, curriculum_cls: Any) -> list[dict[str, Any]]:
        """Config fields per difficulty, cut at the first level whose config the dataset rejects
        (some upstream curricula run past their own config's limits: caesar_cipher above 2)."""
        if curriculum_cls is None:
            return [dict(self.config)]
        from reasoning_gym.coaching.attributes import RangeAttributeDefinition
        from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode

        levels: list[dict[str, Any]] = []
        n = max((len(a.levels) for a in curriculum_cls().attributes.values()), default=1)
        for difficulty in range(1, n + 1):
            cur = curriculum_cls()
            touched: list[str] = []
            for name, attr in cur.attributes.items():
                cur.set_attr_level(name, min(difficulty - 1, len(attr.levels) - 1))
                if isinstance(attr, RangeAttributeDefinition):
                    touched += [attr.lower_field_name, attr.upper_field_name]
                else:
                    touched.append(attr.field_name)
            cfg = cur.generate_configuration(context=DefaultCurriculumContext(mode=RangeAttributeMode(RANGE_MODE)))
            knobs = {**{f: getattr(cfg, f) for f in touched}, **self.config}
            try:
                self._create(knobs, f"at difficulty={difficulty}")
            except ValueError:
                break
            levels.append(knobs)
        return levels or [dict(self.config)]

    def _create(self, knobs: dict[str, Any], where: str, seed: int = 0) -> Any:
        import reasoning_gym

        try:
            return reasoning_gym.create_dataset(self.dataset, **knobs, seed=seed, size=1)
        except (AssertionError, TypeError, ValueError) as e:
            raise ValueError(f"task 'rg': dataset {self.dataset!r} rejects its config {where} ({knobs}): {e}") from None

    def _dataset(self, difficulty: int, seed: int) -> Any:
        return self._create(self._levels[difficulty - 1], f"at difficulty={difficulty}", seed=seed)

    def make(self, rng: random.Random, difficulty: int) -> Example:
        entry = self._dataset(difficulty, seed=rng.getrandbits(32))[0]
        answer = "" if entry["answer"] is None else str(entry["answer"])
        return Example(
            uid="", question=str(entry["question"]), answer=answer, solution=answer or None,
            meta={"dataset": self.dataset, "entry": entry},
        )

    def score(self, parsed: str, example: Example) -> float:
        """The dataset's score for `parsed`, clamped to [0, 1]; raises what the scorer raises."""
        d = example.difficulty
        if d not in self._scorers:
            self._scorers[d] = self._dataset(d, seed=0)
        s = float(self._scorers[d].score_answer(parsed, example.meta["entry"]))
        return 0.0 if math.isnan(s) else min(1.0, max(0.0, s))

    def check(self, parsed: str, example: Example) -> VerifyResult:
        try:
            s = self.score(parsed, example)
        except Exception as e:  # noqa: BLE001  (a third-party scorer: its failure becomes the verdict)
            return VerifyResult(0.0, Verdict.MALFORMED, parsed, f"score_answer raised {type(e).__name__}: {e}")
        if s >= 1.0:
            return VerifyResult(1.0, Verdict.CORRECT, parsed)
        return VerifyResult(0.0, Verdict.WRONG, parsed, f"score {s:.3g}")

    def partial_credit(self, parsed: str, example: Example) -> float:
        try:
            return self.score(parsed, example)
        except Exception:  # noqa: BLE001  (as in `check`)
            return 0.0
