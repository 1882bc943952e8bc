"""Code-writing task family `code`: write a small Python function; the reward is the share of its
hidden unit tests that pass when run in a sandbox.

Each problem is a pipeline over a list of integers, described in English, that the function must
implement: maps (add, multiply, square, absolute value, modulo), filters (even, odd, greater than,
multiples of, every other element), reorderings (sort, reverse, dedupe, take the first k), scans
(prefix sums, differences, running maximum), and optionally a final reduction (sum, max, min,
count, distinct count). Difficulty d (1..10) is the number of stages; reorderings unlock at d >= 3
and scans at d >= 5, so function complexity grows with d. The question shows one worked example;
the `n_tests` test inputs (the empty list among them) and their expected outputs live only in
`Example.meta` — the sandbox gets the inputs, the host compares the outputs, so a solution cannot
read the expected values, only compute them.

    task = make_task("code", sandbox="local")            # sandbox: local (default) | docker | auto
    ex = task.example("train", index=0, difficulty=4)
    task.check(ex.solution, ex)                           # VerifyResult(1.0, CORRECT, ...)
    task.verify_many(completions, examples, extract)      # a whole GRPO group through a SandboxPool

Verdicts (never exceptions): code that does not parse, or defines no callable of the asked name,
is MALFORMED (reward 0); otherwise CORRECT when every test passes, else WRONG with the share of
passing tests as reward (`reward="fraction"`, the default) or 0 (`reward="all"`); `partial_credit`
is always the share. A timeout, a crash, a memory or output blow-up keeps the tests that finished
before it. A sandbox that cannot run at all (an engine gone away) scores 0 and is logged as an error.

Options: `sandbox` (local: bubblewrap, else unshare namespaces | docker | auto: Docker first, or a
`sandboxes.Sandbox`; where nothing isolates the sandbox is refused and the job stops, unless the
goal opted in with `sandbox: unsafe_plain`, which the job inherits), `n_tests` (1..64, default 8),
`timeout` (wall seconds per solution, all tests together, default 5), `reward` (fraction | all),
`workers` (threads for `verify_many`, default the CPU count). The code runs with the sandbox's
Python (standard library only). Answers are multi-line code: the harness needs a delimited answer
format (e.g. a fenced block), not the one-word default; `check` also strips a surrounding ```
fence.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import logging
import os
import random
import secrets
import threading
from collections import OrderedDict
from typing import Any, ClassVar, Sequence

from trainer.tasks.base import Example, Extractor, Task, Verdict, VerifyResult, register_task

log = logging.getLogger(__name__)

SANDBOX_KINDS = ("local", "docker", "auto")
REWARD_MODES = ("fraction", "all")
CACHE_SIZE = 4096  # scored (example, code) pairs kept so partial_credit does not rerun the tests

# --------------------------------------------------------------------------- stages
# Each op: (English text, solution code lines, function on a list). `{k}` is the stage parameter.
MAPS = {
    "add": ("adds {k} to every element", ["xs = [x + {k} for x in xs]"], lambda xs, k: [x + k for x in xs]),
    "mul": ("multiplies every element by {k}", ["xs = [x * {k} for x in xs]"], lambda xs, k: [x * k for x in xs]),
    "square": ("squares every element", ["xs = [x * x for x in xs]"], lambda xs, k: [x * x for x in xs]),
    "abs": ("replaces every element by its absolute value", ["xs = [abs(x) for x in xs]"],
            lambda xs, k: [abs(x) for x in xs]),
    "mod": ("replaces every element x by the remainder of x divided by {k} (a number from 0 to {km1})",
            ["xs = [x % {k} for x in xs]"], lambda xs, k: [x % k for x in xs]),
}
FILTERS = {
    "even": ("keeps only the even elements", ["xs = [x for x in xs if x % 2 == 0]"],
             lambda xs, k: [x for x in xs if x % 2 == 0]),
    "odd": ("keeps only the odd elements", ["xs = [x for x in xs if x % 2 != 0]"],
            lambda xs, k: [x for x in xs if x % 2 != 0]),
    "gt": ("keeps only the elements greater than {k}", ["xs = [x for x in xs if x > {k}]"],
           lambda xs, k: [x for x in xs if x > k]),
    "mult": ("keeps only the multiples of {k}", ["xs = [x for x in xs if x % {k} == 0]"],
             lambda xs, k: [x for x in xs if x % k == 0]),
    "every_other": ("keeps only the elements at even positions (the first, third, fifth, ...)",
                    ["xs = xs[::2]"], lambda xs, k: xs[::2]),
}
REORDERS = {
    "sort": ("sorts the elements in ascending order", ["xs = sorted(xs)"], lambda xs, k: sorted(xs)),
    "sort_desc": ("sorts the elements in descending order", ["xs = sorted(xs, reverse=True)"],
                  lambda xs, k: sorted(xs, reverse=True)),
    "reverse": ("reverses the order of the elements", ["xs = xs[::-1]"], lambda xs, k: xs[::-1]),
    "dedupe": ("removes repeated elements, keeping the first occurrence of each",
               ["xs = list(dict.fromkeys(xs))"], lambda xs, k: list(dict.fromkeys(xs))),
    "take": ("keeps only the first {k} elements (all of them if there are fewer)", ["xs = xs[:{k}]"],
             lambda xs, k: xs[:k]),
}


def _prefix_sums(xs: list[int]) -> list[int]:
    out, acc = [], 0
    for x in xs:
        acc += x
        out.append(acc)
    return out


def _running_max(xs: list[int]) -> list[int]:
    out: list[int] = []
    for x in xs:
        out.append(x if not out else max(out[-1], x))
    return out


SCANS = {
    "prefix_sum": ("replaces each element by the sum of itself and all elements before it",
                   ["acc, out = 0, []", "for x in xs:", "    acc += x", "    out.append(acc)", "xs = out"],
                   lambda xs, k: _prefix_sums(xs)),
    "diff": ("replaces the list by the differences between neighbours (next minus previous; one element "
             "fewer, empty if there are fewer than two)", ["xs = [b - a for a, b in zip(xs, xs[1:])]"],
             lambda xs, k: [b - a for a, b in zip(xs, xs[1:])]),
    "running_max": ("replaces each element by the largest element seen so far (itself included)",
                    ["out = []", "for x in xs:", "    out.append(x if not out else max(out[-1], x))", "xs = out"],
                    lambda xs, k: _running_max(xs)),
}
REDUCES = {
    "sum": ("returns the sum of the elements (0 for an empty list)", "return sum(xs)", lambda xs: sum(xs)),
    "max": ("returns the largest element (0 for an empty list)", "return max(xs) if xs else 0",
            lambda xs: max(xs) if xs else 0),
    "min": ("returns the smallest element (0 for an empty list)", "return min(xs) if xs else 0",
            lambda xs: min(xs) if xs else 0),
    "count": ("returns the number of elements", "return len(xs)", lambda xs: len(xs)),
    "distinct": ("returns the number of distinct elements", "return len(set(xs))", lambda xs: len(set(xs))),
}
ALL_OPS = {**MAPS, **FILTERS, **REORDERS, **SCANS}
VERBS = ("process", "transform", "crunch", "reduce", "filter", "compute", "tally", "shape", "refine", "digest")
NOUNS = ("numbers", "values", "items", "readings", "scores", "samples", "points", "counts")


def _param(op: str, rng: random.Random) -> int:
    if op == "add":
        return rng.choice([k for k in range(-9, 10) if k != 0])
    if op == "mul":
        return rng.randint(2, 5)
    if op in ("mod", "mult"):
        return rng.randint(2, 7)
    if op == "gt":
        return rng.randint(-10, 10)
    if op == "take":
        return rng.randint(1, 5)
    return 0


@dataclasses.dataclass(frozen=True)
class Stage:
    op: str
    k: int = 0

    def text(self) -> str:
        table = REDUCES if self.op in REDUCES else ALL_OPS
        return table[self.op][0].format(k=self.k, km1=self.k - 1)

    def apply(self, xs: list[int]) -> list[int]:
        return ALL_OPS[self.op][2](xs, self.k)


def pipeline_for(rng: random.Random, difficulty: int) -> tuple[list[Stage], str | None]:
    """`difficulty` stages; the last is a reduction with probability 1/2 from difficulty 2 on."""
    pools = [MAPS, FILTERS] + ([REORDERS] if difficulty >= 3 else []) + ([SCANS] if difficulty >= 5 else [])
    reduce = rng.choice(sorted(REDUCES)) if difficulty >= 2 and rng.random() < 0.5 else None
    stages: list[Stage] = []
    squared = False
    while len(stages) < difficulty - (reduce is not None):
        op = rng.choice(sorted(rng.choice(pools)))
        if op == "square" and squared:  # one squaring keeps the numbers readable
            continue
        squared |= op == "square"
        stages.append(Stage(op, _param(op, rng)))
    return stages, reduce


def run_pipeline(stages: Sequence[Stage], reduce: str | None, xs: list[int]) -> Any:
    for s in stages:
        xs = s.apply(list(xs))
    return REDUCES[reduce][2](xs) if reduce else xs


def solution_source(name: str, stages: Sequence[Stage], reduce: str | None) -> str:
    lines = [f"def {name}(xs):"]
    for s in stages:
        lines += ["    " + line.format(k=s.k) for line in ALL_OPS[s.op][1]]
    lines.append("    " + (REDUCES[reduce][1] if reduce else "return xs"))
    return "\n".join(lines) + "\n"


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


# --------------------------------------------------------------------------- the runner in the sandbox
# Imports the solution, calls it on every case, and prints one tagged JSON line per case as soon
# as it is done (so tests finished before a timeout still count). Expected outputs never enter.
RUNNER = r'''
import json, sys
TAG, NAME = sys.argv[1], sys.argv[2]
out = sys.stdout
def emit(obj):
    try:
        line = json.dumps(obj)
    except (TypeError, ValueError, RecursionError):
        line = json.dumps({"i": obj.get("i"), "error": "result is not JSON-serialisable"})
    out.write(TAG + " " + line + "\n")
    out.flush()
with open("cases.json") as f:
    cases = json.load(f)
try:
    import solution
except BaseException as e:
    emit({"status": "import_error", "error": (type(e).__name__ + ": " + str(e))[:300]})
    raise SystemExit(0)
fn = getattr(solution, NAME, None)
if not callable(fn):
    emit({"status": "missing"})
    raise SystemExit(0)
for i, args in enumerate(cases):
    try:
        emit({"i": i, "out": fn(*args)})
    except BaseException as e:
        emit({"i": i, "error": type(e).__name__})
emit({"status": "done"})
'''


def strip_fence(code: str) -> str:
    text = code.strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
        if text.rstrip().endswith("```"):
            text = text.rstrip()[:-3]
    return text


@dataclasses.dataclass(frozen=True)
class Score:
    passed: int
    total: int
    verdict: Verdict
    detail: str


@register_task
class CodeTask(Task):
    name = "code"
    min_difficulty = 1
    max_difficulty = 10
    charset: ClassVar[str] = ""  # code is free text: use the model's own tokenizer
    names = ("python", "function", "functions", "code", "coding", "program", "programs", "programming")
    words = ("write", "writes", "writing", "implement", "implements", "pipeline", "pipelines", "tests")
    difficulty_patterns = (r"\b(\d+)[- ]stages?\b", r"\bof (\d+) stages\b") + Task.difficulty_patterns
    difficulty_label = "{d} stages"
    unread_options = ("sandbox", "n_tests", "timeout", "reward")
    # multi-line code: a fenced block, closed by the end of the completion (eos) or a closing fence
    answer_format = {"prefix": "```python\n", "regex": "```python\n(.*?)(?:```|\\Z)", "stop": None}
    template = "{question}\n"
    length_probes = 32

    def __init__(self, seed: int = 0, sandbox: str = "local", n_tests: int = 8, timeout: float = 5.0,
                 reward: str = "fraction", workers: int | None = None, **options: Any) -> None:
        super().__init__(seed=seed, **options)
        from sandboxes import Sandbox

        if not (sandbox in SANDBOX_KINDS or isinstance(sandbox, Sandbox)):
            raise ValueError(f"task 'code': sandbox={sandbox!r} must be one of {', '.join(SANDBOX_KINDS)} "
                             "or a sandboxes.Sandbox")
        if not (isinstance(n_tests, int) and 1 <= n_tests <= 64):
            raise ValueError(f"task 'code': n_tests={n_tests!r} must be an integer in [1, 64]")
        if not (isinstance(timeout, (int, float)) and 0 < timeout <= 300):
            raise ValueError(f"task 'code': timeout={timeout!r} must be in (0, 300] seconds")
        if reward not in REWARD_MODES:
            raise ValueError(f"task 'code': reward={reward!r} must be one of {', '.join(REWARD_MODES)}")
        if workers is not None and not (isinstance(workers, int) and workers >= 1):
            raise ValueError(f"task 'code': workers={workers!r} must be a positive integer")
        given = sandbox if isinstance(sandbox, Sandbox) else None
        self.sandbox_kind = given.isolation.value if given else sandbox
        self.n_tests, self.timeout, self.reward_mode = n_tests, float(timeout), reward
        self.workers = workers or (os.cpu_count() or 1)
        self._sandbox: Any = given
        self._pool: Any = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], Score] = OrderedDict()

    # Tasks travel to Ray workers: the sandbox and its threads are rebuilt there on first use.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_sandbox=None, _pool=None, _lock=None, _cache=OrderedDict())
        if self.sandbox_kind not in SANDBOX_KINDS:  # a Sandbox instance was given: rebuild a local one
            state["sandbox_kind"] = "local"
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- generation
    def make(self, rng: random.Random, difficulty: int) -> Example:
        name = f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}"
        for _ in range(50):
            stages, reduce = pipeline_for(rng, difficulty)
            inputs = [[]] + [[rng.randint(-20, 20) for _ in range(rng.randint(1, 8))]
                             for _ in range(self.n_tests - 1)]
            expected = [run_pipeline(stages, reduce, xs) for xs in inputs]
            # A test set whose outputs are all equal is passed by a constant: draw again.
            if self.n_tests == 1 or len({_canon(e) for e in expected}) > 1:
                break
        shown = [rng.randint(-9, 9) for _ in range(rng.randint(3, 5))]
        steps = [s.text() for s in stages] + ([REDUCES[reduce][0]] if reduce else ["returns the resulting list"])
        question = (
            f"Write a Python function named {name} that takes a list of integers xs and:\n"
            + "\n".join(f"{i + 1}. {t};" for i, t in enumerate(steps))[:-1] + ".\n"
            + f"For example, {name}({shown}) returns {run_pipeline(stages, reduce, shown)}."
        )
        solution = solution_source(name, stages, reduce)
        meta = {"function": name, "stages": [[s.op, s.k] for s in stages], "reduce": reduce,
                "inputs": inputs, "expected": expected}
        return Example(uid="", question=question, answer=solution, solution=solution, meta=meta)

    # ----------------------------------------------------------------- sandbox
    @property
    def sandbox(self) -> Any:
        """The sandbox solutions run in, built on first use from the `sandbox` option (limits:
        `timeout` wall and CPU seconds, 256 MiB, 16 processes, 256 KiB of output)."""
        with self._lock:
            if self._sandbox is None:
                from sandboxes import Limits, make_sandbox

                limits = Limits(wall_seconds=self.timeout, cpu_seconds=self.timeout, memory_bytes=256 << 20,
                                pids=16, output_bytes=256 << 10, file_bytes=1 << 20, disk_bytes=16 << 20)
                self._sandbox = make_sandbox(self.sandbox_kind, limits=limits)
                log.info("task code: sandbox %s", self._sandbox.describe())
            return self._sandbox

    def _pool_for(self, sandbox: Any) -> Any:
        with self._lock:
            if self._pool is None:
                from sandboxes import SandboxPool

                self._pool = SandboxPool(sandbox, workers=self.workers)
            return self._pool

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
            if self._sandbox is not None:
                self._sandbox.close()
            self._pool = self._sandbox = None

    # ----------------------------------------------------------------- scoring
    def _key(self, code: str, example: Example) -> tuple[str, str]:
        h = hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()
        return (f"{example.uid}|{hashlib.sha256(example.question.encode()).hexdigest()[:16]}", h)

    def _static(self, code: str, example: Example) -> Score | None:
        """A verdict without running anything, when the code cannot be a solution."""
        total = len(example.meta["inputs"])
        try:
            ast.parse(code)
        except SyntaxError as e:
            return Score(0, total, Verdict.MALFORMED, f"syntax error: {e.msg} (line {e.lineno})")
        except (ValueError, MemoryError, RecursionError) as e:  # NUL bytes, absurd nesting
            return Score(0, total, Verdict.MALFORMED, f"unparsable: {type(e).__name__}")
        return None

    def sandbox_request(self, code: str, example: Example, tag: str) -> Any:
        """The sandbox run that tests `code` on `example`: the runner, the solution and the inputs;
        `tag` marks the runner's result lines."""
        files = {"solution.py": code, "cases.json": json.dumps([[xs] for xs in example.meta["inputs"]])}
        return self.sandbox.python_request(RUNNER, files=files, args=[tag, example.meta["function"]])

    def _score_run(self, res: Any, example: Example, tag: str) -> Score:
        from sandboxes import StopReason

        expected = example.meta["expected"]
        total = len(expected)
        outcomes: dict[int, bool] = {}
        status = None
        prefix = tag + " "
        for line in res.stdout_text.splitlines():
            if not line.startswith(prefix):
                continue
            try:
                obj = json.loads(line[len(prefix):])
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            if "status" in obj and status is None:
                status = obj
            i = obj.get("i")
            if isinstance(i, int) and 0 <= i < total and i not in outcomes:
                outcomes[i] = "out" in obj and _canon(obj["out"]) == _canon(expected[i])
        if res.reason is StopReason.ERROR:
            log.error("task code: the sandbox could not run a solution: %s", res.detail)
            return Score(0, total, Verdict.WRONG, f"sandbox error: {res.detail}")
        if status and status.get("status") == "missing":
            return Score(0, total, Verdict.MALFORMED, f"no function named {example.meta['function']}")
        if status and status.get("status") == "import_error":
            return Score(0, total, Verdict.WRONG, f"solution failed on import: {status.get('error')}")
        passed = sum(outcomes.values())
        if status is None and not outcomes and res.reason is StopReason.EXIT:
            return Score(0, total, Verdict.WRONG, f"no test ran: the program exited with status {res.exit_code}")
        if res.reason is not StopReason.EXIT:
            why = {StopReason.TIMEOUT: "timeout", StopReason.MEMORY: "memory limit",
                   StopReason.OUTPUT_CAP: "output limit", StopReason.KILLED: "killed"}.get(res.reason, res.reason.value)
            return Score(passed, total, Verdict.WRONG, f"{why} after {len(outcomes)} of {total} tests; {passed} passed")
        verdict = Verdict.CORRECT if passed == total else Verdict.WRONG
        return Score(passed, total, verdict, f"{passed}/{total} tests passed")

    def _remember(self, key: tuple[str, str], score: Score) -> Score:
        with self._lock:
            self._cache[key] = score
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return score

    def _cached(self, key: tuple[str, str]) -> Score | None:
        with self._lock:
            return self._cache.get(key)

    def score_many(self, codes: Sequence[str], examples: Sequence[Example]) -> list[Score]:
        """Score solutions (already extracted) against their examples, running the ones that need
        it concurrently in the sandbox pool."""
        if len(codes) != len(examples):
            raise ValueError(f"score_many: {len(codes)} codes for {len(examples)} examples")
        scores: list[Score | None] = [None] * len(codes)
        todo: list[tuple[int, tuple[str, str], str, Any]] = []
        for n, (raw, ex) in enumerate(zip(codes, examples)):
            code = strip_fence(raw)
            key = self._key(code, ex)
            scores[n] = self._cached(key) or self._static(code, ex)
            if scores[n] is None:
                tag = secrets.token_hex(8)
                todo.append((n, key, tag, self.sandbox_request(code, ex, tag)))
            else:
                self._remember(key, scores[n])
        if todo:
            sandbox = self.sandbox
            if len(todo) == 1:
                results = [sandbox.execute(todo[0][3])]
            else:
                results = self._pool_for(sandbox).map([req for *_, req in todo])
            for (n, key, tag, _), res in zip(todo, results):
                scores[n] = self._remember(key, self._score_run(res, examples[n], tag))
        return [s for s in scores if s is not None]

    def _result(self, code: str, score: Score) -> VerifyResult:
        share = score.passed / score.total if score.total else 0.0
        if score.verdict is Verdict.CORRECT:
            reward = 1.0
        elif score.verdict is Verdict.MALFORMED or self.reward_mode == "all":
            reward = 0.0
        else:
            reward = share
        return VerifyResult(reward, score.verdict, code, score.detail)

    def check(self, parsed: str, example: Example) -> VerifyResult:
        return self._result(parsed, self.score_many([parsed], [example])[0])

    def partial_credit(self, parsed: str, example: Example) -> float:
        score = self.score_many([parsed], [example])[0]
        return score.passed / score.total if score.total and score.verdict is not Verdict.MALFORMED else 0.0

    def verify_many(self, completions: Sequence[str], examples: Sequence[Example], extract: Extractor,
                    truncated: Sequence[bool] | None = None) -> list[VerifyResult]:
        """`verify` for a batch (a GRPO group): the sandbox runs go through a pool concurrently."""
        truncated = truncated if truncated is not None else [False] * len(completions)
        if not (len(completions) == len(examples) == len(truncated)):
            raise ValueError(f"verify_many: {len(completions)} completions, {len(examples)} examples, "
                             f"{len(truncated)} truncation flags")
        parsed = [extract(c) for c in completions]
        run = [(n, p.strip()) for n, p in enumerate(parsed) if p is not None]
        scores = self.score_many([p for _, p in run], [examples[n] for n, _ in run])
        out: list[VerifyResult] = []
        by_n = {n: (p, s) for (n, p), s in zip(run, scores)}
        for n in range(len(completions)):
            if n in by_n:
                out.append(self._result(*by_n[n]))
            else:
                verdict = Verdict.TRUNCATED if truncated[n] else Verdict.MALFORMED
                out.append(VerifyResult(0.0, verdict, None, "no answer found in completion"))
        return out

