"""What a RunConfig needs beyond its field types, checked before anything starts.

The typed config (trainer/config.py) says whether each value is well formed. Some values are only
known to be usable once the part that consumes them is built: a task name is looked up in the task
registry, task options are the task's constructor arguments, a charset must cover what the task
writes, a model must fit in memory. The trainer finds these when it starts; a swarm run starts the
trainer as a job, so without this check a bad value becomes a job that fails and is restarted over
and over. `check_run(cfg)` builds what is cheap to build (the task, never the model) and raises a
`ConfigError` naming the field and the value.

    from trainer.preflight import check_run, training_bytes
    check_run(cfg)                     # ConfigError: task.name='juggling': unknown task; known: ...
    training_bytes(cfg.model)          # float32 weights + gradients + AdamW moments (+ buffers)

The memory estimate is the training state of one replica: 16 bytes a parameter (float32 weights,
gradients and AdamW's two moments) plus the built-in model's rotary tables. Activations come on
top, so the limit (MEMORY_FRACTION of physical memory) refuses only models that cannot train here
at all. A Hugging Face model is counted from its safetensors headers, else estimated from its
config.json; one that is neither is not counted.
"""
from __future__ import annotations

import json
import math
import pathlib
import struct
from typing import Any

from trainer.config import ConfigError, ModelConfig, RunConfig

MEMORY_FRACTION = 0.8          # of physical memory, for one replica's training state
BYTES_PER_PARAM = 16           # float32 weights + gradients + AdamW exp_avg + exp_avg_sq
SEED_LIMIT = 2 ** 53           # the trainer seeds generators with seed * 1000 + rank (int64)
CHARSET_PROBES = 32            # examples per difficulty checked against a custom charset
SAFETENSORS_HEADER_MAX = 100 << 20


def check_run(cfg: RunConfig) -> None:
    """Raise ConfigError for a value the trainer would refuse at start (or die on later)."""
    if not -SEED_LIMIT <= cfg.seed <= SEED_LIMIT:
        raise ConfigError(f"seed={cfg.seed}: must be within ±2**53")
    task = _build_task(cfg)
    _check_registries(cfg)
    if cfg.model.kind == "builtin" and cfg.model.charset is not None:
        _check_charset(cfg, task)
    if cfg.model.kind == "hf":
        path = pathlib.Path(cfg.model.path or "").expanduser()
        if not path.is_dir():
            raise ConfigError(f"model.path={cfg.model.path!r}: directory not found")
        if not (path / "config.json").is_file():
            raise ConfigError(f"model.path={cfg.model.path!r}: no config.json (not a Hugging Face model directory)")
    check_memory(cfg.model)
    if cfg.fork_from:
        check_fork_from(cfg.fork_from)


def check_fork_from(fork_from: str) -> None:
    """`fork_from` names a checkpoint the trainer can load: the `.pt` file and its manifest beside
    it (trainer/checkpoint.py). The checksum is verified when the trainer loads it (a checkpoint may
    be gigabytes); a missing one would otherwise be a job that fails at start and is restarted."""
    path = pathlib.Path(fork_from)      # as the trainer opens it (trainer/loop.py: Trainer.fork)
    if not path.is_file():
        why = "a folder, not a checkpoint file" if path.is_dir() else "checkpoint file not found"
        raise ConfigError(f"fork_from={fork_from!r}: {why}")
    if path.suffix != ".pt":
        raise ConfigError(f"fork_from={fork_from!r}: not a checkpoint file (<name>.pt)")
    manifest = path.with_suffix(".json")
    try:
        sha = json.loads(manifest.read_text()).get("sha256")
    except (OSError, ValueError, AttributeError):
        sha = None
    if not isinstance(sha, str):
        raise ConfigError(f"fork_from={fork_from!r}: no readable manifest {manifest.name} beside it "
                          "(a checkpoint without one was never completely written)")


def _build_task(cfg: RunConfig) -> Any:
    from trainer.tasks import TASKS, make_task

    if cfg.task.name not in TASKS:
        raise ConfigError(f"task.name={cfg.task.name!r}: unknown task; known: {', '.join(sorted(TASKS))}")
    try:
        task = make_task(cfg.task.name, seed=cfg.seed, **cfg.task.options)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"task.options={_short(cfg.task.options)}: {e}") from None
    cur = cfg.harness.curriculum
    for field, d in (("start", cur.start), ("end", cur.end)):
        if d is None:
            continue
        try:
            task.check_difficulty(d)
        except ValueError as e:
            raise ConfigError(f"harness.curriculum.{field}={d}: {e}") from None
    return task


