"""The engine on real clusters: placement, pull/push, commits, moves, loss of a worker."""
import asyncio
import contextlib
import json
import os
import signal
import threading
import time
import functools
from functools import partial

import dask.config
import numpy as np
import pytest
import scipy.sparse as sp

import dscar
from dscar.algorithms.datasets import lasso_alpha_max, make_regression
from dscar.algorithms.lasso import LassoCD
from conftest import RowCounter, assert_exactly_once, row_data
from dscar import TableSpec


def scheduler_jobs(cl):
    return cl.client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins["dscar-coordinator"].jobs))


def test_every_row_is_applied_once_per_clock_inproc(inproc):
    res = dscar.fit(RowCounter(), row_data(103), inproc, n_shards=7, max_clocks=5)
    assert res.n_clocks == 5 and not res.converged
    assert_exactly_once(res, 103)
    assert sum(res.history[0].shards_per_worker.values()) == 7
    assert scheduler_jobs(inproc) == []  # the job is forgotten when fit returns


def test_default_shards_follow_the_step_work_per_worker():
    from dscar.api.driver import _data_size, default_n_shards
    from dscar.core.shard_count import MIB

    assert default_n_shards(2, 10**8, 800 * MIB) == 8  # 400 MiB a worker: extra shards cost < 5 % of its steps
    assert default_n_shards(2, 10**6, 8 * MIB) == 2  # 4 MiB a worker: one each
    assert default_n_shards(2, 10**8, 800 * MIB, shards_cost_quality=True) == 2
    assert default_n_shards(2, 10**8, 800 * MIB, balancing=False) == 2
    assert default_n_shards(3, 442, 38_896) == 3  # tiny data: one per worker
    assert default_n_shards(2, 5, None) == 5  # bytes unknown: four per worker, rows bound it
    assert default_n_shards(4, 2, 10**9) == 4  # never fewer than the workers (fit then refuses 2 rows)
    X = sp.random(100, 10, density=0.5, format="csr", random_state=0)
    assert _data_size({"X": X, "y": np.zeros(100)}) == (100, X.data.nbytes + X.indices.nbytes + X.indptr.nbytes + 800)
    assert _data_size({"a": {"x": np.zeros(10)}, "b": {"x": np.zeros((3, 4))}}) == (3, 80)  # phases: the fewest of each
    assert _data_size({"X": [[1.0]]}) == (None, None) and _data_size(None) == (None, None)


def test_a_fit_without_n_shards_cuts_small_data_into_one_shard_per_worker_and_big_data_into_more(inproc):
    tiny = dscar.fit(RowCounter(), row_data(103), inproc, max_clocks=1)
    assert sum(tiny.history[0].shards_per_worker.values()) == 2
    wide = {**row_data(1000), "pad": np.zeros((1000, 6 << 10))}  # 48 MiB: 24 a worker, 24 ms of steps a clock
    big = dscar.fit(RowCounter(), wide, inproc, max_clocks=1)
    assert sum(big.history[0].shards_per_worker.values()) == 4
    assert_exactly_once(big, 1000)
    static = dscar.fit(RowCounter(), wide, inproc, max_clocks=1, sharding="static", policies=[])
    assert sum(static.history[0].shards_per_worker.values()) == 2  # nothing to balance: one each
    class Stale(RowCounter):
        shards_cost_quality = True

    stale = dscar.fit(Stale(), wide, inproc, max_clocks=1)
    assert sum(stale.history[0].shards_per_worker.values()) == 2  # more shards would cost it quality
    given = dscar.fit(RowCounter(), row_data(103), inproc, max_clocks=1, n_shards=6)
    assert sum(given.history[0].shards_per_worker.values()) == 6  # an explicit count wins


class FirstPartOnly(dscar.Algorithm):
    """Every shard adds 1 to each row of the first of two partitions of ``t``: its owner is the
    only one with staged updates to collect."""

    name = "first-part-only"
    data_names = ("row",)

    def tables(self, meta):
        return [TableSpec("t", 8, n_parts=2)]

    def shard_step(self, ctx, data):
        ctx.add("t", ctx.xp.ones(4))

    def clock_end(self, ctx):
        return {"objective": float(dscar.to_host(ctx.pull("t")).sum())}

    def converged(self, history, tol):
        return False


def _count_fetches(dask_worker):
    h = dask_worker.handlers["dscar_fetch_staged"]
    if not getattr(h, "_counted", False):
        @functools.wraps(h)  # keeps the signature: distributed passes ``comm`` as the original wants it
        def counted(*a, **k):
            dask_worker._fetches = getattr(dask_worker, "_fetches", 0) + 1
            return h(*a, **k)
        counted._counted = True
        dask_worker.handlers["dscar_fetch_staged"] = counted
    return getattr(dask_worker, "_fetches", 0)


def test_an_owner_fetches_staged_updates_only_from_workers_that_staged_some_for_it(inproc):
    before = sum(inproc.client.run(_count_fetches).values())
    with dask.config.set({"dscar.apply-inline-bytes": 0}):  # (small updates would ride their commits)
        res = dscar.fit(FirstPartOnly(), row_data(8), inproc, n_shards=8, max_clocks=4, sharding="static",
                        policies=[])
    after = sum(inproc.client.run(_count_fetches).values())
    assert res.history[-1].objective == 4 * 8 * 4  # 4 clocks x 8 shards x 4 rows: every update applied once
    np.testing.assert_array_equal(res.params["t"], [32.0] * 4 + [0.0] * 4)
    # both workers ran shards; only the first partition's owner collects, from the other worker
    assert all(n > 0 for n in res.history[-1].shards_per_worker.values())
    assert after - before == 4  # one fetch a clock, not two


