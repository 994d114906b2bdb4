"""The clock end folded into the apply of a BSP clock's last pass (``BspSchedule._fold``): a
fault-free clock sends no clock-end item and no ``clock_done``; a folded clock end reads every owner's
tables as applied; one that cannot run goes back to the item path; a loss under it skips the clock."""
import functools
import sys
import threading
import time
from collections import Counter

import dask
import numpy as np
import pytest

import dscar
from conftest import RowCounter, assert_exactly_once, row_data, scheduler_calls
from dscar.worker import plugin as worker_plugin
from dscar.worker.plugin import ParamServer

def _fit(cluster, clocks: int = 4, model=None, **kw):
    with scheduler_calls(cluster.client) as calls:
        res = dscar.fit(model or RowCounter(), row_data(40), cluster, n_shards=4, max_clocks=clocks, **kw)
    return res, calls


class ReadOnlyCounter(RowCounter):
    """``RowCounter`` saying what its clock end does: it only reads, so it runs while the next clock begins
    (``Algorithm.clock_end_reads_only``). Its clock end reads ``seen``, which the next clock's first apply
    zeroes: a clock end that read after that apply would report ``seen_min`` 0."""

    clock_end_reads_only = True


def test_a_fault_free_fit_sends_no_clock_done_and_matches_the_unfolded_fit(inproc):
    res, calls = _fit(inproc)
    assert_exactly_once(res, 40)
    assert calls.get("dscar_clock_done", 0) == 0 and calls.get("dscar_clock_failed", 0) == 0, calls
    assert not [e for e in res.events if e["kind"] in ("clock-end-unfolded", "clock-end-skipped")]
    with dask.config.set({"dscar.fold-clock-end": False}):
        unfolded, calls_unfolded = _fit(inproc)
    assert calls_unfolded.get("dscar_clock_done", 0) == 4, calls_unfolded  # one a clock on the item path
    assert [r.metrics for r in unfolded.history] == [r.metrics for r in res.history]
    np.testing.assert_array_equal(unfolded.params["count"], res.params["count"])


def _slow_applies(cluster, monkeypatch, wait) -> None:
    """Every worker of ``cluster`` but the first applies a BSP pass of clock ``c`` once ``wait(c)`` returned,
    off its event loop (``INLINE_APPLY_BYTES``): the loop, which in-process workers share, runs on."""
    first = min(cluster.workers)
    apply_pass = worker_plugin.Job.apply_pass

    def slow(self, run, keys, workers, fetched, reset, owned, me, clock, *rest):
        if me != first:
            wait(clock)
        return apply_pass(self, run, keys, workers, fetched, reset, owned, me, clock, *rest)

    monkeypatch.setattr(worker_plugin, "INLINE_APPLY_BYTES", -1)
    monkeypatch.setattr(worker_plugin.Job, "apply_pass", slow)


def test_a_folded_clock_end_waits_for_the_other_owners_apply(inproc, monkeypatch):
    """Every worker but the first applies slowly (off its event loop): the folded clock end, which
    starts once its own worker applied, must still read every row as applied (``count_min`` is the
    clock); without the wait for the owner's apply it reads the other partition one clock behind."""
    _slow_applies(inproc, monkeypatch, lambda clock: time.sleep(0.3))
    res, calls = _fit(inproc, clocks=3)
    assert calls.get("dscar_clock_done", 0) == 0, calls  # (folded into the first worker's apply)
    assert_exactly_once(res, 40)


