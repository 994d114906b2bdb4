"""Elastic membership (issue 41): dscar on Dask's adaptive clusters, and the hand-off plan of a
worker that Dask retires."""
import threading
from collections import Counter
import time

import dask
import numpy as np
import pytest
from distributed import LocalCluster
from hypothesis import given, settings
from hypothesis import strategies as st

import dscar
from dscar.algorithms.datasets import make_regression
from dscar.algorithms.lasso import LassoCD
from dscar.scheduler.coordinator import PLUGIN_NAME
from dscar.scheduler.elastic import Elastic
from dscar.core.elastic import (EVEN_MIN_GAIN, adaptive_target, even_plan, handoff_plan, handoff_targets, retirable, setting_up,
                           shard_plan, ssp_leave_step, unit_even_plan, unit_handoff_plan,
                           workers_wanted)
from dscar.errors import InvalidInputError
from bench.worker_models import CHECK_KEYS, FANOUT_ROWS, ExactlyOnce, check_final
from dscar.core.partitions import TableLayout, row_bounds, row_units, shard_homes


# ------------------------------------------------------------------ pure
def test_a_job_wants_one_worker_per_shard_capped_by_the_user_setting():
    assert workers_wanted(12) == 12
    assert workers_wanted(12, 4) == 4
    assert workers_wanted(3, 8) == 3
    assert workers_wanted(5, 0) == 5  # 0: no cap of the user's
    with pytest.raises(ValueError, match="elastic-workers"):
        workers_wanted(5, -1)
    with pytest.raises(ValueError, match="at least one shard"):
        workers_wanted(0)


def test_adaptive_is_told_the_larger_of_its_own_target_and_the_jobs_wants():
    assert adaptive_target(1, []) == 1  # no job: Dask's own target
    assert adaptive_target(0, [6]) == 6
    assert adaptive_target(9, [6]) == 9  # Dask tasks want more: they get it


def test_no_worker_of_a_running_job_is_retirable_as_idle():
    assert retirable(["a", "b", "c"], {"b"}) == ["a", "c"]
    assert retirable(["a", "b"], set()) == ["a", "b"]


keys = st.lists(st.tuples(st.sampled_from("wxyz"), st.integers(0, 5)), unique=True, min_size=1, max_size=16)


@given(keys, st.data())
def test_a_hand_off_moves_exactly_the_leavers_partitions_to_stayers_and_evens_the_load(parts, data):
    workers = ["a", "b", "c", "d"]
    owners = {k: data.draw(st.sampled_from(workers)) for k in parts}
    rows = {k: data.draw(st.integers(1, 100)) for k in parts}
    leaving = set(data.draw(st.lists(st.sampled_from(workers), unique=True, max_size=3)))
    staying = [w for w in workers if w not in leaving]
    plan = handoff_plan(owners, rows, leaving, staying)
    assert set(plan) == {k for k, w in owners.items() if w in leaving}
    assert all(w in staying for w in plan.values())
    # greedy least-loaded: after the move, the most loaded stayer received nothing it could have
    # passed to the least loaded one without overtaking it
    load = {w: sum(rows[k] for k, o in {**owners, **plan}.items() if o == w) for w in staying}
    for k, target in plan.items():
        assert load[target] - rows[k] <= min(load.values())


def test_nobody_staying_means_no_hand_off():
    assert handoff_plan({("w", 0): "a"}, {("w", 0): 5}, {"a"}, ["a"]) == {}


@given(running=st.sets(st.sampled_from("abc")), unapplied=st.sets(st.sampled_from("abc")), quiet=st.booleans())
def test_an_ssp_leaver_hands_off_only_once_nothing_of_it_is_in_flight_and_the_tables_hold_still(running, unapplied, quiet):
    step = ssp_leave_step("a", running, unapplied, quiet)
    assert (step == "hand-off") == ("a" not in running and "a" not in unapplied and quiet)
    if "a" in running:
        assert step == "drain"  # its attempts first: a hand-off now would lose their updates
    elif "a" in unapplied:
        assert step == "flush"
    # the others' attempts and staged updates do not hold it back (they are not its to lose)
    assert ssp_leave_step("a", running - {"a"}, unapplied - {"a"}, True) == "hand-off"


def test_a_paused_ssp_window_starts_no_batch_until_resumed_and_names_the_writers_of_unapplied_updates():
    from dscar.core.ssp import ApplyBatch, ClockWindow

    w = ClockWindow(n_shards=2, staleness=1, limit=5, min_batch=2)
    w.allow(5)
    for shard in (0, 1):
        w.start(shard)
    assert w.commit(0, 1, "a", w.epoch) == [] and w.unapplied_writers() == {"a"}  # waits for a batch
    w.pause()
    assert w.commit(1, 1, "b", w.epoch) == [] and w.in_flight is None  # a batch was due: the pause holds it
    assert w.unapplied_writers() == {"a", "b"}
    (batch,) = w.resume()
    assert isinstance(batch, ApplyBatch) and w.unapplied_writers() == {"a", "b"}  # in flight: not applied yet
    w.batch_applied(batch.batch)
    assert w.unapplied_writers() == set()
    w.check()


def test_a_bad_elastic_workers_setting_is_refused_before_work_starts():
    with dask.config.set({"dscar.core.elastic-workers": "four"}):
        with pytest.raises(InvalidInputError, match="dscar.core.elastic-workers"):
            dscar.fit(LassoCD(0.01), {"X": [[1.0]], "y": [1.0]}, "tcp://127.0.0.1:1")


# --------------------------------------------------------------- cluster
class StopOnceGrown(LassoCD):
    """Lasso that stops (converges) only once every worker of a grown cluster has run shards of it:
    the fit's length is tied to the cluster's state, not to a clock count or a timer."""

    converged_on_workers = False  # (its rule reads the cluster from the driver's process)

    def __init__(self, alpha: float, local_cluster=None, client=None, grown_to: int = 0):
        super().__init__(alpha)
        self._cluster, self._client, self._grown_to = local_cluster, client, grown_to
        #: what Dask would retire as idle, asked on the scheduler while the job ran (each clock)
        self._closable: list[list[str]] = []

    def __getstate__(self):  # (the cluster stays in the driver)
        return {k: v for k, v in self.__dict__.items() if k not in ("_cluster", "_client", "_closable")}

    def converged(self, history, tol) -> bool:
        scheduler = self._cluster.scheduler
        self._closable.append(self._client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.workers_to_close(n=len(dask_scheduler.workers))))
        job = next(iter(scheduler.plugins[PLUGIN_NAME].jobs.values()))
        workers = list(scheduler.workers)
        return len(workers) >= self._grown_to and all(job.monitor.mean_step(w) is not None for w in workers)


def wait_for(what, limit_s: float = 90.0) -> None:
    """Wait until ``what()`` holds (state, not a timer: the limit only stops a broken run)."""
    deadline = time.monotonic() + limit_s
    while not what():
        assert time.monotonic() < deadline, "state not reached"
        time.sleep(0.05)