def test_a_fast_worker_takes_shards_from_a_slow_one_and_the_data_moves(inproc):
    # shards 0-3 start on the first worker and are slow; 4-7 on the second are fast
    res = dscar.fit(RowCounter(sleep=0.15, slow_shards=(0, 1, 2, 3)), row_data(80), inproc, n_shards=8, max_clocks=2)
    assert_exactly_once(res, 80)
    first, second = res.workers
    assert res.history[0].shards_per_worker[second] > 4  # it stole from the backlog
    moved = [e for e in res.events if e["kind"] == "shard-moved" and e["clock"] == 1]
    assert moved and all(e["source"] == first and e["target"] == second and e["shard"] < 4 for e in moved)


class SpinningRowCounter(RowCounter):
    """Each step first spins until its thread has used ``spin`` CPU seconds."""

    def __init__(self, spin: float):
        super().__init__()
        self.spin = spin

    def shard_step(self, ctx, data):
        c0 = time.thread_time()
        while time.thread_time() - c0 < self.spin:
            pass
        super().shard_step(ctx, data)


def test_a_steps_cpu_time_is_reported_beside_its_wall_time(inproc):
    """``compute_cpu_s`` is the runner thread's CPU within ``compute_s``: all of a spinning step's, none
    of a sleeping one's (what a step spends waiting, for a core or here for the sleep, is the difference)."""
    def total(res, key):
        return sum(t[key] for t in res.history[0].timings.values())

    slept = dscar.fit(RowCounter(sleep=0.05), row_data(8), inproc, n_shards=4, max_clocks=1)
    assert total(slept, "compute_s") >= 4 * 0.05 and total(slept, "compute_cpu_s") < 4 * 0.02
    spun = dscar.fit(SpinningRowCounter(0.05), row_data(8), inproc, n_shards=4, max_clocks=1)
    assert total(spun, "compute_s") >= total(spun, "compute_cpu_s") >= 4 * 0.05


def test_file_data_is_read_by_the_workers(inproc, tmp_path):
    X, y, _ = make_regression(1200, 30, 5, seed=2)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    alpha = 0.05 * lasso_alpha_max(X, y)
    from_files = dscar.fit(LassoCD(alpha, tol=1e-10), str(tmp_path), inproc, n_shards=4)
    from_memory = dscar.fit(LassoCD(alpha, tol=1e-10), {"X": X, "y": y}, inproc, n_shards=4)
    np.testing.assert_allclose(from_files.params["w"], from_memory.params["w"], atol=1e-10)


def test_an_error_in_the_shard_step_is_reported_with_the_shard_and_failures(inproc):
    class Broken(RowCounter):
        def shard_step(self, ctx, data):
            if ctx.shard == 2:
                raise ZeroDivisionError("shard two is broken")
            super().shard_step(ctx, data)

    with pytest.raises(dscar.JobFailedError, match=r"(?s)shard 2 failed 3 time.*shard two is broken") as info:
        dscar.fit(Broken(), row_data(40), inproc, n_shards=4, max_clocks=3)
    assert scheduler_jobs(inproc) == []
    kinds = [e["kind"] for e in info.value.events]  # what led to it, for a post-mortem
    assert kinds.count("shard-failed") >= 3 and "job-failed" in kinds
    assert all(e["shard"] == 2 for e in info.value.events if e["kind"] == "shard-failed")


def test_processes_lasso_and_exactly_once_over_tcp(procs):
    X, y, _ = make_regression(4000, 50, 8, seed=11)
    alpha = 0.02 * lasso_alpha_max(X, y)
    from sklearn.linear_model import Lasso as SkLasso

    sk = SkLasso(alpha=alpha, tol=1e-12, max_iter=100000).fit(X, y)
    res = dscar.fit(LassoCD(alpha, tol=1e-10), {"X": X, "y": y}, procs, n_shards=6)
    np.testing.assert_allclose(res.params["w"], sk.coef_, atol=1e-6)
    # every table has its partitions on both workers, and shard data went to both
    assert len({w for rec in res.history for w in rec.shards_per_worker}) == 2
    counted = dscar.fit(RowCounter(sleep=0.05, slow_shards=(0, 1)), row_data(60), procs, n_shards=6, max_clocks=3)
    assert_exactly_once(counted, 60)