@pytest.mark.parametrize("push", [True, False])
def test_a_folded_clock_end_that_an_owner_cannot_serve_runs_as_an_item(inproc, monkeypatch, push):
    """An owner that does not apply in time (here: says so at clock 2's first read, in its push or in
    its answer to the read) leaves the folded clock end unrun: the item path runs it, once, and the
    fit's results are those of a fault-free one."""
    refused: list = []
    if push:
        push_first_read = ParamServer._push_first_read

        def refuse_once(self, job_id, run, reader, ask):
            job = self.jobs.get(job_id)
            if not refused and reader is not None and job is not None and job.clock_seen == 2:
                refused.append(run)
                ask = None
            return push_first_read(self, job_id, run, reader, ask)

        monkeypatch.setattr(ParamServer, "_push_first_read", refuse_once)
    else:
        until_applied = ParamServer._until_applied

        async def refuse_once(self, job_id, run):
            job = self.jobs.get(job_id)
            if not refused and job is not None and job.clock_seen == 2:
                refused.append(run)
                return "not applied within the test's bound"
            return await until_applied(self, job_id, run)

        monkeypatch.setattr(ParamServer, "_until_applied", refuse_once)
    with dask.config.set({"dscar.push-first-read": push}):
        res, calls = _fit(inproc, clocks=3)
    assert refused, "no folded clock end read another owner's table"
    (ev,) = [e for e in res.events if e["kind"] == "clock-end-unfolded"]
    assert ev["clock"] == 2 and ("was not applied on" if push else "not applied within the test's bound") in ev["reason"], ev
    assert calls.get("dscar_clock_done", 0) == 1, calls  # clock 2's, from the item path
    assert_exactly_once(res, 40)
    assert not any(r.metrics.get("skipped") for r in res.history)


@pytest.mark.parametrize("model", [RowCounter, ReadOnlyCounter], ids=["folded", "ahead"])
def test_a_loss_under_the_folded_clock_end_skips_its_clock_and_the_fit_goes_on(inproc, tmp_path, model):
    """A loss at the clock end of clock 2, aimed at each worker in turn, fires only where that clock
    end runs (folded: on the worker owning the most partitions; no clock_done on either fit); the clock
    is skipped, as a loss under an unfolded clock end skips it, and every other clock counts. The same
    where the clock end runs ahead of the next clock (``ahead``): the loss restores a partition it reads."""
    fired_on = []
    for worker in (0, 1):
        res, calls = _fit(inproc, clocks=4, model=model(), faults=[dscar.faults.lose(worker, 2, point="clock-end")],
                          checkpoint=dscar.CheckpointConfig(str(tmp_path / str(worker)), policy="full", every=1))
        assert calls.get("dscar_clock_done", 0) == 0, calls
        fired = [e for e in res.events if e["kind"] == "fault-lose"]
        if not fired:  # the other worker ran clock 2's clock end
            assert [r.metrics.get("skipped") for r in res.history] == [None] * 4
            continue
        fired_on.append(worker)
        assert fired[0]["clock"] == 2 and fired[0]["point"] == "clock-end"
        assert res.n_clocks == 4 and res.history[1].metrics.get("skipped") == 1.0, res.history[1]
        skipped = [e for e in res.events if e["kind"] == "clock-end-skipped"]
        assert [e["clock"] for e in skipped] == [2] and ("ahead" in skipped[0]["reason"]) == (model is ReadOnlyCounter)
        for rec in (res.history[0], *res.history[2:]):
            assert rec.metrics["seen_min"] == rec.metrics["seen_max"] == 1.0, rec  # exactly once where it counts
    assert len(fired_on) == 1, fired_on  # clock 2's clock end ran on exactly one worker


#: rows of ``SummedCounter``'s large table: 8 bytes each, over ``SMALL_TABLE_BYTES``, so it is summarized, not pulled
BIG_ROWS = 160_000


class SummedCounter(RowCounter):
    """``RowCounter`` whose clock end also reads a large table as its owners' summaries (as LDA reads
    ``word_topic``): each shard adds 1 to its share of ``big``'s rows, so after clock ``c`` every row
    holds ``c``; ``big_sum`` and ``big_min`` show a summary read one clock behind or half applied."""

    def tables(self, meta):
        from dscar import TableSpec
        return [*super().tables(meta), TableSpec("big", BIG_ROWS)]

    def shard_step(self, ctx, data):
        super().shard_step(ctx, data)
        per = BIG_ROWS // ctx.meta.n_rows
        lo, hi = int(data["row"][0]) * per, (int(data["row"][-1]) + 1) * per
        ctx.add("big", ctx.xp.ones(hi - lo), start=lo)

    def clock_end(self, ctx):
        out = super().clock_end(ctx)
        parts = ctx.summaries("big")
        return {**out, "big_sum": float(sum(p[0][0] for p in parts)), "big_min": float(min(p[1][0] for p in parts))}

    def clock_end_summaries(self):
        return ["big"]

    def summarize(self, table, rows, start):
        rows = dscar.to_host(rows)
        return [np.array([rows.sum()]), np.array([rows.min()])]


