"""How far training grows the weights past their untrained size: each SFT family of the suite at
its healthy lr, at 10x and at 30x it, from its random init (the trainer's `weight_growth`, the
weights' norm over the freshly built model's). The threshold the controller reads
(`agents.step_detectors.NORM_GROWN`, 1.5) must sit between the healthy runs and the inflated ones.

    python benchmarks/weight_growth.py [--steps 200]

Writes benchmarks/results/weight_growth.{json,md}: the growth after 30, 100 and the last step.
"""
from __future__ import annotations

import argparse
import copy
import json
import pathlib
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

from agents.step_detectors import NORM_GROWN  # noqa: E402
from swarmbench.scenarios import FAMILIES  # noqa: E402
from trainer.config import RunConfig  # noqa: E402
from trainer.loop import Trainer  # noqa: E402

MULTIPLES = (1, 10, 30)
AT = (30, 100)


def growth(run: dict, lr_times: float, steps: int, out_dir: str, name: str) -> list[float]:
    r = copy.deepcopy(run)
    r["recipe"].update(lr=r["recipe"]["lr"] * lr_times, steps=steps, eval_interval=0)
    r.update(name=name, out_dir=out_dir, checkpoint={"interval": 0}, samples_per_step=0)
    rows: list[dict] = []
    Trainer(RunConfig.model_validate(r), on_step=rows.append).run()
    return [x["weight_growth"] for x in rows if "weight_growth" in x]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    if args.steps <= max(AT):
        ap.error(f"--steps must be above {max(AT)}")
    out: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fam in FAMILIES.values():
            if fam.grpo:
                continue
            for k in MULTIPLES:
                g = growth(fam.run, k, args.steps, tmp, f"{fam.name}-x{k}")
                out.setdefault(fam.name, {})[f"x{k}"] = [round(g[i - 1], 3) for i in (*AT, len(g))]
                print(fam.name, f"x{k}", out[fam.name][f"x{k}"], flush=True)
    res = HERE / "results"
    (res / "weight_growth.json").write_text(json.dumps({"steps": args.steps, "norm_grown": NORM_GROWN,
                                                        "growth": out}, indent=1) + "\n")
    lines = [f"# The weights' growth over their untrained size (`python benchmarks/weight_growth.py --steps {args.steps}`)",
             "", f"Each SFT family of the suite from its random init at its healthy lr and at 10x and 30x it; the "
             f"controller's threshold is {NORM_GROWN}. Cells: growth after {AT[0]} / {AT[1]} / {args.steps} steps.", "",
             "| family | healthy lr | 10x | 30x |", "|---|---|---|---|"]
    for fam, cells in out.items():
        lines.append(f"| {fam} | " + " | ".join(" / ".join(f"{v:.3g}" for v in cells[f"x{k}"]) for k in MULTIPLES) + " |")
    (res / "weight_growth.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
