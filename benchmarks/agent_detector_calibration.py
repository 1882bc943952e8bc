"""Agent detector calibration: the share each agent detector (agents/agent_critic.py) reads on short
healthy agent runs and on runs with one harness fault, the ground for its threshold.

    nice -n 19 .venv/bin/python benchmarks/agent_detector_calibration.py --seeds 505,512 --grpo-steps 8 \
        --out benchmarks/results/agent_detector_calibration

Runs: the agentic fault scenarios of swarmbench/agentic.py (origin `config`), per environment
(lookup and calc at difficulty 1, the warm-ups the scenarios use) and seed. The scenarios' healthy
configs differ by mechanism (positional demonstrations for `parser`, verbose outputs and a
12-character cut for `observation_cut`), so there is one warm-up per distinct healthy config; from
it, GRPO runs `--grpo-steps` steps under the healthy harness (a healthy run) and under each fault
that shares that healthy config (a faulted run), every sampled trajectory written to samples.jsonl
with its step-level record, as the trainer writes them. After each GRPO step the detectors read
Evidence built as the controller builds it (`agents.evidence.collect`: the newest 32 samples and
the metrics rows; the live harness as `ev.harness`), and `detector_shares` gives the share each
compares with its threshold. Warm-up weights are in memory only; nothing is evaluated held-out
(train success is reported per run, to tell a run that has not learned the task).

Deviation from the controller: each GRPO step samples 32 trajectories (4 episodes x 8) and all 32
are written, so a 32-sample window is one step's (the controller's runs write `samples_per_step`,
2 by default, so its window spans 16 steps). The expected share is the same; the window's spread
over episodes is narrower here.

Output: OUT.json (every window's shares, per run) and OUT.md (per detector: healthy windows' max
and false alarms at the threshold, the targeted faults' min share and detections).
"""
from __future__ import annotations

import argparse
import copy
import json
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the detector each scenario mechanism should trip (the ones without a step-level or limit detector map to None)
TARGET = {"parser": "agent_malformed_call", "observation_cut": "agent_observation_cut",
          "description": "agent_tool_spec_differs", "missing_tool": "agent_unknown_tool", "max_turns": "agent_turn_limit"}
# per environment: the seeds' healthy configs, each with the mechanisms that share it
GROUPS = {"lookup": {"plain": ("missing_tool", "max_turns", "description"), "parser": ("parser",),
                     "observation_cut": ("observation_cut",)},
          "calc": {"plain": ("missing_tool", "max_turns"), "parser": ("parser",)}}


def trainer(data: dict[str, Any], seed: int, name: str, out: str):
    from trainer.agent_train import AgentTrainConfig, AgentTrainer

    d = copy.deepcopy(data)
    g = d.setdefault("grpo", {})
    d.update(seed=seed, name=name, out_dir=out, threads=1, samples_per_step=g.get("prompts", 4) * g.get("group_size", 8))
    return AgentTrainer(AgentTrainConfig.parse(d), printer=None)


def warm(data: dict[str, Any], seed: int, out: str) -> dict[str, Any]:
    t = trainer(data, seed, "warm", out)
    t.warm_up()
    return {"model": copy.deepcopy(t.policy.model.state_dict()), "opt": copy.deepcopy(t.opt.state_dict()),
            "cursor": t.cursor, "rng": t.rng.get_state(), "step": t.step}


def grpo_run(data: dict[str, Any], seed: int, state: dict[str, Any], name: str, out: str, steps: int
             ) -> list[dict[str, Any]]:
    """GRPO from the warm state; the detectors' shares after each step."""
    from agents.agent_critic import detector_shares
    from agents.evidence import collect
    from trainer.runlog import RunLog

    t = trainer(data, seed, name, out)
    t.policy.model.load_state_dict(state["model"])
    t.opt.load_state_dict(state["opt"])
    t.cursor, t.step = state["cursor"], state["step"]
    t.rng.set_state(state["rng"])
    for g in t.opt.param_groups:
        g["lr"] = t.cfg.grpo.lr
    t.log = RunLog(t.cfg.run_dir)
    windows = []
    for i in range(steps):
        row = {**t.row_base("grpo"), **t.grpo_step(i)}
        t.step += 1
        t.write_row({**row, "step_time": 0.0})
        ev = collect(t.cfg.run_dir, "RUNNING", harness=t.harness.model_dump(mode="json"))
        windows.append({"grpo_step": i, "success": row["success"],
                        "shares": {k: (round(v, 4) if v is not None else None) for k, v in detector_shares(ev).items()}})
    t.log.close()
    return windows