class SummedCounterAsking(SummedCounter):
    """The same model without ``clock_end_summaries``: its clock end asks for the summaries in a message of their own."""

    def clock_end_summaries(self):
        return []


def _worker_calls(client) -> Counter:
    from bench.overhead import install_counters, read_counters
    client.run(install_counters)
    out = Counter()
    for per in client.run(read_counters).values():
        out.update(per)
    return out


def _assert_summed(res):
    assert_exactly_once(res, 40)
    for rec in res.history:
        assert rec.metrics["big_sum"] == BIG_ROWS * rec.clock and rec.metrics["big_min"] == rec.clock, rec


@pytest.mark.parametrize("fold", [True, False])
def test_a_clock_end_reads_the_small_tables_and_the_summaries_in_one_message_per_owner(inproc, fold):
    """``clock_end_summaries`` names ``big``: the clock end's first read asks each other owner for its
    small-table partitions and its summaries of ``big`` at once (no ``dscar_summarize``), folded or
    not, and reads what the two messages of the model that does not name it read."""
    with dask.config.set({"dscar.fold-clock-end": fold}):
        before = _worker_calls(inproc.client)
        res = dscar.fit(SummedCounter(), row_data(40), inproc, n_shards=4, max_clocks=3)
        one = _worker_calls(inproc.client) - before
        asking = dscar.fit(SummedCounterAsking(), row_data(40), inproc, n_shards=4, max_clocks=3)
        two = _worker_calls(inproc.client) - before - one
    _assert_summed(res)
    assert one["dscar_summarize"] == 0 and two["dscar_summarize"] == 3, (one, two)  # a clock end: 1 other owner
    assert [r.metrics for r in asking.history] == [r.metrics for r in res.history]


#: the passes (run ids) a read tagged ``after`` reached some worker for (in-process workers: one process)
_READS_ARRIVED: set[int] = set()
_READS = threading.Condition()


def _note_reads(dask_worker):
    """Wrap this worker's ``dscar_pull_many``: note the pass a folded clock end's read waits for."""
    handler = dask_worker.handlers["dscar_pull_many"]

    @functools.wraps(handler)
    def noted(*args, **kw):
        if kw.get("after") is not None:
            with _READS:
                _READS_ARRIVED.add(int(kw["after"]))
                _READS.notify_all()
        return handler(*args, **kw)
    dask_worker.handlers["dscar_pull_many"] = noted


def _unwrap_reads(dask_worker):
    handler = dask_worker.handlers["dscar_pull_many"]
    dask_worker.handlers["dscar_pull_many"] = getattr(handler, "__wrapped__", handler)


def test_a_folded_clock_end_sends_its_first_read_as_its_apply_begins(inproc, monkeypatch):
    """Every owner's apply of a pass waits until a read of that pass (``after``) reached some worker:
    the folded clock end must send its first read when its worker's apply begins, not once it ended
    (then every apply would wait out its bound, and the check fails). The reads still see every row
    as applied."""
    waited: list[tuple[int, bool]] = []
    apply_pass = worker_plugin.Job.apply_pass

    def waiting_apply(self, run, *rest):
        with _READS:
            waited.append((run, _READS.wait_for(lambda: run in _READS_ARRIVED, timeout=10)))
        return apply_pass(self, run, *rest)

    _READS_ARRIVED.clear()
    inproc.client.run(_note_reads)
    monkeypatch.setattr(worker_plugin, "INLINE_APPLY_BYTES", -1)  # every apply in a thread: the loop runs on
    monkeypatch.setattr(worker_plugin.Job, "apply_pass", waiting_apply)
    try:
        with dask.config.set({"dscar.push-first-read": False}):  # (the read asks: no owner pushes)
            res = dscar.fit(SummedCounter(), row_data(40), inproc, n_shards=4, max_clocks=3)
    finally:
        inproc.client.run(_unwrap_reads)
    _assert_summed(res)
    assert waited and all(ok for _, ok in waited), waited
    assert not [e for e in res.events if e["kind"] == "clock-end-unfolded"]


