"""Declared settings of a steered run: what may be changed, of what type, in what range, and
whether the live trainer applies it at a step end (`hot`) or needs a checkpoint and a relaunch
(`restart`).

    declared = declared_settings(trainer.args, trainer)        # what SwarmCallback writes
    check_change(declared, {"learning_rate": 3e-4})             # -> None (valid)
    check_change(declared, {"learning_rate": -1})               # -> "learning_rate=-1: must be > 0"

`check_change` is pure and imports neither torch nor transformers: the swarm runs it on the
`settings.json` a run wrote (`read_declared`) before it backtests or sends anything, and the
callback runs the same function before it applies a command, so a change the swarm accepts is one
the live trainer accepts. Its result has the shape of `swarm.backtest.check_change`: None, or a
one-line reason naming the field and the value.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pathlib
from typing import Any, Iterable, Literal, Mapping

SettingType = Literal["float", "int", "bool", "str"]
Apply = Literal["hot", "restart"]

SETTINGS_FILE = "settings.json"


@dataclasses.dataclass(frozen=True)
class Setting:
    """One changeable setting. Bounds follow pydantic's names: `gt`/`ge` below, `lt`/`le` above."""

    name: str
    type: SettingType
    apply: Apply
    help: str = ""
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    choices: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if self.type not in ("float", "int", "bool", "str"):
            raise ValueError(f"Setting {self.name!r}: type={self.type!r} must be float, int, bool or str")
        if self.apply not in ("hot", "restart"):
            raise ValueError(f"Setting {self.name!r}: apply={self.apply!r} must be 'hot' or 'restart'")
        if self.choices is not None and not isinstance(self.choices, tuple):
            object.__setattr__(self, "choices", tuple(self.choices))

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in dataclasses.asdict(self).items() if v is not None and v != ""}
        if self.choices is not None:
            d["choices"] = list(self.choices)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Setting":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in fields})


def as_settings(declared: Mapping[str, Setting] | Iterable[Setting | Mapping[str, Any]]) -> dict[str, Setting]:
    """The declared settings by name, from a mapping, a list of `Setting`s or their JSON form."""
    if isinstance(declared, Mapping):
        if "settings" in declared and not isinstance(declared.get("settings"), Setting):
            return as_settings(declared["settings"])       # a whole settings.json
        return {k: (v if isinstance(v, Setting) else Setting.from_json(v)) for k, v in declared.items()}
    out: dict[str, Setting] = {}
    for s in declared:
        s = s if isinstance(s, Setting) else Setting.from_json(s)
        out[s.name] = s
    return out


def _type_error(s: Setting, v: Any) -> str | None:
    if s.type == "bool":
        return None if isinstance(v, bool) else "must be true or false"
    if s.type == "str":
        return None if isinstance(v, str) else "must be a string"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"must be a{'n integer' if s.type == 'int' else ' number'}"
    if not math.isfinite(float(v)):
        return "must be finite"
    if s.type == "int" and float(v) != int(v):
        return "must be an integer"
    return None


def coerce(s: Setting, v: Any) -> Any:
    """A valid value in its declared type (JSON may carry 2.0 for an int, 1 for a float)."""
    if s.type == "int":
        return int(v)
    if s.type == "float":
        return float(v)
    return v


def check_value(s: Setting, v: Any) -> str | None:
    """Why `v` is not a valid value of `s` (without the name), else None."""
    err = _type_error(s, v)
    if err:
        return err
    if s.choices is not None and v not in s.choices:
        return "must be one of " + ", ".join(map(str, s.choices))
    if s.type in ("int", "float"):
        x = float(v)
        for bound, ok, op in ((s.gt, lambda b: x > b, ">"), (s.ge, lambda b: x >= b, ">="),
                              (s.lt, lambda b: x < b, "<"), (s.le, lambda b: x <= b, "<=")):
            if bound is not None and not ok(bound):
                return f"must be {op} {bound:g}"
    return None


def check_change(declared: Mapping[str, Setting] | Iterable[Setting | Mapping[str, Any]],
                 change: Mapping[str, Any]) -> str | None:
    """Why the live trainer would refuse `change` ({setting name: new value}), else None: an empty
    change, an undeclared name, a value of the wrong type or out of range. Every field is checked;
    the first failure is the reason."""
    settings = as_settings(declared)
    if not isinstance(change, Mapping) or not change:
        return "a change needs at least one setting"
    for k, v in change.items():
        s = settings.get(k)
        if s is None:
            known = ", ".join(sorted(settings)) or "none"
            return f"unknown setting {k!r} (declared: {known})"
        err = check_value(s, v)
        if err:
            return f"{k}={v!r}: {err}"
    return None


def needs_restart(declared: Mapping[str, Setting] | Iterable[Setting | Mapping[str, Any]], change: Mapping[str, Any]) -> bool:
    """A valid change needs a relaunch when any of its settings does (a change is applied whole)."""
    settings = as_settings(declared)
    return any(settings[k].apply == "restart" for k in change)


