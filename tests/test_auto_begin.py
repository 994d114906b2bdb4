"""The coordinator begins the next BSP clock itself (``dscar.auto-begin``, ``effects.BeginClock``): the
stopping rule is evaluated with the folded clock end on the history it was sent (``protocol.RuleHistory``),
and where it says go on and the driver's last clock is not reached, clock t+1 begins without a round trip
to the driver. A fit gives the same clocks, metrics and parameters as one whose driver begins each clock."""
import threading
import time

import dask
import numpy as np
import pytest
from distributed import LocalCluster

import dscar
from conftest import RowCounter, assert_exactly_once, row_data, scheduler_calls
from dscar.algorithms import corpora
from dscar.algorithms.datasets import lasso_alpha_max, make_classification, make_regression
from dscar.algorithms.lasso import LassoCD
from dscar.algorithms.lda import LDAGibbs, lda_data
from dscar.algorithms.mlr import MLRSGD
from dscar.core.effects import BeginClock
from dscar.core.job import ApplyPass, JobConfig, JobState
from dscar.core.partitions import PartitionMap, TableLayout
from dscar.core.protocol import ClockEndOutcome, RuleHistory, extend_copy
from dscar.core.shards import ShardQueue
from dscar.scheduler.coordinator import PLUGIN_NAME

# ------------------------------------------------------------------------------ pure
def test_a_worker_s_copy_of_the_history_gets_only_what_it_lacks_and_a_lost_copy_gets_everything_again():
    h = RuleHistory()
    copy: list = []
    assert h.part_for("a") == {"from": 0, "metrics": []} and extend_copy(copy, {"from": 0, "metrics": []})
    for i in range(3):
        h.add({"objective": float(i)})
        part = h.part_for("a")
        assert part == {"from": i, "metrics": [{"objective": float(i)}]}  # one entry a clock
        assert extend_copy(copy, part)
    assert copy == h.metrics
    assert not extend_copy([], h.part_for("a") | {"from": 2})  # a copy that lacks earlier entries: not evaluated
    h.forget("a")
    assert h.part_for("a") == {"from": 0, "metrics": h.metrics}
    assert h.part_for("b")["from"] == 0  # another worker: everything
    out = ClockEndOutcome(metrics={"objective": 1.0}, stop=False)
    assert ClockEndOutcome.from_msg(out.to_msg()) == out
    assert ClockEndOutcome.from_msg(ClockEndOutcome(metrics={"objective": 1.0}).to_msg()).stop is None


def _job(until: int) -> JobState:
    cfg = JobConfig("j", 4, {"w": "param"}, [], [""])
    pmap = PartitionMap([TableLayout("w", 8, 2)])
    pmap.assign(["a", "b"])
    queue = ShardQueue(4, reloadable=True)
    for s in range(4):
        queue.set_holder(s, "a")
    job = JobState(cfg, queue, pmap, policies=[])
    job.workers = ["a", "b"]
    job.schedule.fold_clock_end = job.schedule.auto_begin = True
    job.schedule.auto_until = until
    return job


def _clock(job: JobState, clock: int, stop: bool | None) -> tuple[dict, list]:
    """Run ``clock`` (begun already) to its folded clock end, which says ``stop``: its clock-end item
    and the effects of its end."""
    effects = []
    while (item := job.next_item("a", 0.0)) is not None:
        for m in item["shards"]:
            effects += job.commit("a", clock, item["run"], m["shard"], m["attempt"], 0.0)[1]
    (apply,) = [e for e in effects if isinstance(e, ApplyPass)]
    assert job.applied(apply.run_id, 0.0) == []
    item = apply.clock_end
    return item, job.clock_end_done(item["worker"], item["run"], {"objective": float(clock)}, 0.0, 0.0, clock, stop)


@pytest.mark.parametrize("stop, until, begun", [(False, 3, True), (True, 3, False), (None, 3, False),
                                                (False, 1, False)])
