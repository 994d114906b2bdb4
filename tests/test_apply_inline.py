"""Small staged updates ride their commits (``apply_plan.rides_commit``): the coordinator puts them in
the owners' apply messages and no owner fetches them. On a real in-process cluster: an owner applies
inline updates only (no ``fetch_staged``), a pass mixing inline and fetched keys applies each once,
and a stager lost between its commit and the apply skips its clock as a fetched one does, with every
row counted the same."""
from __future__ import annotations

import functools

import dask.config
import pytest

import dscar
from dscar.worker import runner
from dscar.worker.runner import owned_here
from bench.overhead import install_counters, read_counters
from conftest import RowCounter, assert_exactly_once, row_data

#: every update is fetched by its owners
FETCHED = {"dscar.apply-inline-bytes": 0}


@pytest.fixture(scope="module")
def four():
    with dscar.Cluster(n_workers=4, processes=False) as cl:
        cl.wait_for_workers(4)
        yield cl


def _count_inline(dask_worker) -> int:
    """How many inline updates (``[key, table, part, payload]``) this worker's apply messages carried."""
    h = dask_worker.handlers["dscar_apply"]
    if not getattr(h, "_inline_counted", False):
        @functools.wraps(h)  # keeps the signature: distributed passes ``comm`` as the original wants it
        def counted(*a, **k):
            dask_worker._inline_seen = getattr(dask_worker, "_inline_seen", 0) + len(k.get("inline") or ())
            return h(*a, **k)
        counted._inline_counted = True
        dask_worker.handlers["dscar_apply"] = counted
    return getattr(dask_worker, "_inline_seen", 0)


def _fit(cl, algo, n_rows: int, **kw) -> tuple[dscar.FitResult, int, int]:
    """A fit, and the ``fetch_staged`` calls and the inline updates the workers got during it."""
    cl.client.run(install_counters)

    def now() -> tuple[int, int]:
        fetches = sum(c.get("dscar_fetch_staged", 0) + c.get("dscar_fetch_combined", 0)
                      for c in cl.client.run(read_counters).values())
        return fetches, sum(cl.client.run(_count_inline).values())

    f0, i0 = now()
    res = dscar.fit(algo, row_data(n_rows), cl, progress=False, policies=[], **kw)
    f1, i1 = now()
    return res, f1 - f0, i1 - i0


def test_an_owner_applies_inline_updates_and_fetches_nothing(four):
    """One partition per table, so one owner: each other worker's few rows ride its commit."""
    res, fetches, inline = _fit(four, RowCounter(n_parts=1), 40, n_shards=8, max_clocks=4)
    assert_exactly_once(res, 40)
    assert fetches == 0 and inline > 0
    with dask.config.set(FETCHED):  # the same fit fetching them: the inline path is what removed the fetches
        res, fetches, inline = _fit(four, RowCounter(n_parts=1), 40, n_shards=8, max_clocks=4)
    assert_exactly_once(res, 40)
    assert fetches > 0 and inline == 0


def test_a_pass_of_inline_and_fetched_keys_applies_each_once(four):
    """103 rows in 10 shards: 11-row shards stage 2 x 88 bytes (their rows of both tables), 10-row ones
    2 x 80; at a limit of 170 bytes the 10-row shards' updates ride their commits and the 11-row ones
    are fetched. The 4 partitions of each table (one a worker) cut rows 26, 52 and 78: shard 2 (rows
    22-33, 11 rows) and shard 4 (rows 43-53, 10 rows) each reach two owners, so whichever worker runs
    them, every pass has a fetched key and an inline one (however the load hands out the shards)."""
    with dask.config.set({"dscar.apply-inline-bytes": 170}):
        res, fetches, inline = _fit(four, RowCounter(n_parts=4), 103, n_shards=10, max_clocks=4)
    assert_exactly_once(res, 103)
    assert fetches > 0 and inline > 0


def _lose_a_stager_before_the_apply(dask_scheduler, clock: int) -> None:
    """As the coordinator's apply of ``clock`` is under way (its first messages sent in the decision that
    completed the pass), it loses a worker that ran committed attempts of the pass, owns nothing and runs no
    clock end (as a crash right after its commit), then waits for the apply's answers."""
    coord = dask_scheduler.plugins["dscar-coordinator"]
    original = coord._apply_pass

    async def apply_pass(job, e, *sent):
        if e.clock == clock and not getattr(coord, "_test_lost", None):
            owners = set(job.pmap.owners.values()) | {(e.clock_end or {}).get("worker")}
            stager = sorted({w for _, _, w in e.committed} - owners)[0]
            coord._test_lost = stager
            await coord._h_simulate_loss(job.cfg.job_id, stager)
        return await original(job, e, *sent)

    coord._apply_pass = apply_pass


