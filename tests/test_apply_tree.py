"""The apply fan-out through an aggregation tree (``dscar.core.apply_plan``) on real clusters: the same
fit as the direct plan to the last bit, exactly once, and a combiner killed mid-apply is a loss like
any other (its clock skipped and recovered), not a failed fit."""
from __future__ import annotations

import functools

import dask.config
import numpy as np
import pytest

import dscar
from conftest import RowCounter, assert_exactly_once
from dscar import faults
from dscar.algorithms.mlr import MLRSGD, load_digits_split

#: every pass goes through a binary tree (no direct plan is cheap enough; no update rides its commit)
TREE = {"dscar.apply-fanin": 2, "dscar.apply-direct-per-worker": 0, "dscar.apply-inline-bytes": 0}
#: every update is fetched by its owners (none rides its commit)
FETCHED = {"dscar.apply-inline-bytes": 0}
DIGITS = dict(l2=1e-3, lr=1.0, decay=0.05, momentum=0.7, batch_size=32, steps=24)


class ScatteredRowCounter(RowCounter):
    """RowCounter whose rows are scattered (``scattered_rows``): every shard adds to every partition
    (dense, as MLR's gradients), by row indices (``add_rows``)."""

    def shard_step(self, ctx, data):
        ones = ctx.xp.ones(data["row"].shape[0])
        ctx.add_rows("count", data["row"], ones)
        ctx.add_rows("seen", data["row"], ones)


def scattered_rows(n: int) -> dict:
    return {"row": np.random.default_rng(0).permutation(n).astype(np.int64)}


def _count(dask_worker, op: str) -> int:
    """How many ``dscar_<op>`` messages this worker answered (the handler is wrapped once)."""
    name = f"dscar_{op}"
    h = dask_worker.handlers[name]
    if not getattr(h, "_counted", False):
        @functools.wraps(h)  # keeps the signature: distributed passes ``comm`` as the original wants it
        def counted(*a, **k):
            dask_worker._counts[name] = dask_worker._counts.get(name, 0) + 1
            return h(*a, **k)
        counted._counted = True
        dask_worker._counts = getattr(dask_worker, "_counts", {})
        dask_worker.handlers[name] = counted
    return dask_worker._counts.get(name, 0)


def _counts(cl) -> tuple[int, int]:
    return (sum(cl.client.run(_count, op="fetch_staged").values()),
            sum(cl.client.run(_count, op="fetch_combined").values()))


@pytest.fixture(scope="module")
def five():
    with dscar.Cluster(n_workers=5, processes=False) as cl:
        yield cl


def test_a_forced_tree_applies_every_row_once_per_clock(five):
    staged0, combined0 = _counts(five)
    with dask.config.set(TREE):
        res = dscar.fit(ScatteredRowCounter(n_parts=5), scattered_rows(103), five, n_shards=10, max_clocks=4)
    staged1, combined1 = _counts(five)
    assert_exactly_once(res, 103)
    assert staged1 == staged0  # no direct fetch: every update went through the tree
    # each pass: 4 children fetched by their parents, 4 owners fetch from the root (the root reads its own)
    assert 0 < combined1 - combined0 <= res.n_clocks * (2 * 5 - 2)


def test_mlr_through_the_tree_equals_the_direct_plan(five):
    Xtr, _, ytr, _ = load_digits_split()
    kw = dict(n_shards=10, max_clocks=5, sharding="static", policies=[])
    staged0, combined0 = _counts(five)
    with dask.config.set(FETCHED):
        direct = dscar.fit(MLRSGD(10, **DIGITS), {"X": Xtr, "y": ytr}, five, **kw)
    staged1, combined1 = _counts(five)
    with dask.config.set(TREE):
        tree = dscar.fit(MLRSGD(10, **DIGITS), {"X": Xtr, "y": ytr}, five, **kw)
    staged2, combined2 = _counts(five)
    assert staged1 > staged0 and combined1 == combined0  # the direct plan on 5 workers
    assert combined2 > combined1 and staged2 == staged1  # the tree
    np.testing.assert_allclose([r.objective for r in tree.history], [r.objective for r in direct.history],
                               rtol=1e-12)
    np.testing.assert_allclose(tree.params["W"], direct.params["W"], rtol=1e-12)


def test_ssp_batches_through_the_tree_apply_each_update_once(five):
    """Under SSP a batch's attempts span clocks and the combined set is held per (run, batch):
    every clock's reduction still sums one update per row, no read is staler than the window."""
    from test_ssp_engine import SspRowCounter

    staged0, combined0 = _counts(five)
    with dask.config.set(TREE):
        res = dscar.fit(SspRowCounter(n_parts=5, sleep=0.02, slow_shards=(0,), staleness=2), {"row": np.arange(80)},
                        five, n_shards=10, max_clocks=6, consistency="ssp", staleness=2, policies=[])
    staged1, combined1 = _counts(five)
    assert combined1 > combined0 and staged1 == staged0
    assert res.n_clocks == 6
    for rec in res.history:
        assert rec.metrics["seen_min"] == rec.metrics["seen_max"] == 1.0, rec
        assert rec.metrics["stale"] == 0, rec
    np.testing.assert_array_equal(res.params["count"], np.full(80, 6.0))


