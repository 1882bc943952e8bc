"""Perturbations: faults injected for evaluation, applied by the trainer.

Generic mechanisms with readable shortcuts. On the run's config: override any recipe/harness
field. In the data pipeline, below the harness, so no harness or recipe version changes: corrupt
SFT labels (`label_noise`), write the examples in another format (`data_format`), draw harder
problems than the curriculum says (`data_shift`), repeat a small pool of examples (`duplicates`).
On the machine: SIGKILL the worker, stall, corrupt the newest checkpoint, slow every step
(`slow_worker`), die of out-of-memory while the batch is above a limit (`oom`).

The trainer applies them silently: nothing about them is written to metrics, samples, events, the
command log or the logged config — the operators must find the problem from its effects. Which
faults have fired is kept in `OUT_DIR/.perturb/NAME.json`, outside the run directory, so a
restarted worker is not killed again by the same one-shot fault, and a data fault stays in force.
The data faults are the data source's: they travel in a checkpoint's state (`carried`), and a
backtest forked from any checkpoint of a run also reads the faults that run's source has now
(`read_source`), so it trains on the data every reader gets, never on a source from before a change
because its checkpoint is. Each fault keeps the step it began at: a harness that pins the source to
its revision before a step (`harness.filters.as_of_step`) reads none that began at or after it.
The machine's faults stay with the machine.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import signal
import time
from typing import Any, Callable

from harness.faults import HARNESS_FAULTS
from trainer.config import Perturbation
from trainer.tasks.base import Example, Split

# shortcut → (kind, defaults); the harness faults are the harness's (harness/faults.py), applied as overrides
SHORTCUTS: dict[str, tuple[str, dict[str, Any]]] = {
    "lr_spike": ("override", {"set": {"recipe.lr": 0.5}}),
    "worker_kill": ("kill", {}),
    "hang": ("stall", {"seconds": 60.0}),
    "broken_template": ("override", {"set": HARNESS_FAULTS["broken_template"]}),
    "label_noise": ("label_noise", {"fraction": 0.4}),
    "too_hard": ("override", {"set": HARNESS_FAULTS["too_hard"]}),
    "low_temperature": ("override", {"set": HARNESS_FAULTS["low_temperature"]}),
    "truncation": ("override", {"set": HARNESS_FAULTS["truncation"]}),
    "reward_hack": ("override", {"set": HARNESS_FAULTS["reward_hack"]}),
    "corrupt_checkpoint": ("corrupt_checkpoint", {}),
}


DATA_KINDS = ("label_noise", "data_format", "data_shift", "duplicates")   # in force from their step on, carried by forks


def check(p: Perturbation) -> Perturbation:
    """Raise ValueError naming the field unless the kind has the fields it needs (a data fault that
    changes nothing, a slow worker that is not slower, an OOM with no batch limit)."""
    if p.kind == "data_format" and p.style is None:
        raise ValueError(f"data_format needs style (one of {', '.join(DATA_FORMATS)})")
    if p.kind == "data_shift" and p.levels < 1:
        raise ValueError(f"data_shift needs levels >= 1, got levels={p.levels}")
    if p.kind == "duplicates" and (p.pool < 1 or p.fraction <= 0):
        raise ValueError(f"duplicates needs pool >= 1 and fraction > 0, got pool={p.pool}, fraction={p.fraction}")
    if p.kind == "slow_worker" and p.seconds <= 0:
        raise ValueError(f"slow_worker needs seconds > 0 (added to every step), got seconds={p.seconds}")
    if p.kind == "oom" and p.max_batch_size < 1:
        raise ValueError(f"oom needs max_batch_size >= 1 (the largest recipe.batch_size that fits), "
                         f"got max_batch_size={p.max_batch_size}")
    return p


def expand(p: Perturbation) -> Perturbation:
    """Fill a shortcut's kind and defaults (explicit fields win), and check the kind's fields."""
    if p.shortcut is None:
        if p.kind is None:
            raise ValueError("perturbation needs a kind or a shortcut")
        return check(p)
    if p.shortcut not in SHORTCUTS:
        raise ValueError(f"unknown perturbation shortcut {p.shortcut!r}; known: {', '.join(sorted(SHORTCUTS))}")
    kind, defaults = SHORTCUTS[p.shortcut]
    # fields left at their defaults do not override the shortcut's settings — also after a
    # round trip through a full dump (where every field counts as "set")
    fields = type(p).model_fields
    data = {k: v for k, v in p.model_dump().items()
            if k != "shortcut" and v != fields[k].get_default(call_default_factory=True)}
    if p.kind is not None and p.kind != kind:
        raise ValueError(f"perturbation shortcut {p.shortcut!r} is kind {kind!r}, not {p.kind!r}")
    merged = {**defaults, **data, "kind": kind}
    return check(Perturbation.model_validate(merged))


def check_overrides(cfg: Any, perturbations: list[Perturbation]) -> None:
    """Raise ValueError (naming the perturbation) unless every override would validate on `cfg`
    (a RunConfig): a bad perturbation is a config error before anything starts, not at its step."""
    from trainer.config import set_dotted

    for i, p in enumerate(perturbations):
        try:
            for k, v in expand(p).set.items():
                if not k.startswith(("recipe.", "harness.")):
                    raise ValueError(f"can only override recipe.* or harness.* fields, not {k!r}")
                set_dotted(cfg, k, v)
        except ValueError as e:
            raise ValueError(f"perturbations[{i}]: {str(e).replace('invalid config: ', '')}") from None


def noisy_label(answer: str, uid: str, fraction: float, noise: str = "random_char") -> str:
    """Deterministically corrupt `fraction` of labels (chosen by uid hash). `random_char`: change
    one character; `off_by_one`: an integer answer + 1 (other answers: as `random_char`).
    Random noise leaves the right answer the most frequent label for a question, so SFT still
    learns it, only slower; off-by-one on half the labels leaves SFT two equally likely answers."""
    h = int.from_bytes(hashlib.sha256(uid.encode()).digest()[:8], "little")
    if (h % 10_000) / 10_000 >= fraction or not answer:
        return answer
    if noise == "off_by_one" and answer.lstrip("-").isdigit():
        return str(int(answer) + 1)
    i = (h >> 16) % len(answer)
    c = answer[i]
    repl = str((int(c) + 1 + (h >> 32) % 9) % 10) if c.isdigit() else ("x" if c != "x" else "y")
    return answer[:i] + repl + answer[i + 1 :]


# data_format: what a changed export writes. The answer styles change the SFT target (the reference
# completion), so the policy learns the new format while the task's verifier expects the old one;
# the question styles change the problem text the harness template wraps (the prompt), as a template
# change would, but below the harness. '=' and ' ' are characters every built-in charset has.
DATA_FORMATS: dict[str, Callable[[Example], Example]] = {
    "answer_prefix": lambda ex: dataclasses.replace(ex, solution="=" + (ex.solution or ex.answer)),
    "answer_spaced": lambda ex: dataclasses.replace(ex, solution=" ".join(ex.solution or ex.answer)),
    "answer_reversed": lambda ex: dataclasses.replace(ex, solution=(ex.solution or ex.answer)[::-1]),
    "question_prefix": lambda ex: dataclasses.replace(ex, question="=" + ex.question),
    "question_spaced": lambda ex: dataclasses.replace(ex, question=" ".join(ex.question)),
}
SOURCE_FAULTS = ".source-faults.json"   # beside a checkpoint fetched from run storage: its run's fault state
POOL_BASE = 1 << 40    # train-split indices of a duplicates pool: far from any cursor a run or a fork reaches


def _unit(key: str) -> float:
    """A deterministic draw in [0, 1) from `key`."""
    return (int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") % 1_000_000) / 1_000_000


def draw_example(task: Any, index: int, difficulty: int, faults: list[Perturbation]) -> Example:
    """Train example `index` at `difficulty` as the data pipeline hands it over with `faults` (data
    faults) in force: drawn harder (`data_shift`), from a small pool (`duplicates`: which indices
    repeat is a hash of the index, so a resumed or forked run draws the same stream), then written
    in the changed format (`data_format`)."""
    for p in faults:
        if p.kind == "data_shift":
            difficulty = min(task.max_difficulty, difficulty + p.levels)
    for p in faults:
        if p.kind == "duplicates" and _unit(f"duplicates|{index}") < p.fraction:
            index = POOL_BASE + int(_unit(f"pool|{index}") * p.pool)
    ex = task.example(Split.TRAIN, index, difficulty)
    for p in faults:
        if p.kind == "data_format":
            ex = DATA_FORMATS[p.style](ex)
    return ex


def out_of_memory_message(batch_size: int, device: str) -> str:
    """What an allocator says when a step's activations no longer fit (their size grows with the batch)."""
    need = batch_size * (1 << 26)
    if device == "cuda":
        return (f"CUDA out of memory. Tried to allocate {need / 2**30:.2f} GiB. GPU 0 has a total capacity of "
                f"{max(8, 2 * need / 2**30):.2f} GiB of which {need / 2**31:.2f} GiB is free.")
    return (f"DefaultCPUAllocator: can't allocate memory: you tried to allocate {need} bytes. "
            "Error code 12 (Cannot allocate memory)")