def settings_version(values: Mapping[str, Any]) -> str:
    """A short content hash of the values in force (written on every metrics row, like the built-in
    trainer's recipe_version)."""
    blob = json.dumps({k: values[k] for k in sorted(values)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# ---- what an HF / TRL trainer declares -----------------------------------------------------------

# generation settings: where a trainer keeps each one (every place it is found is set and read
# back; they must agree). TRL's GRPOTrainer reads `temperature` both when sampling (its generation
# config) and when scoring log-probs (logits / temperature), so both are set together.
GENERATION: dict[str, tuple[tuple[str, ...], ...]] = {
    "temperature": (("temperature",), ("generation_config", "temperature"), ("args", "temperature")),
    "max_completion_length": (("max_completion_length",), ("generation_config", "max_new_tokens"),
                              ("args", "max_completion_length")),
}

# settings a relaunch applies: TrainingArguments fields (and TRL config fields) with their types
# and ranges; only those the run's args have are declared
_RESTART: tuple[Setting, ...] = (
    Setting("per_device_train_batch_size", "int", "restart", "examples per device per micro-batch", ge=1),
    Setting("gradient_accumulation_steps", "int", "restart", "micro-batches per optimizer step", ge=1),
    Setting("max_steps", "int", "restart", "optimizer steps in the run", ge=1),
    Setting("warmup_steps", "float", "restart", "warm-up steps (a value below 1 is a fraction of the run)", ge=0),
    Setting("adam_beta1", "float", "restart", "AdamW beta1", ge=0, lt=1),
    Setting("adam_beta2", "float", "restart", "AdamW beta2", ge=0, lt=1),
    Setting("adam_epsilon", "float", "restart", "AdamW epsilon", gt=0),
    Setting("seed", "int", "restart", "random seed", ge=0),
    # TRL
    Setting("num_generations", "int", "restart", "completions per prompt (GRPO)", ge=2),
    Setting("beta", "float", "restart", "KL coefficient (GRPO/DPO)", ge=0),
    Setting("max_prompt_length", "int", "restart", "longest prompt in tokens", ge=1),
    Setting("num_iterations", "int", "restart", "updates per generation batch (GRPO)", ge=1),
    Setting("epsilon", "float", "restart", "clipping range (GRPO)", gt=0),
    Setting("max_length", "int", "restart", "longest training sequence in tokens (SFT)", ge=1),
)


def _has_path(obj: Any, path: tuple[str, ...]) -> bool:
    for name in path:
        if obj is None or not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return obj is not None


def declared_settings(args: Any, trainer: Any = None, extra: Iterable[Setting] = ()) -> list[Setting]:
    """The settings a run with these TrainingArguments (and, when given, this trainer object)
    declares: the optimiser's learning rate and weight decay and gradient clipping are hot; a
    generation setting is hot where the trainer keeps it on an attribute it reads per step (not on
    the vLLM path, whose sampling parameters live in another process), else restart when the args
    have it; the args' schedule, batch and algorithm fields are restart; `extra` adds the user's
    own (restart) settings."""
    out = [
        Setting("learning_rate", "float", "hot", "peak learning rate (the scheduler's base value)", gt=0, le=1),
        Setting("weight_decay", "float", "hot", "AdamW weight decay of the decayed parameter groups", ge=0, le=1),
        Setting("max_grad_norm", "float", "hot", "gradient clipping norm (0 turns clipping off)", ge=0),
    ]
    vllm = bool(getattr(args, "use_vllm", False))
    gen = {"temperature": dict(type="float", help="sampling temperature", gt=0, le=10),
           "max_completion_length": dict(type="int", help="longest generated completion in tokens", ge=1)}
    for name, spec in gen.items():
        on_trainer = trainer is not None and any(_has_path(trainer, p) for p in GENERATION[name] if p[0] != "args")
        if on_trainer and not vllm:
            out.append(Setting(name, apply="hot", **spec))
        elif on_trainer or hasattr(args, name):
            out.append(Setting(name, apply="restart", **spec))
    try:
        from transformers.trainer_utils import SchedulerType

        out.append(Setting("lr_scheduler_type", "str", "restart", "learning-rate schedule",
                           choices=tuple(s.value for s in SchedulerType)))
    except ImportError:   # transformers absent: the swarm's side reads settings.json instead
        pass
    out += [s for s in _RESTART if hasattr(args, s.name)]
    names = {s.name for s in out}
    for s in extra:
        if s.name in names:
            raise ValueError(f"extra setting {s.name!r} is already declared")
        if s.apply != "restart":
            raise ValueError(f"extra setting {s.name!r}: apply={s.apply!r}; the callback can only relaunch with "
                             "a setting of the user's script (apply='restart')")
        out.append(s)
        names.add(s.name)
    return out


ACTIONS: tuple[dict[str, str], ...] = (
    {"cmd": "set_fields", "help": "change declared settings: {\"fields\": {name: value}}"},
    {"cmd": "eval", "help": "evaluate at the next step end"},
    {"cmd": "checkpoint", "help": "save a checkpoint at the next step end"},
    {"cmd": "rollback", "help": "relaunch from a checkpoint of the run's index: {\"name\": \"init\"} (the untrained "
                                "start) or a checkpoint-N; set_fields sent before the relaunch go with it"},
    {"cmd": "stop", "help": "stop after the next step end"},
    {"cmd": "pause", "help": "hold the run at the next step end (heartbeat `paused`) until `resume` or `stop`"},
    {"cmd": "resume", "help": "go on after a pause"},
)


def read_declared(run_dir: str | pathlib.Path) -> dict[str, Any] | None:
    """The run's settings.json: {"settings": [...], "actions": [...], "values": {...}, "overrides": {...}}."""
    try:
        return json.loads((pathlib.Path(run_dir) / SETTINGS_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
