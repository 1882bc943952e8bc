"""Typed run configuration: model, recipe, task, harness, checkpoints, perturbations.

YAML is only the serialisation (`RunConfig.from_yaml` / `to_yaml`). Every field has a default and
a description; cross-field checks raise `ValueError`s that name the field and the value, which
the CLI turns into one line and exit code 2.
"""
from __future__ import annotations

import copy
import hashlib
import json
import pathlib
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.spec import HarnessSpec
from sandboxes.errors import SwarmlabError


class _Strict(BaseModel):
    # allow_inf_nan=False: every float setting is finite (`.inf`/`.nan` in YAML is refused naming the
    # field); a bound of `le=`/`ge=` alone lets `.inf` through on the open side
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ConfigError(SwarmlabError, ValueError):
    """A config that cannot be used; the message is one line naming the field and the value."""


class ModelConfig(_Strict):
    kind: Literal["builtin", "hf"] = Field("builtin", description="built-in transformer or a local HF causal LM")
    path: str | None = Field(None, description="local directory of a Hugging Face causal LM (kind=hf)")
    d_model: int = Field(128, ge=8, description="built-in: hidden size")
    n_layers: int = Field(3, ge=1, le=64, description="built-in: transformer blocks")
    n_heads: int = Field(4, ge=1, description="built-in: attention heads (must divide d_model)")
    d_ff: int = Field(0, ge=0, description="built-in: SwiGLU hidden size; 0 = 8/3·d_model rounded to 8")
    max_seq_len: int = Field(128, ge=8, description="built-in: longest prompt + completion in tokens")
    kernels: Literal["auto", "torch", "triton"] = Field(
        "auto", description="log-prob/RMSNorm implementation: auto = triton on CUDA; on CPU torch ops, the built-in "
        "model's RMSNorm fused in C (kernels/cpu.py, built on first use; torch ops without a C compiler); torch = torch ops"
    )
    charset: str | None = Field(None, description="built-in: the characters of the character tokenizer (plus <pad>, "
                                "<bos>, <eos>, <unk>); None = every character the built-in task families write (88). "
                                "A task's own characters learn faster (3-digit addition, seeds 0-8: median 500 vs 600 steps "
                                "to 95%, and the seed that stalled for 2700 steps took 300; benchmarks/results/"
                                "time_to_accuracy.md); validated to cover what the task and harness write")
    learned_positions: bool = Field(False, description="built-in: add a learned absolute position embedding to the "
                                                       "token embedding (rotary stays on)")
    init: Literal["scaled_residual", "torch"] = Field(
        "scaled_residual", description="built-in: 'torch' = PyTorch's default init for every layer; 'scaled_residual' = "
                                       "the same but the residual output projections N(0, 0.02/sqrt(2·n_layers)) (GPT-2)")
    share_prompts: bool = Field(True, description="run each distinct prompt of a batch through the model once "
                                                  "(GRPO groups) and repeat its KV cache; same results, less compute")

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.kind == "hf" and not self.path:
            raise ValueError("model.path is required when model.kind='hf'")
        if self.kind == "hf" and self.init != "scaled_residual":
            raise ValueError("model.init applies to the built-in model only (kind='builtin'); HF models load their weights")
        if self.charset is not None and (self.kind == "hf" or not self.charset or len(set(self.charset)) != len(self.charset)):
            raise ValueError(f"model.charset={self.charset!r}: " + ("applies to the built-in model only (kind='builtin')"
                             if self.kind == "hf" else "must be non-empty characters, each once"))
        if self.kind == "hf" and self.learned_positions:
            raise ValueError("model.learned_positions applies to the built-in model only (kind='builtin')")
        if self.kind == "builtin" and self.d_model % self.n_heads:
            raise ValueError(f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}")
        if self.kind == "builtin" and (self.d_model // self.n_heads) % 2:
            raise ValueError(f"model head dim {self.d_model // self.n_heads} must be even for rotary embeddings")
        return self


# Upper bounds of sizes that would otherwise end in an out-of-memory error or a job that never
# finishes a step: far above what a run on one machine uses (examples: batches of 64-128, evals of
# 200-500, 4 samples a step, 1-16 threads), far below what exhausts one.
THREADS_MAX = 256              # torch threads of one worker (10**6 threads: ENOMEM at start)
BATCH_MAX = 1 << 16            # prompts (SFT: examples) in one step
EVAL_MAX = 100_000             # held-out examples in one eval (greedy rollouts, 256 at a time)
SAMPLES_MAX = 1024             # rollouts written to samples.jsonl per step

RUN_CONTROL = ("steps", "stop_at_heldout")   # recipe fields that say how long to run, not how to train


class Recipe(_Strict):
    algorithm: Literal["sft", "grpo", "distill"] = Field("sft", description="see trainer/algorithms")
    sft_warmup_steps: int = Field(0, ge=0, description="train with SFT for the first N steps, then with `algorithm` "
                                                       "(GRPO and distill need a policy that sometimes succeeds)")
    sft_warmup_batch_size: int | None = Field(None, ge=1, le=BATCH_MAX, description="examples per SFT warm-up "
                                              f"step (default: batch_size; at most {BATCH_MAX})")
    lr: float = Field(3e-3, gt=0.0, le=10.0, description="peak learning rate (AdamW)")
    schedule: Literal["constant", "cosine", "linear"] = Field("cosine", description="learning-rate decay after warm-up "
                                                              "down to min_lr_ratio·lr at the last step")
    warmup_steps: int = Field(10, ge=0, description="steps of linear learning-rate warm-up from 0")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="the schedule's final learning rate as a share of lr")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW decoupled weight decay")
    batch_size: int = Field(64, ge=1, le=BATCH_MAX, description=f"prompts per step (SFT: examples per step); at most "
                            f"{BATCH_MAX}")
    group_size: int = Field(8, ge=1, description="GRPO/distill: completions sampled per prompt")
    clip_eps: float = Field(0.2, gt=0.0, le=1.0, description="GRPO importance-ratio clip")
    kl_coef: float = Field(0.0, ge=0.0, description="GRPO: weight of the k3 KL to the frozen reference")
    advantage: str = Field("grpo", description="advantage estimator (registry in trainer/algorithms/core.py)")
    loss: str = Field("grpo_clip", description="policy loss (registry in trainer/algorithms/core.py)")
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "token_sum"] = Field(
        "token_mean", description="GRPO: how per-token losses become one (token_mean: over all completion tokens, as in "
        "DAPO/Dr.GRPO; seq_mean_token_mean: mean per sequence, then over sequences; token_sum: summed)")
    updates_per_batch: int = Field(1, ge=1, le=16, description="GRPO: optimiser steps per rollout batch")
    grad_clip: float = Field(1.0, gt=0.0, description="clip the global gradient norm to this")
    steps: int = Field(300, ge=0, description="total optimiser steps of the run")
    eval_interval: int = Field(25, ge=0, description="held-out eval every N steps (0 = only at the end)")
    eval_size: int = Field(200, ge=1, le=EVAL_MAX, description=f"held-out examples per eval (greedy); at most {EVAL_MAX}")
    stop_at_heldout: float | None = Field(None, ge=0.0, le=1.0, description="end early once held-out accuracy reaches this")
    on_nonfinite: Literal["skip", "stop"] = Field("skip", description="non-finite loss: skip the step or stop the run")

    @model_validator(mode="after")
    def _check(self) -> "Recipe":
        if self.algorithm in ("grpo", "distill") and self.group_size < 2 and self.algorithm == "grpo":
            raise ValueError(f"recipe.group_size={self.group_size} must be >= 2 for algorithm 'grpo'")
        return self

    @property
    def version(self) -> str:
        """The SHA-256 of the recipe's canonical JSON without its run-control fields (RUN_CONTROL:
        how long the run goes and when it stops, which a controller sets from its budget and
        target), as a harness is versioned: every metrics row carries the version of the recipe it
        trained with, so a change of how it trains that nobody commanded shows."""
        blob = json.dumps(self.model_dump(mode="json", exclude=set(RUN_CONTROL)), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


class TaskConfig(_Strict):
    name: str = Field("addition", description="task family (trainer/tasks)")
    options: dict[str, Any] = Field(default_factory=dict, description="family-specific options")


class CheckpointConfig(_Strict):
    interval: int = Field(50, ge=0, description="save every N steps (0 = only on command and at the end)")
    keep_last: int = Field(3, ge=1, description="retention: newest N periodic checkpoints are kept")


class Perturbation(_Strict):
    """A fault injected for evaluation. Never visible in metrics, samples or logs the operators read.

    kinds: `override` (set recipe/harness fields: `set`, dotted keys like `recipe.lr`,
    `harness.sampling.temperature`), `kill` (SIGKILL the worker), `stall` (sleep `seconds` without
    progress), `label_noise` (corrupt `fraction` of SFT labels, as `noise` says), `corrupt_checkpoint` (damage the
    newest checkpoint file); in the data pipeline, below the harness (no harness or recipe version
    changes): `data_format` (examples written as `style` says), `data_shift` (problems `levels`
    harder than the curriculum's), `duplicates` (`fraction` of the stream drawn from a pool of `pool`
    examples); on the machine: `slow_worker` (every step `seconds` slower), `oom` (the job dies of
    out-of-memory at every step while recipe.batch_size is above `max_batch_size`). `shortcut`
    expands to one of these (see trainer/perturb.py, which also checks each kind's fields)."""

    kind: Literal["override", "kill", "stall", "label_noise", "corrupt_checkpoint", "data_format", "data_shift",
                  "duplicates", "slow_worker", "oom"] | None = Field(
        None, description="the fault mechanism (see above); None when `shortcut` names it")
    shortcut: str | None = Field(None, description="a named fault with its defaults, e.g. lr_spike, broken_template "
                                 "(trainer/perturb.py SHORTCUTS); explicit fields win")
    at_step: int = Field(0, ge=0, description="apply when this step starts (0 = from the start)")
    set: dict[str, Any] = Field(default_factory=dict, description="override: dotted recipe.*/harness.* fields to set")
    seconds: float = Field(0.0, ge=0.0, le=86400.0, description="stall: seconds the worker sleeps without progress; "
                           "slow_worker: seconds every step takes longer (at most a day)")
    fraction: float = Field(0.0, ge=0.0, le=1.0, description="label_noise: share of SFT labels corrupted; duplicates: "
                            "share of the training stream drawn from the pool")
    noise: Literal["random_char", "off_by_one"] = Field(
        "random_char", description="label_noise: how a corrupted label is wrong — one character replaced at random, "
        "or an integer answer off by one (+1: a systematic labelling bug, the same on every corrupted example)")
    style: Literal["answer_prefix", "answer_spaced", "answer_reversed", "question_prefix", "question_spaced"] | None = Field(
        None, description="data_format: what the data pipeline writes differently — the reference answer SFT learns "
        "(before the harness renders it) with a '=' before it, its characters spaced or reversed; or the question the "
        "template wraps with a '=' before it or its characters spaced")
    levels: int = Field(0, ge=0, le=64, description="data_shift: difficulty levels the training stream draws above "
                        "the curriculum's (capped at the task's hardest)")
    pool: int = Field(0, ge=0, le=1_000_000, description="duplicates: distinct examples the repeated part of the stream "
                      "is drawn from")
    max_batch_size: int = Field(0, ge=0, description="oom: the largest recipe.batch_size that fits in memory")
    where: Literal["data", "compute"] = Field("data", description="slow_worker: where a step spends the extra seconds — "
                                              "waiting on the data pipeline (a slow loader or disk) or in its compute "
                                              "(a throttled device)")
    once: bool = Field(True, description="kill/stall: only the first time the step is reached (not after a restart); "
                       "slow_worker: only in the process it started in (a restarted job runs on another worker)")


class Tunable(BaseModel):
    """A field the trainer reads on every step, so a live change, a backtest's fork and a rollback
    take effect at once (tests/test_trainer_live_fields.py), with the range a search may move it in."""

    model_config = ConfigDict(frozen=True)
    field: str
    lo: float
    hi: float
    integer: bool = False
    algorithms: tuple[str, ...] = ()       # the algorithms that read it (empty: every one)
    why: str = ""


# The fields a search may tune, most sensitive first: the learning rate decides whether Adam trains a
# transformer at all; the sampling temperature whether a GRPO group has any reward variance; then the
# answer length, the batch, and the training difficulty. Moves are multiplicative (x3 up, /10 down for
# the lr; x2 and /2 for sizes) or a step (temperature 0.3, difficulty 1), within [lo, hi].
TUNABLE: tuple[Tunable, ...] = (
    Tunable(field="recipe.lr", lo=1e-5, hi=0.1, why="peak learning rate"),
    Tunable(field="harness.sampling.temperature", lo=0.3, hi=1.5, algorithms=("grpo",),
            why="sampling temperature of training rollouts"),
    Tunable(field="harness.sampling.max_new_tokens", lo=1, hi=4096, integer=True, why="longest completion"),
    Tunable(field="recipe.batch_size", lo=8, hi=1024, integer=True, why="prompts per step"),
    Tunable(field="harness.curriculum.start", lo=1, hi=64, integer=True, why="training difficulty"),
)


class RunConfig(_Strict):
    name: str = Field("run", pattern=r"^[A-Za-z0-9_.-]+$", description="the run's folder name under out_dir")
    seed: int = Field(0, description="seed of the model init, the data stream and sampling")
    out_dir: str = Field("runs", description="the run writes to OUT_DIR/NAME")
    task: TaskConfig = Field(default_factory=TaskConfig, description="what the policy learns: the task family and its options")
    model: ModelConfig = Field(default_factory=ModelConfig, description="the policy: built-in transformer or a local HF model")
    recipe: Recipe = Field(default_factory=Recipe, description="the algorithm and its optimisation settings")
    harness: HarnessSpec = Field(default_factory=HarnessSpec, description="everything outside the weights that shapes "
                                 "trajectories and reward: template, answer format, sampling, reward, curriculum, filters")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="when checkpoints are written and kept")
    perturbations: list[Perturbation] = Field(default_factory=list, description="faults injected for evaluation")
    fork_from: str | None = Field(None, description="start from this checkpoint file (.pt) of another run, verified by its checksum")
    fork_mode: Literal["full", "state", "weights"] = Field(
        "full", description="full: weights, optimiser, step, data cursor and RNG, recipe/harness from this config; "
        "state: the same but recipe/harness from the checkpoint; weights: weights only")
    fork_overrides: dict[str, Any] = Field(default_factory=dict, description="dotted recipe.*/harness.* fields set after the fork")
    stop_step: int | None = Field(None, ge=0, description="end the run at this step instead of recipe.steps, with its final "
                                  "evaluation, while the lr schedule still runs over recipe.steps (its last lr held "
                                  "beyond it): a backtest arm trains a stretch of the run's own schedule")
    samples_per_step: int = Field(4, ge=0, le=SAMPLES_MAX, description="rollouts written to samples.jsonl per step "
                                  f"(at most {SAMPLES_MAX}, and never more than the step's rollouts)")
    num_workers: int = Field(1, ge=1, le=64, description=">1: data-parallel over Ray Train workers (gloo on CPU)")
    threads: int = Field(0, ge=0, le=THREADS_MAX, description="torch intra-op threads per worker (0 = torch default; "
                         f"at most {THREADS_MAX})")

    @model_validator(mode="after")
    def _check_shards(self) -> "RunConfig":
        r = self.recipe
        for name, b in (("recipe.batch_size", r.batch_size), ("recipe.sft_warmup_batch_size", r.sft_warmup_batch_size)):
            if b is not None and b < self.num_workers:
                raise ValueError(f"{name}={b} is less than num_workers={self.num_workers}: a data-parallel worker "
                                 "would get no examples")
        return self

    @property
    def run_dir(self) -> pathlib.Path:
        return pathlib.Path(self.out_dir) / self.name

    @property
    def keeps_fork_init(self) -> bool:
        """A full fork with checkpoints on keeps its source's untrained `init` as its own
        (`trainer.loop.Trainer.inherit_init`; a job with run storage fetches it with the checkpoint)."""
        return bool(self.fork_from) and self.fork_mode == "full" and bool(self.checkpoint.interval)

    @classmethod
    def from_yaml(cls, path: str | pathlib.Path) -> "RunConfig":
        return cls.parse(load_yaml(path, "config file") or {})

    @classmethod
    def parse(cls, data: Any) -> "RunConfig":
        return parse_config(cls, data)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def parse_config(cls: Any, data: Any) -> Any:
    """`cls.model_validate(data)` for a config mapping; anything wrong is one ConfigError naming the field."""
    if not isinstance(data, dict):
        raise ConfigError(f"config must be a mapping, got {type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, data)) from None


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml's parser when built with it (~5x faster)


def parse_yaml(text: str | bytes, *, unique_keys: bool = False) -> Any:
    """`yaml.safe_load` with the C parser when available (same safe constructors and results).
    `unique_keys`: a mapping that names a key twice is a `yaml.constructor.ConstructorError` naming
    the key, where it is and the line of its first use (PyYAML keeps the last value silently)."""
    return yaml.load(text, Loader=_UniqueKeyLoader if unique_keys else _LOADER)


class _UniqueKeyLoader(_LOADER):  # type: ignore[misc, valid-type]
    """The same safe loader, refusing duplicate keys before anything is constructed."""

    def construct_document(self, node: yaml.Node) -> Any:
        _refuse_duplicate_keys(self, node)
        return super().construct_document(node)


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _refuse_duplicate_keys(loader: Any, root: yaml.Node) -> None:
    """Walk the composed document once (an aliased node is visited once, so an alias bomb costs
    its size, not its expansion) and raise a ConstructorError at the second use of a key in one
    mapping. Keys compare as constructed (`1` and `0x1` are one key, as they would be in the dict);
    a merge (`<<: *base`) may still be overridden by an explicit key, as YAML allows."""
    seen_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, value_node in node.value:
                shown = ""
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                    key = loader.construct_object(key_node)   # a scalar: hashable, cached for the document
                    shown = str(key)[:64]
                    if key in first:
                        where = f" in {path}" if path else ""
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r}{where} (first at line {first[key]})", key_node.start_mark)
                    first[key] = key_node.start_mark.line + 1
                stack.append((value_node, f"{path}.{shown}" if path else shown))


