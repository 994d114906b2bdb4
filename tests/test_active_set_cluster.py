"""The active set on real clusters (``dscar.active-workers`` "auto"; the rest of the suite pins "all"):
a small fit runs on one worker while the other stands by, a large one grows to all, a fit started on
all shrinks once its first clock shows the steps are cheap, and a lost active worker is replaced by
the standby one."""
import threading

import dask
import numpy as np
import pytest
from distributed import LocalCluster

import dscar
from dscar import faults
from dscar.algorithms.datasets import lasso_alpha_max, make_regression
from dscar.algorithms.lasso import LassoCD
from dscar.checkpoint import CheckpointConfig
from dscar.core import active_set
from dscar.errors import InvalidInputError
from dscar.scheduler.coordinator import PLUGIN_NAME
from bench.chaos import CHECK_KEYS, ExactlyOnce, check_final

AUTO = {"dscar.active-workers": "auto"}


def events(res, kind: str) -> list[dict]:
    return [e for e in res.events if e["kind"] == kind]


def assert_exactly_once(res, clocks: int) -> None:
    for rec in res.history:
        assert all(rec.metrics[k] == 0 for k in CHECK_KEYS), (rec.clock, rec.metrics)
    assert check_final(res.params["seen"], clocks, True) == 0


def test_a_small_fit_on_two_workers_runs_on_one_with_a_one_worker_fit_s_result():
    X, y, _ = make_regression(2000, 20, seed=5)
    data = {"X": X, "y": y}
    with dscar.Cluster(n_workers=1, processes=False) as one:
        ref = dscar.fit(LassoCD(0.01), data, one, n_shards=2, max_clocks=8, tol=1e-300, progress=False)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as lc, \
            dask.config.set(AUTO):
        cl = dscar.connect(lc)  # (installs the coordinator)
        coordinator = lc.scheduler.plugins[PLUGIN_NAME]
        line, waited = coordinator._line, []
        # who waits in the line for work while the job runs
        line.wait = lambda w, wait=line.wait: (coordinator.jobs and waited.append(w), wait(w))[1]
        res = dscar.fit(LassoCD(0.01), data, cl, n_shards=2, max_clocks=8, tol=1e-300, progress=False)
    assert res.active_workers == 1 and len(res.workers) == 2
    start = events(res, "active-workers")[0]
    assert start["active"] == 1 and len(start["standby"]) == 1 and start["reason"] == "data size"
    measured = events(res, "active-workers")[1]
    assert measured["reason"] == "measured" and measured["active"] == 1 and measured["measured_on"] == 1
    standby = start["standby"][0]
    assert all(standby not in rec.shards_per_worker for rec in res.history)  # it ran nothing
    assert waited and standby not in waited  # its poll waits out of the line: no change wakes it for nothing
    np.testing.assert_allclose([r.objective for r in res.history], [r.objective for r in ref.history], rtol=1e-9)


def test_a_fit_whose_clock_is_mostly_step_work_grows_to_every_worker_and_stays_exactly_once():
    clocks = 4  # (1 s of steps a clock on one worker: a second one pays unless the rest of a clock tops 0.36 s)
    with dscar.Cluster(n_workers=2, processes=False) as cl, dask.config.set(AUTO):
        res = dscar.fit(ExactlyOnce(clocks, work_s=0.25), {"x": np.zeros((8, 1))}, cl, n_shards=4,
                        max_clocks=clocks, progress=False)
    decided = [e for e in events(res, "active-workers") if e["reason"] == "measured"]
    assert len(decided) == 1 and decided[0]["measured_on"] == 1 and decided[0]["active"] == 2, decided
    assert res.active_workers == 2
    rejoined = [e for e in events(res, "active-workers") if e.get("rejoined")]
    assert [e["reason"] for e in rejoined] == ["grow"] and rejoined[0]["clock"] == decided[0]["clock"], rejoined
    assert "worker-ready" in {e["kind"] for e in res.events}
    assert len(res.history[-1].shards_per_worker) == 2  # both ran shards once it rejoined
    assert_exactly_once(res, clocks)


def test_a_fit_started_on_every_worker_shrinks_when_its_steps_are_cheap_with_no_loss_and_no_rework(monkeypatch):
    clocks = 6
    big = {"x": np.zeros((1 << 22, 1))}  # 32 MiB: started on both workers by the data's size
    # a worker measured to cost 50 ms a clock: the trivial steps (a few ms) surely shrink it, however loaded
    measured = active_set.measured_costs
    monkeypatch.setattr(active_set, "measured_costs", lambda *a: (measured(*a)[0], 0.05))
    with dscar.Cluster(n_workers=2, processes=False) as cl, dask.config.set(AUTO):
        res = dscar.fit(ExactlyOnce(clocks), big, cl, n_shards=4, max_clocks=clocks, progress=False)
    start, decided = events(res, "active-workers")[:2]
    assert start["active"] == 2 and decided["reason"] == "measured" and decided["active"] == 1, (start, decided)
    standby = events(res, "worker-standby")
    assert len(standby) == 1 and res.active_workers == 1
    assert events(res, "handoff")[0]["failed"] == 0
    kinds = {e["kind"] for e in res.events}
    assert not {"worker-lost", "worker-left", "recovery-started", "rollback"} & kinds
    assert [r.clock for r in res.history] == list(range(1, clocks + 1))  # no clock skipped or run again
    assert set(res.history[-1].shards_per_worker) == set(res.workers) - {standby[0]["worker"]}
    assert_exactly_once(res, clocks)


