"""The bench's sittings: which machine measured a row, and the speed factors fitted between them
(swarmbench.machine)."""
from __future__ import annotations

import time

import pytest


# ---- sittings and their speeds -------------------------------------------------------------------

def _row(sitting, method, scenario, cpu, t, seed=0, ref=None, steps=300, capped=False, wall=30.0, label=True):
    return {"key": f"{scenario}|{method}|{seed}", "scenario": scenario, "scenario_hash": scenario, "method": method,
            "seed": seed, "code_state": "c0", "cpu_total": cpu, "steps": steps, "capped": capped, "wall_s": wall,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)), "machine_ref_cpu_s": ref,
            **({"sitting": sitting} if label else {})}


def test_sitting_speeds_come_from_repeated_runs_not_from_a_noisy_reference():
    """Sitting a's machine is 3x slower than b's, but its reference says 13/2.8 = 4.6x: the factor
    follows the four oracle and plain runs measured in both. Capped runs, runs of other lengths and
    runs of a method that is not one fixed trainer run do not count. A sitting that no repeated run
    links to another gets the ratio of the references."""
    from swarmbench import machine

    t0 = 1.8e9
    rows = []
    for i, (method, work) in enumerate([("oracle", 10.0), ("plain", 20.0), ("oracle", 7.0), ("plain", 15.0)]):
        rows.append(_row("boot:a", method, f"s{i}", 3.0 * work * (1.02 if i % 2 else 0.98), t0 + 60 * i, ref=13.0))
        rows.append(_row("boot:b", method, f"s{i}", work, t0 + 86400 + 60 * i, ref=2.8))
    rows.append(_row("boot:a", "oracle", "capped", 90.0, t0 + 600, ref=13.0, capped=True))
    rows.append(_row("boot:b", "oracle", "capped", 5.0, t0 + 86400 + 600, ref=2.8, capped=True))
    rows.append(_row("boot:a", "plain", "short", 90.0, t0 + 700, ref=13.0, steps=90))
    rows.append(_row("boot:b", "plain", "short", 5.0, t0 + 86400 + 700, ref=2.8, steps=80))
    rows.append(_row("boot:a", "swarm", "s0", 200.0, t0 + 800, ref=13.0))
    rows.append(_row("boot:b", "swarm", "s0", 10.0, t0 + 86400 + 800, ref=2.8))
    rows.append(_row("boot:c", "swarm", "s9", 10.0, t0 + 2 * 86400, ref=5.6))
    sp = machine.fit_speeds(rows, here="boot:b", here_ref=2.8)
    by = {s.name: s for s in sp.sittings}
    assert sp.base == "boot:b" and by["boot:b"].factor == pytest.approx(1.0)
    assert by["boot:a"].factor == pytest.approx(1 / 3, rel=0.02) and by["boot:a"].how == "repeated runs"
    assert by["boot:a"].anchors == 4 and by["boot:a"].spread == pytest.approx(0.02, abs=0.005)
    assert by["boot:c"].how == "reference workload" and by["boot:c"].anchors == 0
    c_implied = [2.8 / 5.6, 13.0 / 5.6 * by["boot:a"].factor]          # through b, and through a
    assert min(c_implied) <= by["boot:c"].factor <= max(c_implied)
    assert sp.of_row(rows[0]) == pytest.approx(by["boot:a"].factor)
    assert sp.ratio("boot:b", "boot:a") == pytest.approx(3.0, rel=0.02)


def test_old_rows_are_one_sitting_where_their_runs_overlap_and_two_where_a_gap_parts_them():
    """Rows written before rows named their sitting carry only their process's reference: two
    processes whose runs overlap in time wrote into one ledger on one machine (one sitting, whatever
    their references said); rows with no reference, hours apart with nothing running between, may
    be two machines (two sittings, linked only by their repeated runs). Two boots never merge."""
    from swarmbench import machine

    t0 = 1.8e9
    rows = [_row(None, "plain", "p", 10.0, t0 + 100, ref=2.7, wall=200, label=False),
            _row(None, "swarm", "q", 12.0, t0 + 250, ref=5.0, wall=200, label=False),
            _row(None, "oracle", "x", 10.0, t0 + 10_000, label=False),
            _row(None, "oracle", "y", 10.0, t0 + 10_100, label=False),
            _row(None, "oracle", "x", 30.0, t0 + 20_000, label=False),
            _row(None, "oracle", "y", 30.0, t0 + 20_100, label=False),
            _row("boot:a", "oracle", "z", 10.0, t0 + 30_000, wall=100),
            _row("boot:b", "oracle", "z", 10.0, t0 + 30_050, wall=100)]
    sp = machine.fit_speeds(rows, here="boot:a")
    names = {sp.sitting_of_row(r) for r in rows[:2]}
    assert len(names) == 1                                   # 2.7 and 5.0: one sitting
    one = next(s for s in sp.sittings if s.name in names)
    assert one.labels == ["ref:2.7", "ref:5"] and one.ref_cpu_s == pytest.approx(3.85)
    old = [sp.sitting_of("unlabelled", machine._row_time(r)) for r in rows[2:6]]
    assert old[0] == old[1] != old[2] == old[3]
    factors = {s.name: s.factor for s in sp.sittings}
    assert factors[old[0]] / factors[old[2]] == pytest.approx(3.0, rel=1e-3)  # the same runs cost 3x in the later one
    assert sp.sitting_of("boot:a") != sp.sitting_of("boot:b")


def test_the_reference_is_measured_once_per_sitting_and_shared(tmp_path):
    from swarmbench import machine

    calls = []

    def measure():
        calls.append(1)
        return 2.5 + len(calls)

    assert machine.shared_reference(tmp_path, "boot:a", measure) == 3.5
    assert machine.shared_reference(tmp_path, "boot:a", measure) == 3.5      # a second process of the sitting
    assert machine.shared_reference(tmp_path, "boot:b", measure) == 4.5      # another sitting measures its own
    assert len(calls) == 2
    assert machine.cached_reference(tmp_path, "boot:a") == 3.5 and machine.cached_reference(tmp_path, "boot:c") is None