# Bounds on a config or goal file, so reading, validating and re-dumping it stays quick: the
# files are a few KB; a 60 MB string took a minute to dump, and anchors/aliases can make a small
# file expand to billions of nodes when walked (every use of an alias counts here).
YAML_MAX_BYTES = 1 << 20
YAML_MAX_STRING = 64 << 10        # characters of one string (key or value)
YAML_MAX_CHARS = 4 << 20          # characters of all strings, aliases counted at each use
YAML_MAX_NODES = 100_000
YAML_MAX_DEPTH = 32


def load_yaml(path: str | pathlib.Path, what: str) -> Any:
    """Parse a YAML file; a missing, oversized, non-UTF-8 or unparsable file is a ConfigError naming it."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} {str(p)!r} not found")
    try:
        with open(p, "rb") as f:
            raw = f.read(YAML_MAX_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{what} {str(p)!r} cannot be read: {e.strerror or e}") from None
    if len(raw) > YAML_MAX_BYTES:
        raise ConfigError(f"{what} {str(p)!r} is larger than {YAML_MAX_BYTES} bytes (a {what} is a few KB of YAML)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {str(p)!r} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    if "\0" in text:
        raise ConfigError(f"{what} {str(p)!r} is not YAML text (NUL byte at offset {text.index(chr(0))})")
    try:
        data = parse_yaml(text, unique_keys=True)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{what} {str(p)!r} is not valid YAML: {' '.join(str(problem).split())}{where}") from None
    except RecursionError:
        raise ConfigError(f"{what} {str(p)!r} is nested too deeply") from None
    check_yaml_size(data, f"{what} {str(p)!r}")
    return data


def check_yaml_size(data: Any, where: str) -> None:
    """ConfigError naming the field where `data` passes the YAML_MAX_* bounds (nodes, depth, string lengths)."""
    nodes = chars = 0
    stack: list[tuple[Any, tuple[str, ...], int]] = [(data, (), 0)]
    while stack:
        node, loc, depth = stack.pop()
        nodes += 1
        field = ".".join(loc) or "<top>"
        if nodes > YAML_MAX_NODES:
            raise ConfigError(f"{where}: {field}: more than {YAML_MAX_NODES} values in all (anchors and aliases count at each use)")
        if depth > YAML_MAX_DEPTH:
            raise ConfigError(f"{where}: {field}: nested deeper than {YAML_MAX_DEPTH} levels")
        if isinstance(node, (str, bytes)):
            if len(node) > YAML_MAX_STRING:
                raise ConfigError(f"{where}: {field}: a string of {len(node)} characters, longer than {YAML_MAX_STRING}")
            chars += len(node)
            if chars > YAML_MAX_CHARS:
                raise ConfigError(f"{where}: {field}: more than {YAML_MAX_CHARS} characters of text in all "
                                  "(anchors and aliases count at each use)")
        elif isinstance(node, dict):
            for k, v in node.items():
                stack.append((k, loc + ("<key>",), depth + 1))
                stack.append((v, loc + (str(k)[:64],), depth + 1))
        elif isinstance(node, (list, tuple, set)):
            stack.extend((v, loc[:-1] + (f"{loc[-1] if loc else ''}[{i}]",), depth + 1) for i, v in enumerate(node))


def format_validation_error(e: ValidationError, data: Any = None) -> str:
    """One line per error: `field.path=value: message`."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "<config>"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] in ("value_error", "assertion_error") and not err["loc"][-1:] == ():
            parts.append(f"{loc}: {msg}" if loc != "<config>" else msg)
        elif err["type"] == "extra_forbidden":
            parts.append(f"{loc}: unknown field")
        else:
            parts.append(f"{loc}={err.get('input')!r}: {msg}")
    return "invalid config: " + "; ".join(parts)


