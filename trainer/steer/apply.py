"""Hot settings: how each one is set on a live Hugging Face Trainer at a step end, and read back.

    live = Live(args, optimizer, lr_scheduler, trainer, decay_groups)
    before = read(live, "learning_rate")
    write(live, "learning_rate", 3e-4)
    after = read(live, "learning_rate")   # what the acknowledgement states

Where each value lives, and why there:
  learning_rate   the scheduler's base values (`base_lrs`). A LambdaLR-style schedule (linear,
                  cosine, constant, with warm-up) recomputes every group's lr as base × factor at
                  each `scheduler.step()`, overwriting any edit of the param groups; so the base
                  values are scaled, and the groups' current lr by the same ratio so that the very
                  next optimizer step already uses the new value (the scheduler stepped before the
                  step-end hook). Per-group ratios (layer-wise lrs) are kept; the value is the
                  first group's base. A scheduler without base values (ReduceLROnPlateau) does not
                  overwrite the groups: only they are scaled.
  weight_decay    the optimizer's decayed param groups (those holding a parameter the Trainer
                  decays: not biases, not norms). Groups without decay stay at zero.
  max_grad_norm   `args.max_grad_norm`, which the Trainer reads before every clip.
  temperature, max_completion_length
                  every place the trainer keeps it (`settings.GENERATION`): its attribute, its
                  generation config, its args. All must read back equal.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from sandboxes.errors import SwarmlabError
from trainer.steer.settings import GENERATION


class ApplyError(SwarmlabError, RuntimeError):
    """A hot setting could not be set or did not read back as set: the change is not in force."""


@dataclasses.dataclass
class Live:
    args: Any
    optimizer: Any = None
    lr_scheduler: Any = None
    trainer: Any = None
    decay_groups: tuple[int, ...] | None = None   # indices of the optimizer's decayed groups


def _optimizer(obj: Any) -> Any:
    """The torch optimizer under accelerate's wrapper (which proxies `param_groups` anyway)."""
    while obj is not None and not hasattr(obj, "param_groups") and hasattr(obj, "optimizer"):
        obj = obj.optimizer
    return obj


def _groups(live: Live) -> list[dict[str, Any]]:
    opt = _optimizer(live.optimizer)
    if opt is None or not getattr(opt, "param_groups", None):
        raise ApplyError("the trainer has no optimizer yet")
    return opt.param_groups


def _scheduler(live: Live) -> Any:
    """The torch scheduler under accelerate's wrapper (`.scheduler`, which has no base values)."""
    s = live.lr_scheduler
    while s is not None and not hasattr(s, "base_lrs") and hasattr(s, "scheduler"):
        s = s.scheduler
    return s


def decay_group_indices(optimizer: Any, model: Any) -> tuple[int, ...]:
    """The indices of the optimizer's groups that hold a parameter the Trainer decays (its own
    rule: `Trainer.get_decay_parameter_names`), else of those with a non-zero weight decay."""
    opt = _optimizer(optimizer)
    groups = getattr(opt, "param_groups", None) or []
    ids: set[int] = set()
    if model is not None:
        try:
            from transformers import Trainer

            names = set(Trainer.get_decay_parameter_names(None, model))
            ids = {id(p) for n, p in model.named_parameters() if n in names}
        except Exception:   # a model the rule cannot walk: fall back on the groups' own values
            ids = set()
    if ids:
        return tuple(i for i, g in enumerate(groups) if any(id(p) in ids for p in g["params"]))
    return tuple(i for i, g in enumerate(groups) if g.get("weight_decay", 0.0))


def _lookup(obj: Any, path: tuple[str, ...]) -> tuple[Any, str] | None:
    for name in path[:-1]:
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return (obj, path[-1]) if obj is not None and hasattr(obj, path[-1]) else None


def _places(live: Live, name: str) -> list[tuple[Any, str]]:
    out = []
    for path in GENERATION[name]:
        root = live.args if path[0] == "args" else live.trainer
        sub = path[1:] if path[0] == "args" else path
        hit = _lookup(root, sub) if root is not None else None
        if hit is not None:
            out.append(hit)
    return out


