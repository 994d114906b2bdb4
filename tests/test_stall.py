"""A job that stops moving on while its workers answer is reported once (``dscar.core.stall``)."""
from __future__ import annotations

import threading

import dask
import pytest

import dscar
from dscar.core.stall import StallWatch, workers_to_ask

from conftest import RowCounter, row_data
from test_ssp_engine import _apply_all, _commit_item, _job


def test_a_stall_is_reported_once_when_the_key_stands_still_past_the_limit():
    w = StallWatch(limit_s=5.0)
    assert w.observe("a", 0.0) is None
    assert w.observe("a", 5.0) is None  # at the limit, not past it
    assert w.observe("a", 6.5) == 6.5
    assert w.observe("a", 9.0) is None  # reported once per episode
    assert w.observe("b", 10.0) is None  # it moved: a new episode starts
    assert w.observe("b", 16.0) == 6.0


def test_a_job_waiting_for_its_driver_is_no_stall():
    w = StallWatch(limit_s=1.0)
    assert w.observe("a", 0.0, working=False) is None
    assert w.observe("a", 5.0, working=False) is None
    assert w.observe("a", 5.5, working=True) is None  # the wait does not count towards a stall
    assert w.observe("a", 7.0, working=True) == 2.0  # (from the last look at it waiting)


def test_an_ssp_jobs_progress_key_moves_with_commits_and_applies_and_its_report_says_what_runs():
    job = _job()
    key0, working = job.progress()
    assert working
    item = job.next_item("a", 0.0)
    key1, _ = job.progress()
    assert key1 != key0  # an attempt started
    _apply_all(job, _commit_item(job, item, "a", 0.1), 0.1)
    assert job.progress()[0] != key1
    held = job.next_item("b", 0.2)
    report = job.stall_report()
    assert report["stage"] == "ssp" and report["open_clocks"] == [1, 2, 3]
    assert [held["shards"][0]["shard"], held["shards"][0]["attempt"], "b"] in report["running"]
    assert report["shard_phases"]["running"] == 1


def test_a_stall_report_looks_into_the_workers_it_names_or_else_every_worker():
    assert workers_to_ask({"running": [[0, 0, "b"], [3, 1, "a"]], "clock_end_worker": None}, ["a", "b", "c"]) == ["a", "b"]
    assert workers_to_ask({"running": [], "clock_end_worker": "c"}, ["a", "b", "c"]) == ["c"]
    assert workers_to_ask({"running": []}, ["b", "a"]) == ["a", "b"]  # between stages: anywhere


#: lets BlockedShard's step go (in-process workers share it; an algorithm is pickled, an Event is not)
RELEASE = threading.Event()


class BlockedShard(RowCounter):
    """Shard 0's step at clock 2 waits until the test lets it go (``RELEASE``), or 60 s."""

    def shard_step(self, ctx, data):
        if ctx.clock == 2 and ctx.shard == 0:
            RELEASE.wait(60)
        super().shard_step(ctx, data)


@pytest.mark.timeout(90)
def test_a_fit_blocked_inside_a_step_is_reported_stalled_with_the_attempt_that_runs(inproc, caplog):
    """Both workers answer (the step blocks the runner thread only), so no hang is found; the
    coordinator reports the stall with the shard that holds the clock, then the fit goes on."""
    release = RELEASE
    release.clear()
    coord = inproc.client.cluster.scheduler.plugins["dscar-coordinator"]

    def blocked_shard_reported(e) -> bool:
        return e["kind"] == "job-stalled" and e["clock"] == 2 and 0 in [r[0] for r in e["running"]]

    def watcher():  # lets the step go once its stall has been reported (a loaded machine may add others)
        while not release.is_set():
            if any(blocked_shard_reported(e) for j in list(coord.jobs.values()) for e in list(j.events)):
                release.set()
            release.wait(0.05)

    t = threading.Thread(target=watcher, daemon=True)
    t.start()
    with dask.config.set({"dscar.core.stall-timeout": 1.0}):
        res = dscar.fit(BlockedShard(), row_data(32), inproc, n_shards=4, max_clocks=3, policies=[])
    release.set()
    t.join()
    stalls = [e for e in res.events if blocked_shard_reported(e)]
    assert len(stalls) == 1, stalls  # once per episode
    assert stalls[0]["stage"] == "shards" and stalls[0]["stalled_s"] >= 1.0
    # the blocked step's runner thread is seen waiting inside it; a batch member queued behind it (a
    # busy machine may leave one there) names the same worker, or another that is asked too
    holder = next(w for shard, _, w in stalls[0]["running"] if shard == 0)
    assert set(stalls[0]["stacks"]) == {w for *_, w in stalls[0]["running"]}
    assert any("test_stall.py" in f and f.endswith("in shard_step") for f in stalls[0]["stacks"][holder])
    assert res.n_clocks == 3
    assert any("has not moved on" in r.getMessage() for r in caplog.records if r.name == "dscar.driver")
