"""The clock end folded into the apply of a BSP clock's last pass (``BspSchedule._fold``): a
fault-free clock sends no clock-end item and no ``clock_done``; a folded clock end reads every owner's
tables as applied; one that cannot run goes back to the item path; a loss under it skips the clock."""
import time

import dask
import numpy as np
import pytest

import dscar
from conftest import RowCounter, assert_exactly_once, row_data, scheduler_calls
from dscar.worker import plugin as worker_plugin
from dscar.worker.plugin import ParamServer

def _fit(cluster, clocks: int = 4, **kw):
    with scheduler_calls(cluster.client) as calls:
        res = dscar.fit(RowCounter(), row_data(40), cluster, n_shards=4, max_clocks=clocks, **kw)
    return res, calls


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


def test_a_folded_clock_end_waits_for_the_other_owners_apply(inproc, monkeypatch):
    """Every worker but the first applies slowly (off its event loop): the folded clock end, which
    starts once its own worker applied, must still read every row as applied (``count_min`` is the
    clock); without the wait for the owner's apply it reads the other partition one clock behind."""
    first = min(inproc.workers)
    slow_apply = worker_plugin.Job.apply_pass

    def apply_pass(self, run, keys, workers, fetched, reset, owned, me, *rest):
        if me != first:
            time.sleep(0.3)
        return slow_apply(self, run, keys, workers, fetched, reset, owned, me, *rest)

    monkeypatch.setattr(worker_plugin, "INLINE_APPLY_BYTES", -1)  # every apply in a thread: the loop runs on
    monkeypatch.setattr(worker_plugin.Job, "apply_pass", apply_pass)
    res, calls = _fit(inproc, clocks=3)
    assert calls.get("dscar_clock_done", 0) == 0, calls  # (folded into the first worker's apply)
    assert_exactly_once(res, 40)


def test_a_folded_clock_end_that_an_owner_cannot_serve_runs_as_an_item(inproc, monkeypatch):
    """An owner that does not apply in time (here: says so at clock 2's first read) leaves the folded
    clock end unrun: the item path runs it, once, and the fit's results are those of a fault-free one."""
    refused: list = []
    until_applied = ParamServer._until_applied

    async def refuse_once(self, job_id, run):
        job = self.jobs.get(job_id)
        if not refused and job is not None and job.clock_seen == 2:
            refused.append(run)
            return "not applied within the test's bound"
        return await until_applied(self, job_id, run)

    monkeypatch.setattr(ParamServer, "_until_applied", refuse_once)
    res, calls = _fit(inproc, clocks=3)
    assert refused, "no folded clock end read another owner's table"
    (ev,) = [e for e in res.events if e["kind"] == "clock-end-unfolded"]
    assert ev["clock"] == 2 and "not applied within the test's bound" in ev["reason"], ev
    assert calls.get("dscar_clock_done", 0) == 1, calls  # clock 2's, from the item path
    assert_exactly_once(res, 40)
    assert not any(r.metrics.get("skipped") for r in res.history)


def test_a_loss_under_the_folded_clock_end_skips_its_clock_and_the_fit_goes_on(inproc, tmp_path):
    """A loss at the clock end of clock 2, aimed at each worker in turn, fires only where that clock
    end runs (folded: on the worker owning the most partitions; no clock_done on either fit); the clock
    is skipped, as a loss under an unfolded clock end skips it, and every other clock counts."""
    fired_on = []
    for worker in (0, 1):
        res, calls = _fit(inproc, clocks=4, faults=[dscar.faults.lose(worker, 2, point="clock-end")],
                          checkpoint=dscar.CheckpointConfig(str(tmp_path / str(worker)), policy="full", every=1))
        assert calls.get("dscar_clock_done", 0) == 0, calls
        fired = [e for e in res.events if e["kind"] == "fault-lose"]
        if not fired:  # the other worker ran clock 2's clock end
            assert [r.metrics.get("skipped") for r in res.history] == [None] * 4
            continue
        fired_on.append(worker)
        assert fired[0]["clock"] == 2 and fired[0]["point"] == "clock-end"
        assert res.n_clocks == 4 and res.history[1].metrics.get("skipped") == 1.0, res.history[1]
        for rec in (res.history[0], *res.history[2:]):
            assert rec.metrics["seen_min"] == rec.metrics["seen_max"] == 1.0, rec  # exactly once where it counts
    assert len(fired_on) == 1, fired_on  # clock 2's clock end ran on exactly one worker