def _summarize_callers(monkeypatch) -> list[str]:
    """The function that calls ``PartitionStore.summarize``, each time it is called (list comprehensions skipped)."""
    from dscar.worker.partition_store import PartitionStore

    callers: list[str] = []
    summarize = PartitionStore.summarize

    def noted(self, *a, **kw):
        frame = sys._getframe(1)
        while frame.f_code.co_name == "<listcomp>":
            frame = frame.f_back
        callers.append(frame.f_code.co_name)
        return summarize(self, *a, **kw)

    monkeypatch.setattr(PartitionStore, "summarize", noted)
    return callers


def test_the_other_owner_summarizes_in_its_apply_and_answers_the_waiting_read_at_once(inproc, monkeypatch):
    """A folded clock end's first read that waits at another owner has that owner summarize in the
    thread that applied the pass, right after it (``ParamServer._apply_then_summarize``): the read's
    answer takes those summaries and no handler summarizes again. Here every apply waits for its
    pass's read, so the read is always there first."""
    callers = _summarize_callers(monkeypatch)
    apply_pass = worker_plugin.Job.apply_pass

    def waiting_apply(self, run, *rest):
        with _READS:
            _READS.wait_for(lambda: run in _READS_ARRIVED, timeout=10)
        return apply_pass(self, run, *rest)

    _READS_ARRIVED.clear()
    inproc.client.run(_note_reads)
    monkeypatch.setattr(worker_plugin, "INLINE_APPLY_BYTES", -1)  # every apply in a thread: the loop runs on
    monkeypatch.setattr(worker_plugin.Job, "apply_pass", waiting_apply)
    try:
        with dask.config.set({"dscar.push-first-read": False}):  # (the read asks: no owner pushes)
            res = dscar.fit(SummedCounter(), row_data(40), inproc, n_shards=4, max_clocks=3)
    finally:
        inproc.client.run(_unwrap_reads)
    _assert_summed(res)
    # a clock: the clock end's own partitions (ShardRunner.summarize), the other owner's in its apply
    assert sorted(set(callers)) == ["_apply_then_summarize", "summarize"], callers
    assert callers.count("_apply_then_summarize") == 3, callers


def _count_peer_calls(dask_worker) -> dict[str, int]:
    """Wraps this worker's ``dscar_pull_many`` and ``dscar_first_read`` to count a clock end's calls; returns the counts."""
    counts = getattr(dask_worker, "_fold_counts", None)
    if counts is None:
        counts = dask_worker._fold_counts = Counter()
        for name in ("dscar_pull_many", "dscar_first_read"):
            h = dask_worker.handlers[name]

            @functools.wraps(h)  # keeps the signature: distributed passes ``comm`` as the original wants it
            def counted(*a, _h=h, _name=name, **k):
                if _name == "dscar_first_read" or k.get("after") is not None:  # (a clock end's, not a step's)
                    counts[_name] += 1
                return _h(*a, **k)
            dask_worker.handlers[name] = counted
    return dict(counts)


def test_the_other_owners_push_the_first_read_once_they_applied_and_are_not_asked(inproc, monkeypatch):
    """The other owner pushes the folded clock end what its first read asks (``_push_first_read``), once
    a clock and once it applied the pass (every apply here is slow, off the event loop): nobody asks
    it (no ``pull_many``), its summaries are computed in the thread that applied the pass and
    nowhere else, and every read sees every row as applied. With the push turned off the clock end
    asks: one ``pull_many`` a clock and no push."""
    callers = _summarize_callers(monkeypatch)
    apply_pass = worker_plugin.Job.apply_pass

    def slow_apply(self, run, *rest):
        time.sleep(0.05)
        return apply_pass(self, run, *rest)

    def counts() -> Counter:
        return sum((Counter(c) for c in inproc.client.run(_count_peer_calls).values()), Counter())

    monkeypatch.setattr(worker_plugin, "INLINE_APPLY_BYTES", -1)  # every apply in a thread: the loop runs on
    monkeypatch.setattr(worker_plugin.Job, "apply_pass", slow_apply)
    c0 = counts()
    res = dscar.fit(SummedCounter(), row_data(40), inproc, n_shards=4, max_clocks=3)
    c1 = counts()
    _assert_summed(res)
    assert not [e for e in res.events if e["kind"] == "clock-end-unfolded"]
    assert c1 - c0 == Counter({"dscar_first_read": 3}), c1 - c0
    assert sorted(set(callers)) == ["_apply_then_summarize", "summarize"], callers  # (the clock end's own too)
    assert callers.count("_apply_then_summarize") == 3, callers
    with dask.config.set({"dscar.push-first-read": False}):
        res = dscar.fit(SummedCounter(), row_data(40), inproc, n_shards=4, max_clocks=3)
    _assert_summed(res)
    assert counts() - c1 == Counter({"dscar_pull_many": 3}), counts() - c1