def test_the_next_clock_begins_on_the_coordinator_only_where_the_rule_said_go_on_before_the_last_clock(stop, until,
                                                                                                       begun):
    job = _job(until)
    job.begin(1, 0.0)
    item, effects = _clock(job, 1, stop)
    assert ("rule" in item) == (until > 1)  # (at the driver's last clock the rule decides nothing here)
    assert ([e for e in effects if isinstance(e, BeginClock)] == [BeginClock(2)]) == begun
    report = job.report_for(1)
    assert report["next_begun"] is begun and report["stop"] is stop
    if not begun:
        return
    job.schedule.keep_report()  # (what the coordinator does before it begins clock 2)
    job.begin(2, 0.0)
    assert job.report_for(2) is None and job.report_for(1) == report  # the driver reads clock 1's report still
    item, effects = _clock(job, 2, False)
    assert item["rule"] == {"from": 0, "metrics": [{"objective": 1.0}]}  # (the first clock's was empty)
    job.schedule.keep_report()
    job.begin(3, 0.0)
    item, effects = _clock(job, 3, False)
    assert "rule" not in item and not [e for e in effects if isinstance(e, BeginClock)]  # the driver's last clock
    assert job.schedule.rule.metrics == [{"objective": float(c)} for c in (1, 2, 3)]


# --------------------------------------------------------------------------- cluster
def _fit_both(cluster, algorithm, data, **kw):
    """The same fit with auto-begin on, then off: each result and its counted calls."""
    out = []
    for auto in (True, False):
        with dask.config.set({"dscar.auto-begin": auto}), scheduler_calls(cluster.client) as calls:
            res = dscar.fit(algorithm, data, cluster, progress=False, **kw)
        out.append((res, calls))
    return out


def _same(a: dscar.FitResult, b: dscar.FitResult, rtol: float = 0.0) -> None:
    """Same clocks, stop and metrics and parameters: exactly, or to ``rtol`` (and 1e-12 absolute: Lasso's
    gap at rounding level) where two fits of the model differ in rounding anyway (2 workers: the order a
    clock's updates are summed in is the commits')."""
    assert [r.clock for r in a.history] == [r.clock for r in b.history]
    assert a.converged == b.converged
    assert [sorted(r.metrics) for r in a.history] == [sorted(r.metrics) for r in b.history]
    for ra, rb in zip(a.history, b.history):
        np.testing.assert_allclose([ra.metrics[k] for k in sorted(ra.metrics)],
                                   [rb.metrics[k] for k in sorted(ra.metrics)], rtol=rtol, atol=1e-12 if rtol else 0.0)
    assert a.params.keys() == b.params.keys()
    for k in a.params:
        np.testing.assert_allclose(a.params[k], b.params[k], rtol=rtol, atol=1e-12 if rtol else 0.0)


def test_a_fit_whose_clocks_the_coordinator_begins_equals_one_whose_driver_begins_them(inproc):
    (auto, calls), (driven, calls_driven) = _fit_both(inproc, RowCounter(), row_data(40), n_shards=4, max_clocks=5)
    assert_exactly_once(auto, 40)
    _same(auto, driven)
    assert calls.get("dscar_begin_clock") == 1, calls  # the first clock only: the coordinator began the others
    assert calls_driven.get("dscar_begin_clock") == 5, calls_driven
    assert not auto.converged and auto.n_clocks == 5  # the driver's last clock: none begun after it
    np.testing.assert_array_equal(auto.params["count"], np.full(40, 5.0))