def _undo(dask_scheduler) -> str | None:
    coord = dask_scheduler.plugins["dscar-coordinator"]
    coord.__dict__.pop("_apply_pass", None)
    return coord.__dict__.pop("_test_lost", None)


@pytest.mark.parametrize("config", [{}, FETCHED], ids=["inline", "fetched"])
def test_a_stager_lost_after_its_commit_skips_the_clock_and_counts_every_row_the_same(config):
    """Its committed updates are held by the coordinator (inline) or staged on it (fetched): either
    way the loss during the apply skips the clock, the fit goes on, and no row is counted differently
    from another (the owner applied the pass whole, or not at all)."""
    with dscar.Cluster(n_workers=4, processes=False) as cl, dask.config.set(config):
        cl.wait_for_workers(4)
        cl.client.run_on_scheduler(_lose_a_stager_before_the_apply, clock=3)
        try:
            res = dscar.fit(RowCounter(n_parts=1), row_data(40), cl, n_shards=8, max_clocks=6, progress=False,
                            policies=[])
        finally:
            lost = cl.client.run_on_scheduler(_undo)
    assert lost is not None
    assert [r.clock for r in res.history if r.skipped] == [3]
    for rec in res.history:
        if not rec.skipped:
            assert rec.metrics["seen_min"] == rec.metrics["seen_max"] == 1.0, rec
            assert rec.metrics["count_min"] == rec.metrics["count_max"], rec
    assert res.params["count"].min() == res.params["count"].max() >= res.n_clocks - 1


@pytest.mark.parametrize("config,inline_wanted", [({}, True), (FETCHED, False)], ids=["inline", "fetched"])
def test_the_fits_setting_reaches_worker_processes(procs, config, inline_wanted):
    """Set in the fitting process only, ``dscar.apply-inline-bytes`` still decides what worker processes
    send (the job's spec carries it): at 0 the owner fetches the other worker's updates, by default none."""
    with dask.config.set(config):
        res, fetches, inline = _fit(procs, RowCounter(n_parts=1), 40, n_shards=8, max_clocks=4)
    assert_exactly_once(res, 40)
    assert (fetches == 0 and inline > 0) if inline_wanted else (fetches > 0 and inline == 0), (fetches, inline)


def test_a_bad_setting_is_refused_before_the_fit_starts(inproc):
    with dask.config.set({"dscar.apply-inline-bytes": -1}), pytest.raises(dscar.InvalidInputError,
                                                                           match="apply-inline-bytes"):
        dscar.fit(RowCounter(), row_data(10), inproc, max_clocks=1, progress=False)


def test_updates_to_partitions_owned_by_their_stager_are_not_packed():
    """``owned_here``: an attempt whose updates touch only its own worker's partitions sends none
    (its own apply adds them); one touching another's, or every partition of a table, is packed."""
    owners = {("w", 0): "a", ("w", 1): "b", ("s", 0): "a"}
    n_parts = {"w": 2, "s": 1}
    assert owned_here({"w": [0], "s": None}, owners, "a", n_parts)
    assert not owned_here({"w": [0, 1]}, owners, "a", n_parts)
    assert not owned_here({"w": None}, owners, "a", n_parts)
    assert owned_here({}, owners, "a", n_parts)


def test_a_lone_worker_packs_nothing_for_its_commits(monkeypatch):
    """On one worker every partition is its own: its commits carry no updates (packing them cost a
    1-worker clock of 16 shards ~0.3 ms for nothing), and every update is applied once."""
    packed = []
    original = runner.inline_updates

    def counted(staged, limit):
        packed.append(len(staged))
        return original(staged, limit)

    monkeypatch.setattr(runner, "inline_updates", counted)
    with dscar.Cluster(n_workers=1, processes=False) as cl:
        res = dscar.fit(RowCounter(n_parts=2), row_data(40), cl, n_shards=8, max_clocks=3, progress=False)
        assert_exactly_once(res, 40)
        assert packed == []
    with dscar.Cluster(n_workers=2, processes=False) as cl, dask.config.set({"dscar.active-workers": "all"}):
        res = dscar.fit(RowCounter(n_parts=1), row_data(40), cl, n_shards=8, max_clocks=3, progress=False,
                        policies=[], sharding="static")
        assert_exactly_once(res, 40)
    assert packed  # (the worker that owns nothing packs its updates for the owner)
