"""The pilot: a few short runs over model size × learning rate, within a stated share of the goal's
CPU budget, whose winner starts the run (issue 32, source `pilot` of swarm/plan.py).

    from swarm.pilot import pilot, piloted_plan
    result = pilot(goal, share=0.15, work_dir=DIR)        # runs the trainer; a PilotResult (data)
    plan = piloted_plan(goal.plan(), result, goal.run)    # the winner's fields and checkpoint, source `pilot`
    swarm plan GOAL --pilot [--pilot-share 0.15] [--pilot-dir DIR]   # the same from the command line

Successive halving (Jamieson & Talwalkar 2016; ASHA without the asynchrony) over this project's own
trainer. Every candidate trains `base_steps` steps (rung 0) and is scored on the held-out split at
the rung's end; the better half (`n // 2`, at least one) goes on from its
checkpoint to twice the steps (rung 1: 2·base_steps, rung 2: 4·base_steps, …) until one candidate
remains, one reaches the target, or the CPU budget is spent. With a held-out accuracy target the
plan's own values go first, to rung 1, and win without a search (stop `on_course`) when their curve
reaches the target for less CPU than the other candidates' runs are expected to cost. The search (`next_rung(results,
schedule) -> Promote | Stop`), its ranking and the prediction of the winner's cost are pure
functions of the recorded rung results, in swarm/pilot_search.py (its docstring states the ranking:
predicted cost to the target, then what was measured beyond its noise, then the plan's prior);
`pilot` is the I/O that runs what it says and records what came out.

Candidates: model sizes around the plan's (d_model/2 with one layer fewer, the plan's, d_model·1.5
with one layer more) × learning rates around the plan's (lr/3, lr, lr·3). A field the goal writes
is never varied (its value is every candidate's) and never chosen by the pilot; `piloted_plan`
applied to another goal's plan leaves a written field the goal's, whatever the winner's value.
The prior (the order in which results no measurement tells apart are ranked) puts the plan's own
values first, then the candidates one axis away from them (the model size, or the lr), then two,
in the candidates' order.

Budget: `share` (default 0.15) of `budget.worker_cpu_s`. A run is started only while the recorded
CPU is under it and the run's estimated cost (the candidate's own CPU per step so far, or at rung 0
the mean cost of the rung-0 runs so far) does not take it past it; so the pilot passes its share by
at most one run's misestimate, and when a run's estimate is unknown (the first run), by that run.
`base_steps` defaults to the same share of `budget.steps` spread over the whole schedule (every
rung of every candidate), at least MIN_BASE_STEPS; the CPU share is the cap that stops it early.

CPU: the runs are in this process, one after another, with one torch thread (`threads: 1`), and
each run's cost is the process CPU time (`time.process_time`) across it: the trainer's build, its
steps, its checkpoints and its end-of-rung evaluation (the process's first run also carries its
first-use costs: 1.2 to 1.4 CPU-s measured here). Why not a subprocess per run: a process pays
about 1.8 CPU-s to start Python and import torch and the trainer (measured here), which on rungs
of a few seconds would be most of the pilot's budget and would measure the start-up rather than
the candidates; with one thread the process CPU of a run is that run's (nothing else in the
process computes meanwhile). The total
(`cpu_s`) is the process CPU over the whole pilot, gaps included. CPU per step at one thread is
what the prediction extrapolates: a run with more threads spends more CPU per step (less wall).

The lr schedule of every pilot run is the live run's (`recipe.steps` = `budget.steps`, warm-up and
decay as planned), read at the pilot's steps: a rung goes on where the last stopped, and the
winner's checkpoint is exactly the start of the run that goes on from it.

Resumable: with `work_dir`, each finished run is appended to WORK_DIR/pilot.jsonl and a pilot
started again with the same schedule skips what is recorded (the trainers resume from their
checkpoints); the CPU of a run killed before it finished is not recorded.

The winner's checkpoint starts the run: the pilot keeps each candidate's last checkpoint (its runs
checkpoint every `base_steps`, the newest kept) and records the winner's (`PilotResult.checkpoint`,
absolute; None when the pilot ran in a temporary folder) with the PILOT_FIELDS values it trained.
`piloted_plan` then chooses `fork_from: <that .pt>` and `fork_mode: full` (source `pilot`): the
trainer (trainer/loop.py `Trainer.fork`) loads the weights, the optimiser state (Adam's moments),
the step count, the data cursor and the RNG from it, and takes recipe and harness from the run's
own config — continuing, not fine-tuning: the run's lr schedule is read at the winner's step, and
the winner's steps count toward the run's `recipe.steps` (= `budget.steps`), so they are not
trained again. A checkpoint that is missing, corrupt or of another model is one ConfigError naming
`fork_from`. The checkpoint is not used, and the plan says why in a note (`start_refused`), when
the plan does not train (`run.task` written), the goal writes `fork_from` or `fork_mode`, or a
PILOT_FIELDS value the run trains differs from the winner's (a user-written size or lr wins).
A run that goes on from the pilot keeps the winner's untrained start as its `init` checkpoint
(trainer/loop.py `Trainer.inherit_init`; with run storage too), so a fix that starts over starts
from untrained weights.

Before a run (`swarm run`, the controller's plan node: `plan_run`): a goal whose plan fills the
model size or the lr (its task comes from the words, it does not write all of PILOT_FIELDS) gets
the pilot unless its `pilot.enabled` is false or `--no-pilot` is given, or its memory holds a
past plan on the same task that reached its target (swarm/plan_memory.py: that plan's fields, no
pilot). Its folder is the run's `.swarm/pilot/`, so a `swarm run` killed during the pilot resumes
it (`swarm resume`); each
finished pilot run is a timeline row `pilot_run` (the live view's progress); the plan with the
winner's fields is recorded in `.swarm/plan.json` and the goal adopts it (`Goal.adopt`), so the
live run, its restarts and every later reading of the goal's start config train the winner. The
pilot's CPU is one entry (`pilot`) of the run's worker-CPU meter, so `budget.worker_cpu_s` pays for
it; of its steps, the winner's count in `budget.steps` (the live run goes on from them), the other
candidates' do not. The live run's own checkpoints come first when it restarts (a resumed
controller, a relaunched job); backtests fork the live run's checkpoints and drop `fork_from`
(swarm/backtest.py).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import pathlib
import re
import statistics
import tempfile
import time
from typing import Any, Callable, Iterable

from sandboxes.errors import SwarmlabError
from swarm.pilot_search import LOSS_TAIL, Prediction, Promote, RungResult, Schedule, Stop, next_rung, predict

DEFAULT_SHARE = 0.15
MIN_BASE_STEPS = 10
EVAL_SIZE = 100               # held-out examples at each rung's end
PILOT_FIELDS = ("model.d_model", "model.n_layers", "recipe.lr")
AXES = (("model.d_model", "model.n_layers"), ("recipe.lr",))   # what the prior counts a candidate's distance in


class PilotError(SwarmlabError, ValueError):
    """A pilot that cannot run: bad share, no candidates, a candidate the trainer refuses."""


# ---- records ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One point of the search: the dotted run fields it sets (PILOT_FIELDS the goal leaves out)."""

    name: str
    fields: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "fields": dict(self.fields)}


