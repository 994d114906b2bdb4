"""The hollow-worker benchmark: its quick mode runs dscar's real protocol end to end on many workers
per process, every clock completes exactly once, and its figures come from what it measured."""
import statistics

import numpy as np
import pytest

from bench import hollow


class FakeRecord:
    def __init__(self, clock, per_worker, count_min, count_max, total):
        self.clock, self.shards_per_worker = clock, per_worker
        self.metrics = {"count_min": count_min, "count_max": count_max, "objective": total}


class FakeResult:
    def __init__(self, history, count):
        self.history, self.params, self.n_clocks = history, {"count": count}, len(history)


def test_exactly_once_finds_a_missing_commit_a_double_count_and_a_wrong_table():
    good = [FakeRecord(1, {"a": 2, "b": 2}, 1.0, 1.0, 8.0), FakeRecord(2, {"a": 1, "b": 3}, 2.0, 2.0, 16.0)]
    assert hollow.exactly_once(FakeResult(good, np.full(8, 2.0)), 4, 8) == []
    short = [good[0], FakeRecord(2, {"a": 1, "b": 2}, 2.0, 2.0, 16.0)]
    assert hollow.exactly_once(FakeResult(short, np.full(8, 2.0)), 4, 8) == [
        "clock 2: 3 shards committed, expected 4"]
    twice = [good[0], FakeRecord(2, {"a": 1, "b": 3}, 2.0, 3.0, 17.0)]
    assert "clock 2: counts 2.0..3.0" in hollow.exactly_once(FakeResult(twice, np.full(8, 2.0)), 4, 8)[0]
    table = np.full(8, 2.0)
    table[3] = 1.0
    assert hollow.exactly_once(FakeResult(good, table), 4, 8) == ["final table: counts 1.0..2.0, expected 2"]


def test_the_model_stops_on_the_workers_unless_the_driver_begins_the_clocks():
    assert hollow.HollowStep.converged_on_workers is True  # as every bundled model: dscar.auto-begin
    assert hollow.DriverHollowStep.converged_on_workers is False


def test_the_algorithm_pickles_without_its_driver_side_hook():
    import pickle

    algo = hollow.DriverHollowStep(0.01)
    algo.on_clock = lambda n: None
    copy = pickle.loads(pickle.dumps(algo))
    assert copy.on_clock is None and copy.work_s == 0.01


@pytest.fixture(scope="module")
def quick_run(quick_bench):
    return quick_bench("hollow")


