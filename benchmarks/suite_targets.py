"""The decision model's targets, measured on a benchmark suite's results.

    python benchmarks/suite_targets.py benchmarks/results/suite_headline.json \
        --work /tmp/bench/work [--out benchmarks/results/suite_headline_targets]

Reads the results JSON `swarm bench` writes (every run of every method, the scenarios and their
class) and, for the swarm's runs, the run folders under the bench work dirs (each holds the swarm's
workspace: its state.db has every intervention with its outcome). Writes a markdown table (and JSON)
of each target: what it asks, what was measured, and whether it is met. Paired ratios compare the
swarm with another method on the same scenario and seed.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import sqlite3
import statistics
import sys
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from swarmbench.scenarios import RESTARTS  # noqa: E402


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def swarm_records(work_dirs: list[pathlib.Path]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """(scenario, seed) -> the interventions of the newest swarm run of it found under the work dirs."""
    out: dict[tuple[str, int], tuple[float, list[dict[str, Any]]]] = {}
    for w in work_dirs:
        for spec in (w / "runs").glob("*-swarm-s*/spec.json"):
            db = spec.parent / "work" / "ws" / ".swarm" / "state.db"
            if not db.exists() or not (spec.parent / "result.json").exists():
                continue
            name = spec.parent.name.split("-", 1)[1].rsplit("-swarm-s", 1)
            key = (name[0], int(name[1]))
            t = (spec.parent / "result.json").stat().st_mtime
            if key in out and out[key][0] >= t:
                continue
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                ivs = [json.loads(r[0]) for r in con.execute("SELECT data FROM interventions")]
            finally:
                con.close()
            out[key] = (t, ivs)
    return {k: v for k, (_, v) in out.items()}


def ledger_records(res: dict[str, Any]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """(scenario, seed) -> the interventions a swarm run's ledger row keeps (kind, status, changes,
    gain, refused), for runs whose workspace is gone; the workspaces' records take precedence."""
    return {(r["scenario"], r["seed"]): r["intervention_records"] for r in res["runs"]
            if r["method"] == "swarm" and isinstance(r.get("intervention_records"), list)}


PER_ORIGIN = 8   # failing scenarios each fault origin needs (issue 35's targets)


