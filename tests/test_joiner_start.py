"""A worker that joins mid-fit, or that its Nanny restarts, is busy setting up its plugins before it can
answer anything (its event loop imports dscar's modules: several seconds on a loaded machine). The
coordinator must not take that silence for a hung worker (issue 41's churn counted healthy joiners
removed then as losses: 36 losses for 34 kills), nor wait for it: no apply pass and no hand-off goes to
a worker that is still setting up and has nothing of the job."""
from __future__ import annotations

import threading
import time

import numpy as np
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

import dscar
from bench.worker_models import CHECK_KEYS, ExactlyOnce
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


def wait_for(cond, timeout: float = 60.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.01)


class GrowOnce(ExactlyOnce):
    """``ExactlyOnce`` that adds a worker after ``at`` clocks and stops 2 clocks after the joiner holds a
    shard (it ran one), or once a worker was removed."""

    converged_on_workers = False  # (its hook runs in the driver's process)

    def __init__(self, clocks: int, work_s: float, at: int, retire: bool = False):
        super().__init__(clocks, work_s)
        self.at, self.retire = at, retire
        self.cluster = None
        self.client = None  #: retires an owner once the joiner is in the cluster (``retire``)
        self.thread: threading.Thread | None = None
        self.first: set[str] = set()  #: the workers before the join
        self.working_at: int | None = None  #: the clock at whose end the joiner first held a shard

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("cluster", "first", "working_at", "client", "thread")}

    def converged(self, history, tol) -> bool:
        coordinator = self.cluster.scheduler.plugins[PLUGIN_NAME]
        job = next(iter(coordinator.jobs.values()))
        if len(history) == self.at:
            self.first = set(self.cluster.scheduler.workers)
            self.cluster.scale(len(self.first) + 1)
            if self.retire:  # once the joiner is in the cluster, setting up: an owner leaves
                wait_for(lambda: len(self.cluster.scheduler.workers) > len(self.first))
                leaver = sorted(set(job.pmap.owners.values()))[0]
                self.thread = threading.Thread(target=self.client.retire_workers, kwargs={"workers": [leaver]})
                self.thread.start()
                wait_for(lambda: leaver in coordinator.elastic.leaving or leaver in job.lost)
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


def clock_of(res, kind: str) -> int:
    return next(e["clock"] for e in res.events if e["kind"] == kind)


def test_clocks_go_on_while_a_joiner_sets_up():
    """The joiner is live from its registration, but owns and holds nothing: the apply passes leave it
    out, so the clocks run on the others meanwhile instead of waiting in an apply for its set-up."""
    clocks = 400
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        with Client(lc) as c:
            c.register_plugin(SlowStart(list(lc.scheduler.workers), BLOCKED_S))
        cl = dscar.connect(lc)
        algo = GrowOnce(clocks, work_s=0.05, at=2)
        algo.cluster = lc
        res = dscar.fit(algo, {"x": np.arange(6.0)}, cl, n_shards=6, max_clocks=clocks, progress=False)
    # BLOCKED_S of set-up: many clocks of 3 x 0.05 s (one, the apply waiting for it, without the fix)
    assert clock_of(res, "worker-ready") - clock_of(res, "worker-joined") >= 5, [
        (e["kind"], e["clock"]) for e in res.events if e["kind"].startswith("worker")]
    assert not any(r.skipped for r in res.history)
    for r in res.history:
        assert all(r.metrics[k] == 0 for k in CHECK_KEYS), (r.clock, r.metrics)


def test_a_retirement_while_a_joiner_sets_up_hands_off_to_the_others_at_once():
    """An owner retired while a joiner sets up hands off at the next boundary to the workers that are
    set up: the joiner, owning nothing, is the least loaded, but a copy to it would hold the boundary
    until its set-up is over."""
    clocks = 400
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        with Client(lc) as c:
            c.register_plugin(SlowStart(list(lc.scheduler.workers), BLOCKED_S))
        cl = dscar.connect(lc)
        algo = GrowOnce(clocks, work_s=0.05, at=2, retire=True)
        algo.cluster, algo.client = lc, cl.client
        res = dscar.fit(algo, {"x": np.arange(6.0)}, cl, n_shards=6, max_clocks=clocks, progress=False)
        algo.thread.join(60)
    kinds = [e["kind"] for e in res.events]
    handoff = [e for e in res.events if e["kind"] == "handoff"]
    assert len(handoff) == 1 and handoff[0]["failed"] == 0 and handoff[0]["partitions"] > 0
    assert not {"worker-removed", "worker-lost", "recovery-started"} & set(kinds)
    # the hand-off did not wait for the joiner: clocks ran between it and the joiner's readiness
    assert clock_of(res, "worker-ready") - handoff[0]["clock"] >= 3, [
        (e["kind"], e["clock"]) for e in res.events if e["kind"].startswith("worker") or e["kind"] == "handoff"]
    assert not any(r.skipped for r in res.history)
    for r in res.history:
        assert all(r.metrics[k] == 0 for k in CHECK_KEYS), (r.clock, r.metrics)
