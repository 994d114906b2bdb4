"""Batched grants and commits, and idle jobs that cost the scheduler nothing, on a real cluster.

The scheduler's ``dscar_*`` handlers are wrapped with counters of calls begun and ended (as
bench.overhead counts them), so a test sees every call a worker's runner makes, and how many of
its long polls are waiting."""
from __future__ import annotations

import functools
import inspect
import time
from collections import Counter

import dask
import numpy as np
import pytest
from distributed.scheduler import heartbeat_interval

import dscar
from tests.conftest import RowCounter, assert_exactly_once, row_data

pytestmark = pytest.mark.cluster

#: heartbeat intervals an idle runner is watched for: it must make no call meanwhile
IDLE_INTERVALS = 4


def _tracked(handler, name: str, calls: Counter):
    """``handler`` counting its calls begun (``name``) and ended (``name + ":done"``)."""

    @functools.wraps(handler)
    def wrapper(*args, **kwargs):
        calls[name] += 1
        out = handler(*args, **kwargs)
        if not inspect.isawaitable(out):
            calls[name + ":done"] += 1
            return out

        async def waited():
            try:
                return await out
            finally:
                calls[name + ":done"] += 1
        return waited()

    return wrapper


def _track(dask_scheduler=None) -> None:
    calls = dask_scheduler._test_calls = Counter()
    for name, h in list(dask_scheduler.handlers.items()):
        if name.startswith("dscar_"):
            dask_scheduler.handlers[name] = _tracked(h, name, calls)


def _calls(dask_scheduler=None) -> dict:
    return dict(dask_scheduler._test_calls)


def _waiting_polls(calls: dict) -> int:
    """The runners' long polls for work now waiting: ``dscar_next``, and BSP commits waiting for their
    worker's next item (``protocol.Commit.wait``)."""
    return sum(calls.get(h, 0) - calls.get(h + ":done", 0) for h in ("dscar_next", "dscar_commit"))


@pytest.fixture(scope="module")
def tracked():
    with dscar.Cluster(n_workers=2, processes=False) as cl:
        cl.client.run_on_scheduler(_track)
        yield cl


def _calls_a_clock(tracked, handler: str, fit) -> float:
    """``handler``'s calls a clock on the scheduler: those of ``fit(9)`` less those of ``fit(3)``, over
    the 6 clocks between (setup and the final gather cancel)."""

    def calls(clocks: int) -> int:
        before = tracked.client.run_on_scheduler(_calls).get(handler, 0)
        fit(clocks)
        return tracked.client.run_on_scheduler(_calls).get(handler, 0) - before

    short, long = calls(3), calls(9)
    return (long - short) / 6


def _bsp_fit(tracked, sleep: float):
    """A fit of 8 shards of 64 rows on ``tracked`` for ``_calls_a_clock``, checked exactly once."""

    def fit(clocks: int) -> None:
        res = dscar.fit(RowCounter(sleep=sleep), row_data(64), tracked, n_shards=8, max_clocks=clocks)
        assert_exactly_once(res, 64)

    return fit


def test_a_worker_commits_its_shards_of_a_clock_in_one_call(tracked):
    """8 shards of 50 ms steps on 2 workers: once the steps are measured (the first clocks), each
    worker gets its 4 shards in one item and commits them in one call: 2 commits a clock, not 8 as
    one shard an item costs. A worker that runs out first asks the other's unstarted members back,
    and a member it takes costs one commit more: on a loaded machine about 3 a clock; 5 is the bound."""

    per_clock = _calls_a_clock(tracked, "dscar_commit", _bsp_fit(tracked, sleep=0.05))
    print(f"{per_clock:.2f} commits a clock for 8 shards on 2 workers")
    assert per_clock <= 5, f"{per_clock:.1f} commits a clock for 8 shards on 2 workers"