def measure(envs: list[str], seeds: list[int], steps: int, out: str) -> list[dict[str, Any]]:
    from swarmbench.agentic import scenario

    runs = []
    for env in envs:
        for seed in seeds:
            for base, mechanisms in GROUPS[env].items():
                healthy = scenario(seed, env, mechanisms[0], "config")["healthy"]
                t0 = time.process_time()
                state = warm(healthy, seed, out)
                print(f"[{env} s{seed} {base}] warm-up {time.process_time() - t0:.0f} CPU-s", flush=True)
                arms = [("healthy", None, healthy)] + [
                    ("fault", m, scenario(seed, env, m, "config")["config"]) for m in mechanisms]
                for kind, m, data in arms:
                    name = f"{env}-s{seed}-{base}-{m or 'healthy'}"
                    w = grpo_run(data, seed, state, name, out, steps)
                    runs.append({"env": env, "seed": seed, "healthy_config": base, "kind": kind, "mechanism": m,
                                 "target": TARGET.get(m or ""), "windows": w})
                    last = w[-1]["shares"]
                    print(f"  {name}: success {statistics.mean(x['success'] for x in w):.2f}; last window " +
                          " ".join(f"{k.removeprefix('agent_')}={v}" for k, v in last.items() if v), flush=True)
    return runs


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per detector: the healthy windows' shares (max, false alarms at the threshold) and the
    targeted faulted runs' (min, detections)."""
    from agents.agent_critic import END_SHARE, LIMIT_COLUMNS, STEP_MODES, STEP_SHARE

    out = {}
    for name in list(LIMIT_COLUMNS) + list(STEP_MODES):
        thr = END_SHARE if name in LIMIT_COLUMNS else STEP_SHARE[STEP_MODES[name]]

        def vals(rs: list[dict[str, Any]]) -> list[float]:
            return [w["shares"][name] for r in rs for w in r["windows"] if w["shares"][name] is not None]

        healthy = vals([r for r in runs if r["kind"] == "healthy"])
        other_faults = vals([r for r in runs if r["kind"] == "fault" and r["target"] != name])
        target = vals([r for r in runs if r["kind"] == "fault" and r["target"] == name])
        out[name] = {"threshold": thr, "healthy_windows": len(healthy), "healthy_max": max(healthy, default=None),
                     "healthy_mean": statistics.mean(healthy) if healthy else None,
                     "healthy_fires": sum(v >= thr for v in healthy),
                     "other_fault_windows": len(other_faults), "other_fault_max": max(other_faults, default=None),
                     "other_fault_fires": sum(v >= thr for v in other_faults),
                     "target_windows": len(target), "target_min": min(target, default=None),
                     "target_median": statistics.median(target) if target else None,
                     "target_fires": sum(v >= thr for v in target)}
    return out


def fmt(v: Any) -> str:
    return "–" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def report(runs: list[dict[str, Any]], summ: dict[str, Any], cmd: str, cpu: float, wall: float) -> str:
    lines = ["# Agent detector calibration", "",
             f"`{cmd}` ({cpu:.0f} CPU-s, {wall:.0f} s wall, one torch thread, `nice -n 19` on a shared 2-core machine). "
             "Script: `benchmarks/agent_detector_calibration.py`; numbers: `agent_detector_calibration.json`.", "",
             "Each window: the share a detector compares with its threshold after one GRPO step (32 sampled "
             "trajectories; limit detectors: the mean end share over the newest 5 GRPO rows).", "",
             "| detector | threshold | healthy windows | healthy max (mean) | healthy fires | other faults' max | "
             "other faults' fires | targeted fault windows | targeted min (median) | targeted fires |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in summ.items():
        lines.append(f"| {name} | {s['threshold']} | {s['healthy_windows']} | {fmt(s['healthy_max'])} "
                     f"({fmt(s['healthy_mean'])}) | {s['healthy_fires']} | {fmt(s['other_fault_max'])} | "
                     f"{s['other_fault_fires']} | {s['target_windows']} | {fmt(s['target_min'])} "
                     f"({fmt(s['target_median'])}) | {s['target_fires']} |")
    lines += ["", "## Runs", "", "| run | kind | train success (mean over steps) | shares, last window (non-zero) |",
              "|---|---|---|---|"]
    for r in runs:
        w = r["windows"]
        last = ", ".join(f"{k.removeprefix('agent_')} {v:.2f}" for k, v in w[-1]["shares"].items() if v)
        lines.append(f"| {r['env']} s{r['seed']} {r['mechanism'] or r['healthy_config'] + ' (healthy)'} | {r['kind']} | "
                     f"{statistics.mean(x['success'] for x in w):.2f} | {last or '–'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", default="lookup,calc")
    ap.add_argument("--seeds", default="505")
    ap.add_argument("--grpo-steps", type=int, default=6)
    ap.add_argument("--out", default="benchmarks/results/agent_detector_calibration")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    t0, c0 = time.time(), time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        runs = measure(a.envs.split(","), [int(s) for s in a.seeds.split(",")], a.grpo_steps, tmp)
    summ = summary(runs)
    cmd = ("benchmarks/agent_detector_calibration.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    cpu, wall = time.process_time() - c0, time.time() - t0
    pathlib.Path(a.out + ".json").write_text(json.dumps({"command": cmd, "cpu_s": cpu, "wall_s": wall,
                                                         "summary": summ, "runs": runs}, indent=1))
    pathlib.Path(a.out + ".md").write_text(report(runs, summ, cmd, cpu, wall))
    print(report(runs, summ, cmd, cpu, wall))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