# ---- dotted config paths -----------------------------------------------------------------------
# The one home of `recipe.lr`-style paths into config dicts: the trainer's commands and fork
# overrides, the workspace's PRs and reverts, and the operators' reads and proposal checks all go
# through these, so a path means the same everywhere.


def get_dotted(d: Any, path: str) -> tuple[bool, Any]:
    """(found, value) of dotted `path` in nested dicts `d`; the empty path is `d` itself."""
    node = d
    for p in path.split(".") if path else []:
        if not isinstance(node, dict) or p not in node:
            return False, None
        node = node[p]
    return True, node


def put_dotted(d: dict[str, Any], path: str, value: Any, *, name: str | None = None) -> None:
    """Set dotted `path` in `d` in place, creating missing sections. A value in the way of a section
    is a ConfigError naming `name` (the caller's spelling of the key, e.g. `harness.template.x`)."""
    node = d
    parts = path.split(".")
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"change {name or path!r}: {p!r} is not a section")
        node = nxt
    node[parts[-1]] = value


def del_dotted(d: dict[str, Any], path: str) -> None:
    """Remove dotted `path` from `d` when it is there."""
    parent, _, last = path.rpartition(".")
    found, node = get_dotted(d, parent)
    if found and isinstance(node, dict):
        node.pop(last, None)


