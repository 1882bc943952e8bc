"""benchmarks/judge_calibration.py: each pair of evals is judged as the judge judges a change
applied at the first, and only the stretch before the run's target counts."""
from __future__ import annotations

import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("judge_calibration", ROOT / "benchmarks" / "judge_calibration.py")
jc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(jc)


def test_pairs_are_judged_before_the_target_only(tmp_path):
    results = tmp_path / "suite_x.json"
    results.write_text(json.dumps({"runs": [
        {"method": "oracle", "scenario": "s", "target": 0.9, "curve": [[1, 0.5], [2, 0.3], [3, 0.7], [4, 0.95], [5, 0.1]]},
        {"method": "plain", "scenario": "s", "target": 0.9, "curve": [[1, 0.5], [2, 0.0]]}]}))
    (tmp_path / "other.json").write_text("[]")
    runs = jc.curves([results, tmp_path / "other.json"])
    assert runs == [("suite_x", "s", 0.9, [0.5, 0.3, 0.7, 0.95, 0.1])]      # the oracle's only
    counts = jc.replay(runs, 1, 200)["all"]
    # 0.5 -> 0.3 credibly worse, 0.3 -> 0.7 credibly better; the run stopped at 0.95
    assert counts == {"undone": 1, "kept": 1}
    assert jc.main(["--lags", "0"]) == 2
