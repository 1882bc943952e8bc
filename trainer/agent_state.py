"""Checkpoints, resume and fork of the agent trainer (trainer/agent_train.py), through
`trainer.checkpoint.CheckpointManager` (atomic, hashed, the `latest_good` walk).

A checkpoint is the whole state a run goes on from, taken at the end of an optimiser step:

    model, opt, ref          weights, AdamW state, the KL reference's weights (None without KL)
    step, stage, stage_step  the run's step, its stage (warmup, grpo, grpo_critic, done) and the
                             index of the stage's next step
    cursor, rng              the train-episode cursor; python, numpy, torch and the sampling generator
    harness, start_harness   full AgentHarness specs (a harness a critic or a command changed survives)
    change_pending, edits    the pending `harness_fault_step` change; the critic's verdicts so far
    progress, history        the co-evolution's numbers so far; the metrics rows (held-out success)
    recipe                   the live `RECIPE_FIELDS` (a command may have set them)

`begin` decides where a run starts: the newest checkpoint of its own that verifies (a torn newer
one is skipped and recorded as `checkpoint_corrupt`), logged as `resume`; else `fork_from` (another
run's checkpoint file, verified by its hash): the whole state, its recipe fields included (unlike
`trainer.loop`'s `fork_mode: full`, which takes the recipe from the run's config), this config's
stage lengths, then `fork_overrides`, the one way to change them; else from scratch. A fork keeps the source's data cursor and sampling stream, so
arms forked from one checkpoint see the same episodes and a fork without overrides continues as
the source did: the paired comparison a backtest wants.

`changed` sets dotted fields (`harness.<path>`, `RECIPE_FIELDS`) on a config and harness, validated
whole: `fork_overrides` and the inbox's set_recipe / set_fields (trainer/agent_control.py) use it.
"""
from __future__ import annotations

import copy
import pathlib
import random
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
import yaml

from harness.agent import AgentHarness, apply_edit
from trainer.algorithms.core import get_advantage, get_loss
from trainer.checkpoint import CheckpointError, CheckpointManager, choose_resume
from trainer.config import ConfigError, get_dotted, put_dotted
from trainer.policy import Policy
from trainer.runlog import atomic_write_text

if TYPE_CHECKING:
    from trainer.agent_train import AgentTrainer

STATE_FORMAT = "agent-1"
# what the trainer reads at every step (learning rates and their warm-ups, batch shapes, the loss)
RECIPE_FIELDS = ("sft.lr", "sft.warmup_steps", "sft.batch_size", "grpo.lr", "grpo.warmup_steps", "grpo.prompts",
                 "grpo.group_size", "grpo.temperature", "grpo.clip_eps", "grpo.loss", "grpo.advantage",
                 "grpo.updates_per_batch", "grad_clip")


def field_key(key: str) -> str | None:
    """Why a dotted `key` of set_fields/set_recipe/fork_overrides names nothing this trainer
    changes live, else None."""
    if key.startswith("harness.") and len(key) > len("harness."):
        return None
    if key.removeprefix("recipe.") in RECIPE_FIELDS:
        return None
    return f"{key!r} is not harness.* or a field read at every step ({', '.join(RECIPE_FIELDS)})"


def recipe_values(cfg: Any) -> dict[str, Any]:
    """The live values of `RECIPE_FIELDS` (a checkpoint holds them)."""
    data = cfg.model_dump(mode="json")
    return {k: get_dotted(data, k)[1] for k in RECIPE_FIELDS}


def changed(cfg: Any, harness: AgentHarness, fields: dict[str, Any], max_len: int | None = None) -> tuple[Any, AgentHarness]:
    """The config and harness with dotted `fields` set (the recipe fields, then the harness edits),
    all validated before either is used, the harness within a policy of `max_len` tokens; a
    ValueError names the key and the value."""
    data = cfg.model_dump(mode="json")
    edits: list[tuple[str, Any]] = []
    for key, value in fields.items():
        why = field_key(key)
        if why is not None:
            raise ValueError(why)
        if key.startswith("harness."):
            edits.append((key.removeprefix("harness."), value))
        else:
            put_dotted(data, key.removeprefix("recipe."), value, name=key)
    new_cfg = type(cfg).parse(data)
    get_loss(new_cfg.grpo.loss)
    get_advantage(new_cfg.grpo.advantage)
    if new_cfg.grpo.temperature != cfg.grpo.temperature and harness.sampling.temperature != new_cfg.grpo.temperature:
        harness = apply_edit(harness, "sampling.temperature", new_cfg.grpo.temperature)
    for path, value in edits:
        harness = apply_edit(harness, path, value)
    if max_len is not None and harness.sampling.max_new_tokens >= max_len:
        raise ValueError(f"invalid harness: sampling.max_new_tokens={harness.sampling.max_new_tokens} must be below "
                         f"the policy's {max_len} tokens")
    return new_cfg, harness


