"""How many workers a fit keeps active (``dscar.core.active_set``): the predicted clock, the decision with
its hysteresis, the start from the data's size, who stands by and who rejoins."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dscar.core.active_set import (CROSS_WORKER_COST_S, MIN_GAIN, START_PER_WORKER_S, best_count, bounds, choose, initial_count,
                                   measured_costs, mode, predicted_clock_s, rejoiners, split)
from dscar.core.shard_count import MIB, STEP_S_PER_MIB

pytestmark = pytest.mark.pure

seconds = st.floats(0, 100, allow_nan=False)
counts = st.integers(1, 64)


def test_a_small_clock_stays_on_one_worker_and_a_large_one_spreads():
    # measured on one worker: 2 ms of steps in an 8 ms clock; 300 ms of steps in a 320 ms clock
    assert choose(*measured_costs(0.002, 0.008, 1), current=1, floor=1, ceiling=2) == 1
    assert choose(*measured_costs(0.300, 0.320, 1), current=1, floor=1, ceiling=4) == 4
    # measured on two: 2 ms of steps in all, the clock 12 ms: one worker does it faster
    assert choose(*measured_costs(0.002, 0.012, 2), current=2, floor=1, ceiling=2) == 1
    # issue 43's LDA K=20 on Reuters (main, load 5): 14 ms of steps in a 26 ms clock on one worker (on two: 64 ms)
    assert choose(*measured_costs(0.0141, 0.0264, 1), current=1, floor=1, ceiling=2) == 1


def test_the_measured_costs_split_the_clock_into_its_step_work_and_per_worker_parts():
    assert measured_costs(0.010, 0.030, 1) == pytest.approx((0.010, 0.020))
    # on two workers the cross-worker cost is paid once, not per worker
    assert measured_costs(0.020, 0.030, 2) == pytest.approx((0.020, (0.020 - CROSS_WORKER_COST_S) / 2))
    assert measured_costs(0.030, 0.030, 1) == pytest.approx((0.030, 0.0))
    assert measured_costs(0.050, 0.030, 1)[1] == 0.0  # (steps longer than their clock: clamped)
    # the prediction at the measured count gives the measured clock back
    parallel, per_worker = measured_costs(0.8, 0.5, 4)
    assert predicted_clock_s(parallel, per_worker, 4) == pytest.approx(0.5)


def test_a_large_cluster_of_long_steps_keeps_every_worker():
    """bench.hollow's clocks (100 ms steps, 4 shards a worker): W = 64, a 152 ms clock; W = 256, a 734 ms
    clock. The serial part a worker adds is ~1 ms: charging every worker a cross-worker cost of 10 ms
    would have shrunk the W = 256 fit to about 100 workers."""
    for w, clock_s in ((64, 0.152), (256, 0.734)):
        assert choose(*measured_costs(w * 4 * 0.1, clock_s, w), current=w, floor=1, ceiling=w) == w
    assert initial_count(10 * (1 << 30), 1, 64) == 64  # 10 GiB on 64 workers starts on all of them


@given(seconds, seconds, counts, counts, counts)
def test_the_choice_stays_in_bounds_and_changes_only_for_a_clear_gain(parallel, per_worker, current, floor, ceiling):
    k = choose(parallel, per_worker, current, floor, ceiling)
    lo, hi = bounds(floor, ceiling)
    assert lo <= k <= hi
    now = min(max(current, lo), hi)
    if k != now:
        assert predicted_clock_s(parallel, per_worker, k) <= (1 - MIN_GAIN) * predicted_clock_s(parallel, per_worker, now)
    best = best_count(parallel, per_worker, lo, hi)
    assert all(predicted_clock_s(parallel, per_worker, best) <= predicted_clock_s(parallel, per_worker, n)
               for n in range(lo, hi + 1))


@given(seconds, seconds, counts, counts, counts)
def test_no_flapping_a_decision_is_kept_when_the_same_costs_are_measured_again(parallel, per_worker, current, floor,
                                                                                ceiling):
    k = choose(parallel, per_worker, current, floor, ceiling)
    assert choose(parallel, per_worker, k, floor, ceiling) == k


@given(seconds, seconds, st.floats(0, 0.2), counts, counts)
def test_more_work_a_clock_never_means_fewer_workers(parallel, per_worker, more, floor, ceiling):
    assert best_count(parallel + more, per_worker, floor, ceiling) >= best_count(parallel, per_worker, floor, ceiling)


def test_the_floor_wins_over_the_prediction_and_never_exceeds_the_workers_there_are():
    assert choose(0.0, 1.0, 1, floor=3, ceiling=4) == 3
    assert bounds(5, 2) == (2, 2)
    assert initial_count(0, floor=2, ceiling=4) == 2


def test_the_start_comes_from_the_data_size_at_the_cheapest_step_rate_and_all_workers_when_unknown():
    # the break-even of 1 and 2 workers: parallel / 2 = per-worker cost + cross-worker cost
    even = 2 * (START_PER_WORKER_S + CROSS_WORKER_COST_S) / STEP_S_PER_MIB * MIB
    assert initial_count(0.9 * even, 1, 2) == 1
    assert initial_count(1.1 * even, 1, 2) == 2
    assert initial_count(None, 1, 3) == 3
    assert initial_count(1e15, 1, 8) == 8


def test_the_workers_owning_most_stay_active_and_the_missing_count_rejoins_by_name():
    assert split({"a": 10, "b": 30, "c": 30}, 2) == (["b", "c"], ["a"])
    assert split({"a": 0, "b": 0}, 1) == (["a"], ["b"])
    assert split({"a": 1}, 5) == (["a"], [])
    assert rejoiners({"c", "b"}, n_active=0, wanted=1) == ["b"]
    assert rejoiners({"c", "b"}, n_active=1, wanted=4) == ["b", "c"]
    assert rejoiners({"c"}, n_active=2, wanted=1) == []


def test_a_bad_setting_or_measurement_is_refused():
    assert mode("auto") == "auto"
    with pytest.raises(ValueError, match="dscar.active-workers"):
        mode("some")
    with pytest.raises(ValueError, match="at least one worker"):
        predicted_clock_s(1.0, 1.0, 0)
    with pytest.raises(ValueError, match="seconds"):
        choose(float("nan"), 0.0, 1, 1, 2)


@given(st.dictionaries(st.sampled_from("abcdefgh"), st.integers(0, 100), min_size=1), counts)
def test_a_split_keeps_the_k_most_loaded_active_and_the_rest_stand_by(load, k):
    active, standby = split(load, k)
    assert sorted(active + standby) == sorted(load) and len(active) == max(1, min(k, len(load)))
    assert all(load[a] >= load[s] for a in active for s in standby)  # the hand-off moves the fewest rows


@given(st.sets(st.sampled_from("abcdefgh")), st.integers(0, 8), st.integers(0, 8))
def test_exactly_the_missing_count_rejoins_as_far_as_standby_workers_go(standby, n_active, wanted):
    back = rejoiners(standby, n_active, wanted)
    assert set(back) <= standby and len(back) == min(len(standby), max(0, wanted - n_active))