class SummedReadOnly(SummedCounter):
    clock_end_reads_only = True


def test_ahead_of_the_next_clock_the_other_owner_answers_its_apply_before_it_summarizes(inproc, monkeypatch):
    """Where the clock end runs ahead of the next clock (clocks 1 and 2 of 3), the other owner's apply
    answers before it summarizes (the answer begins the next clock): its push computes the summaries
    after it (``_with_summaries``), not in the apply's thread; the last clock's end runs first, as before.
    Every read sees every row as applied either way."""
    callers = _summarize_callers(monkeypatch)
    res = dscar.fit(SummedReadOnly(), row_data(40), inproc, n_shards=4, max_clocks=3)
    _assert_summed(res)
    pushed = [c for c in callers if c != "summarize"]  # (the clock end's own partitions: ``summarize``)
    assert sorted(pushed) == ["_apply_then_summarize", "run", "run"], callers


def test_on_worker_processes_the_push_replaces_the_read(procs):
    """Over TCP (a message's arrays arrive as tuples): the other owner's push answers the folded clock
    end's first read a clock, and no read is sent (``pull_many`` only in the driver's final read of
    the tables, one an owner); with the push turned off the clock end reads, one a clock."""
    from bench.overhead import Trivial, install_counters, read_counters

    def calls() -> Counter:
        return sum((Counter(c) for c in procs.client.run(read_counters).values()), Counter())

    procs.client.run(install_counters)
    data = {"x": np.zeros((16, 1))}
    c0 = calls()
    res = dscar.fit(Trivial(), data, procs, n_shards=16, max_clocks=6, progress=False, policies=[])
    c1 = calls()
    with dask.config.set({"dscar.push-first-read": False}):
        off = dscar.fit(Trivial(), data, procs, n_shards=16, max_clocks=6, progress=False, policies=[])
    c2 = calls()
    assert [r.metrics for r in res.history] == [r.metrics for r in off.history]
    pushed, read = c1 - c0, c2 - c1
    assert pushed["dscar_first_read"] == 6 and pushed["dscar_pull_many"] == 2, pushed
    assert read["dscar_first_read"] == 0 and read["dscar_pull_many"] == 6 + 2, read


def test_an_owner_without_an_owner_map_pushes_nothing_and_is_asked(inproc, monkeypatch):
    """An owner that holds no owner map yet (a joiner given no work item since it took partitions on)
    cannot work out what the folded clock end's first read asks of it: its push says it asks nothing,
    the clock end asks it instead, and the fit is exact (here every push is worked out from an empty map)."""
    first_read_ask = ParamServer._first_read_ask

    def from_an_empty_map(self, job, run, reader, *rest):
        held, job.owners = job.owners, {}
        try:
            return first_read_ask(self, job, run, reader, *rest)
        finally:
            job.owners = held

    monkeypatch.setattr(ParamServer, "_first_read_ask", from_an_empty_map)
    res, _ = _fit(inproc, clocks=3)
    assert_exactly_once(res, 40)
    assert not [e for e in res.events if e["kind"] == "clock-end-unfolded"]


#: clock -> set once a shard step of that clock ran (``Overlapping``; in-process workers share this module)
_STEPPED: dict[int, threading.Event] = {}


