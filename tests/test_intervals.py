"""Checkpoint intervals from measurements and the live rework estimate (``dscar.core.intervals``; no cluster),
then the automatic interval on a real cluster."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dscar
from dscar import CheckpointConfig
from dscar.core.intervals import IntervalPlanner, expected_waste, rework_estimate, young_daly_s

from conftest import RowCounter, row_data


def test_young_daly_is_sqrt_2_cost_mtbf_and_minimises_the_expected_waste():
    assert young_daly_s(2.0, 100.0) == pytest.approx(20.0)
    cost, mtbf, clock = 0.5, 3600.0, 0.1
    best = young_daly_s(cost, mtbf) / clock
    grid = np.linspace(best / 4, best * 4, 401)
    waste = [expected_waste(p, clock, cost, mtbf) for p in grid]
    assert grid[int(np.argmin(waste))] == pytest.approx(best, rel=0.02)


def test_the_planner_keeps_the_configured_period_until_it_has_a_cost_and_an_mtbf():
    p = IntervalPlanner(default_period=10, mtbf_s=None, started=0.0)  # the first clock began at t = 0
    assert p.due(1)  # a first checkpoint early: it measures a cost
    p.record_cost(0.08)
    for _ in range(5):
        p.record_clock(0.02)
    p.taken(1)
    choice = p.replan(now=5.0)
    assert choice["period"] == 10 and choice["mtbf_source"] == "unknown" and not p.due(10) and p.due(11)
    p.abandoned()  # that version never completes (a writer was lost): the next clock end takes one
    assert p.due(2)
    p.replan(now=5.0)
    p.record_loss()  # one loss in 50 s of job time: MTBF observed as 50 s
    choice = p.period(now=50.0)
    assert choice["mtbf_source"] == "observed" and choice["mtbf_s"] == pytest.approx(50.0)
    assert choice["period"] == round(math.sqrt(2 * 0.08 * 50.0) / 0.02) and choice["source"] == "young-daly"


@given(cost=st.floats(1e-4, 10.0), mtbf=st.floats(1.0, 1e6), clock=st.floats(1e-3, 10.0))
@settings(max_examples=200, deadline=None)
def test_a_configured_mtbf_gives_the_young_daly_period_in_whole_clocks_at_least_one(cost, mtbf, clock):
    p = IntervalPlanner(default_period=10, mtbf_s=mtbf)
    p.record_cost(cost)
    p.record_clock(clock)
    period = p.period(now=0.0)["period"]
    assert period >= 1 and period == max(1, round(young_daly_s(cost, mtbf) / clock))


def test_rework_estimate_is_the_age_under_full_recovery_and_the_lost_share_under_partial():
    unsaved = {"a": 9.0, "b": 16.0}  # norms 3 and 4 of a total 5
    assert rework_estimate(6, "full", unsaved) == 6
    assert rework_estimate(6, "partial", unsaved) == pytest.approx(6 * 4 / 5)
    assert rework_estimate(0, "partial", unsaved) == 0
    assert rework_estimate(4, "partial", {"a": 0.0, "b": 0.0}) == pytest.approx(2.0)  # no change measured: 1/W
    assert rework_estimate(6, "partial", unsaved, memory=True) == pytest.approx(4 / 5)  # a buddy's copy: age <= 1


def test_the_automatic_interval_follows_the_measured_cost_on_a_cluster(tmp_path):
    """With interval="auto" and an MTBF, every checkpoint after the first is taken one Young/Daly
    period (from the costs and clock times the job measured, reported in the event) after the
    previous one, and every clock reports the age and rework estimate of the newest checkpoint."""
    mtbf = 0.5  # short: the period (~sqrt(MTBF)) stays well inside the run even when a busy machine slows it
    cfg = CheckpointConfig(str(tmp_path), policy="full", every=100, recovery="partial", interval="auto", mtbf=mtbf)
    with dscar.Cluster(n_workers=2, processes=False) as cl:
        res = dscar.fit(RowCounter(sleep=0.002), row_data(40), cl, n_shards=4, max_clocks=60, checkpoint=cfg)
    chosen = [e for e in res.events if e["kind"] == "checkpoint-interval"]
    started = [e["clock"] for e in res.events if e["kind"] == "checkpoint-started"]
    assert started[0] == 1 and chosen, res.events
    assert chosen[0]["source"] == "configured every" and chosen[0]["period"] == 100  # no cost measured yet
    measured = chosen[1:]
    assert measured, chosen
    for e in measured:
        assert e["source"] == "young-daly" and e["mtbf_source"] == "configured" and e["mtbf_s"] == mtbf
        assert e["period"] == max(1, round(math.sqrt(2 * e["cost_s"] * mtbf) / e["clock_s"]))
    # the configured every=100 would have checkpointed once in 60 clocks (on a busy machine the measured cost
    # and so the period grow: a second checkpoint is what the run can promise, each one period after the last)
    assert len(started) >= 2, started
    in_force, last = None, None
    for e in res.events:  # each checkpoint comes one period (the one in force then) after the previous
        if e["kind"] == "checkpoint-interval":
            in_force = (e["time"], e["period"])
        elif e["kind"] == "checkpoint-started":
            if last is not None:
                # a start re-plans at once (same time): the period that made it due was chosen before
                assert e["clock"] - last == decided, (started, chosen)
            last = e["clock"]
        if in_force is not None and not (e["kind"] == "checkpoint-interval" and any(
                x["kind"] == "checkpoint-started" and x["time"] == e["time"] for x in res.events)):
            decided = in_force[1]
    for rec in res.history:
        est = rec.checkpoint
        assert est is not None and 0 <= est["rework_estimate"] <= est["age"]


def test_a_worker_restarted_by_policy_is_not_counted_as_a_failure():
    """The observed MTBF counts failures: a straggler restarted on purpose is not one."""
    from dscar.core.job import JobConfig, JobState
    from dscar.core.partitions import PartitionMap, TableLayout
    from dscar.core.shards import ShardQueue

    pm = PartitionMap([TableLayout("w", 10, 2)])
    pm.owners = {("w", 0): "a", ("w", 1): "b"}
    cfg = JobConfig("j", 2, {"w": "param"}, [], [""], CheckpointConfig("x", interval="auto"))
    job = JobState(cfg, ShardQueue(2, reloadable=True), pm)
    job.workers = ["a", "b", "c"]
    job.pending_restarts = ["c"]
    job.begin(1, now=0.0)
    job.lose("c", now=1.0)
    assert job.checkpoints.interval.losses == 0
    job.lose("b", now=2.0)
    assert job.checkpoints.interval.losses == 1 and job.checkpoints.interval.mtbf(now=2.0) == (2.0, "observed")
