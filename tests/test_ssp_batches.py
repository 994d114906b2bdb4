"""SSP work items with several attempts, through the simulator of the pure core (``bench.sim``): no Dask.

A worker is handed, in one item, several startable shards it holds, each at its own next clock within
the window, and answers with one commit naming each attempt (``JobState.commit_many``, as the
coordinator calls it). Hypothesis draws the cluster (workers, shards each, staleness, stragglers, a
crash, a hang, a join, step times); after every decision of the core the window's, the queue's and the
batch index's invariants hold, the window and the queue agree on every shard, and every member handed
out is a shard the window let start at its own clock. At the end every clock finished, every update
of every clock was applied once; where a worker's shards become startable together, items hold several
attempts (fewer commits than attempts)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.sim import Sim, SimConfig
from dscar.core.shards import ShardStatus
from dscar.core.ssp import ShardPhase

pytestmark = pytest.mark.pure

#: the queue's status of a shard in each window phase, between decisions (``SspSchedule._sync_queue``)
QUEUE_STATUS = {ShardPhase.TODO: ShardStatus.TODO, ShardPhase.RUNNING: ShardStatus.DOING,
                ShardPhase.COMMITTED: ShardStatus.DONE, ShardPhase.APPLYING: ShardStatus.DONE}


class CheckedSim(Sim):
    """``Sim`` that checks the core's invariants after each decision and every SSP item handed out."""

    def __init__(self, cfg: SimConfig):
        super().__init__(cfg)
        #: members of each shard item handed out
        self.item_sizes: list[int] = []

    def _decide(self, name, fn, *args):
        job = self.job
        window = job.window
        before = {s: (window.shard_clock(s), window.phase(s)) for s in range(self.cfg.n_shards)}
        top = window.top
        out = super()._decide(name, fn, *args)
        if name == "next_item" and out is not None and out["op"] == "shard":
            shards = [m["shard"] for m in out["shards"]]
            assert len(shards) == len(set(shards)), out  # a shard once an item
            self.item_sizes.append(len(shards))
            for m in out["shards"]:
                clock, phase = before[m["shard"]]
                if m["backup"]:  # another worker's running attempt: the shard's clock, started already
                    assert phase is ShardPhase.RUNNING and m["clock"] == clock, m
                else:  # a start the window allowed: its own next clock, within the window
                    assert phase is ShardPhase.TODO and m["clock"] == clock <= top, (m, top)
                    assert window.phase(m["shard"]) is ShardPhase.RUNNING
                if window.rebuilding is None:
                    assert (m["shard"], m["clock"] - 1) in window.applied or m["clock"] - 1 <= window.floor
        self._check()
        return out

    def _check(self) -> None:
        job = self.job
        window, queue = job.window, job.queue
        window.check()
        queue.check()
        job.dispatch._batch_index.check()
        if window.recovering:
            return
        for s in range(self.cfg.n_shards):
            assert queue.status(s) is QUEUE_STATUS[window.phase(s)], (s, window.phase(s), queue.status(s))
        for worker, members in job.dispatch.batched.items():  # members that may not have started: running
            for shard, attempt in members:
                assert any(a.attempt == attempt and a.worker == worker for a in queue.running_attempts(shard))


# the pure tier's longest test (11-15 s quiet, 44 s beside four busy loops): the suite's 120 s timeout
# took it once on a machine at load 6-7 (a helper's run, this test's failure message lost)
@pytest.mark.timeout(600)
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# a source lost between its batch's apply and the apply's answer: the job must not hear the batch applied
@example(workers=4, shards_per_worker=3, staleness=0, stragglers=0, crash=True, hang=False, join=False, jitter=0.1,
         backup=False, seed=200)
@given(workers=st.integers(2, 10), shards_per_worker=st.integers(2, 5), staleness=st.integers(0, 2),
       stragglers=st.integers(0, 2), crash=st.booleans(), hang=st.booleans(), join=st.booleans(),
       jitter=st.sampled_from([0.0, 0.1, 0.5]), backup=st.booleans(), seed=st.integers(0, 10_000))
def test_ssp_items_hold_several_shards_each_at_its_own_clock_and_every_update_is_applied_once(
        workers, shards_per_worker, staleness, stragglers, crash, hang, join, jitter, backup, seed):
    cfg = SimConfig(workers, shards_per_worker=shards_per_worker, clocks=5, consistency="ssp", staleness=staleness,
                    step_s=0.1, jitter=jitter, stragglers=min(stragglers, workers - 1),
                    losses=[(0.35, 1)] if crash else [], hangs=[(0.75, 0)] if hang and workers > 2 else [],
                    joins=[0.5] if join else [], policies=("backup",) if backup else (), seed=seed, max_sim_s=600.0)
    sim = CheckedSim(cfg)
    r = sim.run()
    assert r.finished and r.clocks_done == cfg.clocks, (r.error, sim.job.stall_report())
    assert r.exactly_once, f"lost or doubled (clock, shard): {r.lost_shards}"
    assert r.commits <= r.attempts, (r.commits, r.attempts)  # (several attempts an item: the test below)


def test_ssp_items_hold_several_attempts_where_a_worker_holds_several_startable_shards():
    """Without jitter a worker's shards become startable together: its items hold several, and it commits
    fewer times than it ran attempts. (With jitter, tiny clusters may hand out one shard an item
    throughout: Hypothesis found 2 workers x 2 shards, jitter 0.5, with 20 commits for 20 attempts.)"""
    cfg = SimConfig(4, shards_per_worker=4, clocks=5, consistency="ssp", staleness=1, step_s=0.1, jitter=0.0,
                    policies=("backup",), seed=0, max_sim_s=600.0)
    sim = CheckedSim(cfg)
    r = sim.run()
    assert r.finished and r.exactly_once
    assert max(sim.item_sizes) > 1 and r.commits < r.attempts, (sim.item_sizes, r.commits, r.attempts)