def read(live: Live, name: str) -> Any:
    """The value in force (hot settings from where the trainer uses them, others from args)."""
    if name == "learning_rate":
        sched = _scheduler(live)
        if sched is not None and getattr(sched, "base_lrs", None):
            return float(sched.base_lrs[0])
        return float(_groups(live)[0]["lr"])
    if name == "weight_decay":
        groups = _groups(live)
        idx = live.decay_groups if live.decay_groups is not None else range(len(groups))
        vals = {float(groups[i].get("weight_decay", 0.0)) for i in idx}
        if len(vals) > 1:
            raise ApplyError(f"the decayed groups disagree on weight_decay: {sorted(vals)}")
        return vals.pop() if vals else float(getattr(live.args, "weight_decay", 0.0))
    if name in GENERATION:
        places = _places(live, name)
        if live.trainer is not None and not any(o is not live.args for o, _ in places):
            places = []
        vals = [getattr(o, a) for o, a in places]
        if not vals:
            return getattr(live.args, name, None)
        if any(v != vals[0] for v in vals):
            raise ApplyError(f"{name} differs between the places the trainer keeps it: {vals}")
        return vals[0]
    v = getattr(live.args, name, None)
    return getattr(v, "value", v)   # an enum (lr_scheduler_type) as its value


def write(live: Live, name: str, value: Any) -> None:
    """Set a hot setting where the trainer reads it. Raises ApplyError when it cannot."""
    if name == "learning_rate":
        old = read(live, "learning_rate")
        if not (old > 0 and math.isfinite(old)):
            raise ApplyError(f"the scheduler's base learning rate is {old}: cannot rescale it")
        ratio = float(value) / old
        sched = _scheduler(live)
        groups = _groups(live)
        if sched is not None and getattr(sched, "base_lrs", None):
            if len(sched.base_lrs) != len(groups):
                raise ApplyError(f"the scheduler has {len(sched.base_lrs)} base values for {len(groups)} param groups")
            # SequentialLR / ChainedScheduler: each inner schedule computes from its own base values
            for sc in [sched, *(getattr(sched, "_schedulers", None) or [])]:
                if getattr(sc, "base_lrs", None):
                    sc.base_lrs = [b * ratio for b in sc.base_lrs]
                if getattr(sc, "_last_lr", None):
                    sc._last_lr = [x * ratio for x in sc._last_lr]
        for g in groups:
            g["lr"] = g["lr"] * ratio
            if "initial_lr" in g:
                g["initial_lr"] = g["initial_lr"] * ratio
        live.args.learning_rate = float(value)
        return
    if name == "weight_decay":
        groups = _groups(live)
        idx = live.decay_groups if live.decay_groups is not None else range(len(groups))
        if not idx:
            raise ApplyError("the optimizer has no decayed parameter group")
        for i in idx:
            if "weight_decay" not in groups[i]:
                raise ApplyError(f"the optimizer's param group {i} has no weight_decay")
            groups[i]["weight_decay"] = float(value)
        live.args.weight_decay = float(value)
        return
    if name == "max_grad_norm":
        live.args.max_grad_norm = float(value)
        return
    if name in GENERATION:
        places = [(o, a) for o, a in _places(live, name) if o is not live.args]
        if not places:
            raise ApplyError(f"the trainer keeps no {name} it reads per step")
        for o, a in _places(live, name):
            setattr(o, a, value)
        return
    raise ApplyError(f"{name} is not a hot setting")


def apply_change(live: Live, change: dict[str, Any]) -> dict[str, Any]:
    """Apply a validated hot change whole: set each setting, read each back; on any failure (an
    error, or a value that reads back different) restore every setting already set and raise
    ApplyError. Returns the values read back."""
    before = {k: read(live, k) for k in change}
    done: list[str] = []
    try:
        for k, v in change.items():
            write(live, k, v)
            done.append(k)
        after = {k: read(live, k) for k in change}
        for k, v in change.items():
            got = after[k]
            same = math.isclose(float(got), float(v), rel_tol=1e-9, abs_tol=1e-15) if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(got, (int, float)) else got == v
            if not same:
                raise ApplyError(f"{k} reads back {got!r} after setting {v!r}")
        return after
    except Exception as e:
        for k in reversed(done):
            try:
                write(live, k, before[k])
            except Exception:
                pass
        if isinstance(e, ApplyError):
            raise
        raise ApplyError(f"{type(e).__name__}: {e}") from e
