"""The `swarm` command line.

    swarm train CONFIG [--json] [--ray] [--address URL]   run a training job directly (no agents)
    swarm control RUN_DIR CMD [k=v ...] [--wait]           send a control command to a running job
    swarm status RUN_DIR                                   heartbeat, last metrics, recent commands

Errors in input print one line and exit with code 2; nothing is started.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import time
from typing import Any, Optional

import typer

from sandboxes.text import clean_text  # model and trajectory text reaches the terminal without escapes
from swarm.cli_base import DEFAULT_WS, WS_HELP, err, fail, out
from swarm.cli_sandbox import sandbox_app
from swarm.cli_skills import skills_app

app = typer.Typer(add_completion=False, no_args_is_help=True, help="swarmlab: autonomous model-training R&D")
app.add_typer(skills_app, name="skills")
app.add_typer(sandbox_app, name="sandbox")
LIVE_KEYS = ("loss", "reward_mean", "pass_rate", "heldout_acc", "entropy", "grad_norm", "tokens_per_s")


def _load_config(path: str):
    from trainer.config import ConfigError, RunConfig

    try:
        return RunConfig.from_yaml(path)
    except ConfigError as e:
        fail(str(e))


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


@app.command()
def train(
    config: str = typer.Argument(..., help="run config (YAML)"),
    json_out: bool = typer.Option(False, "--json", help="machine-readable output: one JSON line per step, then the summary"),
    ray: bool = typer.Option(False, "--ray", help="submit as a Ray job (private local head unless --address)"),
    address: Optional[str] = typer.Option(None, help="Ray dashboard/Jobs address of an existing cluster"),
    out_dir: Optional[str] = typer.Option(None, help="override the config's out_dir"),
    name: Optional[str] = typer.Option(None, help="override the run name"),
) -> None:
    """Run a training job directly, with a live progress bar and key metrics."""
    from trainer.config import ConfigError

    cfg = _load_config(config)
    try:
        if out_dir or name:
            cfg = type(cfg).parse({**cfg.model_dump(mode="json"), **({"out_dir": out_dir} if out_dir else {}),
                                   **({"name": name} if name else {})})
        from trainer.preflight import check_run

        check_run(cfg)
    except ConfigError as e:
        fail(str(e))
    if ray or address or cfg.num_workers > 1:
        _train_ray(cfg, config, address, json_out)
        return
    from trainer.loop import Trainer

    try:
        if json_out:
            trainer = Trainer(cfg, on_step=lambda row: print(json.dumps(row), flush=True))
            summary = trainer.run()
            print(json.dumps({"summary": summary}), flush=True)
        else:
            summary = _train_live(cfg)
    except ConfigError as e:
        fail(str(e))
    if summary["status"] not in ("completed", "stopped_by_command", "target_reached"):
        raise typer.Exit(1)


def _train_live(cfg) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from trainer.loop import Trainer

    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[metrics]}"),
                        console=out, transient=False)
    state: dict[str, Any] = {}

    def on_step(row: dict[str, Any]) -> None:
        if "heldout_acc" in row:
            state["heldout_acc"] = row["heldout_acc"]
        shown = {k: row[k] for k in LIVE_KEYS if k in row}
        if "heldout_acc" not in shown and "heldout_acc" in state:
            shown["heldout_acc"] = state["heldout_acc"]
        progress.update(tid, completed=row["step"], total=trainer.recipe.steps,
                        metrics="  ".join(f"{k}={_fmt(v)}" for k, v in shown.items()))

    trainer = Trainer(cfg, on_step=on_step)
    out.print(f"run [bold]{cfg.name}[/] → {cfg.run_dir}  task={cfg.task.name} algorithm={cfg.recipe.algorithm} "
              f"model={cfg.model.kind} params={sum(p.numel() for p in trainer.params):,} kernels={trainer.backend}")
    with progress:
        tid = progress.add_task(cfg.name, total=cfg.recipe.steps, metrics="")
        summary = trainer.run()
    out.print(f"[bold]{summary['status']}[/] at step {summary['step']}"
              + (f"  held-out accuracy {summary['heldout_acc']:.3f}" if "heldout_acc" in summary else "")
              + f"  (metrics: {cfg.run_dir / 'metrics.jsonl'})")
    return summary


def _train_ray(cfg, config_path: str, address: str | None, json_out: bool) -> None:
    import tempfile

    from trainer.launch import ensure_head, stop_head, submit_job

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False, dir=None) as f:
        f.write(cfg.to_yaml())
        resolved = f.name
    err.print(f"starting {'cluster connection' if address else 'a private Ray head on 127.0.0.1'} …")
    head = ensure_head(address, num_cpus=max(2, cfg.num_workers + 1))
    try:
        job = submit_job(head, resolved)
        err.print(f"submitted Ray job {job} ({head.dashboard_url}); metrics in {cfg.run_dir}")
        status = _follow(cfg, head, job, json_out)
    finally:
        stop_head(head)
        pathlib.Path(resolved).unlink(missing_ok=True)
    if status != "SUCCEEDED":
        fail(f"Ray job {job} ended {status}; see its logs above", code=1)


def _follow(cfg, head, job: str, json_out: bool) -> str:
    from ray.job_submission import JobStatus

    from agents.evidence import Tail

    client, tail = head.client(), Tail(keep=1)   # each poll parses only what was appended (and follows a roll)
    while True:
        rows: list[dict] = []
        tail.rows(cfg.run_dir / "metrics.jsonl", on_row=rows.append)
        for row in rows:
            if json_out:
                print(json.dumps(row), flush=True)
            else:
                out.print(f"step {row['step']:>5}/{cfg.recipe.steps}  "
                          + "  ".join(f"{k}={_fmt(row[k])}" for k in LIVE_KEYS if k in row))
        st = client.get_job_status(job)
        if st in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            if st != JobStatus.SUCCEEDED:
                err.print(client.get_job_logs(job)[-3000:])
            return str(st.value)
        time.sleep(1.0)


@app.command()
def control(
    run_dir: str = typer.Argument(..., help="the run's directory (OUT_DIR/NAME)"),
    cmd: str = typer.Argument(..., help="set_recipe | set_harness | checkpoint | rollback | pause | resume | stop"),
    args: list[str] = typer.Argument(None, help="key=value pairs: set_recipe lr=0.001; set_harness version=HASH; rollback name=CKPT"),
    wait: float = typer.Option(0.0, help="wait up to this many seconds for the acknowledgement"),
) -> None:
    """Send a command to a running job; it is applied at the next safe point and acknowledged."""
    from trainer.control import send_command, wait_for_ack

    if not pathlib.Path(run_dir).is_dir():
        fail(f"run directory {run_dir!r} not found")
    payload: dict[str, Any] = {}
    fields: dict[str, Any] = {}
    for a in args or []:
        if "=" not in a:
            fail(f"argument {a!r} is not key=value")
        k, v = a.split("=", 1)
        try:
            val = json.loads(v)
        except json.JSONDecodeError:
            val = v
        if cmd == "set_recipe":
            fields[k] = val
        else:
            payload[k] = val
    if fields:
        payload["fields"] = fields
    cid = send_command(run_dir, cmd, **payload)
    if wait <= 0:
        out.print(cid)
        return
    try:
        ack = wait_for_ack(run_dir, cid, timeout=wait)
    except TimeoutError as e:
        fail(str(e), code=1)
    print(json.dumps(ack))
    if ack["status"] != "applied":
        raise typer.Exit(1)


@app.command()
def status(run_dir: Optional[str] = typer.Argument(None, help="a run's directory (default: the workspace's live run)"),
           workspace: str = typer.Option(DEFAULT_WS, help=WS_HELP)) -> None:
    """Heartbeat, last metrics and the last commands of a run (and the swarm's interventions)."""
    from trainer.runlog import read_heartbeat, tail_jsonl

    if run_dir is None:
        run_dir = str(pathlib.Path(workspace) / ".swarm" / "runs" / "train")
        if (pathlib.Path(workspace) / ".swarm" / "state.db").exists():
            interventions(workspace, json_out=False)
    p = pathlib.Path(run_dir)
    if not p.is_dir():
        fail(f"run directory {run_dir!r} not found")
    hb = read_heartbeat(p)
    rows = tail_jsonl(p / "metrics.jsonl", 50)       # the newest rows only: the file grows for days
    acks = tail_jsonl(p / "command_log.jsonl", 5)
    age = f"{time.time() - hb['time']:.1f}s ago" if hb else "never"
    out.print(f"state: {hb['state'] if hb else 'unknown'}  step: {hb['step'] if hb else '-'}  heartbeat: {age}")
    if rows:
        last = rows[-1]
        if last.get("final"):  # the end-of-run eval row carries no training metrics: show both
            last = {**next((r for r in reversed(rows) if not r.get("final")), {}), **last}
        out.print("  ".join(f"{k}={_fmt(last[k])}" for k in ("step",) + LIVE_KEYS if k in last))
    for a in acks[-5:]:
        out.print(f"command {a['id']} {a['cmd']}: {a['status']} {a.get('result', a.get('reason'))}")


# ---- the swarm -------------------------------------------------------------------------------


def _store(workspace: str):
    from swarm.store import Store

    db = pathlib.Path(workspace) / ".swarm" / "state.db"
    if not os.path.lexists(db):
        fail(f"no swarm run in workspace {workspace!r} (no .swarm/state.db); start one with `swarm run GOAL --workspace {workspace}`")
    try:
        return Store(db)
    except ValueError as e:   # a link, a FIFO, a folder or another file in its place: one line
        fail(str(e))


def _sandbox_policy(goal) -> None:
    """The goal decides, for the controller and the jobs it starts (they inherit the variable),
    whether untrusted code may run unisolated. Without its opt-in a machine where no sandbox
    isolates is refused here, in one line, before anything starts; with it, a loud warning."""
    from sandboxes import SandboxUnavailable, make_sandbox
    from sandboxes.base import PLAIN_OPT_IN_ENV

    if goal.sandbox == "unsafe_plain":
        os.environ[PLAIN_OPT_IN_ENV] = "unsafe_plain"
        err.print("[bold red]WARNING: sandbox: unsafe_plain[/] — where neither Docker, bubblewrap nor unshare "
                  "isolates, skill programs and code-task rewards run in a plain subprocess that shares this "
                  "machine's network (the Ray head included) and files", highlight=False, soft_wrap=True)
        return
    os.environ.pop(PLAIN_OPT_IN_ENV, None)
    try:
        make_sandbox("auto").close()
    except SandboxUnavailable as e:
        fail(f"no sandbox for untrusted code: {e}")


QUIET_HELP = "no live view: only the final lines (for scripts and logs)"
TB_HELP = "also write the run as TensorBoard event files here (metrics, interventions, harness versions, backtest arms)"
NOTIFY_HELP = ("a command run when an intervention starts waiting for approval and when the run ends "
               "(no shell; SWARM_EVENT, SWARM_INTERVENTION, SWARM_DETAIL, SWARM_APPROVE, SWARM_WORKSPACE in its environment)")
JSON_HELP = "machine-readable: one JSON line per timeline event ({\"event\": ...}) as it happens, then the summary"


def _notifier(command: str | None):
    """The notification hook for `command` (None: none), or one error line naming what is wrong."""
    if command is None:
        return None
    from swarm.live import Notify

    try:
        return Notify(command)   # the check a goal's `notify:` passed in `swarm validate` (swarm.goal.notify_argv)
    except ValueError as e:
        fail(str(e))


def _run_controller(make, summary_path: str | None, json_out: bool, goal: Any = None, quiet: bool = False,
                    tensorboard: str | None = None, notify: str | None = None) -> None:
    """`goal`: known before `make` (a new run), its sandbox policy is checked before anything is
    created; otherwise (resume) once the controller has read it. The run is shown live (swarm.live:
    rich Live on a terminal, one line per event otherwise), as JSON lines with `json_out`, or not
    at all with `quiet`; `tensorboard`: a log directory the run is also written to (swarm.tensorboard);
    `notify`: a command run when an intervention waits for approval and when the run ends."""
    from swarm.store import WorkspaceLocked
    from trainer.config import ConfigError

    if notify is None and goal is not None:
        notify = goal.notify   # the goal's hook; --notify overrides it
    notifier = _notifier(notify)   # checked before anything is created
    if goal is not None:
        _sandbox_policy(goal)
    try:
        ctrl = make()
    except WorkspaceLocked as e:
        fail(str(e))
    except (ConfigError, ValueError, OSError) as e:   # OSError: a folder it cannot write, a full disk
        fail(str(e))
    if goal is None:
        _sandbox_policy(ctrl.goal)
        if notifier is None:
            notifier = _notifier(ctrl.goal.notify)
    err.print(f"swarm running in {ctrl.dir} (policies: {'LLM ' + ctrl.goal.llm.model if ctrl.llm else 'built-in, no LLM configured'}); "
              f"follow with `swarm status --workspace {ctrl.dir}`")
    from swarm.live import Follower, sinks_for

    sinks = sinks_for("json" if json_out else "quiet" if quiet else "live", out)
    if tensorboard:
        from swarm.tensorboard import TensorBoardSink

        sinks.append(TensorBoardSink(tensorboard))
    if notifier is not None:
        sinks.append(notifier)
    follower = Follower(ctrl.dir, sinks).start() if sinks else None
    try:
        try:
            summary = ctrl.run()
        finally:
            if follower is not None:
                follower.stop()
    except KeyboardInterrupt:
        fail(f"interrupted; the run's state is kept: `swarm resume --workspace {ctrl.dir}` continues it", code=130)
    except Exception as e:  # the boundary: the state is in sqlite/git, the error becomes one line
        import traceback

        from sandboxes.private import write_private

        try:
            write_private(ctrl.sdir / "crash.log", traceback.format_exc())   # 0600, never through a link
        except (OSError, ValueError):
            pass   # the one line below still says what stopped it
        fail(f"controller stopped on {type(e).__name__}: {e} (traceback in {ctrl.sdir / 'crash.log'}); "
             f"state kept, `swarm resume --workspace {ctrl.dir}` continues", code=1)
    if summary_path:
        pathlib.Path(summary_path).write_text(json.dumps(summary, indent=1, default=str))
    if json_out:
        print(json.dumps(summary, default=str))
    else:
        out.print(f"[bold]{summary['reason']}[/]: {summary['metric']}={summary['final_metric']} "
                  f"(target {'reached' if summary['reached'] else 'not reached'}) after {summary['steps']} steps, "
                  f"{summary['wall_s']:.0f}s wall, {summary['worker_cpu_s']:.0f} worker-CPU-s, "
                  f"{len(summary['interventions'])} interventions")
        out.print(f"report: {summary['report']}")
    if not summary["reached"]:
        raise typer.Exit(1)


def _load_goal(path: str):
    """The validated goal, or one line and exit code 2 (nothing is created)."""
    from swarm.goal import Goal
    from trainer.config import ConfigError

    try:
        return Goal.load(path)
    except ConfigError as e:
        fail(str(e))


@app.command()
def validate(goal: str = typer.Argument(..., help="goal file (YAML)")) -> None:
    """Check a goal file as `swarm run` does before it creates anything; prints "ok" or one error line."""
    from swarm.plan import validated_lines

    g = _load_goal(goal)
    lines = validated_lines(g) if g.agent is None else [   # the task as understood, the plan's fields by source
        f"ok: agent run on {g.agent.get('env', 'lookup')}, target {g.target.metric} {g.target.op} {g.target.threshold:g}"]
    for line in lines:
        out.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command("plan")
def plan_cmd(
    goal: str = typer.Argument(..., help="goal file (YAML)"),
    pilot: bool = typer.Option(False, "--pilot", help="run the pilot (a few short runs over model size x lr, here, "
                               "in this process) and show its table, winner and prediction"),
    pilot_share: Optional[float] = typer.Option(None, "--pilot-share", help="the pilot's CPU as a share of "
                                                "budget.worker_cpu_s, in (0, 1] (default: the goal's pilot.share)"),
    pilot_dir: Optional[str] = typer.Option(None, "--pilot-dir", help="keep the pilot's runs and record here (a pilot "
                                            "started again there resumes); default: a temporary folder"),
    json_out: bool = typer.Option(False, "--json", help="the plan (and the pilot) as one JSON object"),
) -> None:
    """The plan of a goal: every run field with its source (written, words, task, pilot, default);
    with --pilot, the pilot's table and its prediction of steps and CPU to the target."""
    from swarm.pilot import PilotError, piloted_plan
    from swarm.pilot import pilot as run_pilot
    from swarm.plan import validated_lines

    g = _load_goal(goal)
    if g.agent is not None:
        fail("swarm plan: this goal drives the agent trainer (run.agent): its config is written, nothing is planned")
    pilot_share = g.pilot.share if pilot_share is None else pilot_share
    if not 0 < pilot_share <= 1:
        fail(f"--pilot-share={pilot_share:g}: must be in (0, 1], a share of budget.worker_cpu_s")
    plan, result = g.plan(), None
    if pilot:
        if g.entrypoint is not None or plan is None:
            fail("--pilot: this goal runs a script (run.entrypoint); the pilot runs this project's trainer")

        def progress(r, spent: float) -> None:
            err.print(f"pilot: {r.candidate} rung {r.rung} ({r.steps} steps): held-out {r.heldout:.3f}, loss {r.loss:.3f}, "
                      f"{r.cpu_s:.1f} CPU-s (spent {spent:.1f} of {pilot_share * g.budget.worker_cpu_s:.1f})",
                      markup=False, highlight=False, soft_wrap=True)

        from trainer.config import ConfigError

        try:
            result = run_pilot(g, pilot_share, work_dir=pilot_dir, on_result=progress)
        except (PilotError, ConfigError, OSError) as e:   # a candidate the trainer refuses, a folder it cannot write
            fail(str(e))
        plan = piloted_plan(plan, result, g.run)
    if json_out:
        print(json.dumps({"plan": plan.to_json() if plan else None, "pilot": result.to_json() if result else None},
                         default=str))
        return
    lines = validated_lines(g, plan) + (result.lines() if result else [])
    for line in lines:
        out.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command()
def run(
    goal: str = typer.Argument(..., help="goal file (YAML)"),
    workspace: str = typer.Option(DEFAULT_WS, help=WS_HELP),
    summary: Optional[str] = typer.Option(None, help="write the run summary (JSON) here"),
    jobs: Optional[str] = typer.Option(None, help="ray (Ray Jobs on a private loopback head or --address) | process; "
                                       "default ray, process for a goal that drives the agent trainer"),
    address: Optional[str] = typer.Option(None, help="Ray dashboard address of an existing cluster"),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
    tensorboard: Optional[str] = typer.Option(None, help=TB_HELP),
    notify: Optional[str] = typer.Option(None, help=NOTIFY_HELP),
    no_pilot: bool = typer.Option(False, "--no-pilot", help="no pilot before the run (as the goal's pilot.enabled: "
                                  "false): the plan's defaults train the model size and lr the goal leaves out"),
) -> None:
    """Drive training jobs toward GOAL with the operator swarm (shown live on a terminal). A goal
    whose plan fills the model size or lr gets a short pilot first (swarm/pilot.py), within the
    goal's pilot.share of budget.worker_cpu_s; the plan is the run's first PR."""
    g = _load_goal(goal)
    if no_pilot:   # recorded in the goal the run saves, so a resumed run does not pilot either
        g = g.model_copy(update={"pilot": g.pilot.model_copy(update={"enabled": False})})
    if jobs not in (None, "ray", "process"):
        fail(f"--jobs={jobs!r}: must be 'ray' or 'process'")
    _run_controller(lambda: _create(workspace, g, jobs=jobs, ray_address=address), summary, json_out, goal=g,
                    quiet=quiet, tensorboard=tensorboard, notify=notify)


def _create(workspace: str, goal: Any, **kw: Any):
    """Controller.create, which leaves nothing behind when it fails: a workspace folder this call
    made is removed (one that existed, e.g. the user's git repository, is left as it was)."""
    import shutil

    from swarm.controller import Controller

    d = pathlib.Path(workspace)
    existed = d.exists() or d.is_symlink()
    try:
        return Controller.create(d, goal, **kw)
    except BaseException:
        if not existed:
            shutil.rmtree(d, ignore_errors=True)
        raise


@app.command()
def demo(
    workspace: Optional[str] = typer.Option(None, help="workspace (default: runs/demo-TIMESTAMP)"),
    goal: str = typer.Option(str(pathlib.Path(__file__).resolve().parent.parent / "examples" / "goals" / "config" / "truncation.yaml"),
                             help="the goal to run"),
    jobs: str = typer.Option("ray", help="ray | process"),
    summary: Optional[str] = typer.Option(None, help="write the run summary (JSON) here"),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
    tensorboard: Optional[str] = typer.Option(None, help=TB_HELP),
    notify: Optional[str] = typer.Option(None, help=NOTIFY_HELP),
) -> None:
    """A short run on the embedded defaults (local Ray, sqlite, local git, built-in policies unless
    an LLM is configured): the run starts badly, the swarm diagnoses and fixes it, the goal is reached."""
    ws = workspace or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}"
    g = _load_goal(goal)
    (err if json_out else out).print(f"[bold]demo[/]: {g.goal}\nworkspace {ws}; review it in a browser with "
                                     f"`swarm ui --workspace {ws}`, or `swarm interventions --workspace {ws}`")
    _run_controller(lambda: _create(ws, g, jobs=jobs), summary, json_out, goal=g, quiet=quiet, tensorboard=tensorboard,
                    notify=notify)