def test_partitions_live_on_their_owners_and_pull_push_between_processes(procs):
    """Drive the data plane directly: init, stage, apply (collecting staged updates) and pull across processes."""
    from distributed.protocol.pickle import dumps

    from dscar.algorithm import DataMeta, TableSpec

    client = procs.client
    meta = DataMeta(n_rows=10, n_shards=2, shapes={"row": ()}, dtypes={"row": "int64"})
    tables = [TableSpec("count", 10, n_parts=2), TableSpec("seen", 10, kind="reduction", n_parts=2)]
    token = "direct-token"  # the job's: every call about it carries it (``dscar.core.membership``)
    spec = dumps({"algorithm": RowCounter(), "meta": meta, "tables": tables, "loader": None, "tol": 1e-6, "token": token})
    r = client.sync(client.scheduler.dscar_start_job, job_id="direct", spec=spec, n_shards=2, reloadable=False,
                    tables=[["count", 10, 2, "param"], ["seen", 10, 2, "reduction"]], token=token)
    try:
        owners = {(t, p): w for t, p, w in r["owners"]}
        assert len(set(owners.values())) == 2
        for (t, p), w in owners.items():
            client.sync(client.rpc(w).dscar_init, job_id="direct", parts=[[t, p]], token=token)
        w0 = owners[("count", 0)]
        w1 = next(w for w in procs.workers if w != w0)

        def stage(key, updates, dask_worker=None):  # what a shard attempt on w1 leaves behind
            server = dask_worker.plugins["dscar-paramserver"]
            server.jobs["direct"].tables.stage(tuple(key), 1, updates)

        def reached(run, dask_worker=None):  # what the coordinator answers once its job reached ``run``: no
            dask_worker.plugins["dscar-paramserver"].jobs["direct"].run_confirmed = run  # clock loop runs here

        client.run(reached, 2, workers=[w0])
        client.run(stage, [1, 0, 0], [["count", 0, 1, np.array([2.0, 3.0]), None]], workers=[w1])
        client.run(stage, [1, 1, 0], [["count", 0, 0, np.array([7.0]), None]], workers=[w1])
        r = client.sync(client.rpc(w0).dscar_apply, job_id="direct", clock=1, run=1,
                        committed=[[0, 0, w1]], fetch=[[w1, [[1, 0, 0]]]],  # its role (``dscar.core.apply_plan``)
                        token=token)  # only shard 0 committed: w0 collects it from w1
        assert r["applied"] == 1, r
        got = client.sync(client.rpc(w0).dscar_pull, job_id="direct", table="count", part=0, lo=0, hi=5,
                          token=token)["data"]
        np.testing.assert_array_equal(got, [0.0, 2.0, 3.0, 0.0, 0.0])
        r = client.sync(client.rpc(w0).dscar_apply, job_id="direct", clock=1, run=2, committed=[[1, 0, w1]],
                        fetch=[[w1, [[1, 1, 0]]]], token=token)
        assert r["status"] == "source-lost"  # staged under run 1, asked for run 2: never applied
        info = client.sync(client.rpc(w0).dscar_info, job_id="direct")
        assert info["device"] in ("cpu", "gpu")
    finally:
        client.sync(client.scheduler.dscar_end_job, job_id="direct", token=token)
        for w in procs.workers:
            client.sync(client.rpc(w).dscar_end_job, job_id="direct", token=token)


def _how_the_worker_started() -> dict:
    import sys

    import dask

    return {"parent": os.getppid(), "models_imported": "dscar.algorithms.lda" in sys.modules,
            "profiler": dask.config.get("distributed.worker.profile.enabled")}


def test_embedded_workers_are_forked_from_a_server_that_imported_dscar_once():
    """Worker processes of the embedded cluster fork from a forkserver that preloaded dscar's models,
    not from a fresh interpreter each (a fresh one imports them in 1.5-2 s of CPU per worker), and run
    without Dask's stack sampler (``EMBEDDED_CONFIG``: an idle cluster's background work) -- a worker
    added by ``Cluster.scale`` after the start too (it used to run with Dask's defaults)."""
    with dscar.Cluster(n_workers=1) as cl:
        cl.scale(2)
        cl.wait_for_workers(2, timeout=60)
        got = cl.client.run(_how_the_worker_started)
    assert len(got) == 2 and not any(g["profiler"] for g in got.values()), got
    assert all(g["models_imported"] for g in got.values()), got  # no job ran: the forkserver imported them
    parents = {g["parent"] for g in got.values()}
    assert len(parents) == 1 and os.getpid() not in parents, got  # one forkserver, not this process


