"""One benchmark run in its own process: `python -m swarmbench.worker SPEC.json RESULT.json`.

The runner starts one per run, with the code under test first on PYTHONPATH, so that a crash, a
leaked thread or Ray's state stays in that run, and so that getrusage of the worker's children is
the run's own. SPEC: {method, goal, seed, target, budget, wall_cap, work, progress}. The progress file
gets {cpu_s, wall_s} about every second (the runner's live display reads it); RESULT is written
last, atomically.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import time
import traceback


def main(argv: list[str]) -> int:
    spec = json.loads(pathlib.Path(argv[0]).read_text())
    out = pathlib.Path(argv[1])
    prog = pathlib.Path(spec["progress"])
    last = [0.0]

    def progress(d: dict) -> None:
        now = time.time()
        if now - last[0] >= 1.0:
            last[0] = now
            tmp = prog.with_suffix(".tmp")
            tmp.write_text(json.dumps(d))
            os.replace(tmp, prog)

    from swarmbench.methods import run_method

    t0 = time.time()
    try:
        res = run_method(spec["method"], spec["goal"], int(spec["seed"]), float(spec["target"]), float(spec["budget"]),
                         float(spec["wall_cap"]), pathlib.Path(spec["work"]), progress)
    except Exception:
        res = {"reached": False, "cpu_to_target": None, "cpu_total": None, "curve": [], "wall_s": time.time() - t0,
               "rc": 1, "stop": "error", "log_tail": traceback.format_exc()[-3000:]}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, default=str))
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