def test_a_fit_on_an_adaptive_cluster_grows_it_to_the_maximum_keeps_its_workers_and_lets_it_shrink_after():
    X, y, _ = make_regression(4000, 40, seed=3)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        lc.adapt(minimum=2, maximum=4, interval="100ms", wait_count=2)
        cl = dscar.connect(lc)
        algo = StopOnceGrown(0.001, lc, cl.client, grown_to=4)
        res = dscar.fit(algo, {"X": X, "y": y}, cl, n_shards=8, max_clocks=2000, progress=False)
        kinds = [e["kind"] for e in res.events]
        assert kinds.count("worker-joined") >= 2  # grown from 2 to 4 during the fit
        assert "worker-lost" not in kinds and "recovery-started" not in kinds
        assert len(res.history) < 2000  # it stopped because every one of the 4 workers ran shards
        assert algo._closable and not any(algo._closable)  # while it ran, Dask found no worker to retire
        wait_for(lambda: len(lc.scheduler.workers) == 2)  # adaptive shrinks it to its minimum after the fit


def test_row_units_pair_the_same_row_ranges_of_tables_laid_out_alike_and_shard_homes_name_a_shard_s_rows():
    lays = [TableLayout("seen", 6, 3), TableLayout("bad", 6, 3), TableLayout("w", 6, 2), TableLayout("f", 16, 3)]
    units = row_units(lays)
    assert units[("seen", 1)] == units[("bad", 1)] != units[("seen", 2)]
    assert len({units[("w", 0)], units[("seen", 0)], units[("f", 0)]}) == 3  # other cuts: units of their own
    # shard s of [s, s + 1) lives in the first data-row table's partition holding its middle row
    assert shard_homes(lays, [(i, i + 1) for i in range(6)]) == {0: ("seen", 0), 1: ("seen", 0), 2: ("seen", 1),
                                                                 3: ("seen", 1), 4: ("seen", 2), 5: ("seen", 2)}
    assert shard_homes(lays, [(0, 3), (3, 7)]) == {}  # 7 data rows: no table of the data's rows


def unit_case(data, n_units=4, tables="abc"):
    """Partitions of ``tables`` (laid out alike: a unit per row range) and a singleton table, with owners among
    a..d (some units split) and rows per partition."""
    keys = [(t, p) for t in tables for p in range(n_units)] + [("solo", p) for p in range(2)]
    units = {k: ("u", k[1]) if k[0] != "solo" else k for k in keys}
    owners = {k: data.draw(st.sampled_from("abcd")) for k in keys}
    rows = {k: data.draw(st.integers(1, 20)) for k in keys}
    return keys, units, owners, rows


@given(st.data())
def test_a_unit_hand_off_moves_exactly_the_leavers_partitions_and_keeps_each_row_range_with_one_taker(data):
    keys, units, owners, rows = unit_case(data)
    leaving = set(data.draw(st.lists(st.sampled_from("abcd"), unique=True, min_size=1, max_size=3)))
    staying = [w for w in "abcd" if w not in leaving]
    plan = unit_handoff_plan(owners, rows, units, leaving, staying)
    assert set(plan) == {k for k, w in owners.items() if w in leaving} and set(plan.values()) <= set(staying)
    for u in set(units.values()):  # a row range's partitions of the leavers go to one stayer ...
        members = [k for k in keys if units[k] == u]
        assert len({plan[k] for k in members if k in plan}) <= 1
        if len({owners[k] for k in members}) == 1:  # ... and one that had one owner keeps one
            assert len({plan.get(k, owners[k]) for k in members}) == 1


@given(st.data())
def test_a_unit_even_plan_leaves_every_row_range_with_one_owner_and_nothing_to_do_after(data):
    keys, units, owners, rows = unit_case(data)
    workers = data.draw(st.lists(st.sampled_from("abcdx"), unique=True, min_size=1))
    plan = unit_even_plan(owners, rows, units, workers)
    after = {**owners, **plan}
    assert set(plan.values()) <= set(workers) and all(owners[k] != w for k, w in plan.items())
    for u in set(units.values()):
        members = [k for k in keys if units[k] == u]
        if all(owners[k] in workers for k in members):
            assert len({after[k] for k in members}) == 1  # brought together (and moved whole)
        else:
            assert all(k not in plan for k in members)  # a partition owned outside the workers: left alone
    assert unit_even_plan(after, rows, units, workers) == {}