@app.command()
def resume(
    workspace: str = typer.Option(DEFAULT_WS, help=WS_HELP),
    summary: Optional[str] = typer.Option(None, help="write the run summary (JSON) here"),
    jobs: Optional[str] = typer.Option(None, help="ray | process (default: what the run was started with)"),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
    tensorboard: Optional[str] = typer.Option(None, help=TB_HELP),
    notify: Optional[str] = typer.Option(None, help=NOTIFY_HELP),
) -> None:
    """Continue a swarm run after the controller stopped or was killed."""
    from swarm.controller import Controller

    if jobs not in (None, "ray", "process"):
        fail(f"--jobs={jobs!r}: must be 'ray' or 'process'")
    _run_controller(lambda: Controller.open(workspace, jobs=jobs), summary, json_out, quiet=quiet, tensorboard=tensorboard,
                    notify=notify)


@app.command("tensorboard")
def tensorboard_export(workspace: str = typer.Option(DEFAULT_WS, help=WS_HELP),
                       logdir: str = typer.Option(..., help="where the event files go (then: tensorboard --logdir LOGDIR)")) -> None:
    """Write a run's TensorBoard event files from its records (what `swarm run --tensorboard` writes live)."""
    from swarm.tensorboard import export

    _check_state_db(workspace)
    out.print(f"wrote {export(workspace, logdir)}")


