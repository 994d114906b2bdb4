"""One schedule interface, two implementations (``dscar.core.schedule``): pure, no Dask.

The job asks its schedule every question that depends on the consistency model; the coordinator
asks the job the same questions whichever schedule runs. So one driver loop, written against
the job's calls only, must run a fit to the end under BSP and under SSP, every shard's update of
every clock applied exactly once and every clock reported in order.
"""
from __future__ import annotations

import inspect
from collections import Counter

import pytest

from dscar.core.job import ApplyPass, JobConfig, JobState
from dscar.core.partitions import PartitionMap, TableLayout
from dscar.core.schedule import BspSchedule, Schedule, SspSchedule
from dscar.core.shards import ShardQueue

WORKERS = ["a", "b", "c"]
N_SHARDS = 6


def _protocol_members() -> set[str]:
    return {n for n, _ in inspect.getmembers(Schedule) if not n.startswith("_")} | set(Schedule.__annotations__)


@pytest.mark.parametrize("schedule", [BspSchedule, SspSchedule])
def test_each_schedule_has_every_member_of_the_protocol(schedule):
    job = _job("bsp" if schedule is BspSchedule else "ssp", staleness=1)
    assert isinstance(job.schedule, schedule)
    missing = [n for n in sorted(_protocol_members()) if not hasattr(job.schedule, n)]
    assert missing == []


def _job(consistency: str, staleness: int = 0, clocks: int = 3) -> JobState:
    cfg = JobConfig("j", N_SHARDS, {"w": "param", "loss": "reduction"}, [], [""])
    pmap = PartitionMap([TableLayout("w", 12, 3), TableLayout("loss", 1, 1)])
    pmap.assign(WORKERS)
    queue = ShardQueue(N_SHARDS, reloadable=True)
    for s in range(N_SHARDS):
        queue.set_holder(s, WORKERS[s % len(WORKERS)])
    kw = dict(consistency="ssp", staleness=staleness, max_clocks=clocks) if consistency == "ssp" else {}
    job = JobState(cfg, queue, pmap, policies=[], **kw)
    job.workers = list(WORKERS)
    return job


def _run(job: JobState, clocks: int, slow: str | None = None) -> tuple[Counter, dict[int, dict]]:
    """The coordinator's and the driver's calls, and nothing else: workers ask for work and commit
    it (``slow`` only every third round), every apply is carried out at once, the driver begins
    the next clock once it read the last one's report (under SSP its first begin opens them all)."""
    applied: Counter = Counter()
    reports: dict[int, dict] = {}
    t = 0.0

    def carry_out(effects: list) -> None:
        todo = [e for e in effects if isinstance(e, ApplyPass)]
        while todo:
            e = todo.pop(0)
            for i, (shard, _, _) in enumerate(e.committed):
                applied[(e.clocks[i] if e.clocks else e.clock, shard)] += 1
            todo += [x for x in job.applied(e.run_id, t, e.batch) if isinstance(x, ApplyPass)]

    carry_out(job.begin(1, t))
    for round_ in range(2000):
        t += 0.01
        for w in WORKERS:
            if w == slow and round_ % 3:
                continue
            item = job.next_item(w, t)
            if item is None:
                carry_out(job.idle(w, t))
            elif item["op"] == "clock_end":
                carry_out(job.clock_end_done(w, item["run"], {"objective": float(item["clock"])}, 0.0, t,
                                             clock=item["clock"]))
            else:
                for m in item["shards"]:
                    ok, effects = job.commit(w, m.get("clock", item["clock"]), item["run"], m["shard"], m["attempt"],
                                             t, {"compute_s": 0.01})
                    carry_out(effects)
        while (report := job.report_for(len(reports) + 1)) is not None:
            reports[len(reports) + 1] = report
            if len(reports) < clocks:
                carry_out(job.begin(len(reports) + 1, t))
        if len(reports) == clocks:
            break
    return applied, reports


@pytest.mark.parametrize("consistency,staleness", [("bsp", 0), ("ssp", 0), ("ssp", 2)])
@pytest.mark.parametrize("slow", [None, "b"])
def test_one_driver_loop_runs_a_fit_under_either_schedule(consistency, staleness, slow):
    clocks = 4
    job = _job(consistency, staleness, clocks)
    applied, reports = _run(job, clocks, slow)
    assert sorted(reports) == list(range(1, clocks + 1)) and not job.failed
    assert applied == Counter({(c, s): 1 for c in range(1, clocks + 1) for s in range(N_SHARDS)})
    for clock, report in reports.items():
        assert report["metrics"]["objective"] == float(clock) and not report["skipped"]
        assert sum(report["shards_per_worker"].values()) == N_SHARDS
    assert [c for c, _ in job.objectives] == list(range(1, clocks + 1))
    assert job.progress()[1] is False  # nothing left to do: the stall watch does not watch a finished fit