def set_dotted(cfg: RunConfig, key: str, value: Any) -> RunConfig:
    """Return a copy of `cfg` with `recipe.lr`-style `key` set to `value`, fully re-validated; the
    field must exist."""
    data = cfg.model_dump(mode="json")
    if not key or not get_dotted(data, key)[0]:
        raise ConfigError(f"unknown config field {key!r}")
    put_dotted(data, key, value)
    return RunConfig.parse(data)


def validate_section(section: str, data: dict[str, Any]) -> None:
    """Check a recipe or harness dict against `Recipe` / `HarnessSpec`; a ConfigError names the field."""
    model = Recipe if section == "recipe" else HarnessSpec
    try:
        model.model_validate(data)
    except ValidationError as e:
        msg = format_validation_error(e).removeprefix("invalid config: ")
        raise ConfigError(f"invalid {section}: {msg}") from None


def apply_changes(recipe: dict[str, Any], harness: dict[str, Any],
                  changes: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """New (recipe, harness) dicts with dotted `recipe.*`/`harness.*` changes set, each validated
    against `Recipe`/`HarnessSpec`. Raises a ConfigError (a ValueError) naming the key and value."""
    out = {"recipe": copy.deepcopy(recipe), "harness": copy.deepcopy(harness)}
    for key, value in changes.items():
        section, _, rest = key.partition(".")
        if section not in out or not rest:
            raise ConfigError(f"change {key!r}: only recipe.* and harness.* fields can change")
        put_dotted(out[section], rest, value, name=key)
    for section in ("recipe", "harness"):
        try:
            validate_section(section, out[section])
        except ValueError as e:
            shown = {k: v for k, v in changes.items() if k.startswith(section + ".")}
            raise ConfigError(f"changes {shown} do not apply: {e}") from None
    return out["recipe"], out["harness"]