@app.command()
def interventions(workspace: str = typer.Option(DEFAULT_WS, help=WS_HELP),
                  json_out: bool = typer.Option(False, "--json", help="every intervention, whole, as a JSON list")) -> None:
    """List interventions with their status (ids stay whole at any terminal width)."""
    from swarm.live import fit_table

    st = _store(workspace)
    if json_out:
        print(json.dumps([iv.model_dump(mode="json") for iv in st.list()]))
        return
    rows = []
    for iv in st.list():
        bt = iv.backtest
        rows.append([iv.id, iv.status.value, iv.kind.value, iv.diagnosis.name,
                     f"{bt.effect:+.3f}" if bt else (iv.backtest_skipped and "skipped") or "-",
                     f"{bt.p_value:.3f}" if bt else "-", str(iv.applied_step) if iv.applied_step is not None else "-",
                     iv.risk.value, iv.operator, iv.policy])
        rows[-1] = [clean_text(c, newlines=False) for c in rows[-1]]
    out.print(fit_table(out, ["id", "status", "kind", "diagnosis", "effect", "p", "applied at", "risk", "operator", "policy"], rows))


def _get_iv(workspace: str, iid: str):
    st = _store(workspace)
    try:
        return st, st.get(iid)
    except KeyError:
        fail(f"unknown intervention {iid!r} in workspace {workspace!r} (see `swarm interventions`)")