@dataclasses.dataclass(frozen=True)
class PilotResult:
    """The pilot as data: the table of candidates × rungs, the winner, what it cost and predicts."""

    candidates: tuple[Candidate, ...]
    results: tuple[RungResult, ...]
    winner: Candidate
    stop: Stop
    base_steps: int
    budget_cpu_s: float          # share × budget.worker_cpu_s
    share: float                 # the share asked for
    cpu_s: float                 # process CPU over the whole pilot (the runs and the gaps between them)
    worker_cpu_s: float          # the goal's budget.worker_cpu_s
    prediction: Prediction
    checkpoint: str | None = None   # the winner's last checkpoint (.pt; None: the pilot's folder was temporary)
    trained: dict[str, Any] = dataclasses.field(default_factory=dict)   # PILOT_FIELDS as the winner trained them

    @property
    def spent_share(self) -> float:
        """The pilot's CPU as a share of the goal's worker-CPU budget."""
        return self.cpu_s / self.worker_cpu_s

    def table(self) -> list[list[str]]:
        """Rows: candidate, its fields, then per rung `steps: held-out / loss±its standard error / CPU-s`."""
        rows = []
        for c in self.candidates:
            own = sorted((r for r in self.results if r.candidate == c.name), key=lambda r: r.rung)
            cells = [f"{r.steps}: {r.heldout:.3f} / {r.loss:.3f}{f'±{r.loss_se:.3f}' if math.isfinite(r.loss_se) else ''}"
                     f" / {r.cpu_s:.1f}s" for r in own]
            mark = "*" if c.name == self.winner.name else " "
            rows.append([mark + c.name, *cells])
        return rows

    def lines(self) -> list[str]:
        head = (f"pilot: {len(self.candidates)} candidates, rungs of {self.base_steps}·2^k steps; "
                f"{self.cpu_s:.1f} CPU-s spent of {self.budget_cpu_s:.1f} ({self.spent_share:.1%} of "
                f"budget.worker_cpu_s={self.worker_cpu_s:g}; share {self.share:g})")
        out = [head, "  candidate  steps: held-out / loss / CPU-s, per rung"]
        out += ["  " + "  ".join(row) for row in self.table()]
        out.append(f"  winner: {self.winner.name} ({self.stop.why})")
        out.append("  " + self.prediction.line())
        return out

    def to_json(self) -> dict[str, Any]:
        return {"candidates": [c.to_json() for c in self.candidates], "results": [r.to_json() for r in self.results],
                "winner": self.winner.to_json(), "stop": dataclasses.asdict(self.stop), "base_steps": self.base_steps,
                "budget_cpu_s": self.budget_cpu_s, "share": self.share, "cpu_s": self.cpu_s,
                "worker_cpu_s": self.worker_cpu_s, "spent_share": self.spent_share,
                "prediction": dataclasses.asdict(self.prediction), "checkpoint": self.checkpoint,
                "trained": dict(self.trained)}


