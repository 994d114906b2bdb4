"""bench.scaling: time to the same target on 1 and 2 workers, the clock split, and the entry point."""
import math

import pytest

from bench import scaling


class _Rec:
    def __init__(self, objective, seconds, stage_s=None, timings=None, shards_per_worker=None):
        self.objective, self.seconds, self.skipped = objective, seconds, False
        self.stage_s = stage_s or {"shards": seconds / 2, "apply": seconds / 4}
        self.timings = timings or {"w1": {"pull_s": 0.001, "compute_s": 0.002, "compute_cpu_s": 0.001, "push_s": 0.0}}
        self.shards_per_worker = {"w1": 2} if shards_per_worker is None else shards_per_worker


class _Res:
    def __init__(self, recs):
        self.history = recs


def test_time_to_target_sums_clock_seconds_until_the_objective_reaches_it():
    res = _Res([_Rec(3.0, 0.1), _Rec(2.0, 0.2), _Rec(1.0, 0.3)])
    assert scaling.time_to(res, 2.0) == pytest.approx(0.3)
    assert scaling.time_to(res, 3.5) == pytest.approx(0.1)
    assert math.isinf(scaling.time_to(res, 0.5))


def test_split_takes_medians_after_the_first_clock_and_the_rest_is_other():
    res = _Res([_Rec(1.0, 1.0)] + [_Rec(1.0, s) for s in (0.010, 0.020, 0.030)])
    sp = scaling.split(res)
    assert sp["clock"] == pytest.approx(20.0) and sp["shards"] == pytest.approx(10.0) and sp["apply"] == pytest.approx(5.0)
    assert sp["other"] == pytest.approx(5.0) and sp["pull"] == pytest.approx(1.0) and sp["n_shards"] == 2
    assert sp["cpu_share"] == pytest.approx(0.5)  # the step had a core half of its time
    assert sp["busy"] == 1


def test_split_counts_the_workers_that_ran_a_step_not_those_active():
    """Two active workers of which one ran every shard of most clocks: busy is 1, not 2."""
    spw = [{"a": 2, "b": 2}, {"a": 4}, {"a": 4, "b": 0}, {"a": 3, "b": 1}]
    res = _Res([_Rec(1.0, 0.01, shards_per_worker=s) for s in spw])
    assert scaling.split(res)["busy"] == 1  # the median of 1, 1, 2 (the first clock left out)
    res = _Res([_Rec(1.0, 0.01, shards_per_worker=s) for s in spw[:1] * 3])
    assert scaling.split(res)["busy"] == 2


def test_median_time_to_leaves_out_bursts_that_hit_most_repeats_on_different_clocks():
    # three repeats of 6 clocks of 10 ms; a 90 ms burst hits clock 1 of one repeat and clock 4 of another
    seconds = [[0.01] * 6, [0.01, 0.1] + [0.01] * 4, [0.01] * 4 + [0.1, 0.01]]
    assert scaling.median_time_to(seconds, [6, 6, 6]) == pytest.approx(0.06)
    assert sorted(sum(s) for s in seconds)[1] == pytest.approx(0.15)  # (the median of the totals keeps a burst)
    assert scaling.median_time_to(seconds, [5, 6, 6]) == pytest.approx(0.06)  # the median number of clocks
    assert scaling.median_time_to(seconds, [4, 4, 6]) == pytest.approx(0.04)
    assert math.isinf(scaling.median_time_to(seconds, [None, None, 6]))
    assert scaling.median_time_to(seconds, [6, 6, None]) == pytest.approx(0.06)


def test_both_fits_run_the_same_clocks_past_the_target_clock_and_the_repeats_alternate():
    case = scaling.Case("x", 6, lambda: (None, None))
    assert scaling.fit_clocks(case) > case.clocks  # the target clock is never a fit's last
    res = _Res([_Rec(10.0 - c, 0.01) for c in range(scaling.fit_clocks(case))])
    assert scaling.target_of(res, case) == pytest.approx((10.0 - 5) * (1 + scaling.TARGET_SLACK))  # clock 6's
    assert scaling.clocks_to(res, scaling.target_of(res, case)) == case.clocks
    assert scaling.clocks_to(res, -5.0) is None
    assert [scaling.rep_order(r) for r in range(3)] == [(1, 2), (2, 1), (1, 2)]


@pytest.mark.timeout(600)
def test_quick_mlr_case_reports_both_worker_counts_the_ratio_and_a_plot(quick_bench):
    stdout, d, png = quick_bench("scaling", "--cases", "mlr")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (case,) = d["cases"]
    assert case["case"] == "mlr" and set(case["by_workers"]) == {"1", "2"}
    t1, t2 = case["by_workers"]["1"]["time_s"], case["by_workers"]["2"]["time_s"]
    assert t1 > 0 and case["ratio_1w_over_2w"] == pytest.approx(t1 / t2)
    assert case["by_workers"]["1"]["n_shards"] == 1  # digits: 1 a worker
    # dscar.active-workers "auto": digits are too small for a second worker, which stands by (and the
    # default shard count is for the one active)
    assert case["by_workers"]["2"]["n_shards"] == 1 and case["by_workers"]["2"]["active"] == 1
    assert "2w active" in stdout and "busy" in stdout and case["by_workers"]["2"]["busy"] == 1
    assert "load average" in stdout and "where a clock goes" in stdout
    assert d["machine"]["env"]["OPENBLAS_NUM_THREADS"] == "1"
