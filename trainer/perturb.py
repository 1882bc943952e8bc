"""Perturbations: faults injected for evaluation, applied by the trainer.

Generic mechanisms (override any recipe/harness field, SIGKILL the worker, stall, corrupt SFT
labels, corrupt the newest checkpoint) with readable shortcuts. The trainer applies them
silently: nothing about them is written to metrics, samples, events, the command log or the logged
config — the operators must find the problem from its effects. Which one-shot faults have fired is
kept in `OUT_DIR/.perturb/NAME.json`, outside the run directory, so a restarted worker is not
killed again by the same fault.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import signal
import time
from typing import Any

from trainer.config import Perturbation

# shortcut → (kind, defaults)
SHORTCUTS: dict[str, tuple[str, dict[str, Any]]] = {
    "lr_spike": ("override", {"set": {"recipe.lr": 0.5}}),
    "worker_kill": ("kill", {}),
    "hang": ("stall", {"seconds": 60.0}),
    # a format spec left on the placeholder: the prompt keeps only the question's first 3
    # characters (for 2-digit addition "12+34=" becomes "12+=": the second operand is gone)
    "broken_template": ("override", {"set": {"harness.template": "{question:.3}="}}),
    "label_noise": ("label_noise", {"fraction": 0.4}),
    "too_hard": ("override", {"set": {"harness.curriculum.start": 8, "harness.curriculum.end": 8}}),
    "low_temperature": ("override", {"set": {"harness.sampling.temperature": 0.05}}),
    "truncation": ("override", {"set": {"harness.sampling.max_new_tokens": 2}}),
    "reward_hack": ("override", {"set": {"harness.reward.verifier": "digits_any_order"}}),
    "corrupt_checkpoint": ("corrupt_checkpoint", {}),
}


def expand(p: Perturbation) -> Perturbation:
    """Fill a shortcut's kind and defaults (explicit fields win)."""
    if p.shortcut is None:
        if p.kind is None:
            raise ValueError("perturbation needs a kind or a shortcut")
        return p
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
    return Perturbation.model_validate(merged)


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
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"fired": sorted(self.fired)}))
        os.replace(tmp, self.state_path)

    inherited: tuple[float, str] = (0.0, "random_char")   # a fork's: the label noise of the run it forked

    def label_noise(self) -> tuple[float, str]:
        """(fraction of SFT labels to corrupt now, how) — label_noise applies from its step on, and
        in a run forked (fork_mode state) from one where it was on."""
        return max([(p.fraction, p.noise) for i, p in enumerate(self.items) if p.kind == "label_noise" and i in self.fired]
                   + [self.inherited])

    def before_step(self, step: int, trainer: Any) -> None:
        """Apply what is due at `step`. Overrides mutate the trainer's live recipe/harness once."""
        for i, p in enumerate(self.items):
            if i in self.fired or step < p.at_step:
                continue
            if p.kind == "override":
                trainer.apply_overrides(p.set, silent=True)
                self._mark(i)
            elif p.kind == "label_noise":
                self._mark(i)
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
