"""`swarm bench SUITE ...`: the benchmark suite's command line (`swarm bench` finds it through the
`swarmlab.cli` entry point; `python -m swarmbench.cli` runs it as well).

    swarm bench SUITE [--methods plain oracle pbt pb2 asha swarm] [--seeds 0 1 2 | 0-2]
                      [--more-seeds 1 2 --more-on 5] [--parallel N] [--name NAME]
                      [--src head|worktree|COMMIT] [--workdir DIR] [--results DIR] [--cache DIR]
    swarm bench generate FOLDER --seeds 100-139       write generated scenarios into a suite folder

SUITE: a folder of scenario/goal YAML files, a name under benchmarks/suites/, or `public` (the
example goals, examples/goals/). Bad input: one line naming the option and the value, exit code 2.
"""
from __future__ import annotations

import argparse
import pathlib
import shlex
import sys

from swarmbench import machine
from swarmbench.methods import METHODS
from swarmbench.runner import ROOT, Bench, BenchConfig, live_display, log_display
from trainer.config import ConfigError



def parse_take(items: list[str]) -> dict[str, int]:
    """`failing=20 mild=4` -> {"failing": 20, "mild": 4}; a bad item is a ValueError naming it."""
    out: dict[str, int] = {}
    for it in items:
        k, eq, v = it.partition("=")
        if not eq or not v.strip().isdigit():
            raise ValueError(f"--take {it!r}: expected CLASS=N, e.g. failing=20")
        out[k.strip()] = int(v)
    return out

def resolve_suite(name: str) -> pathlib.Path:
    if name == "public":
        return ROOT / "examples" / "goals"
    p = pathlib.Path(name)
    if p.is_dir():
        return p
    q = ROOT / "benchmarks" / "suites" / name
    if q.is_dir():
        return q
    raise ConfigError(f"SUITE={name!r}: not a folder, nor a suite under benchmarks/suites/, nor 'public'")


def _error(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    from swarmbench.scenarios import parse_seeds, write_suite

    if argv[:1] == ["generate"]:
        ap = argparse.ArgumentParser(prog="swarm bench generate", description="write generated scenarios into a suite folder")
        ap.add_argument("folder")
        ap.add_argument("--seeds", nargs="+", required=True, help="seeds or ranges, e.g. 100-139")
        a = ap.parse_args(argv[1:])
        try:
            for p in write_suite(a.folder, parse_seeds(a.seeds)):
                print(p)
        except ConfigError as e:
            return _error(str(e))
        return 0
    ap = argparse.ArgumentParser(prog="swarm bench", description="run a benchmark suite: calibrate, run each method x seed, "
                                 "write JSON + markdown + plots under benchmarks/results (resumable)")
    ap.add_argument("suite", help="folder of scenario YAML files, a name under benchmarks/suites/, or 'public'")
    ap.add_argument("--methods", nargs="+", default=["plain", "oracle", "pbt", "asha", "swarm"], help=f"of {', '.join(METHODS)}")
    ap.add_argument("--seeds", nargs="+", default=["0"], help="run seeds on every scenario (ranges like 0-2 allowed)")
    ap.add_argument("--more-seeds", nargs="*", default=[], help="extra run seeds on the first --more-on failing scenarios")
    ap.add_argument("--more-on", type=int, default=0, help="how many failing scenarios get --more-seeds")
    ap.add_argument("--more-methods", nargs="*", default=None,
                    help="the methods run on the extra seeds (default: every one of --methods)")
    ap.add_argument("--take", nargs="*", default=[], metavar="CLASS=N",
                    help="run only the first N scenarios of a class in suite order, e.g. failing=20 mild=4 healthy=2 "
                         "(the rest are calibrated until every named class has its N, then left alone)")
    ap.add_argument("--per-origin", action="store_true",
                    help="the failing count of --take and --more-on hold for each fault origin (config, drift, data, "
                         "infra; generator v5): e.g. --take failing=8 --more-on 3 --per-origin")
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time (each also waits for its cores: --cores)")
    ap.add_argument("--cores", type=int, default=None,
                    help="cores the bench processes on this machine share (default: all); a run holds the cores its "
                         "method keeps busy (plain, oracle 1; PBT, PB2, ASHA, swarm 2) while it runs")
    ap.add_argument("--machine-ref", type=float, default=None, metavar="CPU_S",
                    help="this machine's reference workload in CPU-s (default: measured at the start, ~1 min)")
    ap.add_argument("--calibrated-only", action="store_true",
                    help="run only the scenarios already calibrated (in the cache), calibrating none: e.g. the swarm "
                         "on the scenarios another bench process has calibrated")
    ap.add_argument("--name", default=None, help="results name (default: suite_<folder name>)")
    ap.add_argument("--src", default=None, help="head: a snapshot of git HEAD (default); worktree: the working tree; "
                    "a commit: a snapshot of it (e.g. the swarm measured at a fixed commit while development goes on); "
                    "with --report-only: report the rows of that code (default: of the benches that ran)")
    ap.add_argument("--workdir", default=None, help="where runs write (default: a new temporary folder)")
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--cache", default=str(ROOT / "benchmarks" / "cache" / "calibration"), help="calibration cache")
    ap.add_argument("--seed-note", default="", help="a sentence for the results (e.g. which seed range is which)")
    ap.add_argument("--report-only", action="store_true", help="only rewrite the results from the ledger and the "
                    "calibration cache (nothing runs; e.g. while another process runs the bench)")
    a = ap.parse_args(argv)
    try:
        cfg = BenchConfig(suite=str(resolve_suite(a.suite)), methods=a.methods, seeds=parse_seeds(a.seeds),
                          more_seeds=parse_seeds(a.more_seeds), more_on=a.more_on, more_methods=a.more_methods, take=parse_take(a.take), per_origin=a.per_origin, parallel=a.parallel, calibrated_only=a.calibrated_only, name=a.name,
                          cores=a.cores, machine_ref=a.machine_ref, results=a.results, cache=a.cache, src=a.src or "head", workdir=a.workdir,
                          command="swarm bench " + " ".join(shlex.quote(x) for x in argv), seed_note=a.seed_note)
        if a.report_only and a.src is None:
            cfg.src = "worktree"   # nothing runs: no snapshot needed (the code states are the session's)
        bench = Bench(cfg)
    except (ConfigError, ValueError) as e:
        return _error(str(e).replace("\n", " "))
    if a.report_only:
        bench.adopt_session(code=a.src is None)
        bench.load_cached_calibrations()
        bench.write_results()
        print(f"wrote {pathlib.Path(cfg.results) / (bench.name + '.md')} and .json ({len(bench.current_rows())} runs)")
        return 0
    import signal

    def interrupt(signum, frame):   # SIGTERM, and SIGINT in a background job (where it starts ignored)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    from rich.console import Console

    console = Console()
    show = live_display(console) if console.is_terminal else log_display()
    print(f"swarm bench {bench.name}: {len(bench.scenarios)} scenarios, code {bench.src_desc}, work dir {bench.work}", flush=True)
    if bench.machine_ref is None and machine.cached_reference(bench.slots.folder, bench.sitting) is None:
        print("measuring this machine's reference workload (every core slot held) ...", flush=True)
    try:
        bench.run(show)
    except KeyboardInterrupt:
        show.stop()
        print(f"interrupted: finished runs are in {bench.ledger.path}; the same command resumes", file=sys.stderr)
        return 130
    show.stop()
    out = pathlib.Path(cfg.results)
    print(f"wrote {out / (bench.name + '.md')} and .json ({len(bench.current_rows())} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