# ---- the candidates ---------------------------------------------------------------------------


def candidates_for(run: dict[str, Any], written: Callable[[str], bool], *,
                   sizes: Iterable[tuple[int, int]] | None = None,
                   lrs: Iterable[float] | None = None) -> tuple[Candidate, ...]:
    """Model sizes × learning rates around `run`'s (the planned run dict), leaving out every field
    `written` says the goal writes. `sizes` ((d_model, n_layers) pairs) and `lrs` replace the
    defaults (module docstring)."""
    d, layers, heads = run["model"]["d_model"], run["model"]["n_layers"], run["model"]["n_heads"]
    lr = run["recipe"]["lr"]
    if sizes is None:
        step = 2 * heads   # d_model divisible by n_heads, with an even head dim (rotary)
        up = int(math.ceil(d * 1.5 / step) * step)
        sizes = [(max(step, d // 2 // step * step), max(1, layers - 1)), (d, layers), (up, layers + 1)]
    if lrs is None:
        lrs = [lr / 3, lr, lr * 3]
    out: dict[str, Candidate] = {}
    for dm, nl in sizes:
        for x in lrs:
            fields = {"model.d_model": int(dm), "model.n_layers": int(nl), "recipe.lr": _rounded(float(x))}
            fields = {k: v for k, v in fields.items() if not written(k)}
            name = "-".join(_label(k, v) for k, v in fields.items()) or "as-written"
            out.setdefault(name, Candidate(name, fields))   # a written field collapses its axis
    return tuple(out.values())


def prior_order(cands: Iterable[Candidate], run: dict[str, Any]) -> tuple[str, ...]:
    """The candidates' names, those with `run`'s own values (the plan's) first, then one axis away
    from them (the model size, d_model with n_layers; the lr), then two; the candidates' order
    within each."""
    from trainer.config import get_dotted

    def away(c: Candidate) -> int:
        moved = {f for f, v in c.fields.items() if _rounded(get_dotted(run, f)[1]) != v}
        return sum(bool(moved & set(axis)) for axis in AXES)
    return tuple(c.name for c in sorted(cands, key=away))


def _rounded(x: Any) -> Any:
    """A candidate's value as `candidates_for` writes it (a float to 3 significant digits)."""
    return float(f"{x:.3g}") if isinstance(x, float) else x


def _label(field: str, value: Any) -> str:
    short = {"model.d_model": "d", "model.n_layers": "L", "recipe.lr": "lr"}[field]
    return f"{short}{value:.2g}" if isinstance(value, float) else f"{short}{value}"


# ---- the I/O ----------------------------------------------------------------------------------


def pilot(goal: Any, share: float = DEFAULT_SHARE, *, base_steps: int | None = None,
          sizes: Iterable[tuple[int, int]] | None = None, lrs: Iterable[float] | None = None,
          eval_size: int = EVAL_SIZE, work_dir: str | pathlib.Path | None = None,
          on_result: Callable[[RungResult, float], None] | None = None) -> PilotResult:
    """Run the pilot for `goal` (a swarm.goal.Goal on this project's trainer) within `share` of its
    `budget.worker_cpu_s`. `on_result(result, cpu_spent)` is called after every run (live progress).
    `work_dir`: where the runs and the record go (kept; a pilot started again there resumes); None:
    a temporary folder, removed at the end."""
    from trainer.config import ConfigError, RunConfig, get_dotted, put_dotted

    if not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise PilotError(f"pilot share={share!r}: must be in (0, 1], a share of budget.worker_cpu_s")
    if goal.entrypoint is not None:
        raise PilotError("pilot: this goal runs a script (run.entrypoint); the pilot runs this project's trainer")
    if not 1 <= eval_size <= 100_000:
        raise PilotError(f"pilot eval_size={eval_size!r}: must be in [1, 100000]")
    base = goal.run_config("pilot", "runs").model_dump(mode="json")
    if base["model"]["kind"] != "builtin":
        raise PilotError(f"pilot: model.kind={base['model']['kind']!r}: the pilot sizes the built-in model only")
    cands = candidates_for(base, lambda f: get_dotted(goal.run, f)[0], sizes=sizes, lrs=lrs)
    worker = float(goal.budget.worker_cpu_s)
    budget = share * worker
    t = goal.target
    on_acc = t.metric == "heldout_acc" and t.op in (">=", ">")
    probe = Schedule(tuple(c.name for c in cands), 1, budget, threshold=t.threshold if on_acc else None,
                     strict=t.op == ">", eval_size=eval_size, prior=prior_order(cands, base))
    if base_steps is None:
        base_steps = max(MIN_BASE_STEPS, int(share * goal.budget.steps) // probe.step_units())
    if not isinstance(base_steps, int) or base_steps < 1:
        raise PilotError(f"pilot base_steps={base_steps!r}: must be a positive whole number")
    schedule = dataclasses.replace(probe, base_steps=base_steps)
    # the live run's own lr schedule (the controller trains recipe.steps = budget.steps): a rung goes
    # on where the last stopped, and the winner's checkpoint is the start of the run it starts, whose
    # lr goes on from the pilot's (a schedule over the pilot's few steps would anneal each candidate
    # at its last rung, and the run would jump back to the peak lr: measured on sort, held-out 0.84
    # at the pilot's step 168, 0.70 at the run's first evaluation after it)
    lr_steps = max(schedule.steps(schedule.rungs() - 1), int(goal.budget.steps))
    by_name = {c.name: c for c in cands}

    def config(c: Candidate, out_dir: str) -> RunConfig:
        data = copy.deepcopy(base)
        for k, v in c.fields.items():
            put_dotted(data, k, v)
        data.update(name=re.sub(r"[^A-Za-z0-9_.-]", "_", c.name), out_dir=out_dir, threads=1, samples_per_step=0,
                    perturbations=[], checkpoint={"interval": base_steps, "keep_last": 1})
        data["recipe"].update(steps=lr_steps, eval_interval=0, eval_size=eval_size, stop_at_heldout=None)
        try:
            return RunConfig.parse(data)
        except ConfigError as e:
            raise PilotError(f"pilot candidate {c.name}: {e}") from None

    tmp = tempfile.TemporaryDirectory(prefix="swarm-pilot-") if work_dir is None else None
    root = pathlib.Path(tmp.name if tmp else work_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        for c in cands:
            config(c, str(root))   # every candidate validated before any compute
        record = root / "pilot.jsonl"
        # the prior follows from the candidates and the base config, eval_size is a key of its own
        sched = {k: v for k, v in dataclasses.asdict(schedule).items() if k not in ("prior", "eval_size")}
        key = {"schedule": sched, "candidates": [c.to_json() for c in cands],
               "eval_size": eval_size, "base": base, "lr_steps": lr_steps}
        results = _read_record(record, key)
        spent0 = math.fsum(r.cpu_s for r in results)
        c_start = time.process_time()
        import torch

        threads = torch.get_num_threads()
        try:
            while True:
                step = next_rung(results, schedule)
                if isinstance(step, Stop):
                    break
                res = _run(config(by_name[step.candidate], str(root)), step, schedule)
                results.append(res)
                with open(record, "a") as f:
                    f.write(json.dumps(res.to_json()) + "\n")
                if on_result is not None:
                    on_result(res, spent0 + time.process_time() - c_start)
        finally:
            torch.set_num_threads(threads)   # the trainer set one thread for the whole process
        cpu = spent0 + time.process_time() - c_start
        assert step.winner is not None, "a pilot with a positive budget runs at least once"
        wcfg = config(by_name[step.winner], str(root))
        last = max((r for r in results if r.candidate == step.winner), key=lambda r: r.steps)
        ckpt = None if tmp is not None else _checkpoint_at(wcfg.run_dir / "checkpoints", last.steps)
        trained = {f: get_dotted(wcfg.model_dump(mode="json"), f)[1] for f in PILOT_FIELDS}
    finally:
        if tmp is not None:
            tmp.cleanup()
    if on_acc:
        pred = predict(results, step.winner, t.threshold, strict=t.op == ">", eval_size=eval_size)
    else:
        pred = Prediction(None, None, None, "", f"the target is {t.metric} {t.op} {t.threshold:g}; the pilot "
                          "extrapolates held-out accuracy toward a >= target only")
    return PilotResult(cands, tuple(results), by_name[step.winner], step, base_steps, budget, float(share), cpu,
                       worker, pred, ckpt, trained)


def _checkpoint_at(ckpt_dir: pathlib.Path, steps: int) -> str | None:
    """The absolute path of the periodic checkpoint at `steps` in `ckpt_dir`, None when there is none."""
    from trainer.checkpoint import CheckpointManager

    if not ckpt_dir.is_dir():
        return None
    for m in reversed(CheckpointManager(ckpt_dir).manifests()):
        if m.get("kind") == "periodic" and int(m.get("step", -1)) == steps and (ckpt_dir / f"{m['name']}.pt").is_file():
            return str((ckpt_dir / f"{m['name']}.pt").resolve())
    return None


def _read_record(path: pathlib.Path, key: dict[str, Any]) -> list[RungResult]:
    """The results recorded by an earlier pilot with the same schedule in this folder (first line:
    the schedule); a folder with another schedule's record is refused, not mixed."""
    head = json.dumps(key, sort_keys=True, default=str)
    if not path.exists():
        path.write_text(head + "\n")
        return []
    lines = path.read_text().splitlines()
    if not lines or lines[0] != head:
        raise PilotError(f"pilot work_dir {str(path.parent)!r} holds another pilot's record (other candidates, "
                         "steps or goal); use another folder")
    out = []
    for line in lines[1:]:
        try:
            out.append(RungResult.from_json(json.loads(line)))
        except (ValueError, KeyError, TypeError):
            continue   # a torn last line of a killed pilot: that run is run again
    return out


def _run(cfg: Any, step: Promote, schedule: Schedule) -> RungResult:
    """Train `cfg` to `step.steps` (from its checkpoint at the last rung's end), in this process."""
    from trainer.loop import Trainer
    from trainer.runlog import read_jsonl

    c0 = time.process_time()
    summary = Trainer(cfg).run(until=step.steps)
    cpu = time.process_time() - c0
    start = schedule.steps(step.rung - 1) if step.rung else 0
    rows = [r for r in read_jsonl(cfg.run_dir / "metrics.jsonl")
            if not r.get("final") and start < int(r.get("step", 0)) <= step.steps and "loss" in r]
    losses = [float(r["loss"]) for r in rows[-LOSS_TAIL:] if isinstance(r["loss"], (int, float))]
    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    loss = math.fsum(losses) / len(losses) if finite else math.nan
    se = statistics.stdev(losses) / math.sqrt(len(losses)) if finite and len(losses) > 1 else math.nan
    return RungResult(step.candidate, step.rung, int(summary.get("step", step.steps)),
                      float(summary.get("heldout_acc", 0.0)), loss, cpu, str(summary.get("status", "")), se)


def piloted_plan(plan: Any, result: PilotResult, run: dict[str, Any] | None = None) -> Any:
    """`plan` (swarm.plan.Plan) with the winner's fields chosen, source `pilot`, and the winner's last
    checkpoint as the run's start (`fork_from`, `fork_mode: full`) when `start_refused` says nothing
    against it. A field the goal writes stays the goal's: a winner's value for it is left out (the
    pilot never varies a field its own goal writes; this is a plan for another goal's pilot). `run`:
    the goal's run as written (a `fork_from` or `fork_mode` written there keeps the checkpoint out)."""
    from swarm.plan import Choice, Source

    w = result.winner
    mine = [r for r in result.results if r.candidate == w.name]
    last = max(mine, key=lambda r: r.steps)
    evidence = {"candidates": len(result.candidates), "rungs": 1 + max(r.rung for r in result.results),
                "winner": w.name, "steps": last.steps, "heldout_acc": last.heldout, "pilot_cpu_s": round(result.cpu_s, 2)}
    for field, value in w.fields.items():
        if _user(plan, field):
            continue   # start_refused names it when the value differs
        plan = plan.choose(Choice(field, value, Source.PILOT, f"won the pilot ({result.stop.why})", evidence))
    if not _user(plan, "threads"):
        # the pilot measured CPU per step at one thread, and its prediction extrapolates that; a run
        # with every core's threads spends more CPU per step on a model this size (and shares the
        # cores with its backtest arms)
        plan = plan.choose(Choice("threads", 1, Source.PILOT, "the pilot's runs and its prediction are at one torch thread",
                                  {"pilot_cpu_s": round(result.cpu_s, 2)}))
    refused = start_refused(plan, result, run)
    if refused is None:
        ev = {"winner": w.name, "steps": last.steps, "heldout_acc": last.heldout}
        plan = plan.choose(Choice("fork_from", result.checkpoint, Source.PILOT,
                                  f"the pilot's winner ({w.name}) trained {last.steps} steps: the run goes on from its "
                                  "last checkpoint, and those steps count toward it", ev))
        plan = plan.choose(Choice("fork_mode", "full", Source.PILOT, "weights, optimiser state, step count and data "
                                  "cursor from the checkpoint; recipe and harness from the run's config", ev))
    elif plan.applied:
        plan = dataclasses.replace(plan, notes=plan.notes + (f"the run starts from scratch, not from the pilot's "
                                                             f"winner: {refused}",))
    if not plan.applied:
        plan = dataclasses.replace(plan, notes=plan.notes + (
            "run.task is written: the pilot's winner is recorded, the run trains as written",))
    return plan


def start_refused(plan: Any, result: PilotResult, run: dict[str, Any] | None = None) -> str | None:
    """Why the run of `plan` does not start from the pilot winner's checkpoint; None when it does: the
    plan trains (the task comes from the words), the checkpoint was kept, the goal writes no
    `fork_from`/`fork_mode`, and every PILOT_FIELDS value the plan trains is the one the winner
    trained (a user-written size or lr that differs wins, and the checkpoint does not fit it)."""
    from trainer.config import get_dotted

    if not plan.applied:
        return "run.task is written: the run trains as written"
    if result.checkpoint is None:
        return "the pilot's runs were in a temporary folder (keep them: `swarm plan --pilot-dir`, or `swarm run`)"
    for field in ("fork_from", "fork_mode"):
        if run is not None and get_dotted(run, field)[0]:
            return f"the goal writes {field}"
    for field, value in result.trained.items():
        try:
            have = plan.get(field)
        except KeyError:
            continue
        if have.value != value:
            return (f"{field}={have.value!r} ({have.source.value}) differs from the {value!r} the winner trained "
                    f"({result.winner.name})")
    return None


def _user(plan: Any, field: str) -> bool:
    from swarm.plan import Source

    try:
        return plan.get(field).source is Source.USER
    except KeyError:
        return False


# ---- the pilot before a run (the controller's plan node) ---------------------------------------

PLAN_RECORD = "plan.json"   # in the run's .swarm/: the plan it trains, the pilot's result (or why none)
PILOT_DIR = "pilot"         # in the run's .swarm/: the pilot's runs and record


def plan_sizes(goal: Any) -> str | None:
    """Why the plan of `goal` chooses no model size or lr (PILOT_FIELDS); None when it does."""
    from trainer.config import get_dotted

    if goal.entrypoint is not None:
        return "the goal runs a script (run.entrypoint)"
    plan = goal.plan()
    if plan is None or not plan.applied:
        return "run.task is written: the run trains as written"
    if all(get_dotted(goal.run, f)[0] for f in PILOT_FIELDS):
        return f"the goal writes {', '.join(PILOT_FIELDS)}"
    if goal.run_config("pilot", "runs").model.kind != "builtin":
        return "the pilot sizes the built-in model only"
    return None


def pilot_skipped(goal: Any) -> str | None:
    """Why `goal` gets no pilot before its run; None when it gets one."""
    return plan_sizes(goal) or (None if goal.pilot.enabled else "pilot.enabled is false (or --no-pilot)")


def read_record(sdir: str | pathlib.Path) -> dict[str, Any] | None:
    """The plan record of the run whose state folder is `sdir`, None before it is made."""
    p = pathlib.Path(sdir) / PLAN_RECORD
    return json.loads(p.read_text()) if p.is_file() else None


def adopt_recorded(goal: Any, sdir: str | pathlib.Path) -> dict[str, Any] | None:
    """After a controller restart: the goal adopts the plan its run recorded (the pilot's winner)."""
    from swarm.plan import Plan

    rec = read_record(sdir)
    if rec is not None and rec.get("plan") is not None:
        goal.adopt(Plan.from_json(rec["plan"]))
    return rec


def plan_run(goal: Any, sdir: str | pathlib.Path, log: Callable[..., Any],
             recall: Callable[[Any], Any] | None = None) -> dict[str, Any] | None:
    """The plan a run starts from, made once and recorded in `sdir`/PLAN_RECORD: the goal's plan
    with the model size and lr of a past run on the same task that reached its target when
    `recall(goal)` finds one (swarm/plan_memory.py; no pilot then), else with the pilot's winner when
    `pilot_skipped` says nothing against it. The pilot runs in `sdir`/PILOT_DIR (a record there is
    resumed); `log(kind, **data)` gets a `plan_from_memory` row, or a `pilot_started` row, a
    `pilot_run` row per finished run and a `pilot_done` row. The goal adopts the plan. None for a
    goal with no plan (a script)."""
    from trainer.runlog import atomic_write_text

    rec = adopt_recorded(goal, sdir)
    if rec is not None:
        return rec
    plan = goal.plan() if goal.entrypoint is None else None
    if plan is None:
        return None
    why_not = pilot_skipped(goal)
    # memory costs no CPU: it is read with the pilot on or off (a goal's memory settings turn it off)
    hit = recall(goal) if recall is not None and plan_sizes(goal) is None else None
    if hit is not None:
        from trainer.config import ConfigError, RunConfig

        try:   # a past size the trainer refuses with this goal's own fields (e.g. its n_heads): not used
            RunConfig.parse({**hit.choose(plan, goal).run(goal.run), "name": "check", "out_dir": "/tmp"})
        except ConfigError as e:
            log("plan_memory_refused", workspace=hit.workspace, fields=hit.fields, reason=str(e))
            hit = None
    if hit is not None:
        plan = hit.choose(plan, goal)
        why_not = f"memory: a past run on the same task reached its target with {json.dumps(hit.fields)} ({hit.workspace})"
        log("plan_from_memory", workspace=hit.workspace, goal=hit.goal, fields=hit.fields, distance=round(hit.distance, 4),
            worker_cpu_s_to_target=hit.worker_cpu_s_to_target)
    result = None
    if why_not is None:
        share = goal.pilot.share
        budget = share * goal.budget.worker_cpu_s
        log("pilot_started", share=share, budget_cpu_s=round(budget, 2))

        def progress(r: RungResult, spent: float) -> None:
            log("pilot_run", candidate=r.candidate, rung=r.rung, steps=r.steps, heldout=round(r.heldout, 4),
                loss=round(r.loss, 4) if math.isfinite(r.loss) else None, cpu_s=round(r.cpu_s, 2),
                spent_cpu_s=round(spent, 2), budget_cpu_s=round(budget, 2))

        result = pilot(goal, share, work_dir=pathlib.Path(sdir) / PILOT_DIR, on_result=progress)
        plan = piloted_plan(plan, result, goal.run)
        log("pilot_done", winner=result.winner.name, fields=result.winner.fields, cpu_s=round(result.cpu_s, 2),
            runs=len(result.results), prediction=result.prediction.line(),
            start=result.checkpoint if start_refused(plan, result, goal.run) is None else None)
    rec = {"plan": plan.to_json(), "pilot": result.to_json() if result else None, "pilot_skipped": why_not}
    atomic_write_text(pathlib.Path(sdir) / PLAN_RECORD, json.dumps(rec, indent=1, default=str))
    goal.adopt(plan)
    return rec


def pilot_cpu(rec: dict[str, Any] | None) -> dict[str, float]:
    """The run's worker-CPU meter entry of its pilot ({} without one)."""
    p = (rec or {}).get("pilot")
    return {"pilot": float(p["cpu_s"])} if p else {}


def steps_to_target(rows: list[dict[str, Any]], target: Any) -> int | None:
    """The step of the first metrics row at the target (an evaluation; else the final row), None if none."""
    for final in (False, True):
        step = next((r.get("step") for r in rows if bool(r.get("final")) == final and target.met(r.get(target.metric))), None)
        if step is not None:
            return int(step)
    return None


def prediction_vs_outcome(rec: dict[str, Any] | None, rows: list[dict[str, Any]], target: Any,
                          cpu_to_target: float | None, live_cpu_per_step: float | None = None) -> dict[str, Any] | None:
    """The pilot's prediction beside what the run did: steps to the target (the first metrics row
    that meets it) and worker CPU-s to the target (`cpu_to_target`: the run's meter when the
    controller first saw the target met) less the pilot's own, as the prediction is for the run
    after it. The pilot's runs cost far less per step than the live job (one thread, no samples
    written), so its predicted steps are also priced at the live job's own CPU per step
    (`live_cpu_per_step`, measured over the run). None for a run without a pilot."""
    p = (rec or {}).get("pilot")
    if not p:
        return None
    pred = p.get("prediction") or {}
    step = steps_to_target(rows, target)
    run_cpu = None if cpu_to_target is None else round(max(0.0, cpu_to_target - float(p["cpu_s"])), 2)
    return {"pilot_cpu_s": round(float(p["cpu_s"]), 2), "winner": p["winner"]["name"],
            "predicted_steps": pred.get("steps"), "predicted_worker_cpu_s": pred.get("worker_cpu_s"),
            "live_cpu_per_step": round(live_cpu_per_step, 4) if live_cpu_per_step else None,
            "predicted_worker_cpu_s_at_live_cost": (round(float(pred["steps"]) * live_cpu_per_step, 2)
                                                    if live_cpu_per_step and isinstance(pred.get("steps"), (int, float))
                                                    else None),
            "prediction_why": pred.get("why") or pred.get("method") or "",
            "reached": step is not None, "steps_to_target": step, "worker_cpu_s_to_target": run_cpu}
