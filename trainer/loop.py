"""The trainer: one loop for SFT, GRPO and distill, with metrics, samples, checkpoints, control
commands and perturbations handled between steps (the "safe points").

    trainer = Trainer(RunConfig.from_yaml("run.yaml"))
    summary = trainer.run()            # resumes from the newest good checkpoint if there is one
                                       # (data-parallel: the one rank 0 chose, on every rank)

Run it directly (`swarm train CONFIG`), as a Ray job (`trainer.launch`), or data-parallel on Ray
Train workers (`num_workers > 1`, see `trainer.launch.run_ray_train`). Data-parallel, rank 0 reads
the control commands and what they name (a checkpoint to roll back to, a stored harness version)
and every rank applies each command or every rank refuses it (`apply_agreed`,
`trainer.distributed`).
"""
from __future__ import annotations

import copy
import hashlib
import math
import pathlib
import random
import time
from typing import Any, Callable

import numpy as np
import torch

from harness import render
from harness.changes import apply_changes
from harness.curriculum import FiltersRejectEverything, difficulty, draw_batch
from harness.spec import HarnessSpec
from trainer.algorithms.core import ADVANTAGES, LOSSES
from trainer.algorithms.distill import distill_step
from trainer.algorithms.grpo import grpo_step
from trainer.algorithms.sft import answer_loss_row, answer_losses, sft_step
from trainer.checkpoint import CheckpointError, CheckpointManager, ResumeChoice
from trainer.config import ConfigError, RunConfig, set_dotted
from trainer.control import Command, CommandInbox
from trainer.distributed import CommandError, DivergedError, Dist, agree_checkpoint, agree_resume
from trainer.logprobs import batch_logprobs, select_backend
from trainer.perturb import Perturber, check_overrides
from trainer.policy import Batch, Policy
from trainer.rollout import Rollout, prompt_ids, rollout, summarize, target_ids
from trainer.runlog import INIT_CHECKPOINT, RunLog, atomic_write_text, heldout_row
from trainer.tasks.base import Example, Split, make_task

STEPS: dict[str, Callable] = {"sft": sft_step, "grpo": grpo_step, "distill": distill_step}

HEARTBEAT_EVERY_S = 0.5   # while running, the heartbeat is rewritten at most this often (state changes always)

ERROR_CHARS = 500   # of an exception's message kept in the 'error' event that records why the job died

# a command that raises one of these is refused (acknowledged with the reason) and the run goes on;
# any other error ends the run
REFUSED = (ValueError, CheckpointError, KeyError, CommandError)


def step_norms(before: list[torch.Tensor], after: list[torch.Tensor]) -> tuple[float, float]:
    """(‖θ_after − θ_before‖ / ‖θ_after‖, ‖θ_after‖) over every trained parameter: how far one
    optimiser step moved the weights relative to their size (the update ratio: it shows a learning
    rate far too low, where the weights barely move, which a loss that falls slowly does not), and
    their size (a norm that keeps falling shows a weight decay pulling the weights in faster than
    the updates move them). `before` is consumed (overwritten with the difference)."""
    with torch.no_grad():
        torch._foreach_sub_(before, after)
        moved = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(before)))
        size = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(after)))
        return float(moved / size.clamp_min(1e-12)), float(size)