def capture(tr: "AgentTrainer") -> dict[str, Any]:
    """The trainer's state, as a checkpoint holds it."""
    return {
        "format": STATE_FORMAT, "model": tr.policy.model.state_dict(), "opt": tr.opt.state_dict(),
        "ref": tr.ref_policy.model.state_dict() if tr.ref_policy is not None else None,
        "step": tr.step, "stage": tr.stage, "stage_step": tr.stage_step, "cursor": tr.cursor, "segment": tr.segment,
        "harness": tr.harness.model_dump(mode="json"), "start_harness": tr.start_harness.model_dump(mode="json"),
        "change_pending": tr.change_pending, "edits": copy.deepcopy(tr.edits), "progress": copy.deepcopy(tr.progress),
        "history": copy.deepcopy(tr.history), "heldout_start": tr.heldout_start,
        "heldout_warm": getattr(tr, "heldout_warm", None), "recipe": recipe_values(tr.cfg),
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                "gen": tr.rng.get_state()},
    }


def restore(tr: "AgentTrainer", st: dict[str, Any]) -> None:
    """Put the trainer in the state `st` (from `capture`)."""
    if not isinstance(st, dict) or st.get("format") != STATE_FORMAT:
        found = st.get("format") if isinstance(st, dict) else type(st).__name__
        raise CheckpointError(f"not an agent trainer checkpoint (format {found!r}, expected {STATE_FORMAT!r})")
    tr.policy.model.load_state_dict(st["model"])
    tr.opt.load_state_dict(st["opt"])
    tr.ref_policy = None
    if st["ref"] is not None:
        tr.ref_policy = Policy(tr.policy.cfg, tr.policy.tok, copy.deepcopy(tr.policy.model))
        tr.ref_policy.model.load_state_dict(st["ref"])
        tr.ref_policy.model.requires_grad_(False)
    data = tr.cfg.model_dump(mode="json")
    for k, v in st["recipe"].items():
        put_dotted(data, k, v)
    tr.cfg = type(tr.cfg).parse(data)
    tr.step, tr.stage, tr.stage_step = st["step"], st["stage"], st["stage_step"]
    tr.cursor, tr.segment = st["cursor"], st["segment"]
    tr.harness = AgentHarness.model_validate(st["harness"])
    tr.start_harness = AgentHarness.model_validate(st["start_harness"])
    tr.change_pending, tr.edits = st["change_pending"], copy.deepcopy(st["edits"])
    tr.progress, tr.history = copy.deepcopy(st["progress"]), copy.deepcopy(st["history"])
    tr.heldout_start = st["heldout_start"]
    if st["heldout_warm"] is not None:
        tr.heldout_warm = st["heldout_warm"]
    else:   # a state from before the warm-up ended (`init`): no warm-up result yet
        tr.__dict__.pop("heldout_warm", None)
    random.setstate(st["rng"]["python"])
    np.random.set_state(st["rng"]["numpy"])
    torch.set_rng_state(st["rng"]["torch"])
    tr.rng.set_state(st["rng"]["gen"])


def save(tr: "AgentTrainer", name: str | None = None) -> str:
    """A checkpoint of the trainer's state now (periodic `step_…`, or `name`); returns its name."""
    assert tr.ckpt is not None and tr.log is not None, "start() opens the run's checkpoints and log"
    path = tr.ckpt.save(capture(tr), tr.step, name)
    tr.log.event("checkpoint", tr.step, name=path.stem, stage=tr.stage, stage_step=tr.stage_step)
    return path.stem


def begin(tr: "AgentTrainer") -> Literal["resume", "fork", "start"]:
    """Where the run starts: its newest checkpoint that verifies, else `fork_from`, else scratch."""
    assert tr.ckpt is not None and tr.log is not None, "start() opens the run's checkpoints and log"
    choice, st = choose_resume(tr.ckpt)
    for name, why in choice.skipped:
        tr.log.event("checkpoint_corrupt", tr.step, name=name, error=why)
    if st is not None:
        restore(tr, st)
        tr.segment += 1
        tr.log.event("resume", tr.step, checkpoint=choice.name, stage=tr.stage, stage_step=tr.stage_step,
                     harness_version=tr.harness.version, skipped=[n for n, _ in choice.skipped])
        return "resume"
    if tr.cfg.fork_from:
        fork(tr, pathlib.Path(tr.cfg.fork_from))
        return "fork"
    return "start"


def fork(tr: "AgentTrainer", path: pathlib.Path) -> None:
    """Start from another agent run's checkpoint file, then set `fork_overrides`."""
    where = f"fork_from={str(path)!r}"
    if not path.is_file():
        raise ConfigError(f"{where}: checkpoint file not found")
    try:
        st = CheckpointManager(path.parent).load(path.stem)
        restore(tr, st)
    except CheckpointError as e:
        raise ConfigError(f"{where}: {e}") from None
    except (RuntimeError, KeyError, ValueError) as e:   # another model's weights
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{where}: the checkpoint does not fit this run's model: {first[:300]}") from None
    tr.segment = 0
    if tr.cfg.fork_overrides:
        try:
            tr.cfg, tr.harness = changed(tr.cfg, tr.harness, tr.cfg.fork_overrides, tr.policy._max_len())
        except ValueError as e:
            raise ConfigError(f"fork_overrides: {e}") from None


def store_harness(tr: "AgentTrainer") -> None:
    """The live harness under RUN_DIR/harnesses/<version>.yaml (what `set_harness {"version"}` reads)."""
    d = pathlib.Path(tr.cfg.run_dir) / "harnesses"
    p = d / f"{tr.harness.version}.yaml"
    if not p.exists():
        d.mkdir(parents=True, exist_ok=True)
        atomic_write_text(p, yaml.safe_dump(tr.harness.model_dump(mode="json"), sort_keys=False))