def test_shards_go_to_the_owner_of_their_rows_in_a_hand_off_and_after_a_switch():
    homes = {0: ("seen", 0), 1: ("seen", 0), 2: ("seen", 1), 3: ("seen", 1)}
    owners = {("seen", 0): "a", ("seen", 1): "b"}
    holders = {0: "a", 1: "c", 2: "c", 3: "b"}
    # c leaves: its shards go to their rows' owners, not to whoever holds the fewest
    assert shard_plan(holders, ["a", "b"], {"c"}, homes, owners) == {1: "a", 2: "b"}
    assert shard_plan(holders, ["a", "b"], {"c"}, homes, {**owners, ("seen", 1): "c"}) == {1: "a", 2: "b"}
    # after a switch: every shard held by another member than its rows' owner follows them
    assert shard_plan(holders, {"a", "b", "c"}, (), homes, owners) == {1: "a", 2: "b"}
    assert shard_plan(holders, {"a", "b"}, (), homes, owners) == {}  # c is not a member (leaving, warming up)
    assert shard_plan(holders, {"a", "b", "c"}, (), homes, owners, follow=False) == {}
    # up to an even share: a owns every shard's rows, but takes 2 of 4 (the pass waits for its busiest worker)
    everything = {("seen", 0): "a", ("seen", 1): "a"}
    assert shard_plan({0: "a", 1: "c", 2: "c", 3: "b"}, {"a", "b", "c"}, (), homes, everything) == {1: "a"}
    assert shard_plan({0: "a", 1: "c", 2: "c", 3: "b"}, ["a", "b"], {"c"}, homes, everything) == {1: "a", 2: "b"}
    # a shard leaving a full owner makes room there for one of its own rows (b: 2 of 4, one of them a's)
    swap = {0: "b", 1: "a", 2: "b", 3: "a"}
    assert shard_plan(swap, ["a", "b"], (), homes, owners) == {0: "a", 3: "b"}
    # a leaver's shard goes before a stayer's: a has room for one (of 3 shards on 2 workers: share 2)
    three = {0: ("seen", 0), 1: ("seen", 0), 2: ("seen", 0)}
    assert shard_plan({0: "a", 1: "b", 2: "c"}, ["a", "b"], {"c"}, three, owners) == {2: "a"}


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_shard_plan_moves_each_shard_once_keeps_an_even_share_and_hands_off_every_leavers_shard(data):
    workers = "abcde"
    n = data.draw(st.integers(1, 24))
    holders = {s: data.draw(st.sampled_from(workers + "-"), label=f"holder {s}") for s in range(n)}
    holders = {s: (None if w == "-" else w) for s, w in holders.items()}
    parts = data.draw(st.integers(1, 6))
    homes = {s: ("seen", s * parts // n) for s in range(n)}
    owners = {("seen", p): data.draw(st.sampled_from(workers), label=f"owner {p}") for p in range(parts)}
    staying = data.draw(st.lists(st.sampled_from(workers), unique=True, min_size=1))
    rest = [w for w in workers if w not in staying]
    leaving = data.draw(st.lists(st.sampled_from(rest), unique=True) if rest else st.just([]))
    plan = shard_plan(holders, staying, leaving, homes, owners)
    after = {**holders, **plan}
    assert set(plan.values()) <= set(staying) and all(holders[s] != w for s, w in plan.items())
    assert not any(w in leaving for w in after.values())  # every leaver's shard handed off
    share = -(-n // len(staying))
    before, held = Counter(holders.values()), Counter(after.values())
    for s, w in plan.items():  # to its rows' owner within an even share (or a swap: nobody's count changes)
        if holders[s] in staying:  # (a stayer's moves only there)
            assert w == owners[homes[s]] and held[w] <= max(share, before[w])
        elif w == owners[homes[s]]:
            assert held[w] <= max(share, before[w])
    # nothing more to do: a second plan moves nothing
    assert shard_plan(after, staying, (), homes, owners) == {}


def test_a_shard_hand_off_spreads_the_leavers_shards_over_the_stayers():
    holders = {0: "a", 1: "a", 2: "b", 3: "c", 4: None}
    plan = shard_plan(holders, ["a", "b", "c"], {"a"})
    assert sorted(plan) == [0, 1] and sorted(plan.values()) == ["b", "c"]
    assert shard_plan(holders, ["a", "b", "c"], {"a", "b", "c"}) == {}


class RetiresAnOwner:
    """A model that asks Dask to retire a partition owner after ``at`` clocks (from the driver, in a
    thread: the retirement waits for the hand-off, which waits for a clock boundary, or under SSP for
    the leaver's drain), and waits until the coordinator heard of it."""

    converged_on_workers = False  # (its hook runs in the driver's process)

    def _retire_at(self, local_cluster, client, at: int) -> None:
        self._cluster, self._client, self._at = local_cluster, client, at
        self.retired: list[str] = []
        self._thread = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_cluster", "_client", "_thread", "retired")}

    def _pick(self, job) -> str:
        """The worker to retire: the first owner by name."""
        return sorted(set(job.pmap.owners.values()))[0]

    def converged(self, history, tol) -> bool:
        if self._at and len(history) == self._at:
            coordinator = self._cluster.scheduler.plugins[PLUGIN_NAME]
            job = next(iter(coordinator.jobs.values()))
            worker = self._pick(job)
            self.retired.append(worker)
            self._thread = threading.Thread(target=self._client.retire_workers, kwargs={"workers": [worker]})
            self._thread.start()
            wait_for(lambda: worker in coordinator.elastic.leaving or worker in job.lost)  # asked (or handed off already)
        return False


class RetireMidFit(RetiresAnOwner, LassoCD):
    """Lasso that retires a partition owner after ``at`` clocks (``RetiresAnOwner``)."""

    def __init__(self, alpha: float, local_cluster=None, client=None, at: int = 0):
        super().__init__(alpha)
        self._retire_at(local_cluster, client, at)


def test_a_worker_retired_mid_fit_hands_off_its_partitions_with_no_loss_and_no_rework():
    X, y, _ = make_regression(3000, 30, seed=5)
    data = {"X": X, "y": y}
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        cl = dscar.connect(lc)
        ref = dscar.fit(LassoCD(0.01), data, cl, n_shards=6, max_clocks=8, tol=1e-300, progress=False)
        algo = RetireMidFit(0.01, lc, cl.client, at=3)
        res = dscar.fit(algo, data, cl, n_shards=6, max_clocks=8, tol=1e-300, progress=False)
        algo._thread.join(60)
        kinds = [e["kind"] for e in res.events]
        handoff = [e for e in res.events if e["kind"] == "handoff"]
        assert len(handoff) == 1 and handoff[0]["workers"] == algo.retired and handoff[0]["failed"] == 0
        assert handoff[0]["partitions"] > 0 and handoff[0]["seconds"] >= 0
        assert "worker-left" in kinds
        assert not {"worker-lost", "recovery-started", "partition-restored", "rollback"} & set(kinds)
        assert [r.clock for r in res.history] == [r.clock for r in ref.history]  # no clock skipped or run again
        np.testing.assert_allclose([r.metrics["objective"] for r in res.history],
                                   [r.metrics["objective"] for r in ref.history], rtol=1e-9)
        wait_for(lambda: algo.retired[0] not in lc.scheduler.workers)  # and Dask retired it


class SspRetireMidFit(RetiresAnOwner, ExactlyOnce):
    """``bench.worker_models.ExactlyOnce`` under SSP (every shard's update counted in param tables, its shard
    state checked against them) that retires a partition owner after ``at`` clocks (``RetiresAnOwner``)."""

    def __init__(self, clocks: int, local_cluster=None, client=None, at: int = 0, staleness: int = 0,
                 work_s: float = 0.0):
        super().__init__(clocks, work_s=work_s, staleness=staleness)
        self._retire_at(local_cluster, client, at)


class UnevenRetireMidFit(RetiresAnOwner, ExactlyOnce):
    """``bench.worker_models.ExactlyOnce`` that retires, after ``at`` clocks, an owner whose hand-off leaves
    the stayers unevenly loaded (``unit_even_plan`` would move something): ``uneven`` is the layout it leaves."""

    def __init__(self, clocks: int, local_cluster=None, client=None, at: int = 0):
        super().__init__(clocks)
        self._retire_at(local_cluster, client, at)
        self.uneven: dict | None = None

    def __getstate__(self):
        return {k: v for k, v in super().__getstate__().items() if k != "uneven"}

    def _pick(self, job) -> str:
        rows = {(t, p): b - a for t, lay in job.pmap.layouts.items() for p, (a, b) in enumerate(lay.bounds)}
        owners, units = sorted(set(job.pmap.owners.values())), row_units(job.pmap.layouts.values())
        for w in owners:
            stay = [v for v in owners if v != w]
            after = {**job.pmap.owners, **unit_handoff_plan(job.pmap.owners, rows, units, [w], stay)}
            if unit_even_plan(after, rows, units, stay):
                self.uneven = loads_of(after, rows, stay)
                return w
        raise AssertionError(f"no owner's hand-off leaves an uneven layout: {job.pmap.owners}")


def test_a_hand_off_that_leaves_the_stayers_uneven_is_evened_out_at_a_later_boundary_with_every_update_once():
    """The stayers take a leaver's partitions a row range at a time (``unit_handoff_plan``, at the boundary);
    what that leaves uneven is copied in the background and switched at a later boundary (``unit_even_plan``):
    the largest owner ends with fewer rows, and every shard's update is applied once in every clock."""
    clocks, n_shards = 8, 8  # (8 shards on 3 workers: some owner's hand-off leaves an uneven layout)
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        cl = dscar.connect(lc)
        coordinator = lc.scheduler.plugins[PLUGIN_NAME]
        algo = UnevenRetireMidFit(clocks, lc, cl.client, at=3)
        final: dict = {}
        switch = coordinator.elastic.switch_copies

        hand_off, aligned = coordinator.elastic.hand_off, []

        def check(job):  # (after the hand-off and after the switch: is every shard with its rows' owner, or does
            homes = coordinator.elastic.shard_homes[job.cfg.job_id]  # that owner hold its even share of them already?)
            held = Counter(job.queue.holder(s) for s in homes)
            share = -(-len(homes) // len(held))
            aligned.append(all(job.queue.holder(s) == job.pmap.owners[h] or held[job.pmap.owners[h]] >= share
                               for s, h in homes.items()))

        async def recorded(job):  # (the owner map as the last boundary leaves it: the job is dropped at its end)
            pending = bool(coordinator.elastic.copies.get(job.cfg.job_id))
            await switch(job)
            final.update(job.pmap.owners)
            if pending:
                check(job)

        async def handed_off(job, *a, **kw):
            await hand_off(job, *a, **kw)
            check(job)

        coordinator.elastic.switch_copies = recorded
        coordinator.elastic.hand_off = handed_off
        res = dscar.fit(algo, {"x": np.arange(float(n_shards))}, cl, n_shards=n_shards, max_clocks=clocks,
                        progress=False)
        algo._thread.join(60)
        kinds = [e["kind"] for e in res.events]
        assert kinds.count("handoff") == 1 and "worker-left" in kinds
        taken = [e for e in res.events if e["kind"] == "partitions-taken-on"]
        assert len(taken) == 1 and taken[0]["failed"] == 0 and taken[0]["clock"] > 3
        # the shards follow their rows: each is held by its rows' owner after the hand-off and after the switch
        # (up to an even share each)
        assert len(aligned) == 2 and all(aligned), aligned
        stay = sorted(algo.uneven)
        job_rows = {(t, p): b - a for t, n in (("seen", n_shards), ("bad", n_shards), ("steps", n_shards),
                                                ("fanout", FANOUT_ROWS))
                    for p, (a, b) in enumerate(row_bounds(n, 3))}
        assert final and max(loads_of(final, job_rows, stay).values()) < max(algo.uneven.values())
        assert not {"worker-lost", "recovery-started", "partition-restored", "rollback"} & set(kinds)
        assert len(res.history) == clocks and not any(r.skipped for r in res.history)
        for r in res.history:  # every shard's update applied once in every clock, in every table
            assert all(r.metrics[k] == 0 for k in CHECK_KEYS), (r.clock, r.metrics)
        assert check_final(res.params["seen"], clocks, True) == 0
        np.testing.assert_array_equal(res.params["fanout"], clocks * float(n_shards))


def test_a_worker_retired_mid_fit_under_ssp_is_drained_and_hands_off_with_no_loss_and_no_rework():
    """Under SSP clocks overlap: the leaver is handed no more work, its committed updates are applied,
    then its partitions (with the SSP updates they hold) and shard states are copied and switched while
    the tables hold still. No checkpoint store: a retirement taken for a loss would fail the fit."""
    clocks, n_shards = 10, 6
    data = {"x": np.arange(float(n_shards))}
    # no straggler policy: on a loaded machine a backup's race loser is a refused commit by design,
    # which is not the hand-off's rework this test looks for
    kw = dict(n_shards=n_shards, max_clocks=clocks, consistency="ssp", staleness=1, progress=False, policies=[])
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        cl = dscar.connect(lc)
        ref = dscar.fit(ExactlyOnce(clocks, work_s=0.02, staleness=1), data, cl, **kw)
        algo = SspRetireMidFit(clocks, lc, cl.client, at=3, staleness=1, work_s=0.02)
        res = dscar.fit(algo, data, cl, **kw)
        algo._thread.join(60)
        kinds = [e["kind"] for e in res.events]
        handoff = [e for e in res.events if e["kind"] == "handoff"]
        assert len(handoff) == 1 and handoff[0]["workers"] == algo.retired and handoff[0]["failed"] == 0
        assert handoff[0]["partitions"] > 0 and handoff[0]["seconds"] >= 0
        left = [e for e in res.events if e["kind"] == "worker-left"]
        assert [e["worker"] for e in left] == algo.retired and left[0]["requeued"] == []  # nothing of it ran again
        assert not {"worker-lost", "recovery-started", "partition-restored", "rollback", "clock-end-skipped",
                    "handoff-timeout", "commit-refused", "shard-failed"} & set(kinds)
        assert [r.clock for r in res.history] == [r.clock for r in ref.history]
        for r in res.history:  # every shard's update applied once, in every clock; shard states carried over
            assert not r.skipped and all(r.metrics[k] == 0 for k in CHECK_KEYS), (r.clock, r.metrics)
        assert check_final(res.params["seen"], clocks, True, staleness=1) == 0
        for table in ("seen", "bad", "steps", "fanout"):  # the same model as the run without the retirement
            np.testing.assert_array_equal(res.params[table], ref.params[table])
        wait_for(lambda: algo.retired[0] not in lc.scheduler.workers)  # and Dask retired it


def loads_of(owners, rows, workers):
    out = {w: 0 for w in workers}
    for k, w in owners.items():
        if w in out:
            out[w] += rows[k]
    return out


@given(keys, st.data())
def test_an_even_plan_moves_partitions_between_members_only_while_that_lowers_the_largest_load(parts, data):
    owners = {k: data.draw(st.sampled_from(["a", "b", "c", "gone"])) for k in parts}
    rows = {k: data.draw(st.integers(1, 100)) for k in parts}
    members = data.draw(st.lists(st.sampled_from(["a", "b", "c", "x", "y"]), unique=True))
    plan = even_plan(owners, rows, members)
    after = {**owners, **plan}
    before, load = loads_of(owners, rows, members), loads_of(after, rows, members)
    assert set(plan.values()) <= set(members) and all(owners[k] in members and owners[k] != w for k, w in plan.items())
    if plan:  # it pays: the largest owner holds fewer rows, by EVEN_MIN_GAIN or more
        assert max(load.values()) <= (1 - EVEN_MIN_GAIN) * max(before.values())
    # and it went as far as its steps go: from where it leaves the partitions, no plan pays
    assert even_plan(after, rows, members) == {}


def test_an_even_plan_leaves_out_the_steps_after_the_largest_load_last_fell():
    # a's 10 goes to x (20 -> 12); then c's 6 could go to y, but b still holds 12: no clock is shorter
    rows = {("t", 0): 10, ("t", 1): 10, ("u", 0): 6, ("u", 1): 6, ("v", 0): 6, ("v", 1): 6}
    owners = {("t", 0): "a", ("t", 1): "a", ("u", 0): "b", ("u", 1): "b", ("v", 0): "c", ("v", 1): "c"}
    assert even_plan(owners, rows, ["a", "b", "c", "x", "y"]) == {("t", 0): "x"}


def test_an_even_plan_at_a_thousand_workers_moves_what_pays_and_nothing_else():
    """One partition of each of 4 tables a worker, as a job that started on 1,000 workers cuts them: a
    joiner can take whole partitions only, and the largest load falls only if every owner sheds rows,
    so nothing moves (before, 1,814 moves shaved 5 of 10,055 rows, in 5.9 s); a survivor that took a
    leaver's partitions (twice the rows) hands them on, 3 moves."""
    members = [f"w{i:04d}" for i in range(1000)]
    rows = {(t, p): n for t, n in (("a", 10_000), ("b", 50), ("c", 1), ("d", 4)) for p in range(1000)}
    owners = {(t, p): members[p] for t, p in rows}
    assert even_plan(owners, rows, members + ["joiner"]) == {}
    heavy = {k: ("w0001" if w == "w0000" else w) for k, w in owners.items()}  # w0000's partitions on w0001
    plan = even_plan(heavy, rows, members[1:])  # two of the 10,000-row partitions must share an owner: no plan
    assert plan == {}
    tens = {(t, p): 10 for t in "abcd" for p in range(1000)}
    plan = even_plan(heavy, tens, members[1:])
    assert len(plan) == 3 and max(loads_of({**heavy, **plan}, tens, members[1:]).values()) == 50  # from 80


def test_an_even_plan_takes_a_joiner_and_a_hand_off_to_the_even_layout_and_moves_nothing_that_does_not_pay():
    # 4 tables of 12, 12, 12, 16 rows cut for 3 workers (4, 4, 4 and 6, 5, 5 rows): a joiner takes the
    # fewest rows that even the 4 workers to 14, the best any owner map of these partitions reaches
    rows, owners = {}, {}
    for t, bounds in (("s", (4, 4, 4)), ("b", (4, 4, 4)), ("t", (4, 4, 4)), ("f", (6, 5, 5))):
        for p, n in enumerate(bounds):
            rows[t, p], owners[t, p] = n, "abc"[p]
    plan = even_plan(owners, rows, ["a", "b", "c", "d"])
    assert max(loads_of({**owners, **plan}, rows, "abcd").values()) == 14 and set(plan.values()) == {"d"}
    # a joiner that holds 6, 5 and 4 rows against another's 4, 4 and 4 swaps its 5 for a 4 (no move helps)
    uneven = {("f", 0): "d", ("f", 1): "d", ("s", 0): "d", ("s", 1): "a", ("b", 1): "a", ("t", 1): "a"}
    swap = even_plan(uneven, rows, ["a", "d"])
    assert sorted(swap.values()) == ["a", "d"] and sorted(loads_of({**uneven, **swap}, rows, "ad").values()) == [13, 14]
    assert even_plan({("w", 0): "a"}, {("w", 0): 10}, ["a", "x"]) == {}  # it would only swap who holds 10
    assert even_plan({("w", 0): "a", ("w", 1): "a"}, {("w", 0): 10, ("w", 1): 10}, ["a", "x"]) == {("w", 0): "x"}
    # two owners at the top: evening one of them out lowers no largest load, so nothing moves
    assert even_plan({("w", 0): "a", ("w", 1): "b"}, {("w", 0): 10, ("w", 1): 10}, ["a", "b", "x"]) == {}
    assert even_plan({("w", 0): "a", ("w", 1): "a"}, {("w", 0): 10, ("w", 1): 10}, ["a"]) == {}  # nobody to take one


WORKERS = ["a", "b", "c", "d", "e"]


@given(st.sets(st.sampled_from(WORKERS)), st.sets(st.sampled_from(WORKERS)),
       st.lists(st.sampled_from(WORKERS)), st.lists(st.sampled_from([*WORKERS, None])))
def test_workers_setting_up_are_the_unregistered_live_ones_with_nothing_of_the_job(live, registered, owners, holders):
    fresh = setting_up(live, registered, owners, holders)
    assert fresh <= live and not fresh & registered and not fresh & set(owners) and not fresh & set(holders)
    # every live worker left out has registered, or owns or holds something (an apply must reach it)
    assert all(w in registered or w in owners or w in holders for w in live - fresh)
    staying = sorted(live)
    targets = handoff_targets(staying, fresh)
    assert set(targets) <= live and (not staying or targets)  # someone takes a leaver's partitions
    if live - fresh:  # only workers set up, all of them
        assert set(targets) == live - fresh
    else:  # nobody is set up: anyone staying
        assert targets == staying


def grow_mid_fit(algo, history) -> None:
    """After ``algo._at`` clocks, add a worker to the cluster and hold the clock loop until the new
    worker has partitions copied to it; put their switch off by one clock, so rows of the copy change
    before it (as they do when the copy runs beside a clock); count the pulls the new worker serves."""
    coordinator = algo._cluster.scheduler.plugins[PLUGIN_NAME]
    if len(history) == algo._at + 1:
        del coordinator.elastic.switch_copies  # the next boundary switches
    if len(history) != algo._at:
        return
    job_id = next(iter(coordinator.jobs))

    async def not_yet(job):
        pass

    coordinator.elastic.switch_copies = not_yet
    before = set(algo._cluster.scheduler.workers)
    algo._cluster.scale(len(before) + 1)
    wait_for(lambda: any(w not in before for w, _ in coordinator.elastic.copies.get(job_id, {}).values()))
    new = next(w for w, _ in coordinator.elastic.copies[job_id].values() if w not in before)
    worker = next(w for w in algo._cluster.workers.values() if w.address == new)
    for op in ("pull", "pull_many"):
        handler = worker.handlers[f"dscar_{op}"]

        def counted(comm, _handler=handler, _op=op, **kw):  # (Dask passes ``comm`` by its name)
            algo.pulls_served.append(_op)
            return _handler(comm, **kw)

        worker.handlers[f"dscar_{op}"] = counted


class GrowMidFit(LassoCD):
    """Lasso that grows its cluster mid-fit (``grow_mid_fit``)."""

    converged_on_workers = False  # (its hook runs in the driver's process)

    def __init__(self, alpha: float, local_cluster=None, at: int = 0):
        super().__init__(alpha)
        self._cluster, self._at = local_cluster, at
        self.pulls_served: list[str] = []  #: the pull messages the joiner answered (each its op)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_cluster", "pulls_served")}

    def converged(self, history, tol) -> bool:
        grow_mid_fit(self, history)
        return False


class CountedGrowMidFit(ExactlyOnce):
    """``bench.worker_models.ExactlyOnce`` (every shard's update counted in param tables, checked at each clock
    end) that grows its cluster mid-fit (``grow_mid_fit``): a row of a moved partition left stale
    shows as an update lost."""

    converged_on_workers = False  # (its hook runs in the driver's process)

    def __init__(self, clocks: int, local_cluster=None, at: int = 0):
        super().__init__(clocks)
        self._cluster, self._at = local_cluster, at
        self.pulls_served: list[str] = []

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_cluster", "pulls_served")}

    def converged(self, history, tol) -> bool:
        grow_mid_fit(self, history)
        return False


def test_a_worker_added_mid_fit_owns_partitions_at_the_boundary_after_its_copy_and_serves_pulls_with_no_rework():
    """The partitions are copied while clocks run (``adopt`` step "copy") and switch owner at a clock
    boundary with the rows changed since the copy re-sent: the objective trajectory is the same as
    without the join, to rounding."""
    X, y, _ = make_regression(3000, 30, seed=5)
    data = {"X": X, "y": y}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        cl = dscar.connect(lc)
        ref = dscar.fit(LassoCD(0.01), data, cl, n_shards=6, max_clocks=8, tol=1e-300, progress=False)
        algo = GrowMidFit(0.01, lc, at=3)
        res = dscar.fit(algo, data, cl, n_shards=6, max_clocks=8, tol=1e-300, progress=False)
        taken = [e for e in res.events if e["kind"] == "partitions-taken-on"]
        assert len(taken) == 1 and taken[0]["partitions"] > 0 and taken[0]["failed"] == 0
        assert taken[0]["clock"] == 4  # at the boundary it was let switch at: clock 4 ended
        assert 0 < taken[0]["rows_resent"] <= taken[0]["rows"]  # clock 4 changed rows of the copy: re-sent
        ready = [e for e in res.events if e["kind"] == "worker-ready"]
        assert len(ready) == 1 and ready[0]["worker"] in taken[0]["workers"]  # (others may even out too)
        new = ready[0]["worker"]
        assert any(new in r.shards_per_worker for r in res.history)  # it ran shards
        assert algo.pulls_served  # and served the pulls of the partitions it owns
        kinds = {e["kind"] for e in res.events}
        assert not {"worker-lost", "recovery-started", "partition-restored", "rollback"} & kinds
        np.testing.assert_allclose([r.metrics["objective"] for r in res.history],
                                   [r.metrics["objective"] for r in ref.history], rtol=1e-9)


def test_a_joiner_s_switch_re_sends_the_rows_changed_since_its_copy_so_no_update_is_lost():
    clocks = 8
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        cl = dscar.connect(lc)
        algo = CountedGrowMidFit(clocks, lc, at=3)
        res = dscar.fit(algo, {"x": np.arange(6.0)}, cl, n_shards=6, max_clocks=clocks, progress=False)
        taken = [e for e in res.events if e["kind"] == "partitions-taken-on"]
        assert len(taken) == 1 and taken[0]["rows_resent"] > 0 and algo.pulls_served
        assert len(res.history) == clocks and not any(r.skipped for r in res.history)
        for r in res.history:  # every shard's update applied once in every clock, in every table
            assert all(r.metrics[k] == 0 for k in CHECK_KEYS), (r.clock, r.metrics)
        assert check_final(res.params["seen"], clocks, True) == 0
        # the partitions that moved (fanout's, the largest): every shard step of every clock adds 1 to each row
        assert "fanout" in {t for t, _ in taken[0]["moved"]}
        np.testing.assert_array_equal(res.params["fanout"], clocks * 6.0)


def test_an_owner_lost_between_its_partitions_copy_and_their_switch_goes_the_loss_s_way(tmp_path):
    """Partitions are copied from both first workers to a joiner and the switch is held a clock; worker 0 is
    lost in that clock: its partitions are restored from a checkpoint (the loss's path), its copies are not
    switched, the others' are, and every shard's update is applied once in every clock."""
    clocks = 8
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        cl = dscar.connect(lc)
        coordinator = lc.scheduler.plugins[PLUGIN_NAME]
        algo = CountedGrowMidFit(clocks, lc, at=3)
        sources: list[set] = []
        switch = coordinator.elastic.switch_copies

        async def noted(job):  # (the sources of the copies each boundary switches)
            sources.append({src for _, src in coordinator.elastic.copies.get(job.cfg.job_id, {}).values()})
            await switch(job)

        grow = Elastic.switch_copies
        Elastic.switch_copies = lambda self, job: noted(job)
        try:
            res = dscar.fit(algo, {"x": np.arange(6.0)}, cl, n_shards=6, max_clocks=clocks, progress=False,
                            checkpoint=dscar.CheckpointConfig(str(tmp_path), policy="full", every=1),
                            faults=[dscar.faults.lose(0, 4)])
        finally:
            Elastic.switch_copies = grow
        lost = [e["worker"] for e in res.events if e["kind"] == "worker-lost"]
        assert lost == [res.workers[0]] and any(lost[0] in s for s in sources)  # it was the source of copies
        kinds = [e["kind"] for e in res.events]
        assert "recovery-started" in kinds and "partition-restored" in kinds
        taken = [e for e in res.events if e["kind"] == "partitions-taken-on"]
        assert taken and all(lost[0] not in e["workers"] for e in taken)
        assert len(res.history) == clocks
        for r in res.history:  # every shard's update applied once, in every clock the loss did not cut short
            if not r.skipped:
                assert all(r.metrics[k] == 0 for k in CHECK_KEYS), (r.clock, r.metrics)
        assert check_final(res.params["seen"], clocks, True) == 0


def memory_tier_fit(algo, cl, clocks: int, tmp_path) -> dscar.FitResult:
    """A fit of ``algo`` (``ExactlyOnce``'s) on 6 shards with the memory tier, and disk checkpoints every 100
    clocks: a partition restored from the disk comes back as of clock 0."""
    return dscar.fit(algo, {"x": np.arange(6.0)}, cl, n_shards=6, max_clocks=clocks, progress=False,
                     checkpoint=dscar.CheckpointConfig(str(tmp_path), policy="full", every=100, memory=True))


def test_a_joiner_lost_right_after_its_switch_gets_its_partitions_back_from_their_old_owners_memory(tmp_path,
                                                                                                   monkeypatch):
    """With the memory tier, an old owner keeps what a switch takes from it as the memory copy of that
    clock: the new owner, lost before its own copy lands at its buddy (here at once, in the switch's
    boundary), has its partitions restored from there, not from the disk's checkpoint 0, and no update
    is lost (the ring may have put an old owner's copy on the joiner itself, gone with it)."""
    from dscar.worker.mirror_store import part_key
    from dscar.worker.plugin import PLUGIN_NAME as WORKER_PLUGIN

    clocks = 8
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        cl = dscar.connect(lc)
        coordinator = lc.scheduler.plugins[PLUGIN_NAME]
        algo = CountedGrowMidFit(clocks, lc, at=3)
        kept: list[tuple] = []  # (partition, old owner, the clock of its kept copy, whether it equals the new owner's)
        switch = Elastic.switch_copies

        async def then_lose_the_joiner(self, job):
            pending = dict(self.copies.get(job.cfg.job_id, {}))
            await switch(self, job)
            moved = {k: (w, src) for k, (w, src) in pending.items() if job.pmap.owners.get(k) == w}
            if not moved:
                return
            plugins = {w.address: w.plugins[WORKER_PLUGIN] for w in lc.workers.values()}
            for k, (w, src) in moved.items():
                if job.cfg.kinds[k[0]] == "param":
                    clock, values = plugins[src].jobs[job.cfg.job_id].mirrors.get(part_key(*k))
                    kept.append((k, src, clock, np.array_equal(values, plugins[w].jobs[job.cfg.job_id].tables.parts[k])))
            (joiner,) = {w for w, _ in moved.values()}
            await self.coordinator._h_simulate_loss(job.cfg.job_id, joiner)

        monkeypatch.setattr(Elastic, "switch_copies", then_lose_the_joiner)
        res = memory_tier_fit(algo, cl, clocks, tmp_path)
    assert kept and all(clock == 4 and same for _, _, clock, same in kept), kept  # (the switch after clock 4)
    (lost,) = [e["worker"] for e in res.events if e["kind"] == "worker-lost"]
    (recovery,) = [e for e in res.events if e["kind"] == "recovery-started"]
    restored = {(t, p) for t, p, _ in recovery["partitions"]}
    param = {k for k, _, _, _ in kept}
    assert param <= restored  # the joiner's param partitions came back ...
    from_memory = {(t, p): (buddy, clock) for t, p, buddy, clock in recovery["from_memory"]}
    assert all(k in from_memory and from_memory[k][1] == 4 for k in param), from_memory  # ... as of clock 4
    assert lost not in {b for b, _ in from_memory.values()}
    assert len(res.history) == clocks and not any(r.skipped for r in res.history)
    for r in res.history:  # every shard's update applied once in every clock
        assert all(r.metrics[k] == 0 for k in CHECK_KEYS), (r.clock, r.metrics)
    assert check_final(res.params["seen"], clocks, True) == 0


class CountedRetireMidFit(RetiresAnOwner, ExactlyOnce):
    """``bench.worker_models.ExactlyOnce`` that retires a partition owner after ``at`` clocks (``RetiresAnOwner``)."""

    def __init__(self, clocks: int, local_cluster=None, client=None, at: int = 0):
        super().__init__(clocks)
        self._retire_at(local_cluster, client, at)


def test_a_worker_lost_right_after_a_hand_off_gets_its_partitions_back_from_the_copies_its_leaving_buddy_passed_on(
        tmp_path, monkeypatch):
    """With the memory tier, a leaver keeps the memory copies of its predecessor in the ring (it is that
    worker's buddy); a hand-off passes them on to the predecessor's buddy among the stayers
    (``handed_copies``, beside the next clock; the leaver's retirement goes on once they landed), so the
    predecessor, lost then, has its partitions restored from there as of the hand-off's clock, not from the
    disk's checkpoint 0, and no update is lost."""
    clocks = 8
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        cl = dscar.connect(lc)
        algo = CountedRetireMidFit(clocks, lc, cl.client, at=3)
        lost: list[str] = []
        hand_off = Elastic.hand_off

        async def then_lose_the_predecessor(self, job, leaving, *a, **kw):
            ring = sorted(self.coordinator._live(job))
            (leaver,) = leaving
            retired = self.leaving[leaver]  # (done once the leaver's copies landed: the next clock runs meanwhile)
            await hand_off(self, job, leaving, *a, **kw)
            await retired
            predecessor = ring[ring.index(leaver) - 1]
            if job.pmap.owned_by(predecessor):
                lost.append(predecessor)
                await self.coordinator._h_simulate_loss(job.cfg.job_id, predecessor)

        monkeypatch.setattr(Elastic, "hand_off", then_lose_the_predecessor)
        res = memory_tier_fit(algo, cl, clocks, tmp_path)
        algo._thread.join(60)
    (handoff,) = [e for e in res.events if e["kind"] == "handoff"]
    assert handoff["workers"] == algo.retired and handoff["copies_to_pass"] > 0
    assert lost and [e["worker"] for e in res.events if e["kind"] == "worker-lost"] == lost
    (recovery,) = [e for e in res.events if e["kind"] == "recovery-started"]
    param = {(t, p) for t, p, _ in recovery["partitions"] if t in ("seen", "bad")}
    from_memory = {(t, p): (buddy, clock) for t, p, buddy, clock in recovery["from_memory"]}
    assert param and all(k in from_memory and from_memory[k][1] == handoff["clock"] for k in param), (param, from_memory)
    assert not {b for b, _ in from_memory.values()} & {lost[0], *algo.retired}
    assert len(res.history) == clocks and not any(r.skipped for r in res.history)
    for r in res.history:  # every shard's update applied once in every clock
        assert all(r.metrics[k] == 0 for k in CHECK_KEYS), (r.clock, r.metrics)
    assert check_final(res.params["seen"], clocks, True) == 0


class CopiesCheckedGrowMidFit(CountedGrowMidFit):
    """``CountedGrowMidFit`` that, at its last clock (the job holds still until the driver ends it), waits
    until every worker keeps just the memory copies the coordinator records for it (``mismatch``: what
    differed when the wait gave up, None once it held)."""

    def __init__(self, clocks: int, local_cluster=None, at: int = 0):
        super().__init__(clocks, local_cluster, at)
        self.mismatch: dict | None = {}

    def __getstate__(self):
        return {k: v for k, v in super().__getstate__().items() if k != "mismatch"}

    def converged(self, history, tol) -> bool:
        from dscar.worker.mirror_store import part_key, shard_key
        from dscar.worker.plugin import PLUGIN_NAME as WORKER_PLUGIN

        grow_mid_fit(self, history)
        if len(history) != self.clocks:
            return False
        coordinator = self._cluster.scheduler.plugins[PLUGIN_NAME]
        (job_id, job), = coordinator.jobs.items()

        def differences() -> dict:
            records = {**{part_key(*k): v for k, v in dict(job.mirrors).items()},
                       **{shard_key(s): v for s, v in dict(job.state_mirrors).items()}}
            out = {}
            for w in self._cluster.workers.values():
                held = w.plugins[WORKER_PLUGIN].jobs[job_id].mirrors.copies
                kept = {k: c for k, (c, _) in dict(held).items()}
                named = {k: c for k, (holder, c) in records.items() if holder == w.address}
                if kept != named:
                    out[w.address] = (kept, named)
            return out

        try:
            wait_for(lambda: not differences(), limit_s=30)
            self.mismatch = None
        except AssertionError:
            self.mismatch = differences()
        return False


def test_after_a_join_each_worker_keeps_only_the_memory_copies_the_coordinator_records_for_it(tmp_path):
    """A join changes the ring (a worker's copies go to a new buddy) and the switch leaves old owners with
    copies (their kept clock): the copies no record names any more are dropped where they are, so the
    memory tier holds one copy of each partition, not one on every worker it ever reached."""
    clocks = 8
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        cl = dscar.connect(lc)
        coordinator = lc.scheduler.plugins[PLUGIN_NAME]
        drops: list[str] = []
        drop = coordinator._drop_copies

        async def noted(job, d):
            drops.append(d.holder)
            await drop(job, d)

        coordinator._drop_copies = noted
        algo = CopiesCheckedGrowMidFit(clocks, lc, at=3)
        try:
            res = dscar.fit(algo, {"x": np.arange(6.0)}, cl, n_shards=6, max_clocks=clocks, progress=False,
                            checkpoint=dscar.CheckpointConfig(str(tmp_path), policy="full", every=100, memory=True))
        finally:
            del coordinator._drop_copies
    assert [e for e in res.events if e["kind"] == "partitions-taken-on"]
    assert drops  # (the join left copies no record named)
    assert algo.mismatch is None, algo.mismatch
    for r in res.history:  # every shard's update applied once in every clock
        assert all(r.metrics[k] == 0 for k in CHECK_KEYS), (r.clock, r.metrics)


def test_a_workers_copies_take_one_message_to_each_source_the_sources_side_by_side():
    """``adopt_all``: each source is asked for all its copies in one ``bundle`` (on a clock boundary's
    path a message per copy costs a round trip each), the sources at once; a source that fails fails
    its own copies only, a switch of a partition never copied here fails without asking, and every
    copy's answer comes back in order."""
    import asyncio
    import types

    from dscar.core.partitions import TableLayout
    from dscar.worker.plugin import ParamServer

    ps = ParamServer()
    busy: dict[str, int] = {}
    together: list[set[str]] = []
    sent: list[tuple[str, list]] = []

    async def apeer(source, op, job_id, calls):
        assert op == "bundle" and job_id == "j"
        busy[source] = busy.get(source, 0) + 1
        together.append({s for s, n in busy.items() if n})
        await asyncio.sleep(0.01)
        busy[source] -= 1
        sent.append((source, calls))
        if source == "b":
            raise OSError("b is gone")
        return {"status": "OK", "answers": [{"status": "OK", "rows": [1], "data": np.full((1, 2), 7.0), "holds": ()}
                                            if op == "lend" else {"status": "missing"} for op, _ in calls]}

    owned = {}
    tables = types.SimpleNamespace(own=lambda t, p, data, holds=(): owned.__setitem__((t, p), np.array(data)))
    job = types.SimpleNamespace(id="j", layouts={"w": TableLayout("w", 40, 4)}, tables=tables)

    async def ajob(job_id):
        return job

    ps._ajob, ps._apeer, ps._incoming = ajob, apeer, {}
    ps._incoming[("j", "w", 0)] = np.zeros((10, 2))
    ps._incoming[("j", "w", 2)] = np.zeros((10, 2))
    r = asyncio.run(ps._h_adopt_all("j", [["w", 0, "a"], ["w", 2, "b"], ["w", 1, "a"], ["w", 3, "a"]], [[5, "a"]],
                                    step="switch"))
    statuses = [p["status"] for p in r["parts"]]
    assert statuses[0] == "OK" and r["parts"][0]["rows_resent"] == 1 and owned[("w", 0)][1, 0] == 7.0
    assert "b is gone" in statuses[1]  # its source failed
    assert "was not copied here" in statuses[2] and "was not copied here" in statuses[3]  # never asked
    assert len(r["shards"]) == 1 and "shard 5 is not on its holder any more: missing" in r["shards"][0]["status"]
    assert sorted(src for src, _ in sent) == ["a", "b"]  # one message each
    assert dict(sent)["a"] == [["lend", {"table": "w", "part": 0, "step": "changes"}], ["copy_shard", {"shard": 5}]]
    assert {"a", "b"} in together  # the two sources side by side
    assert ("j", "w", 2) in ps._incoming  # (a copy that did not switch stays until the coordinator forgets it)


def test_an_old_owner_told_to_keep_what_it_drops_holds_it_as_the_memory_copy_of_that_clock():
    """``lend`` step "drop" and ``drop_shard`` with ``keep``: the partition's values and the shard's state
    (nothing for a shard without one) go into the memory tier's store, labelled with that clock, and
    nothing is held as owned or as a shard any more; without ``keep`` nothing is kept."""
    import types

    from dscar.algorithm import TableSpec
    from dscar.core.partitions import TableLayout
    from dscar.worker.mirror_store import MirrorStore, part_key, shard_key
    from dscar.worker.partition_store import PartitionStore
    from dscar.worker.plugin import ParamServer
    from dscar.worker.shard_store import ShardEntry, ShardStore

    tables = PartitionStore({"w": TableSpec("w", 20, (2,))}, {"w": TableLayout("w", 20, 2)}, np)
    for p in (0, 1):
        tables.own("w", p, np.full((10, 2), float(p + 1)))
    shards = ShardStore()
    shards.put(3, ShardEntry({"x": np.zeros(2)}, {"z": np.arange(4)}))
    shards.put(4, ShardEntry({"x": np.zeros(2)}))
    shards.put(5, ShardEntry({"x": np.zeros(2)}, {"z": np.arange(2)}))
    job = types.SimpleNamespace(id="j", layouts=tables.layouts, tables=tables, shards=shards, mirrors=MirrorStore())
    ps = ParamServer()
    ps.jobs, ps._lent = {"j": job}, {}
    assert ps._h_lend("j", "w", 0, "drop", keep=7) == {"status": "OK", "kept": True}
    assert ps._h_lend("j", "w", 1, "drop") == {"status": "OK", "kept": False}
    assert ps._h_lend("j", "w", 1, "drop", keep=7)["kept"] is False  # (not held any more: nothing to keep)
    assert not tables.parts
    clock, values = job.mirrors.get(part_key("w", 0))
    assert clock == 7 and np.array_equal(values, np.full((10, 2), 1.0))
    assert job.mirrors.get(part_key("w", 1)) is None
    assert ps._h_drop_shard("j", 3, keep=7) == {"status": "OK", "dropped": 1, "kept": True}
    assert ps._h_drop_shard("j", 4, keep=7)["kept"] is False  # a shard with no state: nothing to copy
    assert ps._h_drop_shard("j", 5) == {"status": "OK", "dropped": 1, "kept": False}
    clock, state = job.mirrors.get(shard_key(3))
    assert clock == 7 and np.array_equal(state["z"], np.arange(4)) and not shards.shards
    assert job.mirrors.get(shard_key(4)) is None and job.mirrors.get(shard_key(5)) is None


def test_a_bundle_runs_its_calls_in_order_each_answered_and_only_the_ops_it_may_carry():
    """``bundle``: the calls in order, each one's answer (a call that raises is answered, the next ones
    still run); an op outside ``membership.BUNDLED_OPS`` (an install, a write of a run, a wait) is refused."""
    import asyncio

    from dscar.core.membership import BUNDLED_OPS
    from dscar.worker.plugin import ParamServer

    ps = ParamServer()
    ran = []

    def lend(job_id, table, part, step):
        ran.append((table, part, step))
        if part == 1:
            raise KeyError(part)
        return {"status": "OK"}

    async def forget_copy(job_id, table, part):
        ran.append((table, part, "forget"))
        return {"status": "OK", "dropped": 1}

    ps.handlers = lambda: {"lend": lend, "forget_copy": forget_copy, "apply": lambda **kw: ran.append("apply")}
    r = asyncio.run(ps._h_bundle("j", [["lend", {"table": "w", "part": 0, "step": "drop"}],
                                       ["lend", {"table": "w", "part": 1, "step": "drop"}],
                                       ["apply", {"run": 3}], ["forget_copy", {"table": "w", "part": 2}]]))
    assert [a["status"] for a in r["answers"]] == ["OK", "failed: KeyError(1)", "failed: ValueError(\"'apply' may not be bundled\")", "OK"]
    assert ran == [("w", 0, "drop"), ("w", 1, "drop"), ("w", 2, "forget")]
    assert "apply" not in BUNDLED_OPS and "restore" not in BUNDLED_OPS and "init" not in BUNDLED_OPS

