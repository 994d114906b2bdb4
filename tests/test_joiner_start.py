"""A worker that joins mid-fit, or that its Nanny restarts, is busy setting up its plugins before it can
answer anything (its event loop imports dscar's modules: several seconds on a loaded machine). The
coordinator's hang watch must not take that silence for a hung worker: issue 41's churn counted healthy
joiners removed then as losses (36 losses for 34 kills)."""
from __future__ import annotations

import time

import numpy as np
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

import dscar
from bench.chaos import CHECK_KEYS, ExactlyOnce
from dscar.scheduler.coordinator import PLUGIN_NAME

#: seconds a joiner's event loop is blocked as it sets up: past the hang watch's limit (dscar.hang-timeout
#: 3 s of silence, then a probe of 1.5 s), which removed it before a joiner's start had a grace
BLOCKED_S = 8.0


class SlowStart(WorkerPlugin):
    """Blocks the event loop of each worker not among ``present`` for ``seconds`` as it is set up, as a
    long import does; registered before dscar's plugin, so the worker has not said hello yet."""

    name = "dscar-test-slow-start"

    def __init__(self, present: list[str], seconds: float):
        self.present, self.seconds = set(present), seconds

    def setup(self, worker) -> None:
        if worker.address not in self.present:
            time.sleep(self.seconds)


class GrowOnce(ExactlyOnce):
    """``ExactlyOnce`` that adds a worker after ``at`` clocks and stops 2 clocks after the joiner holds a
    shard (it ran one), or once a worker was removed."""

    def __init__(self, clocks: int, work_s: float, at: int):
        super().__init__(clocks, work_s)
        self.at = at
        self.cluster = None
        self.first: set[str] = set()  #: the workers before the join
        self.working_at: int | None = None  #: the clock at whose end the joiner first held a shard

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("cluster", "first", "working_at")}

    def converged(self, history, tol) -> bool:
        if len(history) == self.at:
            self.first = set(self.cluster.scheduler.workers)
            self.cluster.scale(3)
        job = next(iter(self.cluster.scheduler.plugins[PLUGIN_NAME].jobs.values()))
        if any(e["kind"] == "worker-removed" for e in job.events):
            return True  # (the failure this test looks for: no need to go on)
        if self.first and self.working_at is None:
            if {job.queue.holder(s) for s in range(job.queue.n_shards)} - self.first:
                self.working_at = len(history)
        return self.working_at is not None and len(history) >= self.working_at + 2


def test_a_joiner_busy_setting_up_is_not_taken_for_a_hung_worker():
    clocks = 400  # (a cap: the fit stops once the joiner has run shards)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        with Client(lc) as c:
            c.register_plugin(SlowStart(list(lc.scheduler.workers), BLOCKED_S))  # before dscar's: no hello yet
        cl = dscar.connect(lc)
        algo = GrowOnce(clocks, work_s=0.05, at=2)
        algo.cluster = lc
        res = dscar.fit(algo, {"x": np.arange(6.0)}, cl, n_shards=6, max_clocks=clocks, progress=False)
    kinds = [e["kind"] for e in res.events]
    joined = [e["worker"] for e in res.events if e["kind"] == "worker-joined"]
    assert len(joined) == 1
    assert not {"worker-removed", "worker-lost", "recovery-started"} & set(kinds), [
        e for e in res.events if e["kind"] in ("worker-removed", "worker-lost")]
    assert joined[0] in {e["worker"] for e in res.events if e["kind"] == "worker-ready"}
    assert any(joined[0] in r.shards_per_worker for r in res.history)  # it works once set up
    assert not any(r.skipped for r in res.history)
    for r in res.history:  # and every update was applied once
        assert all(r.metrics[k] == 0 for k in CHECK_KEYS), (r.clock, r.metrics)