@pytest.mark.timeout(240)
def test_a_combiner_killed_mid_apply_costs_its_clock_not_the_fit(tmp_path):
    """Worker processes; every worker stages updates for every partition, so each is in the binary
    tree, and the one at heap position 1 of the address order combines a child's set. Killed at the
    apply of clock 3 (its process exits): the owners' fetches fail, the coordinator removes it, the
    clock is skipped and every partition rolls back to the newest checkpoint, and every row is
    still counted once per completed clock."""
    with dask.config.set(TREE), dscar.Cluster(n_workers=4) as cl:
        workers = cl.workers
        res = dscar.fit(ScatteredRowCounter(n_parts=4), scattered_rows(64), cl, n_shards=8, max_clocks=6,
                        checkpoint=dscar.CheckpointConfig(str(tmp_path), policy="full", every=1, recovery="full"),
                        faults=[faults.kill(workers[1], 3, point="apply")])
    kinds = [e["kind"] for e in res.events]
    assert "fault-kill" in kinds and "worker-lost" in kinds and "recovery-done" in kinds, kinds
    assert res.n_clocks == 6
    assert any(r.skipped for r in res.history)  # the kill cut its clock short
    counts = []
    for rec in res.history:  # every row: each completed clock's update applied once
        if rec.skipped:
            counts.append(None)
            continue
        assert rec.metrics["seen_min"] == rec.metrics["seen_max"] == 1.0, rec
        assert rec.metrics["count_min"] == rec.metrics["count_max"], rec
        counts.append(rec.metrics["count_max"])
    # one more per clock, from 1; after the skipped clock, from the rolled-back checkpoint's count
    # (the newest one published when the kill came: the clock before, or one older still being written)
    first = counts.index(None)
    assert counts[:first] == list(range(1, first + 1)), counts
    after = [c for c in counts[first:] if c is not None]
    assert after and after[0] <= first + 1 and after == list(range(int(after[0]), int(after[0]) + len(after))), counts
    np.testing.assert_array_equal(res.params["count"], np.full(64, after[-1]))


def test_a_bsp_apply_message_names_only_its_workers_commits_and_the_shards_won_elsewhere_go(five):
    """A BSP apply message carries the worker's own commits and the pass's shards as ranges (``clock_shards``,
    one clock's, as an SSP batch's per clock: ``apply_plan.batch_fields``): a copy
    of a shard another worker won is dropped (``ShardStore.install``), its own winner installed."""
    from distributed.protocol.pickle import dumps

    from dscar.algorithm import DataMeta, TableSpec
    from dscar.worker.shard_store import ShardEntry

    client = five.client
    meta = DataMeta(n_rows=10, n_shards=3, shapes={"row": ()}, dtypes={"row": "int64"})
    tables = [TableSpec("count", 10, n_parts=2), TableSpec("seen", 10, kind="reduction", n_parts=2)]
    token = "slim-token"
    spec = dumps({"algorithm": RowCounter(), "meta": meta, "tables": tables, "loader": None, "tol": 1e-6,
                  "token": token})
    client.sync(client.scheduler.dscar_start_job, job_id="slim", spec=spec, n_shards=3, reloadable=False,
                tables=[["count", 10, 2, "param"], ["seen", 10, 2, "reduction"]], token=token)
    try:
        w0, w1 = sorted(five.workers)[:2]

        def hold(dask_worker=None):  # shards 0, 1 and 2 held on w0; an attempt of shard 1 ran there
            job = dask_worker.plugins["dscar-paramserver"].jobs["slim"]
            for s in (0, 1, 2):
                job.shards.put(s, ShardEntry({"row": np.arange(2)}, {"z": np.zeros(2)}))
            job.shards.stage_state((1, 1, 0), job.shards.get(1), {"z": np.ones(2)})
            job.run_confirmed = 1

        def held(dask_worker=None):
            job = dask_worker.plugins["dscar-paramserver"].jobs["slim"]
            return {s: e.state["z"].tolist() for s, e in job.shards.shards.items()}

        client.sync(client.rpc(w0).dscar_warm_up, job_id="slim", token=token)
        client.run(hold, workers=[w0])
        r = client.sync(client.rpc(w0).dscar_apply, job_id="slim", clock=1, run=1, committed=[[1, 0, w0]],
                        clock_shards=[[1, [[0, 2]]]], token=token)  # shards 0 and 1 committed: 1 here, 0 elsewhere
        assert r.get("applied") == 0, r
        assert client.run(held, workers=[w0])[w0] == {1: [1.0, 1.0], 2: [0.0, 0.0]}  # 0 dropped, 1 installed
    finally:
        client.sync(client.scheduler.dscar_end_job, job_id="slim", token=token)
        for w in five.workers:
            client.sync(client.rpc(w).dscar_end_job, job_id="slim", token=token)


def _flaky_fetch(dask_worker, times: int) -> None:
    """This worker's next ``times`` answers to a fetch of its staged updates say a key is missing, as a
    worker that could not be reached looks to its owner (``source-lost``)."""
    name = "dscar_fetch_staged"
    h = dask_worker.handlers[name]
    left = [times]

    @functools.wraps(h)  # keeps the signature: distributed passes ``comm`` as the original wants it
    def flaky(*a, **k):
        if left[0] > 0:
            left[0] -= 1
            return {"status": "missing", "key": [-1, -1, -1]}
        return h(*a, **k)

    dask_worker.handlers[name] = flaky


def test_a_source_that_answers_a_probe_is_not_lost_and_its_pass_is_applied_once(five):
    """A fetch of staged updates that fails (on a loaded machine: a connect timing out to a live worker)
    is not taken for a loss while that worker answers a probe: the pass is sent again, and every row
    still counts each clock once (a worker that had applied it does not apply it again)."""
    first = five.workers[0]
    five.client.run(_flaky_fetch, times=2, workers=[first])
    with dask.config.set(FETCHED):
        res = dscar.fit(ScatteredRowCounter(n_parts=5), scattered_rows(103), five, n_shards=10, max_clocks=4)
    kinds = [e["kind"] for e in res.events]
    assert "apply-retried" in kinds
    assert "worker-lost" not in kinds and "recovery-started" not in kinds
    assert_exactly_once(res, 103)
