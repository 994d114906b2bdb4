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


def test_the_algorithm_pickles_without_its_driver_side_hook():
    import pickle

    algo = hollow.HollowStep(0.01)
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
    assert len(r["clock_s"]) == clocks and all(s > step for s in r["clock_s"])
    assert r["exactly_once_violations"] == []
    assert r["healthy_runs"] == 2 and r["false_positives"] == len(r["false_positive_events"]) == 0
    # figures from the measurements, not typed in
    ideal = r["shards_per_worker"] * step
    assert r["clock_median_s"] == pytest.approx(statistics.median(r["clock_s"][wu:]))
    assert r["clock_ratio"] == pytest.approx(r["clock_median_s"] / ideal)
    assert r["dscar_overhead_s"] == pytest.approx(r["clock_median_s"] - ideal)
    assert len(r["dask"]["round_s"]) == clocks and all(s > step for s in r["dask"]["round_s"])
    assert r["dask_overhead_s"] == pytest.approx(statistics.median(r["dask"]["round_s"][wu:]) - ideal)
    assert r["overhead_ratio"] == pytest.approx(r["dscar_overhead_s"] / r["dask_overhead_s"])
    assert len(r["clock_cpu_ms"]) == clocks - 1 and all(c > 0 for c in r["clock_cpu_ms"])
    assert r["sched_cpu_ms_per_clock"] == pytest.approx(statistics.median(r["clock_cpu_ms"][wu - 1:]))
    for k in ("idle_ms_per_s_dask", "idle_ms_per_s_no_job", "idle_ms_per_s_job"):
        assert 0 < r[k] < 1000  # ms of one thread's CPU per second
    # the shared worker processes and the scheduler's worked during the fit
    assert {"scheduler", "workers-0", "workers-1"} <= set(r["process_cpu_s"])
    assert all(r["process_cpu_s"][k] > 0 for k in ("scheduler", "workers-0", "workers-1"))
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