def test_a_driver_of_short_clocks_reads_several_reports_an_answer_and_times_each_clock(inproc):
    """``dscar.report-linger``: where the coordinator begins the clocks, one answer to the driver brings the
    reports of every clock that finished while it was held (``Coordinator._h_wait``'s ``more``), in order;
    each clock is timed by its finish on the coordinator, not by when its report came."""
    clocks = 24

    def lingered(dask_scheduler):
        return dask_scheduler.plugins["dscar-coordinator"].lingered

    held = inproc.client.run_on_scheduler(lingered)
    with dask.config.set({"dscar.report-linger": "500ms"}), scheduler_calls(inproc.client) as calls:
        t0 = time.perf_counter()
        res = dscar.fit(RowCounter(), row_data(40), inproc, n_shards=4, max_clocks=clocks, progress=False)
        wall = time.perf_counter() - t0
    assert inproc.client.run_on_scheduler(lingered) > held
    assert_exactly_once(res, 40)
    assert [r.clock for r in res.history] == list(range(1, clocks + 1))
    assert calls.get("dscar_begin_clock") == 1, calls
    assert calls.get("dscar_wait", 0) < clocks // 2, calls  # several reports an answer
    # each timed by its finish on the coordinator: not the first of an answer by the ask's 500 ms, the rest by 0
    assert all(0 < r.seconds < 0.5 for r in res.history[1:]), [r.seconds for r in res.history]
    assert sum(r.seconds for r in res.history) <= wall
    held = inproc.client.run_on_scheduler(lingered)
    with dask.config.set({"dscar.report-linger": 0}), scheduler_calls(inproc.client) as calls_each:
        each = dscar.fit(RowCounter(), row_data(40), inproc, n_shards=4, max_clocks=clocks, progress=False)
    # no answer held back: each goes as soon as a report is there (how many clocks it brings is the load's:
    # those that finished while the driver was busy with the last answer)
    assert inproc.client.run_on_scheduler(lingered) == held
    assert calls_each.get("dscar_wait", 0) > calls.get("dscar_wait", 0), (calls_each, calls)
    _same(res, each)


@pytest.mark.parametrize("value", [-0.01, "soon", 5])
def test_a_bad_report_linger_is_refused_before_the_fit_starts(inproc, value):
    with dask.config.set({"dscar.report-linger": value}), \
            pytest.raises(dscar.InvalidInputError, match="dscar.report-linger must be a duration"):
        dscar.fit(RowCounter(), row_data(40), inproc, n_shards=4, max_clocks=2)


class _WhereRuleRuns(RowCounter):
    """``RowCounter`` that records, at each evaluation of its stopping rule, whether it ran in the
    driver's thread (this test's) or elsewhere (a worker's thread: the cluster is in-process)."""

    in_driver: list = []

    def converged(self, history, tol):
        _WhereRuleRuns.in_driver.append(threading.current_thread() is threading.main_thread())
        return False


class _RuleInTheDriver(_WhereRuleRuns):
    converged_on_workers = False


@pytest.mark.parametrize("model, in_driver, begins", [(_WhereRuleRuns, [False] * 4 + [True], 1),
                                                      (_RuleInTheDriver, [True] * 5, 5)])
def test_a_model_whose_rule_must_run_in_the_driver_has_every_clock_begun_by_it(inproc, model, in_driver, begins):
    """By default the rule runs with the clock end, on a worker (at the driver's last clock, nothing
    follows: the driver evaluates it); ``converged_on_workers = False`` keeps it in the driver's process."""
    _WhereRuleRuns.in_driver = []
    with scheduler_calls(inproc.client) as calls:
        res = dscar.fit(model(), row_data(40), inproc, n_shards=4, max_clocks=5, progress=False)
    assert _WhereRuleRuns.in_driver == in_driver
    assert calls.get("dscar_begin_clock") == begins
    assert_exactly_once(res, 40)


def _mlr():
    X, y, _ = make_classification(1_200, 10, 3, seed=4)
    return MLRSGD(3, lr=0.5, batch_size=32, tol=1e-2, patience=2), {"X": X, "y": y}


def _lda():
    return LDAGibbs(4, seed=1, tol=5e-3, window=2), lda_data(corpora.synthetic(120, 150, 40, 4, seed=3).X)


def _lasso():
    X, y, _ = make_regression(2000, 100, seed=2)
    return LassoCD(0.001 * lasso_alpha_max(X, y), tol=1e-10), {"X": X, "y": y}