def failing_targets(fail: list[dict[str, Any]], by: dict[tuple[str, str, int], dict[str, Any]],
                    runs: list[dict[str, Any]], row: Any, where: str, per_origin: int = 0) -> None:
    """The targets on failing runs (`fail`: the swarm's, of one fault origin or all): success, the
    paired worker-CPU to target against PBT and the oracle, and the compute wasted (reported).
    `per_origin`: the failing scenarios the group needs for its success target to count."""
    scenarios = {r["scenario"] for r in fail}
    ok = sum(bool(r.get("reached")) for r in fail)
    short = len(scenarios) < per_origin
    row(f"success on failing scenarios >= 90%{where}",
        (f"{ok}/{len(fail)} ({100 * ok / len(fail):.0f}%) over {len(scenarios)} scenarios" if fail else "no runs"),
        bool(fail) and ok / len(fail) >= 0.9 and not short,
        f"fewer than the {per_origin} failing scenarios an origin needs" if short else "")
    c2t = [r["cpu_to_target"] for r in fail if r.get("reached")]
    for other, bound in (("pbt", 0.5), ("oracle", 1.5)):
        # paired over every failing run both methods have: a run that did not reach the target has an
        # unknown C2T above the CPU it spent, so each pair's ratio is known, or has an upper bound
        # (the other method failed: swarm C2T / the other's CPU spent), or is infinite (the swarm
        # failed); the median of these upper bounds bounds the true paired median from above
        pairs = [(r, by.get((r["scenario"], other, r["seed"]))) for r in fail]
        pairs = [(r, o) for r, o in pairs if o is not None]
        bounds, exact, same = [], 0, []
        for r, o in pairs:
            if not r.get("reached"):
                b = float("inf")
            elif o.get("reached"):
                b = r["cpu_to_target"] / o["cpu_to_target"]
                exact += 1
            elif o.get("cpu_total"):
                b = r["cpu_to_target"] / o["cpu_total"]
            else:
                continue
            bounds.append(b)
            if r.get("sitting_of_row") and r.get("sitting_of_row") == o.get("sitting_of_row"):
                same.append(b)
        theirs = [r["cpu_to_target"] for r in runs if r["method"] == other and r["cls"] == "failing" and r.get("reached")
                  and r["scenario"] in scenarios]
        if not bounds:
            row(f"median worker-CPU to target <= {bound}x {other}'s (failing){where}", f"no failing run of both the swarm and {other}", None)
            continue
        up = median(bounds)
        of_reached = (f"; over reached runs only: {median(c2t):.1f} / {median(theirs):.1f} CPU-s = {median(c2t) / median(theirs):.2f}x"
                      if c2t and theirs else "")
        of_reached += (f"; over the {len(same)} pairs measured in one sitting (no scaling between them): <= {median(same):.2f}x"
                       if same and len(same) < len(bounds) else "")
        row(f"median worker-CPU to target <= {bound}x {other}'s (failing){where}",
            f"paired median <= {up:.2f}x over {len(bounds)} runs ({exact} both reached: exact ratio; "
            f"{sum(1 for r, o in pairs if r.get('reached') and not o.get('reached'))} {other} did not reach: upper bound, "
            f"swarm's C2T / {other}'s CPU spent; {sum(1 for r, _ in pairs if not r.get('reached'))} the swarm did not reach: "
            f"infinite){of_reached}", up <= bound and (not same or median(same) <= bound),
            "met only if it holds over the pairs measured in one sitting too: the others rest on the factors between sittings"
            if same and len(same) < len(bounds) else "")
    have = [r for r in fail if isinstance(r.get("wasted_cpu_s"), (int, float))]
    wasted = [float(r["wasted_cpu_s"]) for r in have]
    spent = sum(float(r.get("cpu_total") or 0.0) for r in have)
    row(f"wasted compute reported{where}", f"{sum(wasted):.0f} of {spent:.0f} worker-CPU-s ({100 * sum(wasted) / spent:.0f}%; "
        f"median {median(wasted):.1f} a run, over the {len(have)} of {len(fail)} runs that record it): rejected, no-effect "
        "and rolled-back changes, exploration that found nothing" if have and spent else
        (f"not recorded by any of {len(fail)} runs" if fail else "no runs"), None)


# fault mechanisms each of which may take one restart: those that end the job (swarmbench.scenarios
# RESTARTS), a hung job, and a slow worker (its fix is a restart that moves no field)
CRASHES = (*RESTARTS, "stall", "slow_worker")


def crashes_of(scenario: dict[str, Any]) -> int:
    """The injected faults of a scenario that may each take a restart (CRASHES): from its fault
    mechanisms where the results name them, else from the faults' text (results written before
    they did)."""
    if isinstance(scenario.get("mechanisms"), list):
        return sum(m in CRASHES for m in scenario["mechanisms"])
    text = scenario.get("faults") or ""
    return (text.count("SIGKILL") + text.count("hang ") + text.count("out of memory")
            + len(re.findall(r"every step [0-9.]+ s slower", text)))