def test_a_bsp_worker_s_commit_waits_for_its_next_item_instead_of_a_poll_more(tracked):
    """Under BSP a worker needs its grants only with its next item, so its last commit of a pass waits
    for that item (``protocol.Commit.wait``) rather than answer at once and be followed by a
    ``dscar_next`` (it was one more per worker: 3 a clock on 2 workers; a clock end sent as an item,
    not folded into the apply, leaves one poll a clock). Exactly once still holds."""

    per_clock = _calls_a_clock(tracked, "dscar_next", _bsp_fit(tracked, sleep=0.01))
    print(f"{per_clock:.2f} dscar_next a clock on 2 workers")
    assert per_clock <= 1.5, f"{per_clock:.1f} dscar_next a clock on 2 workers"


class SspRows(RowCounter):
    """``RowCounter`` that tolerates a clock of staleness (its updates commute)."""

    max_staleness = 1


def test_under_ssp_a_worker_commits_several_shards_of_its_own_in_one_call(tracked):
    """The same fit under SSP (staleness 1): a work item holds several of the worker's shards, each
    at its own next clock, answered by one commit, so a clock of 8 shards costs fewer than 8 commits
    (one shard an item cost 8). A shard's next clock starts only once its update is applied, so a
    worker's shards may split into two items a clock (one runs while the other's commits apply): 6 is
    the bound. Every clock's reduction still sums exactly one update per row, no read is more than a
    clock ahead, and the model holds every update once."""

    def fit(clocks: int) -> None:
        res = dscar.fit(SspRows(sleep=0.05), row_data(64), tracked, n_shards=8, max_clocks=clocks,
                        consistency="ssp", staleness=1)
        for rec in res.history:
            assert rec.metrics["seen_min"] == rec.metrics["seen_max"] == 1.0, rec  # this clock's sums, exactly
            assert rec.clock <= rec.metrics["count_min"] and rec.metrics["count_max"] <= rec.clock + 1, rec
        np.testing.assert_array_equal(res.params["count"], np.full(64, float(clocks)))

    per_clock = _calls_a_clock(tracked, "dscar_commit", fit)
    print(f"{per_clock:.2f} commits a clock for 8 shards on 2 workers under SSP")
    assert per_clock <= 6, f"{per_clock:.1f} commits a clock for 8 shards on 2 workers under SSP"


class HoldStill(RowCounter):
    """``RowCounter`` whose driver, between clocks 2 and 3, watches the runners' calls while the job
    idles (``watch``): the job is registered, no clock runs."""

    converged_on_workers = False  # (the driver holds the job between clocks: it begins them)

    seen: dict = {}

    def converged(self, history, tol):
        if len(history) == 2:
            HoldStill.seen["job"] = watch(HoldStill.client)
        return False


def watch(client) -> tuple[dict, dict]:
    """The scheduler's call counts once both runners' long polls wait, and ``IDLE_INTERVALS``
    heartbeat intervals later."""
    deadline = time.monotonic() + 60
    while _waiting_polls(calls := client.run_on_scheduler(_calls)) < 2:
        assert time.monotonic() < deadline, f"the runners' polls never both waited: {calls}"
        time.sleep(0.05)
    time.sleep(IDLE_INTERVALS * heartbeat_interval(2))
    return calls, client.run_on_scheduler(_calls)


def _runner_calls(calls: dict) -> dict:
    """Calls begun by the runners (the driver renews its lease meanwhile, which is not theirs)."""
    return {k: v for k, v in calls.items() if not k.endswith(":done") and k not in ("dscar_renew",)}


def test_an_idle_job_and_an_idle_cluster_cost_no_call_for_several_heartbeat_intervals(tracked):
    HoldStill.client = tracked.client
    with dask.config.set({"dscar.auto-begin": False}):  # (the driver holds the job between clocks: it begins them)
        res = dscar.fit(HoldStill(), row_data(16), tracked, n_shards=4, max_clocks=3)
    assert_exactly_once(res, 16)  # the waiting polls were woken by the next clock, and the fit went on
    before, after = HoldStill.seen["job"]
    assert _runner_calls(after) == _runner_calls(before), "calls while a job idled between clocks"
    assert _waiting_polls(after) == 2
    before, after = watch(tracked.client)  # no job at all
    assert _runner_calls(after) == _runner_calls(before), "calls while the cluster ran no job"
    assert _waiting_polls(after) == 2