@pytest.mark.timeout(240)
def test_a_killed_active_worker_is_replaced_by_the_standby_one_and_the_fit_converges(tmp_path):
    X, y, _ = make_regression(3000, 80, 12, rho=0.5, seed=4)
    algo = LassoCD(0.01 * lasso_alpha_max(X, y), tol=1e-8, max_working_set=8, working_set_start=8)
    with dscar.Cluster(n_workers=2) as cl, dask.config.set(AUTO):
        base = dscar.fit(algo, {"X": X, "y": y}, cl, n_shards=4, max_clocks=300, progress=False)
    assert base.active_workers == 1
    with dscar.Cluster(n_workers=2) as cl, dask.config.set(AUTO):
        cfg = CheckpointConfig(str(tmp_path), policy="priority", every=4, fraction=0.25, recovery="partial")
        res = dscar.fit(algo, {"X": X, "y": y}, cl, n_shards=4, max_clocks=300, checkpoint=cfg,
                        faults=[faults.kill(0, base.n_clocks // 2, point="apply")])
    assert base.converged and res.converged
    assert abs(res.objective - base.objective) <= 1e-7 * base.objective
    lost = events(res, "worker-lost")
    standby = events(res, "active-workers")[0]["standby"]
    assert len(lost) == 1 and lost[0]["worker"] not in standby  # the active one was killed
    back = [e for e in events(res, "active-workers") if e["reason"] == "loss"]
    assert back and back[0]["rejoined"] == standby
    restored = events(res, "partition-restored")
    assert restored and {e.get("target", e.get("worker")) for e in restored} <= set(standby)
    assert standby[0] in res.history[-1].shards_per_worker


@pytest.mark.parametrize("setting, value", [("dscar.active-workers", "some"), ("dscar.active-workers-min", 0),
                                            ("dscar.active-workers-min", 1.5)])
def test_a_bad_active_workers_setting_is_refused_before_work_starts(setting, value):
    with dask.config.set({setting: value}), pytest.raises(InvalidInputError, match=setting):
        dscar.fit(LassoCD(0.01), {"X": [[1.0]], "y": [1.0]}, "tcp://127.0.0.1:1")


class RetiresTheStandby(LassoCD):
    """Lasso that asks Dask to retire its standby worker after ``at`` clocks (from the driver, in a thread)
    and waits until that worker has left the cluster."""

    converged_on_workers = False  # (its hook runs in the driver's process)

    def __init__(self, alpha: float, local_cluster=None, client=None, at: int = 0):
        super().__init__(alpha)
        self._cluster, self._client, self._at = local_cluster, client, at
        self.retired: list[str] = []

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_cluster", "_client", "retired")}

    def converged(self, history, tol) -> bool:
        if len(history) == self._at:
            coordinator = self._cluster.scheduler.plugins[PLUGIN_NAME]
            (standby,) = next(iter(coordinator.elastic.active.values())).standby
            self.retired.append(standby)
            thread = threading.Thread(target=self._client.retire_workers, kwargs={"workers": [standby]})
            thread.start()
            thread.join(60)
            assert standby not in self._cluster.scheduler.workers
        return False


def test_a_standby_worker_retired_mid_fit_leaves_with_no_loss_and_no_rework():
    X, y, _ = make_regression(2000, 20, seed=5)
    data = {"X": X, "y": y}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as lc, \
            dask.config.set(AUTO):
        cl = dscar.connect(lc)
        ref = dscar.fit(LassoCD(0.01), data, cl, n_shards=2, max_clocks=6, tol=1e-300, progress=False)
        algo = RetiresTheStandby(0.01, lc, cl.client, at=3)
        res = dscar.fit(algo, data, cl, n_shards=2, max_clocks=6, tol=1e-300, progress=False)
    kinds = {e["kind"] for e in res.events}
    assert algo.retired and [e["worker"] for e in events(res, "worker-left")] == algo.retired
    assert not {"worker-lost", "recovery-started", "handoff", "rollback"} & kinds
    assert res.active_workers == 1 and [r.clock for r in res.history] == [r.clock for r in ref.history]
    np.testing.assert_allclose([r.objective for r in res.history], [r.objective for r in ref.history], rtol=1e-9)