class Overlapping(ReadOnlyCounter):
    """A clock end that waits (up to 20 s) until a shard step of the next clock ran, and reports whether
    one did (``overlapped``): 1 where the next clock runs while it runs, 0 where it begins after it."""

    def shard_step(self, ctx, data):
        _STEPPED.setdefault(ctx.clock, threading.Event()).set()
        super().shard_step(ctx, data)

    def clock_end(self, ctx):
        out = super().clock_end(ctx)
        if ctx.clock < 4:
            out["overlapped"] = float(_STEPPED.setdefault(ctx.clock + 1, threading.Event()).wait(20.0))
        return out


def test_a_clock_end_that_only_reads_runs_while_the_next_clock_begins(inproc):
    """With ``clock_end_reads_only``, each clock's shards run while the clock end before reads the tables
    as that clock left them (``seen`` is 1 everywhere, though the next clock's first apply zeroes it):
    its outcome is asked for apart, one a clock but the last (the driver's), and the fit equals one whose
    clock ends run first. With ``dscar.clock-end-ahead`` off, no step runs while a clock end runs."""
    _STEPPED.clear()
    res, calls = _fit(inproc, clocks=4, model=Overlapping())
    assert_exactly_once(res, 40)
    assert [r.metrics["overlapped"] for r in res.history[:3]] == [1.0, 1.0, 1.0]
    assert not [e for e in res.events if e["kind"] in ("clock-end-unfolded", "clock-end-skipped", "clock-withdrawn")]
    _STEPPED.clear()
    with dask.config.set({"dscar.clock-end-ahead": False}):
        calls_off = _worker_calls(inproc.client)
        first, _ = _fit(inproc, clocks=4, model=ReadOnlyCounter())
        calls_off = _worker_calls(inproc.client) - calls_off
    assert calls_off.get("dscar_clock_end_outcome", 0) == 0, calls_off
    assert [r.metrics for r in first.history] == [{k: v for k, v in r.metrics.items() if k != "overlapped"}
                                                  for r in res.history]
    np.testing.assert_array_equal(first.params["count"], res.params["count"])
    calls_on = _worker_calls(inproc.client)
    _fit(inproc, clocks=4, model=ReadOnlyCounter())
    assert (_worker_calls(inproc.client) - calls_on)["dscar_clock_end_outcome"] == 3


class StopsAtThree(ReadOnlyCounter):
    def converged(self, history, tol):
        return len(history) >= 3


def test_a_clock_begun_ahead_of_a_clock_end_that_says_stop_is_withdrawn_unapplied(inproc):
    """The stopping rule says stop at clock 3's end, after clock 4 began ahead of it: clock 4 is withdrawn
    (an event says so), nothing of it is applied, and the fit ends at clock 3 as it does with clock ends first."""
    res, _ = _fit(inproc, clocks=6, model=StopsAtThree())
    assert res.n_clocks == 3 and res.converged
    assert_exactly_once(res, 40)
    withdrawn = [e for e in res.events if e["kind"] == "clock-withdrawn"]
    assert [e["clock"] for e in withdrawn] == [4], withdrawn
    with dask.config.set({"dscar.clock-end-ahead": False}):
        first, _ = _fit(inproc, clocks=6, model=StopsAtThree())
    assert first.n_clocks == 3 and not [e for e in first.events if e["kind"] == "clock-withdrawn"]
    np.testing.assert_array_equal(first.params["count"], res.params["count"])


class AssignsAhead(ReadOnlyCounter):
    def clock_end(self, ctx):
        ctx.assign("count", ctx.xp.zeros(1))
        return super().clock_end(ctx)


def test_a_clock_end_said_to_only_read_that_assigns_fails_the_fit_naming_the_setting(inproc):
    with pytest.raises(dscar.JobFailedError, match="clock_end_reads_only"):
        _fit(inproc, clocks=3, model=AssignsAhead())


class StepMarks(ReadOnlyCounter):
    """``ReadOnlyCounter`` marking each clock in which a shard step ran (``_STEPPED``)."""

    def shard_step(self, ctx, data):
        _STEPPED.setdefault(ctx.clock, threading.Event()).set()
        super().shard_step(ctx, data)