@pytest.mark.parametrize("model", [_mlr, _lda, _lasso], ids=["mlr-tol", "lda-early-stop", "lasso-converged"])
def test_the_stopping_rule_evaluated_with_the_clock_end_stops_at_the_driver_s_clock(inproc, model):
    algorithm, data = model()
    (auto, calls), (driven, _) = _fit_both(inproc, algorithm, data, n_shards=4, max_clocks=40)
    assert driven.converged and 3 <= driven.n_clocks < 40, driven.summary()  # (the rule stops it before the last clock)
    _same(auto, driven, rtol=1e-9)
    assert calls.get("dscar_begin_clock") == 1, calls


class _AtClockEnd(RowCounter):
    """``RowCounter`` that, at the clock end of clock ``at`` (on the worker it is folded into, in this
    process), runs ``_hook`` (a module-level function set by the test: the model is pickled to the
    workers, a function of a test's closure is not); the clock after it is begun by the coordinator."""

    hook = None

    def __init__(self, at: int, n_parts: int | None = None):
        super().__init__(n_parts)
        self.at = at

    def clock_end(self, ctx):
        if ctx.clock == self.at and _AtClockEnd.hook is not None:
            hook, _AtClockEnd.hook = _AtClockEnd.hook, None
            hook()
        return super().clock_end(ctx)


def _wait_for(what, limit_s: float = 90.0) -> None:
    """Wait until ``what()`` holds (state, not a timer: the limit only stops a broken run)."""
    deadline = time.monotonic() + limit_s
    while not what():
        assert time.monotonic() < deadline, "state not reached"
        time.sleep(0.02)


def _begun_by_coordinator(res: dscar.FitResult, calls: dict) -> None:
    assert calls.get("dscar_begin_clock") == 1, calls
    assert not {"worker-lost", "recovery-started", "partition-restored", "rollback"} & {e["kind"] for e in res.events}
    assert res.n_clocks == 6


class _AtClockEndAhead(_AtClockEnd):
    """``_AtClockEnd`` whose clock end runs ahead of the next clock (``clock_end_reads_only``): a hook that
    asks for a boundary's move may land once that next clock began; the move then waits for the boundary after it."""

    clock_end_reads_only = True


@pytest.mark.parametrize("model, boundaries", [(_AtClockEnd, (3,)), (_AtClockEndAhead, (3, 4))], ids=["folded", "ahead"])
def test_a_worker_retired_at_a_boundary_the_coordinator_crosses_hands_off_with_no_loss(model, boundaries):
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        cl = dscar.connect(lc)
        coordinator = lc.scheduler.plugins[PLUGIN_NAME]
        retired, threads = [], []

        def retire_an_owner() -> None:  # (Dask's retirement waits for the hand-off at the next boundary)
            job = next(iter(coordinator.jobs.values()))
            worker = sorted(set(job.pmap.owners.values()))[0]
            retired.append(worker)
            threads.append(threading.Thread(target=cl.client.retire_workers, kwargs={"workers": [worker]}))
            threads[0].start()
            _wait_for(lambda: worker in coordinator.elastic.leaving)

        _AtClockEnd.hook = retire_an_owner
        with scheduler_calls(cl.client) as calls:
            res = dscar.fit(model(at=3), row_data(60), cl, n_shards=6, max_clocks=6, progress=False)
        threads[0].join(60)
    (handoff,) = [e for e in res.events if e["kind"] == "handoff"]
    assert handoff["workers"] == retired and handoff["partitions"] > 0 and handoff["failed"] == 0
    # at the boundary after clock 3, which the coordinator crossed (ahead: clock 4 may have begun before the hook ran)
    assert handoff["clock"] in boundaries, handoff
    assert "worker-left" in {e["kind"] for e in res.events}
    _begun_by_coordinator(res, calls)
    assert_exactly_once(res, 60)
    np.testing.assert_array_equal(res.params["count"], np.full(60, 6.0))