@app.command()
def review(iid: str = typer.Argument(..., help="intervention id"), workspace: str = typer.Option(DEFAULT_WS, help=WS_HELP)) -> None:
    """Show an intervention's report and diff."""
    from swarm.workspace import Workspace

    _, iv = _get_iv(workspace, iid)
    ws = Workspace.open(workspace)
    if iv.branch is None:
        fail(f"intervention {iid} has no PR yet (status {iv.status.value})")
    out.print(clean_text(ws.report(iid)), markup=False, highlight=False)
    out.print(clean_text(ws.diff(iid)), markup=False, highlight=False)


# what a human may ask for, and the statuses it needs: the CLI, `swarm ui` and `swarm mcp` all go
# through queue_human, so every path checks the same things and records who acted
HUMAN_ACTIONS: dict[str, tuple[str, ...]] = {
    "approve": ("awaiting_approval",), "reject": ("awaiting_approval",), "rollback": ("applied", "evaluating", "kept"),
}


def acting_user(channel: str) -> str:
    """Who acted, as recorded in the timeline: the channel and the local user running it."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):   # no passwd entry for the uid (containers)
        user = f"uid {os.getuid()}"
    return f"{channel}:{user}"


def queue_human(workspace: str | os.PathLike, iid: str, action: str, by: str) -> str:
    """Queue a human decision (`approve` | `reject` | `rollback`) on intervention `iid` as the
    timeline row `human_<action>` with `by`; the controller applies it at its next tick. Raises
    ValueError (one line) when the workspace, id, action or the intervention's status does not
    allow it; nothing is written then. Returns what was queued, as a sentence."""
    from swarm.store import Store

    if action not in HUMAN_ACTIONS:
        raise ValueError(f"action {action!r}: must be one of {', '.join(HUMAN_ACTIONS)}")
    db = pathlib.Path(workspace) / ".swarm" / "state.db"
    if not db.exists():
        raise ValueError(f"no swarm run in workspace {str(workspace)!r} (no .swarm/state.db)")
    kind, allowed = f"human_{action}", HUMAN_ACTIONS[action]
    with Store(db) as st:
        try:
            iv = st.get(iid)
        except KeyError:
            raise ValueError(f"unknown intervention {iid!r} in workspace {str(workspace)!r} (see `swarm interventions`)") from None
        done = st.timeline("finished")
        if done:   # no controller tick follows: a queued decision would never be acted on
            raise ValueError(f"the run in workspace {str(workspace)!r} is finished ({done[-1].get('reason')}); "
                             f"intervention {iid} stays {iv.status.value}, nothing would act on a {action}")
        if iv.status.value not in allowed:
            raise ValueError(f"intervention {iid} is {iv.status.value}; {action} needs status {' or '.join(allowed)}")
        asked = [r["kind"] for r in st.timeline() if r.get("id") == iid and r.get("kind", "").startswith("human_")]
        if kind in asked:
            raise ValueError(f"intervention {iid} is {iv.status.value}: {action} already requested")
        # approve and reject: the controller acts on the first one, so a second is refused, not queued
        first = next((k for k in asked if k in ("human_approve", "human_reject")), None)
        if action in ("approve", "reject") and first is not None:
            raise ValueError(f"intervention {iid} is {iv.status.value} with {first.removeprefix('human_')} already "
                             f"requested; that decision stands, {action} is refused")
        st.log(kind, id=iid, by=by)
    return f"{action} of {iid} queued; the controller applies it at its next tick"


def request_stop(workspace: str | os.PathLike, by: str) -> str:
    """Ask the workspace's controller to stop (the file `.swarm/stop`; it stops the job and
    writes the final report); recorded in the timeline with `by` when the run has one."""
    from sandboxes.private import check_private, write_private
    from swarm.store import Store

    d = pathlib.Path(workspace) / ".swarm"
    if check_private(d, "folder") is None:   # a link or a file there: refused, one line
        raise ValueError(f"no swarm run in workspace {str(workspace)!r}")
    # a damaged database (a link, a FIFO, not a database) is refused before anything is written
    st = Store(d / "state.db") if os.path.lexists(d / "state.db") else None
    try:
        write_private(d / "stop", str(time.time()))   # 0600, never through a link
        if st is not None:
            st.log("human_stop", by=by)
    finally:
        if st is not None:
            st.close()
    return "stop requested"


def _human(iid: str, workspace: str, kind: str, allowed: tuple[str, ...]) -> None:
    action = kind.removeprefix("human_")
    assert HUMAN_ACTIONS[action] == allowed, f"{kind}: statuses {allowed} differ from HUMAN_ACTIONS"
    try:
        out.print(queue_human(workspace, iid, action, by=acting_user("cli")))
    except ValueError as e:
        fail(str(e))


@app.command()
def approve(iid: str = typer.Argument(...), workspace: str = typer.Option(DEFAULT_WS, help=WS_HELP)) -> None:
    """Approve an intervention waiting for a human: merge its PR and apply it."""
    _human(iid, workspace, "human_approve", ("awaiting_approval",))


@app.command()
def reject(iid: str = typer.Argument(...), workspace: str = typer.Option(DEFAULT_WS, help=WS_HELP)) -> None:
    """Reject an intervention waiting for a human: close its PR."""
    _human(iid, workspace, "human_reject", ("awaiting_approval",))


@app.command()
def rollback(iid: str = typer.Argument(...), workspace: str = typer.Option(DEFAULT_WS, help=WS_HELP)) -> None:
    """Roll back an applied intervention: revert its merge and restore the checkpoint taken before it."""
    _human(iid, workspace, "human_rollback", ("applied", "evaluating", "kept"))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []})
def bench(ctx: typer.Context) -> None:
    """Benchmark suite: swarm vs plain, oracle, Ray Tune PBT/PB2/ASHA (`swarm bench --help`; docs/benchmarks.md)."""
    from importlib.metadata import distributions

    # the suite (swarmbench) sits above the controller, which never imports it: its command is found
    # through the entry point pyproject.toml declares, in every copy of the metadata on the path (a
    # stale swarmlab.egg-info in the working directory would hide the installed one from entry_points())
    found = [ep for d in distributions() for ep in d.entry_points if ep.group == "swarmlab.cli" and ep.name == "bench"]
    if not found:
        fail("swarm bench: the benchmark suite is not installed (pip install -e . installs swarmbench)")
    raise typer.Exit(found[0].load()(list(ctx.args)))


@app.command()
def stop(workspace: str = typer.Option(DEFAULT_WS, help=WS_HELP)) -> None:
    """Ask the controller to stop: it stops the job and writes the final report."""
    try:
        out.print(request_stop(workspace, by=acting_user("cli")))
    except ValueError as e:
        fail(str(e))


@app.command()
def report(workspace: str = typer.Option(DEFAULT_WS, help=WS_HELP)) -> None:
    """Print the final report (or, while running, where things stand)."""
    p = pathlib.Path(workspace) / "reports" / "final" / "REPORT.md"
    if p.exists():
        out.print(clean_text(p.read_text()), markup=False, highlight=False)
        return
    interventions(workspace, json_out=False)


@app.command()
def ui(
    workspace: Optional[str] = typer.Option(None, help="serve this one workspace"),
    root: Optional[str] = typer.Option(None, help="serve every workspace found under this folder (default: the current one)"),
    port: int = typer.Option(8765, min=0, max=65535, help="port on 127.0.0.1 (0: any free port)"),
) -> None:
    """The review cockpit in a browser: live runs, curves, reports and diffs, approve / reject /
    rollback. Listens on 127.0.0.1 only; open the one-time link it prints."""
    from swarm.ui import Runs, bind, make_app, serve

    _check_served(workspace, root)
    try:
        sock = bind(port)
    except OSError as e:
        fail(f"--port={port}: cannot listen on 127.0.0.1:{port}: {e.strerror or e}")
    runs = Runs(workspace=pathlib.Path(workspace)) if workspace else Runs(root=pathlib.Path(root or "."))
    app_, guard = make_app(runs, port=sock.getsockname()[1])
    out.print(f"swarm cockpit on 127.0.0.1:{guard.port} — open (works once):\n{guard.login_url()}", highlight=False, soft_wrap=True)
    try:
        serve(app_, sock)
    except KeyboardInterrupt:
        pass
    finally:
        runs.close()


def _check_served(workspace: str | None, root: str | None) -> None:
    """What `swarm ui` and `swarm mcp` serve: one workspace, or every one under a folder."""
    if workspace and root:
        fail("give --workspace or --root, not both")
    if workspace:
        _check_state_db(workspace)
    if root and not pathlib.Path(root).is_dir():
        fail(f"--root={root!r}: not a directory")


def _check_state_db(workspace: str) -> None:
    """`--workspace` holds a run whose state database can be opened, or one line and exit 2."""
    from swarm.store import Store

    db = pathlib.Path(workspace) / ".swarm" / "state.db"
    if not os.path.lexists(db):
        fail(f"--workspace={workspace!r}: no swarm run there (no .swarm/state.db)")
    try:
        Store(db).close()   # a link, a FIFO, a folder, a file that is not a database: refused here
    except ValueError as e:
        fail(f"--workspace={workspace!r}: {e}")


@app.command("mcp")
def mcp_server(
    workspace: Optional[str] = typer.Option(None, help="serve this one workspace"),
    root: Optional[str] = typer.Option(None, help="serve every workspace found under this folder (default: the current one)"),
    allow_actions: bool = typer.Option(False, "--allow-actions", help="also offer approve / reject / rollback / stop "
                                       "(recorded as done through MCP); without it the server is read-only"),
) -> None:
    """An MCP server over stdio for agents: runs, status, interventions, review, report (and, with
    --allow-actions, approve / reject / rollback / stop through the CLI's own path)."""
    from swarm.mcp_server import build_server

    _check_served(workspace, root)
    build_server(workspace=workspace, root=None if workspace else (root or "."), allow_actions=allow_actions).run("stdio")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