def test_the_next_clock_begins_with_the_apply_of_the_clock_before(inproc, monkeypatch):
    """Where the clock end only reads, the next clock begins as its clock's last pass is told to apply: a worker
    that applied runs the next clock's steps while another still applies (each takes its own work up once its
    apply is done, ``runner.Job.wait_apply_ended``). The fit equals the one with ``dscar.begin-with-apply`` off."""
    overlapped: dict[int, bool] = {}

    def wait_for_the_next_clock(clock: int) -> None:  # (until a step of the next clock ran)
        if 0 < clock < 4 and clock not in overlapped:
            overlapped[clock] = _STEPPED.setdefault(clock + 1, threading.Event()).wait(5.0)

    _STEPPED.clear()
    _slow_applies(inproc, monkeypatch, wait_for_the_next_clock)
    res, _ = _fit(inproc, clocks=4, model=StepMarks())
    assert overlapped == {1: True, 2: True, 3: True}, overlapped
    assert_exactly_once(res, 40)
    assert not [e for e in res.events if e["kind"] in ("clock-end-unfolded", "clock-end-skipped", "clock-withdrawn")]
    monkeypatch.undo()
    with dask.config.set({"dscar.begin-with-apply": False}):
        off, _ = _fit(inproc, clocks=4, model=ReadOnlyCounter())
    assert [r.metrics for r in off.history] == [r.metrics for r in res.history]
    np.testing.assert_array_equal(off.params["count"], res.params["count"])


@pytest.mark.processes
def test_a_worker_killed_in_the_apply_the_next_clock_began_with_skips_only_that_clock(tmp_path):
    """A worker process killed in the apply of clock 2's last pass, with clock 3 begun with it: clock 2 is
    skipped (some owners may have applied, others not), clock 3 runs on the recovered tables, and every
    other clock counts each row exactly once."""
    res = dscar.fit(ReadOnlyCounter(), row_data(40), n_workers=3, n_shards=6, max_clocks=4,
                    faults=[dscar.faults.kill(1, 2, point="apply")],
                    checkpoint=dscar.CheckpointConfig(str(tmp_path), policy="full", every=1))
    fired = [e for e in res.events if e["kind"] == "fault-kill"]
    assert [e["clock"] for e in fired] == [2], fired
    assert res.n_clocks == 4 and res.history[1].metrics.get("skipped") == 1.0, res.history[1]
    for rec in (res.history[0], *res.history[2:]):
        assert rec.metrics["seen_min"] == rec.metrics["seen_max"] == 1.0, rec


class PullsCount(ReadOnlyCounter):
    """``ReadOnlyCounter`` whose steps read their rows of ``count`` first: each must find the clock before's
    value (``stale`` counts the rows that did not)."""

    def tables(self, meta):
        return super().tables(meta) + [dscar.TableSpec("stale", meta.n_rows, kind="reduction")]

    def shard_step(self, ctx, data):
        lo, n = int(data["row"][0]), int(data["row"].shape[0])
        count = dscar.to_host(ctx.pull("count", lo, lo + n))
        ctx.add("stale", (count != ctx.clock - 1).astype(float), start=lo)
        super().shard_step(ctx, data)

    def clock_end(self, ctx):
        return super().clock_end(ctx) | {"stale": float(dscar.to_host(ctx.pull("stale")).sum())}


def test_a_step_reads_an_owners_rows_once_that_owner_applied_the_clock_before(inproc, monkeypatch):
    """One owner applies for longer than it may keep a read waiting (half ``dscar.rpc-timeout``): the next
    clock's steps, begun with that apply, read its rows again until it applied, and find the clock before's
    counts on every row; no attempt fails."""
    _slow_applies(inproc, monkeypatch, lambda clock: time.sleep(0.5))
    with dask.config.set({"dscar.rpc-timeout": 0.4}):
        res, _ = _fit(inproc, clocks=3, model=PullsCount())
    assert [r.metrics["stale"] for r in res.history] == [0.0] * 3
    assert_exactly_once(res, 40)
    assert not [e for e in res.events if e["kind"] in ("shard-failed", "clock-end-skipped")], res.events