class Perturber:
    def __init__(self, perturbations: list[Perturbation], state_path: pathlib.Path) -> None:
        self.items = [expand(p) for p in perturbations]
        self.state_path = state_path
        self.fired: set[int] = set()
        if state_path.exists():
            try:
                self.fired = set(json.loads(state_path.read_text()).get("fired", []))
            except (json.JSONDecodeError, OSError):
                self.fired = set()

    def _mark(self, i: int) -> None:
        self.fired.add(i)
        self._save()

    def _save(self) -> None:
        """What fired, and the data faults in force (what a fork of this run reads: `read_source`)."""
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"fired": sorted(self.fired), "data": self.carried()["data"]}))
        os.replace(tmp, self.state_path)

    inherited: tuple[float, str] = (0.0, "random_char")   # label noise of a checkpoint that kept no step with it
    inherited_data: tuple[Perturbation, ...] = ()          # a fork's: the data faults of the run it forked
    slow_here: frozenset[int] = frozenset()                # slow_worker faults that fired in this process

    def _in_force(self, as_of: int | None) -> list[Perturbation]:
        """The data faults in force (label noise included): those that fired (from their step on,
        after a restart or a rollback too: the data source changed, not the run) and a fork's, each
        once (a Ray Tune trial restored from a checkpoint has both). With `as_of` (the harness's
        `filters.as_of_step`: the source read as it was before that step of the run, a pinned
        revision), only those the source had before it."""
        out: list[Perturbation] = []
        fired = [p for i, p in enumerate(self.items) if p.kind in DATA_KINDS and i in self.fired]
        for p in fired + list(self.inherited_data):
            if p not in out and (as_of is None or p.at_step < as_of):
                out.append(p)
        return out

    def label_noise(self, as_of: int | None = None) -> tuple[float, str]:
        """(fraction of SFT labels to corrupt now, how) — label_noise applies from its step on, and
        in a run forked (fork_mode state) from one where it was on."""
        return max([(p.fraction, p.noise) for p in self._in_force(as_of) if p.kind == "label_noise"] + [self.inherited])

    def data_faults(self, as_of: int | None = None) -> list[Perturbation]:
        """The data faults in force other than label noise (`_in_force`)."""
        return [p for p in self._in_force(as_of) if p.kind != "label_noise"]

    def carried(self) -> dict[str, Any]:
        """The data faults in force, as a checkpoint's state keeps them for a fork (`inherit`)."""
        return {"label_noise": list(self.label_noise()),
                "data": [p.model_dump(mode="json", exclude_defaults=True) for p in self._in_force(None)]}

    def inherit(self, faults: dict[str, Any]) -> None:
        """Keep the data faults of the run a fork (fork_mode state) starts from, with the steps they
        began at (a checkpoint written before label noise travelled with its step keeps only its
        fraction, in force throughout)."""
        data = tuple(Perturbation.model_validate(d) for d in faults.get("data") or [])
        self.inherited_data = self.inherited_data + tuple(p for p in data if p not in self.inherited_data)
        if not any(p.kind == "label_noise" for p in data):
            frac, how = faults.get("label_noise") or (0.0, "random_char")
            self.inherited = max(self.inherited, (float(frac), str(how)))

    def read_source(self, checkpoint: pathlib.Path) -> None:
        """Also keep the data faults the run that wrote `checkpoint` has in force now: its data
        source as it is today, which a fork reads as every reader does, whatever step the
        checkpoint is from (`OUT_DIR/.perturb/NAME.json` of that run, or the copy fetched beside a
        checkpoint from run storage, SOURCE_FAULTS; nothing where it keeps none)."""
        run_dir = checkpoint.parent.parent
        for path in (checkpoint.parent / SOURCE_FAULTS, run_dir.parent / ".perturb" / f"{run_dir.name}.json"):
            try:
                saved = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(saved, dict) and isinstance(saved.get("data"), list):
                self.inherit({"data": saved["data"]})
            return

    def _slow(self, where: str) -> float:
        return sum(p.seconds for i, p in enumerate(self.items) if p.kind == "slow_worker" and p.where == where
                   and (i in self.slow_here if p.once else i in self.fired))

    def stream(self, task: Any, as_of: int | None = None) -> Callable[[int, int], Example]:
        """`draw(index, difficulty)`: how this step's training examples come out of the data pipeline
        (`draw_example` with the data faults in force; with `as_of`, those the source had before
        that step). A slow worker's delay (`where: data`) is spent here, inside the step's time, as
        a slow loader or disk spends it."""
        delay = self._slow("data")
        if delay:
            time.sleep(delay)
        faults = self.data_faults(as_of)
        if not faults:
            return lambda index, difficulty: task.example(Split.TRAIN, index, difficulty)
        return lambda index, difficulty: draw_example(task, index, difficulty, faults)

    def slow_compute(self) -> None:
        """A slow worker's delay (`where: compute`), spent in the step's compute, after its data is
        in, as a throttled device spends it."""
        delay = self._slow("compute")
        if delay:
            time.sleep(delay)

    def out_of_memory(self, step: int, batch_size: int, device: str = "cpu") -> str:
        """The allocator's message when an `oom` fault is in force (from its step on, and at every
        step after it first fired: a restart does not free the memory) and `batch_size` is above
        its limit; '' while the batch fits."""
        for i, p in enumerate(self.items):
            if p.kind == "oom" and (i in self.fired or step >= p.at_step) and batch_size > p.max_batch_size:
                if i not in self.fired:
                    self._mark(i)
                return out_of_memory_message(batch_size, device)
        return ""

    def before_step(self, step: int, trainer: Any) -> None:
        """Apply what is due at `step`. Overrides mutate the trainer's live recipe/harness once."""
        for i, p in enumerate(self.items):
            if i in self.fired or step < p.at_step:
                continue
            if p.kind == "override":
                trainer.apply_overrides(p.set, silent=True)
                self._mark(i)
            elif p.kind in DATA_KINDS:
                self._mark(i)
            elif p.kind == "slow_worker":
                self._mark(i)
                self.slow_here = self.slow_here | {i}
            elif p.kind == "stall":
                if p.once:
                    self._mark(i)
                time.sleep(p.seconds)  # no heartbeat, no progress: what a hung worker looks like
            elif p.kind == "corrupt_checkpoint":
                path = trainer.ckpt.newest_path()
                if path is not None and path.exists():
                    with open(path, "r+b") as f:
                        f.seek(max(0, path.stat().st_size // 2))
                        f.write(b"\x00corrupt\x00" * 8)
                    self._mark(i)
            elif p.kind == "kill":
                if p.once:
                    self._mark(i)
                os.kill(os.getpid(), signal.SIGKILL)
