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
    # 0.5 -> 0.3 credibly worse (at once: P(harm) > 0.95), 0.3 -> 0.7 credibly better; the run stopped at 0.95
    assert counts == {"pairs": 2, "undone at look 1": 1, "one look": 1, "kept": 1}
    assert jc.main(["--lags", "0"]) == 2
    assert jc.main(["--effects", "1.5"]) == 2


def test_a_small_fall_waits_for_the_next_look_and_a_harm_is_replayed_as_a_shifted_window():
    # 0.5 -> 0.44 is credible only at 1 - alpha: undone on one look by the rule without confirmation,
    # pending here; the next look (0.43) finds it again and undoes it; (0.52) does not
    assert jc.verdicts([0.5, 0.44, 0.43], 0, 1, 200) == ["one look", "undone at look 2"]
    assert jc.verdicts([0.5, 0.44, 0.52], 0, 1, 200) == ["one look", "pending"]
    assert jc.verdicts([0.5, 0.44], 0, 1, 200) == ["one look", "pending"]        # the run stopped: no second look
    # a change that took the rate down by 0.2: 0.5 -> 0.55 reads as 0.35, undone at once
    assert jc.verdicts([0.5, 0.55], 0, 1, 200, effect=0.2) == ["one look", "undone at look 1"]