class StepMeter:
    """The optimiser step's measurements, for a trainer's metrics rows: `before()` just ahead of
    `opt.step()`, `after()` just past it gives the update ratio and the weights' norm
    (`step_norms`) and their growth over `start`, the norm of `params` when the meter is built —
    before any checkpoint loads: the untrained (or pretrained) start, the same for a resume, a
    rollback and every rank (the init is seeded), close to it for another seed (a random init's
    norm barely varies). An lr far too high inflates the weights. One buffer of the weights' size,
    reused (`buffer()`, also scratch between steps)."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params
        self._buf: list[torch.Tensor] | None = None
        with torch.no_grad():
            self.start = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(params))))

    def buffer(self) -> list[torch.Tensor]:
        if self._buf is None:
            self._buf = [torch.empty_like(p) for p in self.params]
        return self._buf

    def before(self) -> None:
        with torch.no_grad():   # a copy: the update is measured, not inferred
            torch._foreach_copy_(self.buffer(), self.params)

    def after(self) -> dict[str, float]:
        ratio, norm = step_norms(self.buffer(), self.params)
        return {"update_ratio": ratio, "weight_norm": norm, "weight_growth": norm / max(self.start, 1e-12)}


class StopRun(Exception):
    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


class Trainer:
    def __init__(self, cfg: RunConfig, dist: Dist | None = None,
                 on_step: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.cfg = cfg
        self.dist = dist or Dist()
        self.on_step = on_step
        self.run_dir = cfg.run_dir
        if cfg.recipe.advantage not in ADVANTAGES:
            raise ConfigError(f"recipe.advantage={cfg.recipe.advantage!r}: unknown; known: {', '.join(sorted(ADVANTAGES))}")
        if cfg.recipe.loss not in LOSSES:
            raise ConfigError(f"recipe.loss={cfg.recipe.loss!r}: unknown; known: {', '.join(sorted(LOSSES))}")
        try:
            self.task = make_task(cfg.task.name, seed=cfg.seed, **cfg.task.options)
            self.task.check_difficulty(cfg.harness.curriculum.start)
            self.policy = Policy.build(cfg.model, seed=cfg.seed)
        except (ValueError, TypeError) as e:
            raise ConfigError(str(e)) from None
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.recipe = cfg.recipe.model_copy(deep=True)
        self.harness = cfg.harness.model_copy(deep=True)
        # the harness as config and commands set it, without silent perturbations: the only one stored
        self.shown = self.harness
        self.eval_difficulty = cfg.harness.curriculum.end or cfg.harness.curriculum.start
        if cfg.model.kind == "builtin" and cfg.model.charset is not None:
            self._check_charset()
        device = next(self.policy.model.parameters()).device
        try:
            self.backend, reason = select_backend(cfg.model.kernels, device)
        except ValueError as e:
            raise ConfigError(f"model.kernels={cfg.model.kernels!r}: {e}") from None
        if not self.policy.is_hf:  # HF models have their own (boolean) `use_kernels` attribute
            norm = self.backend
            if self.backend == "torch" and cfg.model.kernels == "auto" and device.type == "cpu":
                import kernels.cpu

                ok, why = kernels.cpu.available()   # RMSNorm fused in C, built on first use
                norm = "cpu" if ok else "torch"
                reason += f"; RMSNorm: {why}"
            self.policy.model.use_kernels(norm)
        self.params = [p for p in self.policy.model.parameters() if p.requires_grad]
        self.meter = StepMeter(self.params)   # built before any checkpoint loads (its start is the untrained size)
        # the fused AdamW step: one kernel over all parameters instead of ~10 ops per tensor (measured
        # 1.9 -> 0.7 ms per step on the 0.8M-parameter example, one CPU thread)
        fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in self.params)
        self.opt = torch.optim.AdamW(self.params, lr=self.recipe.lr, weight_decay=self.recipe.weight_decay,
                                     betas=(0.9, 0.95), fused=fused or None)
        self.gen = torch.Generator().manual_seed(cfg.seed * 1000 + 17 + self.dist.rank)
        self.step, self.cursor, self.segment = 0, 0, 0
        self.seen: dict[str, None] = {}   # dedupe's memory: the newest questions, oldest first
        self.ref_state: dict[str, torch.Tensor] | None = None
        self.ref_policy: Policy | None = None
        self.paused = False
        self._beat_at: float | None = None   # monotonic time of the last running heartbeat; None = none yet
        self.last_eval: dict[str, float] = {}
        self.reached_target = False
        private = pathlib.Path(cfg.out_dir) / ".perturb" / f"{cfg.name}.json"
        try:
            check_overrides(cfg, cfg.perturbations)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.perturber = Perturber(cfg.perturbations, private)
        self.ckpt = CheckpointManager(self.run_dir / "checkpoints", cfg.checkpoint.keep_last)
        self.log = RunLog(self.run_dir) if self.dist.is_main else None
        self.inbox = CommandInbox(self.run_dir) if self.dist.is_main else None
        self._kernel_reason = reason
        self._last_step_time = time.perf_counter()

    # ---- helpers used by the algorithm steps ----------------------------------------------
    def _check_charset(self) -> None:
        """A custom built-in charset must cover what the task and harness write (prompts and
        reference answers at the curriculum's difficulties): a missing character would be <unk>."""
        stoi = self.policy.tok.stoi
        missing: set[str] = set()
        for d in {self.harness.curriculum.start, self.eval_difficulty}:
            d = min(max(d, self.task.min_difficulty), self.task.max_difficulty)
            for i in range(32):
                ex = self.task.example(Split.TRAIN, i, d)
                text = self.harness.render(ex.question) + render.sft_target(self.harness, ex.solution or ex.answer)
                missing |= {c for c in text if c not in stoi}
        if missing:
            raise ConfigError(f"model.charset lacks characters the task and harness write: {''.join(sorted(missing))!r}")

    def prompt_ids(self, ex: Example) -> list[int]:
        return prompt_ids(self.policy, self.harness, ex)[1]

    def target_ids(self, completion_text: str) -> list[int]:
        return target_ids(self.policy, self.harness, completion_text)

    def lr_at(self, step: int) -> float:
        r = self.recipe
        if r.warmup_steps and step < r.warmup_steps:
            return r.lr * (step + 1) / r.warmup_steps
        if r.schedule == "constant" or r.steps <= r.warmup_steps:
            return r.lr
        frac = min(1.0, (step - r.warmup_steps) / max(1, r.steps - r.warmup_steps))
        decay = 0.5 * (1 + math.cos(math.pi * frac)) if r.schedule == "cosine" else 1.0 - frac
        return r.lr * (r.min_lr_ratio + (1 - r.min_lr_ratio) * decay)

    def backward_halves(self, a: torch.Tensor, b: torch.Tensor, wa: float, wb: float, na: int, nb: int) -> dict[str, float]:
        """Backward a batch's loss `wa·a + wb·b` as its two halves in turn (`a`, `b`: each half's own
        token-mean loss over `na` and `nb` examples), which leaves the batch's gradient in `.grad`
        as one backward would, and measure the gradient's noise on the way from the halves' own
        gradients gA, gB: gA·gB estimates |G|² without bias, (|gA|² + |gB|²)/2 adds the noise of a
        mean over `grad_half` examples (tr Σ / grad_half; the harmonic mean of the halves' sizes).
        Its scratch is the buffer the update ratio measures with (`StepMeter.buffer`), free until
        `optimise` copies the weights into it. `grad_batch`: the examples the step trained on."""
        self.opt.zero_grad(set_to_none=False)
        (a * wa).backward()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        with torch.no_grad():
            half = self.meter.buffer()
            torch._foreach_copy_(half, grads)                          # wa·gA
        (b * wb).backward()                                            # wa·gA + wb·gB
        with torch.no_grad():
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
            hh, hg, gg = torch.stack([torch.stack([torch.sum(h * h), torch.sum(h * g), torch.sum(g * g)])
                                      for h, g in zip(half, grads)]).double().sum(0).tolist()
        if wa <= 0 or wb <= 0 or na <= 0 or nb <= 0:
            return {}
        sq_a, sq_b, dot = hh / wa ** 2, (gg - 2 * hg + hh) / wb ** 2, (hg - hh) / (wa * wb)
        return {"grad_dot": dot, "grad_sq": (sq_a + sq_b) / 2, "grad_half": 2.0 * na * nb / (na + nb),
                "grad_batch": float(na + nb)}

    def optimise(self, loss: torch.Tensor | None, stats: dict[str, float], backward_done: bool = False) -> dict[str, float]:
        """Backward, all-reduce, clip, step. `loss=None` means this rank has nothing to learn
        from this step (no verified success, every group filtered): it still joins the
        all-reduce, so data-parallel ranks never wait on each other; every rank then takes the
        same optimiser step (from the averaged gradient), or none when no rank had a loss. A non-finite loss or gradient norm
        skips the step (on every rank: the norm is global). `backward_done`: the gradient is
        already in `.grad` (`backward_halves`); `loss` only reports its value."""
        t0 = time.perf_counter()
        if not backward_done:
            self.opt.zero_grad(set_to_none=False)
        loss_v = float(loss.detach()) if loss is not None else 0.0
        finite = math.isfinite(loss_v)
        if loss is not None and finite and not backward_done:
            loss.backward()
        elif not finite:
            for p in self.params:  # the all-reduce carries the NaN to every rank: one global decision
                if p.grad is None:     # no backward yet (a first step): zero_grad left no tensor to fill
                    p.grad = torch.zeros_like(p)
                p.grad.fill_(float("nan"))
        contributors = self.dist.mean_grads(self.params, contributes=loss is not None)
        gn = float(torch.nn.utils.clip_grad_norm_(self.params, self.recipe.grad_clip))
        nonfinite = not math.isfinite(gn)
        idle = contributors == 0  # no rank had anything to learn: no step anywhere, as with one process
        out = {**stats, "loss": loss_v, "grad_norm": gn,
               "skipped": 1.0 if (nonfinite or idle) else 0.0, "nonfinite": 1.0 if nonfinite else 0.0}
        if nonfinite:
            self.opt.zero_grad(set_to_none=False)
            if self.log:
                self.log.event("nonfinite", self.step, loss=loss_v, grad_norm=gn, action=self.recipe.on_nonfinite)
            if self.recipe.on_nonfinite == "stop":
                raise StopRun("stopped_nonfinite")
        elif not idle:
            self.sync_optimizer()
            self.meter.before()
            self.opt.step()
            out.update(self.meter.after())
        out["t_update"] = time.perf_counter() - t0
        return out

    def sync_optimizer(self) -> None:
        """Set every optimiser hyperparameter the recipe owns from the recipe in force, before each
        step. The optimiser's param groups are state: `load_state` (resume, rollback, a backtest's
        fork) restores the checkpoint's values, and a live `set_recipe` changes only the recipe, so
        a value read from the groups would be the one in force when the optimiser was built or the
        checkpoint written, not the one the run was told to use."""
        for g in self.opt.param_groups:
            g["lr"] = self.lr_at(self.step)
            g["weight_decay"] = self.recipe.weight_decay

    def ref_logprobs(self, batch: Batch) -> torch.Tensor:
        if self.ref_policy is None:
            assert self.ref_state is not None, "reference weights are captured at run start"
            self.ref_policy = Policy(self.policy.cfg, self.policy.tok, copy.deepcopy(self.policy.model))
            self.ref_policy.model.load_state_dict(self.ref_state)
            self.ref_policy.model.requires_grad_(False)
        logp, _, _ = batch_logprobs(self.ref_policy, batch, self.backend)
        return logp

    def log_samples(self, rolls: list[Rollout]) -> None:
        if not self.log or not self.cfg.samples_per_step:
            return
        for x in rolls[: self.cfg.samples_per_step]:
            self.log.samples.write({"step": self.step, "segment": self.segment, "uid": x.example.uid,
                                    "question": x.example.question, "prompt": x.prompt, "completion": x.completion, "reward": x.reward,
                                    "verdict": x.result.verdict.value, "truncated": x.truncated})

    # ---- data -------------------------------------------------------------------------------
    def next_examples(self) -> list[Example]:
        """This rank's shard of the next batch from the train split, drawn by the harness's curriculum
        through its filters (`harness.curriculum.draw_batch`). Every rank builds the same filtered
        batch from the shared cursor, so the cursor stays identical across ranks."""
        r, W = self.recipe, self.dist.world
        warming_up = r.algorithm != "sft" and self.step < r.sft_warmup_steps
        B = r.sft_warmup_batch_size if warming_up and r.sft_warmup_batch_size else r.batch_size
        diff = difficulty(self.harness, self.step, self.task.min_difficulty, self.task.max_difficulty)
        # the train split as the data pipeline hands it over (the source's revision the harness pins)
        stream = self.perturber.stream(self.task, self.harness.filters.as_of_step)
        try:
            out, self.cursor = draw_batch(self.harness, lambda i: stream(i, diff), self.cursor, B, self.seen)
        except FiltersRejectEverything as e:
            self.cursor = e.cursor
            raise StopRun("data_filters_reject_everything") from None
        lacking = self.perturber.out_of_memory(self.step, r.batch_size, self.params[0].device.type)
        if lacking:
            raise MemoryError(lacking)
        # shards of B·r//W .. B·(r+1)//W: together exactly the batch one process would take
        return out[self.dist.rank * B // W : (self.dist.rank + 1) * B // W]

    # ---- evaluation -------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        exs = [self.task.example(Split.HELDOUT, i, self.eval_difficulty) for i in range(self.recipe.eval_size)]
        exs = exs[self.dist.rank :: self.dist.world]
        rolls: list[Rollout] = []
        for i in range(0, len(exs), 256):
            rolls += rollout(self.policy, self.task, self.harness, exs[i : i + 256], 1, None,
                             greedy=True, for_training=False)
        # the answers' likelihood only where the run learns them as SFT targets (a GRPO run's
        # answer is any that passes, not the task's reference one)
        if self.algorithm_now() not in ("sft", "distill"):
            return heldout_row(summarize(rolls))
        per = answer_losses(self, exs)
        totals = self.dist.sum([float(len(per)), sum(per), sum(x * x for x in per)])
        return {**heldout_row(summarize(rolls)), **answer_loss_row(*totals)}

    # ---- state ------------------------------------------------------------------------------
    def rng_state(self) -> dict[str, Any]:
        """This process's random streams: Python's, numpy's, torch's and the sampling generator."""
        return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                "gen": self.gen.get_state()}

    def ranks_rng(self) -> list[dict[str, Any]] | None:
        """Every rank's random streams, for a checkpoint (data-parallel; None in one process).
        Every rank must call it."""
        return self.dist.gather(self.rng_state()) if self.dist.enabled else None

    def state(self, ranks_rng: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {
            "model": self.policy.model.state_dict(), "opt": self.opt.state_dict(),
            "step": self.step, "cursor": self.cursor, "segment": self.segment, "seen": list(self.seen),
            "recipe": self.recipe.model_dump(mode="json"), "harness": self.harness.model_dump(mode="json"),
            "shown": self.shown.model_dump(mode="json"), "ref": self.ref_state,
            "faults": self.perturber.carried(),   # the data faults in force: carried into state forks only
            "rng": self.rng_state(),
            **({"ranks_rng": ranks_rng} if ranks_rng is not None else {}),
        }

    def load_state(self, st: dict[str, Any]) -> None:
        self.policy.model.load_state_dict(st["model"])
        self.opt.load_state_dict(st["opt"])
        self.step, self.cursor, self.segment = st["step"], st["cursor"], st["segment"]
        self.seen = dict.fromkeys(st["seen"])
        self.recipe = type(self.recipe).model_validate(st["recipe"])
        self.harness = HarnessSpec.model_validate(st["harness"])
        self.shown = HarnessSpec.model_validate(st.get("shown", st["harness"]))
        self.ref_state, self.ref_policy = st["ref"], None
        ranks = st.get("ranks_rng")
        mine = ranks[self.dist.rank] if isinstance(ranks, list) and len(ranks) == self.dist.world else st["rng"]
        random.setstate(mine["python"])
        np.random.set_state(mine["numpy"])
        torch.set_rng_state(mine["torch"])
        self.gen.set_state(mine["gen"])
        if self.dist.rank and mine is st["rng"]:
            # a checkpoint with rank 0's streams only (one process wrote it, or another world size):
            # every other rank derives its own from them, so ranks never sample the same completions
            key = bytes(self.gen.get_state().numpy()) + self.dist.rank.to_bytes(4, "little")
            self.gen.manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1)

    def save(self, name: str | None = None, ranks_rng: list[dict[str, Any]] | None = None) -> str:
        """A checkpoint of the state now (rank 0 writes it; `ranks_rng`: every rank's random streams,
        which `ranks_rng()` gathers on every rank first, so a resume continues each rank's own)."""
        if not self.dist.is_main:
            return name or ""
        path = self.ckpt.save(self.state(ranks_rng), self.step, name)
        self.log.event("checkpoint", self.step, name=path.stem)
        return path.stem

    def store_harness(self) -> None:
        if self.dist.is_main:
            d = self.run_dir / "harnesses"
            d.mkdir(exist_ok=True)
            p = d / f"{self.shown.version}.yaml"
            if not p.exists():
                atomic_write_text(p, self.harness_yaml())

    def harness_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.shown.model_dump(mode="json"), sort_keys=False)

    def apply_overrides(self, fields: dict[str, Any], silent: bool = False) -> None:
        """Set dotted `recipe.*` / `harness.*` fields on the live run, in order, each validated on the
        whole (harness fields by `harness.changes.apply_changes`, as the swarm checks them)."""
        cfg = self.cfg.model_copy(update={"recipe": self.recipe, "harness": self.harness})
        harness = self.harness
        for k, v in fields.items():
            if k.startswith("harness."):
                harness = self._set_harness_field(harness, k, v)
            elif k.startswith("recipe."):
                cfg = set_dotted(cfg, k, v)
            else:
                raise ConfigError(f"can only change recipe.* or harness.* fields, not {k!r}")
        if cfg.recipe.algorithm != self.recipe.algorithm and cfg.recipe.algorithm == "grpo" and self.ref_state is None:
            self.ref_state = copy.deepcopy(self.policy.model.state_dict())
        shown = self.shown
        if not silent:  # a command's change is shown; a silent perturbation's is not
            for k, v in fields.items():
                shown = self._set_harness_field(shown, k, v) if k.startswith("harness.") else shown
        changed = shown != self.shown
        self.recipe, self.harness, self.shown = cfg.recipe, harness, shown
        if changed:
            self.store_harness()

    @staticmethod
    def _set_harness_field(spec: HarnessSpec, key: str, value: Any) -> HarnessSpec:
        try:
            return apply_changes(spec, {key: value})
        except ValueError as e:
            raise ConfigError(str(e)) from None

    # ---- control ----------------------------------------------------------------------------
    def handle_commands(self) -> None:
        cmds = self.inbox.poll() if self.inbox else []
        cmds = self.dist.broadcast([c.model_dump() if isinstance(c, Command) else c for c in cmds])
        for c in cmds:
            if isinstance(c, (tuple, list)):
                if self.inbox:
                    self.inbox.ack(c[0], str(c[1].get("cmd", "?")), self.step, False, c[2])
                continue
            cmd = Command.model_validate(c)
            try:
                result = self.apply_agreed(cmd)
                ok = True
            except REFUSED as e:
                result, ok = str(e), False
            except DivergedError as e:   # the run stops; the command's sender learns why
                if self.inbox:
                    self.inbox.ack(cmd.id, cmd.cmd, self.step, False, str(e))
                raise
            if self.inbox:
                self.inbox.ack(cmd.id, cmd.cmd, self.step, ok, result)
            if ok and cmd.cmd == "stop":
                raise StopRun("stopped_by_command")

    def apply_agreed(self, cmd: Command) -> Any:
        """`apply_command`, with one outcome on every rank of a data-parallel run: the ranks count,
        in one all-reduce, who applied it and who refused it (`REFUSED`). Applied everywhere: its
        result. Refused everywhere: each rank raises its error (one message where rank 0 read or did
        the command's part: `read_checkpoint`, `read_harness`, a checkpoint's save). An error on
        every rank that is no refusal: each raises its own, and the run ends as one process's would.
        Anything else would leave the ranks on different models: every rank raises `DivergedError`,
        and the run stops."""
        if not self.dist.enabled:
            return self.apply_command(cmd)
        try:
            out, err = self.apply_command(cmd), None
        except Exception as e:   # counted below, on every rank: none is left waiting in a collective
            out, err = None, e
        applied, refused = (int(n) for n in self.dist.sum([err is None, isinstance(err, REFUSED)]))
        if applied == self.dist.world:
            return out
        if refused == self.dist.world or applied + refused == 0:
            raise err
        raise DivergedError(f"command {cmd.cmd!r} ({cmd.id}) was applied by {applied} of {self.dist.world} ranks "
                            f"({self.dist.why_failed(err)}): the ranks would train different models, "
                            f"the run stops") from err

    def read_checkpoint(self, name: str) -> dict[str, Any]:
        """The state saved as `name`, for a rollback; data-parallel, the one rank 0 verified, which
        every rank loads by name with its hash checked (`agree_checkpoint`)."""
        return agree_checkpoint(self.ckpt, name, self.dist)

    def read_harness(self, version: str) -> HarnessSpec:
        """The harness stored as `version` under harnesses/; data-parallel, rank 0's, read and
        validated there and sent to every rank (`Dist.on_main`): no other rank reads a file."""

        def read() -> HarnessSpec:
            p = self.run_dir / "harnesses" / f"{version}.yaml"
            if not p.is_file():
                raise ValueError(f"unknown harness version {version!r} (none stored under harnesses/)")
            import yaml

            return HarnessSpec.model_validate(yaml.safe_load(p.read_text()))

        return self.dist.on_main(read)

    def apply_command(self, cmd: Command) -> Any:
        if cmd.cmd == "set_recipe":
            if not cmd.fields:
                raise ValueError("set_recipe needs non-empty 'fields'")
            self.apply_overrides({f"recipe.{k}": v for k, v in cmd.fields.items()})
            return {"recipe": {k: getattr(self.recipe, k) for k in cmd.fields}}
        if cmd.cmd == "set_fields":
            if not cmd.fields:
                raise ValueError("set_fields needs non-empty 'fields' (dotted recipe.*/harness.* keys)")
            before = (self.recipe, self.harness, self.shown)
            self.apply_overrides(dict(cmd.fields))
            try:
                self.task.check_difficulty(self.harness.curriculum.start)
            except ValueError:
                self.recipe, self.harness, self.shown = before
                raise
            return {"set": dict(cmd.fields), "harness_version": self.harness.version}
        if cmd.cmd == "set_harness":
            if cmd.harness is not None:
                spec = HarnessSpec.model_validate(cmd.harness)
            elif cmd.version:
                spec = self.read_harness(cmd.version)
            else:
                raise ValueError("set_harness needs 'version' or 'harness'")
            self.task.check_difficulty(spec.curriculum.start)
            self.harness = self.shown = spec
            self.store_harness()
            return {"harness_version": spec.version}
        if cmd.cmd == "checkpoint":   # rank 0 saves; data-parallel, every rank learns its name or why not
            rngs = self.ranks_rng()
            return {"checkpoint": self.dist.on_main(lambda: self.save(cmd.name, rngs))}
        if cmd.cmd == "rollback":
            if not cmd.name:
                raise ValueError("rollback needs 'name' (a checkpoint name)")
            st = self.read_checkpoint(cmd.name)
            before = self.segment
            self.load_state(st)
            # a new timeline: numbered past every one this run wrote (the checkpoint's own segment may
            # be older, or another run's: a backtest arm's state starts at 0)
            self.segment = max(before, self.segment) + 1
            return {"rolled_back_to": cmd.name, "step": self.step}
        if cmd.cmd == "pause":
            self.paused = True
            return {"paused": True}
        if cmd.cmd == "resume":
            self.paused = False
            return {"paused": False}
        if cmd.cmd == "stop":
            return {"stopping": True}
        raise ValueError(f"unknown command {cmd.cmd!r}")

    # ---- the loop ---------------------------------------------------------------------------
    def choose_start(self) -> tuple[ResumeChoice, dict[str, Any] | None]:
        """Where this run starts (`trainer.distributed.agree_resume`): the newest checkpoint that
        verifies, and its state; data-parallel, rank 0's choice, which every rank loads."""
        return agree_resume(self.ckpt, self.dist)

    def _start(self) -> None:
        resumed = None
        choice, st = self.choose_start()
        for name, err in choice.skipped:
            if self.log:
                self.log.event("checkpoint_corrupt", self.step, name=name, error=err)
        err = None
        try:
            if st is not None:
                self.load_state(st)
                self.segment += 1
                resumed = self.step
            elif self.cfg.fork_from:   # none of its own verifies (or it has none): where it started
                self.fork(pathlib.Path(self.cfg.fork_from))
        except Exception as e:
            if not self.dist.enabled:
                raise
            err = e   # every rank learns of it below, none waits in a collective for this one
        if self.dist.enabled:
            self.dist.agree(err, "loading the start state")
        if self.ref_state is None and (self.recipe.algorithm == "grpo" or self.recipe.kl_coef > 0):
            self.ref_state = copy.deepcopy(self.policy.model.state_dict())
        if self.log:
            redacted = self.cfg.model_copy(update={"perturbations": []})
            atomic_write_text(self.run_dir / "config.yaml", redacted.to_yaml())
            if resumed is None:  # a resumed harness was stored when set, unless a perturbation set it
                self.store_harness()
            self.log.event("resume" if resumed is not None else "start", self.step,
                           params=sum(p.numel() for p in self.params), kernels=self.backend,
                           kernels_reason=self._kernel_reason, world=self.dist.world)
            if resumed is None and not self.cfg.fork_from and self.cfg.checkpoint.interval and self.step == 0:
                self.save(INIT_CHECKPOINT)   # the untrained start: a run that never learnt restarts from it
            elif resumed is None and self.cfg.keeps_fork_init:
                self.inherit_init(pathlib.Path(self.cfg.fork_from))

    def inherit_init(self, source: pathlib.Path) -> None:
        """A run that goes on from another run's checkpoint (`fork_mode: full`: a pilot's winner, a
        warm start) keeps that run's untrained start, when it kept one, as its own `init`, with this
        run's recipe and harness (what a full fork trains with): a fix that starts over starts where
        the weights started, not from the checkpoint it went on from. The source's `init` must sit
        beside the checkpoint: a job with run storage fetches it there with the checkpoint
        (`trainer.run_storage.fetch_checkpoint`)."""
        if not self.dist.is_main or not (source.parent / f"{INIT_CHECKPOINT}.pt").is_file():
            return
        try:
            st = CheckpointManager(source.parent).load(INIT_CHECKPOINT)
        except CheckpointError as e:   # the run goes on without one: a fix that starts over has no untrained start
            self.log.event("checkpoint_corrupt", self.step, name=INIT_CHECKPOINT, error=str(e),
                           inherited_from=str(source.parent))
            return
        harness = self.cfg.harness.model_dump(mode="json")
        st.update(recipe=self.cfg.recipe.model_dump(mode="json"), harness=harness, shown=harness, faults={})
        self.ckpt.save(st, int(st["step"]), INIT_CHECKPOINT)
        self.log.event("checkpoint", self.step, name=INIT_CHECKPOINT, inherited_from=str(source.parent))
        self.save(None)   # the newest checkpoint is where this run starts: a restart resumes there, not at `init`

    def fork(self, path: pathlib.Path) -> None:
        """Start from another run's checkpoint (`fork_mode`): the basis of backtests and warm starts."""
        if not path.is_file():
            raise ConfigError(f"fork_from={str(path)!r}: checkpoint file not found")
        try:
            st = CheckpointManager(path.parent).load(path.stem)
        except CheckpointError as e:
            raise ConfigError(f"fork_from={str(path)!r}: {e}") from None
        try:
            if self.cfg.fork_mode == "weights":
                self.policy.model.load_state_dict(st["model"])
            else:
                self.load_state(st)
        except (RuntimeError, KeyError, ValueError) as e:   # another model's weights, or not a trainer state
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"fork_from={str(path)!r}: the checkpoint does not fit this run's model "
                              f"(model.* fields differ from the run it was saved by): {first[:300]}") from None
        if self.cfg.fork_mode != "weights":
            if self.cfg.fork_mode == "full":
                self.recipe = self.cfg.recipe.model_copy(deep=True)
                self.harness = self.shown = self.cfg.harness.model_copy(deep=True)
            if self.cfg.fork_mode == "state":   # the forked run's data faults go on in the fork (backtests)
                self.perturber.inherit(st.get("faults") or {})
                self.perturber.read_source(path)
            # this run's seed picks its own sampling stream and data (same seed → same stream)
            self.gen.manual_seed(self.cfg.seed * 1000 + 17 + self.dist.rank)
            self.cursor += self.cfg.seed * 1_000_003
            self.segment = 0
        if self.cfg.fork_overrides:
            self.apply_overrides(self.cfg.fork_overrides, silent=True)

    def run(self, until: int | None = None) -> dict[str, Any]:
        """Train to `recipe.steps`, or to `stop_step` when set (the schedule still over `recipe.steps`,
        its last lr held beyond it), or stop early at step `until` (tests). Returns a summary."""
        self._start()
        status = "completed"
        t_start = time.time()
        try:
            while True:
                self.handle_commands()
                while self.paused:
                    if self.log:
                        self.log.heartbeat(self.step, "paused")
                    time.sleep(0.2)
                    self.handle_commands()
                end = self.recipe.steps if self.cfg.stop_step is None else self.cfg.stop_step   # past recipe.steps
                if self.step >= end or (until is not None and self.step >= until):               # the lr holds its last
                    break
                self.perturber.before_step(self.step, self)
                self.train_one_step()
                if self.reached_target:
                    status = "target_reached"
                    break
        except StopRun as e:
            status = e.status
        except Exception as e:
            # the job dies of it, and why is evidence: an allocator's message names the memory, a
            # data error the example (the operators read it; a restart that meets it again fails again)
            if self.dist.is_main and self.log:
                self.log.event("error", self.step, error=type(e).__name__, message=str(e)[:ERROR_CHARS])
                self.log.heartbeat(self.step, "failed")
            raise
        # every rank evaluates its shard of the held-out split: the run's final numbers are over all of it
        final = (self.dist.mean_dict(self.evaluate())
                 if status in ("completed", "stopped_by_command", "target_reached") and self.recipe.steps else {})
        last = until is None or status != "completed"
        rngs = self.ranks_rng() if last else None
        if self.dist.is_main:
            if last:
                self.save(None, rngs)
            if final:
                self.log.metrics.write({"step": self.step, "segment": self.segment, "time": time.time(), "final": True, **final})
            self.log.event("end", self.step, status=status, wall_s=time.time() - t_start, **final)
            self.log.heartbeat(self.step, status)
        summary = {"status": status, "step": self.step, "run_dir": str(self.run_dir), **final}
        self.close()
        return summary

    def algorithm_now(self) -> str:
        """The algorithm of the next update: SFT during `recipe.sft_warmup_steps`, then `recipe.algorithm`."""
        return "sft" if self.step < self.recipe.sft_warmup_steps else self.recipe.algorithm

    def train_one_step(self) -> None:
        t0 = time.perf_counter()
        examples = self.next_examples()
        t_data = time.perf_counter() - t0     # waiting on the data pipeline: an input-bound step shows here
        self.perturber.slow_compute()
        algo = self.algorithm_now()
        if algo != "sft" and self.step == self.recipe.sft_warmup_steps > 0 and self.recipe.kl_coef > 0:
            # the KL reference is the policy the warm-up produced, not the random start
            self.ref_state, self.ref_policy = copy.deepcopy(self.policy.model.state_dict()), None
        stats = STEPS[algo](self, examples)
        stats["t_data"] = t_data
        # what the step was fed, as a trainer logs its input lengths: a data stream that changes shows
        # here on every step, where the sampled questions cover only the newest few hundred
        stats["question_chars"] = sum(len(e.question) for e in examples) / max(1, len(examples))
        # every rank, not only the one that logs: mean_dict below needs the same keys on all ranks
        if algo == "sft" and self.cfg.samples_per_step:
            t1 = time.perf_counter()
            rolls = rollout(self.policy, self.task, self.harness, examples[: self.cfg.samples_per_step], 1,
                            None, greedy=True)
            self.log_samples(rolls)
            stats.update(summarize(rolls))
            stats["t_generate"] = time.perf_counter() - t1
        # the slowest rank's wait for data: every rank waits for it at the all-reduce
        slowest = self.dist.max([t_data])[0]
        stats = {**self.dist.mean_dict({k: float(v) for k, v in stats.items()}), "t_data": slowest}
        self.step += 1
        row: dict[str, Any] = {"step": self.step, "segment": self.segment, "time": time.time(),
                               "lr": self.lr_at(self.step - 1), "difficulty": self.harness.curriculum.difficulty_at(self.step - 1),
                               "harness_version": self.harness.version, "recipe_version": self.recipe.version,
                               "algorithm": algo, **stats}
        if self.recipe.eval_interval and self.step % self.recipe.eval_interval == 0:
            ev = self.dist.mean_dict(self.evaluate())
            self.last_eval = ev
            row.update(ev)
            target = self.recipe.stop_at_heldout
            if target is not None and ev["heldout_acc"] >= target:
                self.reached_target = True
        dt = time.perf_counter() - t0
        row["step_time"] = dt
        row["tokens_per_s"] = stats.get("tokens", 0.0) * self.dist.world / max(dt, 1e-9)
        due = bool(self.cfg.checkpoint.interval) and self.step % self.cfg.checkpoint.interval == 0
        rngs = self.ranks_rng() if due else None
        if self.dist.is_main:
            self.log.metrics.write(row)
            now = time.monotonic()
            # a file rewrite per step cost ~1% of a small step. The monotonic clock counts from an
            # arbitrary point (boot, on Linux), so "never written" is None, not 0.0: a machine up
            # for less than HEARTBEAT_EVERY_S would otherwise throttle the first heartbeat
            if self._beat_at is None or now - self._beat_at >= HEARTBEAT_EVERY_S:
                self.log.heartbeat(self.step, "running")
                self._beat_at = now
            if due:
                self.save(None, rngs)
        if self.on_step:
            self.on_step(row)

    def close(self) -> None:
        if self.inbox:
            self.inbox.close()
        if self.log:
            self.log.close()
