"""The cluster simulation's invariants (benchmarks/cluster_sim.py): determinism, serialised
resources never busier than their capacity, the controller's one-backtest-at-a-time rule capping a
run's arm throughput whatever the nodes, the placement rules, and the saturation point moving with
the tick's cost. Short simulated spans: the whole file runs in a few seconds."""
from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

_spec = importlib.util.spec_from_file_location(
    "cluster_sim", pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "cluster_sim.py")
cs = importlib.util.module_from_spec(_spec)
sys.modules["cluster_sim"] = cs    # its dataclasses resolve their annotations through it
_spec.loader.exec_module(cs)


def sim(**kw):
    return cs.simulate(cs.Params(**{"hours": 0.5, **kw}))


def test_same_seed_same_result_and_another_seed_differs():
    a = sim(nodes=4, runs=4, placement="pinned", seed=3)
    b = sim(nodes=4, runs=4, placement="pinned", seed=3)
    c = sim(nodes=4, runs=4, placement="pinned", seed=4)
    assert a == b
    assert a["counts"] != c["counts"]


@pytest.mark.parametrize("over", [
    {"status_head_cpu_s": 0.05, "status_rtt_s": 0.05},     # each status request costs the Jobs API 50 ms
    {"tick_cpu_s": 2.0, "controller_cores": 1},             # each tick 2 s of the controllers' one core
])
def test_serialised_resources_never_busier_than_their_capacity(over):
    r = sim(nodes=16, runs=16, placement="head", fault_per_h=6.0, **over)
    u = r["utilisation"]
    key = "jobs_api" if "status_head_cpu_s" in over else "controller_host_cpu"
    assert u[key] > 0.9, u   # the demand does reach saturation
    for k, v in u.items():
        if k != "controller_host_mem":   # a memory share, not a queue: it may exceed 1
            assert 0.0 <= v <= 1.0 + 1e-9, (k, v)
    assert (r["api_wait_ms"] if key == "jobs_api" else r["host_wait_ms"]) > 0


@pytest.mark.parametrize("placement", ["pinned", "head"])
def test_one_run_backtests_one_at_a_time_so_its_arms_do_not_grow_with_nodes(placement):
    # Deciding.backtest blocks the controller's loop: one run's arms run at most a look at a time
    rows = [sim(nodes=n, runs=1, placement=placement, fault_per_h=4.0, hours=1.0) for n in (4, 16, 64)]
    assert rows[0]["arms_per_hour"] > 0
    assert len({r["arms_per_hour"] for r in rows}) == 1, [r["arms_per_hour"] for r in rows]


def test_as_shipped_every_job_runs_on_the_head_node():
    r = sim(nodes=8, runs=8, placement="head")
    u, ld = r["utilisation"], r["load"]
    assert u["nodes"] == pytest.approx(u["head_node"] / 8, abs=1e-3)   # the other 7 nodes never compute
    assert ld["head_node"] > 4 and r["live_training_share"] < 0.2


def test_pinned_on_one_node_the_paused_live_job_keeps_the_arms_out():
    # the paused trainer holds its slot, so the arms wait until run_arms' timeout
    r = sim(nodes=1, runs=1, placement="pinned", fault_per_h=4.0, hours=1.5)
    assert r["counts"]["arms"] > 0 and r["counts"]["arms_done"] == 0
    assert r["counts"]["arms_timed_out"] > 0
    assert r["waits_max_s"]["pause"] >= cs.Params().arm_timeout_s


def test_spare_nodes_let_arms_start_at_once():
    r = sim(nodes=12, runs=2, placement="pinned", fault_per_h=4.0)   # 2 live jobs + 2 looks of 4 arms fit
    assert r["counts"]["arms_done"] > 0 and r["counts"]["arms_timed_out"] == 0
    assert r["waits_max_s"]["arm_queue"] == 0


def test_doubling_the_tick_cost_moves_the_saturation_point_down():
    def point(tick_cpu_s):
        pts = [(n, sim(nodes=n, runs=n, placement="pinned", tick_cpu_s=tick_cpu_s, controller_cores=1, hours=0.1,
                       crash_per_h=0.0, fault_per_h=0.0)["utilisation"]["controller_host_cpu"]) for n in (1, 2, 4, 8, 16)]
        return cs.saturation(pts)

    once, twice = point(0.15), point(0.3)
    assert once is not None and twice is not None
    assert twice < once


def test_slower_storage_keeps_the_controller_busier():
    fast, slow = (sim(nodes=4, runs=2, placement="pinned", storage_s=ms / 1000) for ms in (1, 80))
    assert slow["utilisation"]["controller_loop"] > fast["utilisation"]["controller_loop"]


def test_bottleneck_is_the_first_resource_to_saturate_as_nodes_grow():
    def row(n, api, host):
        return {"nodes": n, "load": {}, "utilisation": {"jobs_api": api, "controller_host_cpu": host}}

    rows = [row(1, 0.9, 0.0), row(8, 0.1, 0.2), row(64, 0.3, 0.8)]   # one node is left out
    name, sat = cs.bottleneck(rows, ("jobs_api", "controller_host_cpu"))
    assert name == "controller_host_cpu"
    assert sat["controller_host_cpu"] == pytest.approx(64 + 0.1 * 56 / 0.6)
    assert cs.saturation([(8, 0.5), (64, 0.4)]) is None


def test_bad_params_are_refused_by_name():
    with pytest.raises(ValueError, match="placement='spread'"):
        cs.Params(placement="spread")
    with pytest.raises(ValueError, match="nodes=0"):
        cs.Params(nodes=0)