def measure(res: dict[str, Any], records: dict[tuple[str, int], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    runs = res["runs"]
    by = {(r["scenario"], r["method"], r["seed"]): r for r in runs}
    scenarios = {s["name"]: s for s in res["scenarios"]}
    sw = [r for r in runs if r["method"] == "swarm"]
    rows: list[dict[str, Any]] = []

    def row(target: str, measured: str, met: bool | None, note: str = "") -> None:
        rows.append({"target": target, "measured": measured, "met": met, "note": note})

    fail = [r for r in sw if r["cls"] == "failing"]
    # generator v5: the failing targets hold in each fault origin; a suite without origins is one
    # group, and a run without one among runs with one is a group of its own, never dropped
    if any(r.get("origin") for r in fail):
        for origin in sorted({r.get("origin") or "unknown" for r in fail}):
            group = [r for r in fail if (r.get("origin") or "unknown") == origin]
            failing_targets(group, by, runs, row, f" [{origin}]", per_origin=PER_ORIGIN)
    else:
        failing_targets(fail, by, runs, row, "")
    mild = [(r, by.get((r["scenario"], "plain", r["seed"]))) for r in sw if r["cls"] == "mild"]
    ratios = [r["cpu_total"] / p["cpu_total"] for r, p in mild if p and p.get("cpu_total")]
    row("mild scenarios: <= 1.1x plain's worker CPU", f"median {median(ratios):.2f}x over {len(ratios)} runs "
        f"(each: {', '.join(f'{x:.2f}' for x in ratios)})" if ratios else "no runs",
        bool(ratios) and median(ratios) <= 1.1)
    healthy = [r for r in sw if r["cls"] == "healthy"]
    quiet = sum(1 for r in healthy if not r.get("interventions"))
    row("healthy runs: no applied intervention on >= 95%", f"{quiet}/{len(healthy)}" if healthy else "no runs",
        bool(healthy) and quiet / len(healthy) >= 0.95)
    have = [k for k in ((r["scenario"], r["seed"]) for r in sw) if k in records]
    kept = [iv for k in have for iv in records[k] if iv.get("status") == "kept"]
    no_gain = [iv for iv in kept if iv.get("outcome", {}).get("gain") is not True and iv.get("kind") != "restart"]
    row("zero interventions kept without a measured gain", f"{len(no_gain)} of {len(kept)} kept "
        f"(in {len(have)} of {len(sw)} swarm runs with their records)", (not no_gain) if have else None,
        "a restart is kept when the job trained its window again (a dead job trains none)")
    retries = 0
    for k in have:
        refused = {json.dumps([iv["kind"], iv.get("changes")], sort_keys=True) for iv in records[k] if iv.get("outcome", {}).get("refused")}
        seen: dict[str, int] = {}
        for iv in sorted(records[k], key=lambda x: x.get("created", 0)):
            sig = json.dumps([iv["kind"], iv.get("changes")], sort_keys=True)
            if sig in refused:
                seen[sig] = seen.get(sig, 0) + 1
        retries += sum(n - 1 for n in seen.values())
    row("zero retries of a refused change", f"{retries} (same kind and changes proposed again after a refusal)"
        + ("" if have else ": no swarm run's records to read"), (retries == 0) if have else None)
    over = []
    for r in sw:
        crashes = crashes_of(scenarios.get(r["scenario"]) or {})
        if (r.get("restarts") or 0) > crashes:
            over.append(f"{r['scenario']} s{r['seed']}: {r['restarts']} restarts, {crashes} injected")
    row("restarts <= 1 per injected crash, stall or slow worker", f"{len(over)} runs over" + (f": {'; '.join(over)}" if over else ""),
        not over)
    return rows


def markdown(rows: list[dict[str, Any]], src: str, meta: dict[str, Any]) -> str:
    L = ["# Decision-model targets on the benchmark suite", "",
         f"From `{src}` (code under test: {meta.get('src')}; swarm code state `{meta.get('code_state', {}).get('swarm')}`). "
         "Command: `python benchmarks/suite_targets.py " + src + " --work …`.", "",
         "| target | measured | met |", "|---|---|---|"]
    for r in rows:
        met = "yes" if r["met"] else ("—" if r["met"] is None else "**no**")
        L.append(f"| {r['target']} | {r['measured']}{' (' + r['note'] + ')' if r['note'] else ''} | {met} |")
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", help="a results JSON written by `swarm bench`")
    ap.add_argument("--work", nargs="*", default=[], help="bench work dirs holding the swarm's run folders")
    ap.add_argument("--out", default=None, help="output stem (default: <results stem>_targets)")
    a = ap.parse_args(argv)
    p = pathlib.Path(a.results)
    try:
        res = json.loads(p.read_text())
        res["runs"], res["scenarios"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        print(f"error: {p}: not a results JSON of `swarm bench` ({e})", file=sys.stderr)
        return 2
    rows = measure(res, {**ledger_records(res), **swarm_records([pathlib.Path(w) for w in a.work])})
    out = pathlib.Path(a.out) if a.out else p.with_name(p.stem + "_targets")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    out.with_suffix(".md").write_text(markdown(rows, str(p), res.get("meta", {})))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