def test_only_the_embedded_cluster_is_scaled_by_dscar():
    """``Cluster.scale`` scales the cluster dscar started; a cluster it was given is scaled where it
    was made (dscar holds no handle on its workers' specs), and a bad count is refused first."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=":0") as lc:
        with dscar.connect(lc) as cl:
            with pytest.raises(dscar.InvalidInputError, match="n"):
                cl.scale(-1)
            with pytest.raises(dscar.ClusterError, match="did not start"):
                cl.scale(2)
            assert len(cl.workers) == 1


def test_an_embedded_worker_restarted_by_its_nanny_forks_too_and_the_method_is_given_back():
    """A killed worker's nanny starts it again under the method the process has then: the embedded
    cluster keeps the forkserver's while it lives (``hold_start_method``), so the restart forks from
    the server (it used to spawn a fresh interpreter: ~0.7 s of CPU on the fit's cores); closed, the
    cluster gives the process its own method back."""
    import dask

    before = dask.config.get("distributed.worker.multiprocessing-method")
    with dscar.Cluster(n_workers=2) as cl:
        first = cl.client.run(_how_the_worker_started)
        victim = sorted(first)[0]
        try:
            cl.client.run(os._exit, 1, workers=[victim])
        except Exception:
            pass  # (the worker died before it answered)
        deadline = time.monotonic() + 60
        while victim in (now := cl.workers) or len(now) < 2:  # (its restart is in)
            assert time.monotonic() < deadline, now
            time.sleep(0.05)
        got = cl.client.run(_how_the_worker_started)
    assert victim not in got and len(got) == 2, (first, got)
    parents = {g["parent"] for g in got.values()} | {g["parent"] for g in first.values()}
    assert len(parents) == 1 and os.getpid() not in parents, (first, got)  # the restart forked from the server
    assert dask.config.get("distributed.worker.multiprocessing-method") == before


def _faults_of_a_second_2mb_array() -> int:
    """Page faults of allocating and filling a 2 MiB array right after freeing one of that size."""
    import resource

    import numpy as np

    np.ones(1 << 18).sum()  # 2 MiB, freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    np.ones(1 << 18).sum()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_embedded_workers_reuse_freed_memory_for_large_arrays():
    """``WORKER_MALLOC_ENV``: a worker allocating a 2 MiB array again reuses the heap, where under
    Dask's nanny default each such array is a fresh mapping whose 512 pages all fault. In a fresh
    interpreter: the forkserver's malloc settings are fixed when the first worker starts."""
    import subprocess
    import sys

    script = ("import dscar, json\n"
              "from test_engine import _faults_of_a_second_2mb_array as f\n"
              "with dscar.Cluster(n_workers=1) as cl:\n"
              "    print(json.dumps(list(cl.client.run(f).values())))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(__file__), env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [os.path.dirname(__file__), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert out.returncode == 0, out.stderr[-2000:]
    faults = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(faults) == 1 and faults[0] < 100, faults


@pytest.mark.timeout(180)
def test_killed_worker_mid_clock_its_shards_are_resent_and_requeued():
    """SIGKILL a worker that owns no partition while it runs shards: nothing lost, nothing doubled."""
    with dscar.Cluster(n_workers=3) as cl:
        workers = cl.workers
        victim = workers[-1]  # partitions (n_parts=1) go to workers[0]
        pids = cl.client.run(os.getpid)
        state = {}

        def kill_when_busy():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                jobs = cl.client.run_on_scheduler(_clock_of_running_job)
                if jobs and jobs[0] >= 2:
                    os.kill(pids[victim], signal.SIGKILL)
                    state["killed_at"] = jobs[0]
                    return
                time.sleep(0.02)

        killer = threading.Thread(target=kill_when_busy)
        killer.start()
        res = dscar.fit(RowCounter(n_parts=1, sleep=0.1), row_data(90), cl, n_shards=9, max_clocks=4)
        killer.join()
        assert state.get("killed_at") >= 2
        assert_exactly_once(res, 90)
        kinds = [e["kind"] for e in res.events]
        assert "worker-lost" in kinds and "shards-replaced" in kinds
        lost = next(e for e in res.events if e["kind"] == "worker-lost")
        assert lost["worker"] == victim and not lost["partitions"]


def _clock_of_running_job(dask_scheduler):
    return [j.clock for j in dask_scheduler.plugins["dscar-coordinator"].jobs.values()]


@pytest.mark.timeout(120)
def test_losing_a_partition_owner_fails_the_job_with_a_clear_error():
    with dscar.Cluster(n_workers=2) as cl:
        owner = cl.workers[0]
        pids = cl.client.run(os.getpid)
        threading.Timer(1.0, os.kill, (pids[owner], signal.SIGKILL)).start()
        with pytest.raises(dscar.JobFailedError, match="owned partitions"):
            dscar.fit(RowCounter(n_parts=1, sleep=0.1), row_data(40), cl, n_shards=4, max_clocks=50)


class DiesInInit(RowCounter):
    """The worker process ``victim_pid`` exits (``os._exit``), or stops (``SIGSTOP``: it hangs with
    its connections open), while it sets up its partitions."""

    def __init__(self, victim_pid: int, hang: bool = False, **kw):
        super().__init__(**kw)
        self.victim_pid = victim_pid
        self.hang = hang

    def init_rows(self, table, start, stop, xp):
        if os.getpid() == self.victim_pid:
            if self.hang:
                os.kill(self.victim_pid, signal.SIGSTOP)
            else:
                os._exit(1)
        return super().init_rows(table, start, stop, xp)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("store", "hang"), [(True, False), (False, False), (True, True)])
def test_an_owner_lost_while_it_sets_up_its_partitions_is_a_loss_like_any_other(tmp_path, store, hang):
    """Before clock 1 as in any clock: with a checkpoint store its partitions are restored from the
    initial values (checkpoint 0) and every row counts each clock once; without one the job fails
    with the loss's own message, not as the driver's lost contact with the cluster. A hung owner
    (its init never answers) is dropped by the coordinator, and the driver stops waiting for it."""
    with dscar.Cluster(n_workers=3) as cl:
        victim = cl.workers[1]
        pid = cl.client.run(os.getpid)[victim]
        fit = partial(dscar.fit, DiesInInit(pid, hang=hang, n_parts=3), row_data(60), cl, n_shards=6, max_clocks=3)
        if not store:
            with pytest.raises(dscar.JobFailedError, match=f"worker {victim} owned partitions .* checkpoint store"):
                fit()
            return
        try:
            res = fit(checkpoint=dscar.CheckpointConfig(str(tmp_path)))
        finally:
            if hang:  # (so that the cluster can close it, unless its removal killed it)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
    lost = [e for e in res.events if e["kind"] == "worker-lost"]
    assert [e["worker"] for e in lost] == [victim] and lost[0]["partitions"] and lost[0]["clock"] <= 1
    assert res.n_clocks == 3
    assert_exactly_once(res, 60)
    assert dscar.to_host(res.params["count"]).tolist() == [3.0] * 60


class ScatterCounter(dscar.Algorithm):
    """Each shard scatter-adds into rows spread over every partition, some rows twice."""

    name = "scatter"

    def tables(self, meta):
        return [TableSpec("hits", 50, trailing=(2,), n_parts=3)]

    def shard_step(self, ctx, data):
        rows = (data["row"] * 7) % 50
        rows = np.concatenate([rows, rows[::2]])
        before = dscar.to_host(ctx.pull_rows("hits", rows))
        assert before.shape == (rows.size, 2)
        ctx.add_rows("hits", rows, np.ones((rows.size, 2)))

    def clock_end(self, ctx):
        return {"objective": float(dscar.to_host(ctx.pull("hits")).sum())}

    def converged(self, history, tol):
        return False


def expected_hits(n_rows, n_shards, clocks):
    from dscar.core.partitions import row_bounds

    hits = np.zeros(50)
    for a, b in row_bounds(n_rows, n_shards):
        rows = (np.arange(a, b) * 7) % 50
        np.add.at(hits, np.concatenate([rows, rows[::2]]), 1.0)
    return clocks * hits


@pytest.mark.parametrize("where", ["inproc", "procs"])
def test_scattered_row_pulls_and_adds_across_partitions(where, request):
    cl = request.getfixturevalue(where)
    res = dscar.fit(ScatterCounter(), row_data(64), cl, n_shards=4, max_clocks=2)
    np.testing.assert_array_equal(res.params["hits"][:, 0], expected_hits(64, 4, 2))
    np.testing.assert_array_equal(res.params["hits"][:, 1], expected_hits(64, 4, 2))


class AssigningClockEnd(dscar.Algorithm):
    """A clock end that assigns tables spread over both workers and reads one back: its later
    pulls see its own writes, and every write reaches its owner (the writes to other owners are
    sent together, once per owner)."""

    name = "assigning"

    def tables(self, meta):
        return [TableSpec("a", 9, n_parts=2), TableSpec("b", 5, trailing=(2,), n_parts=2),
                TableSpec("c", 3, dtype="int64", n_parts=1)]

    def shard_step(self, ctx, data):
        pass

    def clock_end(self, ctx):
        k = ctx.clock
        ctx.assign("a", np.arange(9.0) * k)
        ctx.assign("b", np.full((3, 2), -k), start=2)
        ctx.assign("c", np.array([k, 2 * k, 3 * k]))
        a, b = dscar.to_host(ctx.pull("a")), dscar.to_host(ctx.pull("b"))
        assert np.array_equal(a, np.arange(9.0) * k) and np.array_equal(b[2:], np.full((3, 2), -k)), (a, b)
        ctx.assign("a", np.array([100.0 * k]), start=8)
        return {"objective": float(a.sum())}

    def converged(self, history, tol):
        return False


@pytest.mark.parametrize("where", ["inproc", "procs"])
def test_a_clock_end_reads_its_own_assignments_and_they_reach_every_owner(where, request):
    res = dscar.fit(AssigningClockEnd(), row_data(8), request.getfixturevalue(where), n_shards=2, max_clocks=3)
    assert res.n_clocks == 3 and not any(r.skipped for r in res.history)
    np.testing.assert_array_equal(res.params["a"], np.r_[np.arange(8.0) * 3, 300.0])
    np.testing.assert_array_equal(res.params["b"], np.r_[np.zeros((2, 2)), np.full((3, 2), -3.0)])
    np.testing.assert_array_equal(res.params["c"], [3, 6, 9])


class SummarizingClockEnd(RowCounter):
    """The clock end reads ``count`` as its owners' summaries: each partition's first row, rows,
    sum and the process that summed it."""

    def summarize(self, table, rows, start):
        rows = dscar.to_host(rows)
        return [np.array([start, rows.shape[0]]), np.array([rows.sum(), os.getpid()])]

    def clock_end(self, ctx):
        m = super().clock_end(ctx)
        parts = ctx.summaries("count")
        ends = np.cumsum([int(p[0][1]) for p in parts])
        return {**m, "parts": float(len(parts)), "pids": float(len({int(p[1][1]) for p in parts})),
                "in_row_order": float([int(p[0][0]) for p in parts] == [0, *ends[:-1]] and ends[-1] == ctx.meta.n_rows),
                "summed": float(sum(p[1][0] for p in parts))}


class NamedSummariesClockEnd(SummarizingClockEnd):
    """The same, with ``count`` named in ``clock_end_summaries``: the summaries come with the small
    tables' rows, in one message per owner (``ShardRunner.clock_end_reads``)."""

    def clock_end_summaries(self):
        return ["count"]


@pytest.mark.parametrize("model", [SummarizingClockEnd, NamedSummariesClockEnd])
@pytest.mark.parametrize("where", ["inproc", "procs"])
def test_a_clock_end_reads_a_table_as_summaries_made_by_its_owners_in_row_order(where, model, request):
    res = dscar.fit(model(n_parts=5), row_data(23), request.getfixturevalue(where), n_shards=3, max_clocks=2)
    for rec in res.history:
        m = rec.metrics
        assert m["parts"] == 5 and m["in_row_order"] == 1 and m["summed"] == m["objective"] == 23 * rec.clock
        assert m["pids"] == (2 if where == "procs" else 1)  # each owner summed its own partitions


class PaddedCounter(RowCounter):
    """RowCounter behind a one-row table, which makes the first worker the heavier: balancing rows
    alone would give ``count``'s first partition to the second worker. The clock end reports each
    partition's owner (its index among the workers owning anything)."""

    def tables(self, meta):
        return [TableSpec("pad", 7, n_parts=1), *super().tables(meta)]

    def clock_end(self, ctx):
        owners = ctx._job.owners  # the worker's map of owners (engine internals, for this test only)
        workers = sorted(set(owners.values()))
        return {**super().clock_end(ctx), **{f"owner_{p}": float(workers.index(owners[("count", p)])) for p in (0, 1)}}


def test_partitions_of_the_datas_rows_are_owned_where_their_shards_are_placed(procs):
    """Shards 0-1 start on the first worker, 2-3 on the second: ``count``'s partitions follow, so a
    shard's adds to its own rows are applied where it ran (LDA's doc_topic deltas)."""
    # static sharding: each worker runs the shards placed on it (dynamic sharding may move one under load)
    res = dscar.fit(PaddedCounter(), row_data(40), procs, n_shards=4, max_clocks=2, sharding="static", policies=[])
    assert_exactly_once(res, 40)
    m = res.history[-1].metrics
    assert (m["owner_0"], m["owner_1"]) == (0.0, 1.0)
    first, second = sorted(res.workers)
    assert res.history[0].shards_per_worker == {first: 2, second: 2}


# ------------------------------------------------------------- data phases
class PhaseCounter(dscar.Algorithm):
    """Two data phases per clock over the same rows: ``a`` adds 1 to ``x``, then ``b`` checks it
    sees ``a``'s update (a mismatch counts in ``bad``) and adds 1 again. ``seen`` sums both phases."""

    name = "phasecounter"
    phases = ("a", "b")

    def tables(self, meta):
        n = meta.n_rows // 2
        return [TableSpec("x", n), TableSpec("seen", n, kind="reduction"), TableSpec("bad", 1, kind="reduction")]

    def shard_step(self, ctx, data):
        rows = data["row"]
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        if ctx.phase == "b":
            stale = ctx.pull("x", lo, hi) != 2 * ctx.clock - 1
            ctx.add("bad", ctx.xp.asarray([float(stale.sum())]))
        ctx.add("x", ctx.xp.ones(hi - lo), start=lo)
        ctx.add("seen", ctx.xp.ones(hi - lo), start=lo)

    def clock_end(self, ctx):
        seen, x = dscar.to_host(ctx.pull("seen")), dscar.to_host(ctx.pull("x"))
        return {"objective": float(x.sum()), "seen_min": float(seen.min()), "seen_max": float(seen.max()),
                "bad": float(dscar.to_host(ctx.pull("bad"))[0]), "x_min": float(x.min()), "x_max": float(x.max())}

    def converged(self, history, tol):
        return False


def phase_data(n, shards=(3, 4)):
    rows = np.arange(n, dtype=np.int64)
    return dscar.PhasedData({"a": dscar.ArrayData({"row": rows}, shards[0]),
                             "b": dscar.ArrayData({"row": rows}, shards[1])})


def test_data_phases_run_in_order_and_reductions_sum_over_the_clock(inproc):
    res = dscar.fit(PhaseCounter(), phase_data(50), inproc, max_clocks=4)
    for rec in res.history:
        m = rec.metrics
        assert m["bad"] == 0 and m["seen_min"] == m["seen_max"] == 2.0, m
        assert m["x_min"] == m["x_max"] == 2 * rec.clock, m
        assert sum(rec.shards_per_worker.values()) == 7
        assert {"shards:a", "shards:b", "apply:a", "apply:b"} <= rec.phase_s.keys()
    # a dict of phases is accepted too (cut into equal shards per phase)
    res = dscar.fit(PhaseCounter(), {"a": {"row": np.arange(20)}, "b": {"row": np.arange(20)}}, inproc,
                    n_shards=2, max_clocks=1)
    assert res.history[0].metrics["x_max"] == 2


def test_data_phases_must_match_the_algorithm(inproc):
    with pytest.raises(dscar.InvalidInputError, match=r"runs data phases \['a', 'b'\].*has none"):
        dscar.fit(PhaseCounter(), row_data(20), inproc, n_shards=2)
    with pytest.raises(dscar.InvalidInputError, match=r"has \['b', 'a'\]"):
        dscar.fit(PhaseCounter(), {"b": {"row": np.arange(20)}, "a": {"row": np.arange(20)}}, inproc, n_shards=2)
    with pytest.raises(dscar.InvalidInputError, match=r"runs data phases none.*has \['a', 'b'\]"):
        dscar.fit(RowCounter(), phase_data(20), inproc)
    with pytest.raises(dscar.InvalidInputError, match="1 shard.*phase 'a' for 2 workers"):
        dscar.fit(PhaseCounter(), phase_data(20, (1, 2)), inproc)
    with pytest.raises(dscar.InvalidInputError, match="contiguous"):
        dscar.ArrayData({"row": np.arange(10)}, bounds=[(0, 4), (5, 10)])


def test_a_loss_in_the_second_phase_redoes_that_phase_only(inproc, tmp_path):
    """Partial recovery mid-phase ``b`` of clock 2: ``b`` runs again, ``a`` (applied) does not.

    The survivor's rows of ``x`` end at exactly 2 per clock (``a`` redone would add 1 more). The
    lost partition was restored from a checkpoint (even values) and then missed clock 2's ``a``
    but not its ``b`` (redone): its rows end odd (a whole-clock redo would leave them even).
    """
    from dscar.core.partitions import row_bounds

    n = 40
    # static sharding: worker 1 runs its own phase-b shards of clock 2, so the loss fires there (with
    # dynamic sharding and instant steps, a busy machine once let worker 0 run all four first)
    res = dscar.fit(PhaseCounter(), phase_data(n, (4, 4)), inproc, max_clocks=3, sharding="static", policies=[],
                    checkpoint=dscar.CheckpointConfig(str(tmp_path), policy="full", every=1),
                    faults=[dscar.faults.lose(1, 2, phase="b")])
    lost, survivor = res.workers[1], res.workers[0]
    restarted = [e for e in res.events if e["kind"] == "clock-restarted"]
    assert restarted and restarted[0]["clock"] == 2 and restarted[0]["data_phase"] == "b", restarted
    restored = [e for e in res.events if e["kind"] == "partition-restored" and e["table"] == "x"]
    assert len(restored) == 1 and restored[0]["target"] == survivor
    a, b = row_bounds(n, 2)[restored[0]["part"]]
    x, keep = res.params["x"], np.ones(n, bool)
    keep[a:b] = False
    np.testing.assert_array_equal(x[keep], 2 * res.n_clocks)
    assert np.all(x[~keep] % 2 == 1) and np.all(x[~keep] < 2 * res.n_clocks), x
    assert res.history[1].metrics.get("skipped") == 1.0  # a `seen` partition went with it: clock 2's sums are partial
    last = res.history[2].metrics  # exactly once again; only the restored rows hold other values than the count
    assert last["seen_min"] == last["seen_max"] == 2.0 and last["bad"] == b - a
    assert lost not in res.history[2].shards_per_worker


class CachingCounter(RowCounter):
    """Keeps a non-array cache in its shard data (as Lasso keeps its Gram): moving a shard must not
    lose the shard (the cache stays behind; the new holder starts without it)."""

    def shard_step(self, ctx, data):
        data["cache.seen"] = (ctx.clock, np.zeros(3), np.zeros((2, 2)))  # a tuple of unlike arrays
        super().shard_step(ctx, data)


def test_a_shard_with_a_cache_in_its_data_moves_without_loss(inproc):
    res = dscar.fit(CachingCounter(sleep=0.05, slow_shards=(0, 1, 2, 3)), row_data(80), inproc, n_shards=8,
                    max_clocks=3, policies=[])
    assert_exactly_once(res, 80)
    kinds = [e["kind"] for e in res.events]
    assert "shard-moved" in kinds and "shard-failed" not in kinds and "shards-replaced" not in kinds


def test_a_fault_the_fit_never_reached_is_an_event_and_a_warning(inproc, caplog, tmp_path):
    """A loss aimed at clock 5 of a fit that converges at clock 1 measures nothing: the result says so."""
    X, y, _ = make_regression(600, 20, 4, seed=3)
    with caplog.at_level("WARNING", logger="dscar.driver"):
        res = dscar.fit(LassoCD(0.1 * lasso_alpha_max(X, y), tol=1e-8), {"X": X, "y": y}, inproc, n_shards=4,
                        max_clocks=6, faults=[dscar.faults.lose(1, 5)])
    assert res.converged and res.n_clocks < 5
    (ev,) = [e for e in res.events if e["kind"] == "unfired-fault"]
    assert ev["fault"] == "lose" and ev["fault_clock"] == 5 and ev["point"] == "start" and ev["worker"] == inproc.workers[1]
    assert ev["reason"] == f"the fit stopped at clock {res.n_clocks}"
    assert "never fired: the fit stopped" in caplog.text
    fired = dscar.fit(LassoCD(0.1 * lasso_alpha_max(X, y), tol=1e-8), {"X": X, "y": y}, inproc, n_shards=4,
                      max_clocks=6, faults=[dscar.faults.lose(1, 1)], checkpoint=str(tmp_path))
    assert [e["kind"] for e in fired.events if e["kind"].startswith("fault-")] == ["fault-lose"]


@pytest.mark.parametrize("error, wrapped", [
    (ConnectionError("the scheduler's comm closed"), True),
    (OSError("Timed out trying to connect to tcp://10.0.0.1:8786 after 30 s"), True),  # distributed's connect
    (FileNotFoundError(2, "No such file or directory"), False),  # the called side's own error: kept as it is
])
def test_a_connection_lost_under_a_call_is_a_cluster_error(error, wrapped):
    """A call to the scheduler that fails on the way reaches the user as a ``ClusterError`` (the CLI's
    one-line rule), with the original error as its cause; an error of the called side keeps its type."""
    def broken(dask_scheduler, error=error):
        def begin_clock(**kw):
            raise error
        dask_scheduler.handlers["dscar_begin_clock"] = begin_clock

    with dscar.Cluster(n_workers=1, processes=False) as cl:
        cl.client.run_on_scheduler(broken)
        with pytest.raises(dscar.ClusterError if wrapped else type(error)) as info:
            dscar.fit(RowCounter(), row_data(40), cl, n_shards=2, max_clocks=2)
    if wrapped:
        assert str(info.value).startswith(f"lost contact with the cluster: {type(error).__name__}")
        assert isinstance(info.value.__cause__, type(error))


def test_a_checkpoint_that_cannot_be_published_fails_the_fit_naming_it(inproc, tmp_path, monkeypatch):
    """The store refusing a manifest is the store's problem, not the cluster's: a ``JobFailedError`` that
    names the checkpoint and the store."""
    def refuse(fs, root, manifest):
        raise PermissionError(13, "Permission denied", f"{root}/manifest-{manifest['version']}.json")

    monkeypatch.setattr(dscar.checkpoint, "publish", refuse)
    with pytest.raises(dscar.JobFailedError, match=r"publishing checkpoint version 1 to .* failed: PermissionError"):
        dscar.fit(RowCounter(), row_data(40), inproc, n_shards=2, max_clocks=3, checkpoint=str(tmp_path))


def test_idle_long_polls_do_not_wake_each_other():
    """Workers with nothing to do wait in long polls; one that finds nothing must not wake the others
    (each would find nothing, wake the rest, and so on: the scheduler's loop spun at full speed while
    any two workers waited, ~1,500 wakes a clock here, and every other thread of the process starved)."""
    def wakes(dask_scheduler):
        return dask_scheduler.plugins["dscar-coordinator"].wakes

    with dscar.Cluster(n_workers=4, processes=False) as cl:
        before = cl.client.run_on_scheduler(wakes)
        clocks = 6  # one slow shard a clock: three workers wait in their polls meanwhile
        res = dscar.fit(RowCounter(sleep=0.05, slow_shards=(0,)), row_data(40), cl, n_shards=4, max_clocks=clocks,
                        policies=[])
        per_clock = (cl.client.run_on_scheduler(wakes) - before) / clocks
    assert_exactly_once(res, 40)
    assert per_clock < 100, per_clock


def test_a_change_wakes_the_waiting_polls_it_may_concern_not_every_one():
    """A commit, a grant or an effect wakes the waiting polls that hold shards of their own and the head
    of the line (``dscar.core.wake``), not every waiting poll (that was O(W^2) rechecks a clock): over a
    fit, the polls woken are at most W a clock begun, plus ``MISSES + 1`` a change, plus the shards."""
    from dscar.core.wake import MISSES

    def counts(dask_scheduler):
        c = dask_scheduler.plugins["dscar-coordinator"]
        return c.wakes, c.poll_wakes

    n_workers, clocks, n_shards = 16, 6, 16
    with dscar.Cluster(n_workers=n_workers, processes=False) as cl:
        wakes0, polls0 = cl.client.run_on_scheduler(counts)
        # one slow shard a clock: fifteen workers wait in their polls while every change goes on
        res = dscar.fit(RowCounter(sleep=0.05, slow_shards=(0,)), row_data(40), cl, n_shards=n_shards,
                        max_clocks=clocks, policies=[])
        wakes, polls = (b - a for a, b in zip((wakes0, polls0), cl.client.run_on_scheduler(counts)))
    assert_exactly_once(res, 40)
    assert polls <= (MISSES + 1) * wakes + (n_workers + n_shards) * (clocks + 1), (polls, wakes)


class PlacementWatches(RowCounter):
    """RowCounter whose clock end counts the ``until_lost`` polls waiting on the in-process scheduler(s)."""

    def clock_end(self, ctx):
        from distributed import Scheduler

        async def count() -> int:
            n = 0
            for task in asyncio.all_tasks():
                coro = task.get_coro()
                while coro is not None:  # a handler runs inside the task serving its connection
                    if getattr(coro, "__qualname__", "") == "Coordinator._h_until_lost":
                        n += 1
                        break
                    coro = getattr(coro, "cr_await", None)
            return n

        running = [s for s in list(Scheduler._instances) if s.status.name == "running"]  # (earlier tests' are closed)
        n = sum(asyncio.run_coroutine_threadsafe(count(), s.loop.asyncio_loop).result(10) for s in running)
        return {**super().clock_end(ctx), "watches": float(n)}


def test_the_watches_of_a_placement_end_with_it():
    """The driver races each shard it places against a poll that returns once the target is lost
    (``until_lost``); the polls end when the placement is reported done. They used to wait out their
    60 s timeout, so through every fit each change of the job ran one poll per shard (LDA, 2 workers,
    32 shards: a third of the scheduler's CPU)."""
    with dscar.Cluster(n_workers=2, processes=False) as cl:
        res = dscar.fit(PlacementWatches(), row_data(64), cl, n_shards=16, max_clocks=2, policies=[])
    assert_exactly_once(res, 64)
    assert [rec.metrics["watches"] for rec in res.history] == [0.0, 0.0]


def test_the_end_of_a_fit_messages_the_live_workers_not_the_one_it_lost(monkeypatch):
    """The job's state is dropped on every worker still there, and no message goes to a lost worker
    (one waits out the connect timeout: 3 s at the end of every fit that lost an in-process worker)."""
    from dscar.api import driver

    ended: list[str] = []
    call = driver._Run._call_worker

    async def recording(self, address, op, **kw):
        if op == "end_job":
            ended.append(address)
        return await call(self, address, op, **kw)

    monkeypatch.setattr(driver._Run, "_call_worker", recording)
    with dscar.Cluster(n_workers=3, processes=False) as cl:
        # steps of 20 ms and four clocks to fire in: the kill needs worker 2 to start a shard, and with
        # instant steps on a busy machine the other two once ran all six of clocks 2 and 3 (no loss at all)
        res = dscar.fit(RowCounter(n_parts=1, sleep=0.02), row_data(30), cl, n_shards=6, max_clocks=5,
                        faults=[dscar.faults.kill(2, 2)])
        live = cl.workers
    lost = [e["worker"] for e in res.events if e["kind"] == "worker-lost"]
    assert len(lost) == 1 and lost[0] not in live
    assert sorted(ended) == sorted(live)