@pytest.mark.timeout(600)
def test_quick_benchmark_runs_the_protocol_on_shared_processes_and_computes_its_figures(quick_run):
    stdout, d, png = quick_run
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert d["quick"] is True and d["workers"] == [16] and "loadavg_after" in d["machine"]
    (r,) = d["rows"]
    w, clocks, wu, step = r["workers"], r["clocks"], r["warmup"], r["step_s"]
    assert w == 16 and r["procs"] == 2 and r["n_shards"] == w * r["shards_per_worker"]
    # every clock of the measured fit completed, each shard committed once, every row counted once a clock
    assert len(r["clock_s"]) == clocks and r["skipped_clocks"] == 0 and all(s > step for s in r["clock_s"])
    # the measured fit, the short one it is differenced with, and the one held still between clocks
    assert r["healthy_runs"] == 3 and r["false_positives"] == len(r["false_positive_events"]) == 0
    assert r["exactly_once_checked"] == 3 and r["exactly_once_violations"] == []
    # figures from the measurements, not typed in
    ideal = r["shards_per_worker"] * step
    assert r["clock_median_s"] == pytest.approx(statistics.median(r["clock_s"][wu:]))
    assert r["clock_ratio"] == pytest.approx(r["clock_median_s"] / ideal)
    assert r["dscar_overhead_s"] == pytest.approx(r["clock_median_s"] - ideal)
    assert len(r["dask"]["round_s"]) == clocks and all(s > step for s in r["dask"]["round_s"])
    assert r["dask_overhead_s"] == pytest.approx(statistics.median(r["dask"]["round_s"][wu:]) - ideal)
    assert r["overhead_ratio"] == pytest.approx(r["dscar_overhead_s"] / r["dask_overhead_s"])
    # scheduler CPU and messages a steady clock: the long fit less the short one, over the clocks between
    cpu, msgs = r["fit_cpu_ms"], r["fit_messages"]
    assert cpu["long"] > cpu["short"] > 0
    assert r["sched_cpu_ms_per_clock"] == pytest.approx((cpu["long"] - cpu["short"]) / (clocks - wu))
    per_clock = {k: (msgs["long"].get(k, 0) - msgs["short"].get(k, 0)) / (clocks - wu) for k in msgs["long"]}
    assert r["messages_per_clock"] == pytest.approx({k: v for k, v in per_clock.items() if v})
    assert r["messages_per_clock_per_worker"] == pytest.approx(sum(per_clock.values()) / w)
    # every worker commits its shard each clock; the coordinator began the clocks, not the driver
    assert r["messages_per_clock"]["scheduler:dscar_commit"] >= w and r["mode"] == "auto-begin"
    assert "scheduler:dscar_begin_clock" not in r["messages_per_clock"] and "mode: auto-begin" in stdout
    assert "scheduler:dscar_commit" in stdout
    # each process's CPU a steady clock, differenced the same way (what bounds the clock here)
    pl, ps = r["process_cpu_s"], r["short_process_cpu_s"]
    assert r["process_cpu_ms_per_clock"] == pytest.approx({k: (pl[k] - ps.get(k, 0.0)) / (clocks - wu) * 1e3 for k in pl})
    assert r["worker_cpu_ms_per_clock"] == pytest.approx(
        sum(v for k, v in r["process_cpu_ms_per_clock"].items() if k != "scheduler"))
    assert f"W={w}: CPU a steady clock: scheduler loop" in stdout
    for k in ("idle_ms_per_s_dask", "idle_ms_per_s_no_job", "idle_ms_per_s_job"):
        assert 0 < r[k] < 1000  # ms of one thread's CPU per second
    # the shared worker processes and the scheduler's worked during the fit
    assert {"scheduler", "workers-0", "workers-1"} <= set(r["process_cpu_s"])
    assert all(r["process_cpu_s"][k] > 0 for k in ("scheduler", "workers-0", "workers-1"))
    # each worker process's event loop was sampled through the fit (lag in ms: never negative)
    assert {"hollow0", "hollow1", "solo1"} <= set(r["loop_lag_ms"])
    assert all(v["n"] > 0 and 0 <= v["p50"] <= v["p99"] <= v["max"] for v in r["loop_lag_ms"].values())
    # the hung worker (alone in its process) was found, and its time is set against the heartbeat interval
    (h,) = r["hang"]
    assert h["fired"] and h["detected"] and h["other_losses"] == 0 and h["workers"] == w
    assert 0 < h["detect_s"] < 60 and r["hang_detect_s"] == [h["detect_s"]]
    from distributed.scheduler import heartbeat_interval

    assert r["hang_limit_s"] == pytest.approx(2 * heartbeat_interval(w) + 2.0)
    t = r["targets"]
    assert t["hang_detect"]["met"] == (h["detect_s"] <= r["hang_limit_s"])
    assert t["clock_ratio"]["met"] == (r["clock_ratio"] <= 1.2)
    assert t["overhead_ratio"]["met"] == (r["overhead_ratio"] <= 0.5)
    assert stdout.count("MET") == 4 and f"{w:>4} {r['procs']:>5} {r['clock_median_s'] * 1e3:>8.1f}" in stdout
    # this machine's floor (bench.barrier): the same barrier with no dscar, in the same layout, measured
    fl = r["floor"]
    assert fl["workers"] == w and fl["procs"] == r["procs"] and fl["threads"] is True and fl["step_s"] == ideal
    assert len(fl["clock_s"]) == clocks and all(s > ideal for s in fl["clock_s"])
    assert fl["clock_ratio"] == pytest.approx(statistics.median(fl["clock_s"][wu:]) / ideal)
    assert fl["server_cpu_ms_per_clock"] > 0
    assert f"(this machine's floor, bench.barrier: {fl['clock_ratio']:.2f}x" in stdout


def test_the_barrier_floor_times_each_clock_from_the_servers_barriers():
    """``bench.barrier``: W clients in P processes, each a step on its own thread then one message; no
    clock is shorter than the step, and the clocks are counted from the server's barriers."""
    from bench import barrier

    r = barrier.measure(6, 2, step_s=0.05, clocks=4, warmup=1)
    assert r["workers"] == 6 and r["procs"] == 2 and r["threads"] is True and len(r["clock_s"]) == 4
    assert all(s >= 0.05 for s in r["clock_s"]) and r["clock_ratio"] == pytest.approx(r["clock_median_s"] / 0.05)
    assert r["clock_median_s"] == pytest.approx(statistics.median(r["clock_s"][1:]))
    assert "    6     2     yes" in barrier.format_rows([r])


def test_the_driver_sets_up_at_most_setup_concurrency_workers_at_once():
    """At 256 hollow workers a warm_up to every worker at once timed its connects out and stalled the
    setup for SETUP_TIMEOUT_S; the driver now keeps SETUP_CONCURRENCY of them in flight, and still
    reaches every worker."""
    import asyncio
    from types import SimpleNamespace

    from dscar import TableSpec
    from dscar.api import driver

    n = 3 * driver.SETUP_CONCURRENCY + 5
    workers = [f"tcp://w{i}" for i in range(n)]
    calls, in_flight, most = [], 0, 0

    async def call_unless_lost(worker, op, timeout, **kw):
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        calls.append((op, worker))
        return "ok", {"status": "OK"}

    run = SimpleNamespace(tables=[TableSpec("t", n, n_parts=n)], job_id="j", workers=workers,
                          _call_unless_lost=call_unless_lost)
    owners = [["t", i, w] for i, w in enumerate(workers)]
    assert asyncio.run(driver._Run._init_partitions(run, owners, None)) is None
    assert sorted(calls) == sorted([("init", w) for w in workers] + [("warm_up", w) for w in workers])
    assert most == driver.SETUP_CONCURRENCY