def _check_registries(cfg: RunConfig) -> None:
    from trainer.algorithms.core import ADVANTAGES, LOSSES

    if cfg.recipe.advantage not in ADVANTAGES:
        raise ConfigError(f"recipe.advantage={cfg.recipe.advantage!r}: unknown; known: {', '.join(sorted(ADVANTAGES))}")
    if cfg.recipe.loss not in LOSSES:
        raise ConfigError(f"recipe.loss={cfg.recipe.loss!r}: unknown; known: {', '.join(sorted(LOSSES))}")


def _check_charset(cfg: RunConfig, task: Any) -> None:
    """The characters the task and harness write at the curriculum's difficulties, as the trainer
    checks them: one the charset lacks would silently become <unk>."""
    from trainer.tasks import Split

    h, chars = cfg.harness, set(cfg.model.charset or "")
    missing: set[str] = set()
    for d in {h.curriculum.start, h.curriculum.end or h.curriculum.start}:
        d = min(max(d, task.min_difficulty), task.max_difficulty)
        for i in range(CHARSET_PROBES):
            ex = task.example(Split.TRAIN, i, d)
            text = h.render(ex.question) + h.answer.render(ex.solution or ex.answer)
            missing |= set(text) - chars
    if missing:
        raise ConfigError(f"model.charset={cfg.model.charset!r}: lacks characters the task and harness write: "
                          f"{''.join(sorted(missing))!r}")


# ---- memory ------------------------------------------------------------------------------------
def builtin_params(m: ModelConfig) -> tuple[int, int]:
    """(parameters, buffer elements) of the built-in TinyLM for `m` (trainer/model.py's layout)."""
    from trainer.tokenizer import DEFAULT_CHARSET

    d, L = m.d_model, m.n_layers
    ff = m.d_ff or int(math.ceil(8 * d / 3 / 8) * 8)
    vocab = 4 + len(dict.fromkeys(m.charset if m.charset is not None else DEFAULT_CHARSET))
    block = 2 * d + 4 * d * d + 3 * d * ff             # two norms, qkv + proj, SwiGLU gate_up + down
    params = vocab * d * 2 + L * block + d + (m.max_seq_len * d if m.learned_positions else 0)
    buffers = 2 * m.max_seq_len * ((d // m.n_heads) // 2)   # rotary cos and sin
    return params, buffers


def _safetensors_params(path: pathlib.Path) -> int | None:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > SAFETENSORS_HEADER_MAX:
                    return None
                header = json.loads(fh.read(n))
        except (OSError, struct.error, ValueError):
            return None
        for name, t in header.items():
            if name != "__metadata__" and isinstance(t, dict) and isinstance(t.get("shape"), list):
                total += math.prod(int(x) for x in t["shape"])
    return total


def _config_params(path: pathlib.Path) -> int | None:
    """A decoder-only transformer's parameters from the usual config.json keys, None if absent."""
    try:
        c = json.loads((path / "config.json").read_text("utf-8"))
        h, L, v = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["vocab_size"])
        ff = int(c.get("intermediate_size") or 4 * h)
        heads = int(c.get("num_attention_heads") or 1)
        kv = int(c.get("num_key_value_heads") or heads)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    hd = h // max(heads, 1)
    attn = 2 * h * h + 2 * h * kv * hd
    embed = v * h * (1 if c.get("tie_word_embeddings", True) else 2)
    return embed + L * (attn + 3 * h * ff + 2 * h) + h


def training_bytes(m: ModelConfig) -> int | None:
    """Bytes of one replica's training state (see the module docstring); None when unknown."""
    if m.kind == "builtin":
        params, buffers = builtin_params(m)
        return params * BYTES_PER_PARAM + buffers * 4
    path = pathlib.Path(m.path or "").expanduser()
    if not path.is_dir():
        return None
    params = _safetensors_params(path)
    if params is None:
        params = _config_params(path)
    return params * BYTES_PER_PARAM if params is not None else None


def memory_limit() -> int:
    import psutil

    return int(psutil.virtual_memory().total * MEMORY_FRACTION)


def check_memory(m: ModelConfig) -> None:
    need = training_bytes(m)
    limit = memory_limit()
    if need is not None and need > limit:
        what = (f"d_model={m.d_model}, n_layers={m.n_layers}, d_ff={m.d_ff}, max_seq_len={m.max_seq_len}"
                if m.kind == "builtin" else f"path={m.path!r}")
        raise ConfigError(f"model ({what}): training it needs about {_gib(need)} (weights, gradients and AdamW "
                          f"moments in float32), more than {MEMORY_FRACTION:.0%} of this machine's memory ({_gib(limit)})")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n < (1 << 50) else f"{n:.3g} bytes"


def _short(v: Any, n: int = 120) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."