@pytest.mark.parametrize("model, boundaries", [(_AtClockEnd, (3,)), (_AtClockEndAhead, (3, 4))], ids=["folded", "ahead"])
def test_a_joiner_s_copies_switch_at_a_boundary_the_coordinator_crosses(model, boundaries):
    # one worker owns both tables, cut in 2 (two row units, each a partition of ``count`` and one of ``seen``):
    # moving a unit to the joiner lowers the largest owner's load, so it moves (``unit_even_plan``; from two
    # equal owners of a unit each, or from one owner of one unit, no move would)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        cl = dscar.connect(lc)
        coordinator = lc.scheduler.plugins[PLUGIN_NAME]

        def add_a_worker() -> None:  # its copies are made while clock 3 ends; they switch at the boundary after
            job_id = next(iter(coordinator.jobs))
            before = set(lc.scheduler.workers)
            lc.scale(len(before) + 1)
            _wait_for(lambda: any(w not in before for w, _ in coordinator.elastic.copies.get(job_id, {}).values()))

        _AtClockEnd.hook = add_a_worker
        with scheduler_calls(cl.client) as calls:
            res = dscar.fit(model(at=3, n_parts=2), row_data(60), cl, n_shards=6, max_clocks=6, progress=False)
    (taken,) = [e for e in res.events if e["kind"] == "partitions-taken-on"]
    assert taken["partitions"] > 0 and taken["failed"] == 0
    assert taken["clock"] in boundaries, taken  # (as above)
    _begun_by_coordinator(res, calls)
    assert_exactly_once(res, 60)
    np.testing.assert_array_equal(res.params["count"], np.full(60, 6.0))


class _AtClockEnds(RowCounter):
    """``RowCounter`` that runs ``hooks[clock]`` (module-level, as ``_AtClockEnd``'s) at that clock's end."""

    hooks: dict = {}

    def clock_end(self, ctx):
        hook = _AtClockEnds.hooks.pop(ctx.clock, None)
        if hook is not None:
            hook()
        return super().clock_end(ctx)


def test_a_joiner_s_copy_whose_partition_is_handed_off_first_is_forgotten_where_it_was_kept():
    # clock 3 ends: a worker joins and copies a row unit of the one owner (2 units), which Dask then retires; at
    # the boundary its hand-off gives them to the joiner whole, so the copies never switch: each is
    # forgotten on the joiner (and on the leaver), not kept as a partition's worth of memory to the job's end
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        cl = dscar.connect(lc)
        coordinator = lc.scheduler.plugins[PLUGIN_NAME]
        (owner,) = list(lc.scheduler.workers)
        threads, kept = [], {}

        def join_then_retire_the_owner() -> None:
            job_id = next(iter(coordinator.jobs))
            lc.scale(2)
            _wait_for(lambda: coordinator.elastic.copies.get(job_id))
            threads.append(threading.Thread(target=cl.client.retire_workers, kwargs={"workers": [owner]}))
            threads[0].start()
            _wait_for(lambda: owner in coordinator.elastic.leaving)

        def look() -> None:  # two clocks later, on the workers there
            kept.update({w.address: sorted(k for m in (ps._incoming, ps._lent) for k in m)
                         for w in lc.workers.values() if (ps := w.plugins.get("dscar-paramserver")) is not None})

        _AtClockEnds.hooks = {3: join_then_retire_the_owner, 5: look}
        res = dscar.fit(_AtClockEnds(n_parts=2), row_data(60), cl, n_shards=6, max_clocks=6, progress=False)
        threads[0].join(60)
    (handoff,) = [e for e in res.events if e["kind"] == "handoff"]
    assert handoff["workers"] == [owner] and handoff["partitions"] > 0
    assert not [e for e in res.events if e["kind"] == "partitions-taken-on"]  # no copy switched
    assert len(kept) >= 1 and kept == {w: [] for w in kept}, kept  # (the leaver, if Dask has not closed it yet, too)
    assert_exactly_once(res, 60)
