"""Liveness relative to Dask's heartbeat interval (``dscar.core.liveness``; the coordinator's ``hang_timeout``)."""
from __future__ import annotations

import dask.config
import pytest
from distributed.scheduler import heartbeat_interval
from hypothesis import given
from hypothesis import strategies as st

from dscar.scheduler.coordinator import hang_timeout
from dscar.core.liveness import MAX_PROBES, MARGIN_S, MISSED_HEARTBEATS, silence_limit, to_probe, worst_detection_s


def test_small_clusters_keep_the_configured_timeout_and_large_ones_wait_for_missed_heartbeats():
    with dask.config.set({"dscar.hang-timeout": 3.0}):
        assert hang_timeout(4) == hang_timeout(10) == 3.0  # heartbeats every 0.5 s: 3 s is six of them
        for n in (256, 1000, 4000):
            assert hang_timeout(n) == MISSED_HEARTBEATS * heartbeat_interval(n) + MARGIN_S > 3.0
        assert hang_timeout(1000) == pytest.approx(12.1) and hang_timeout(4000) == pytest.approx(42.1)  # intervals of 6 s and 21 s
    with dask.config.set({"dscar.hang-timeout": 60.0}):
        assert hang_timeout(4000) == 60.0  # a longer configured timeout stands


@given(n=st.integers(1, 20_000), configured=st.floats(0.1, 120.0), late=st.floats(0.0, 1.0))
def test_a_healthy_worker_one_heartbeat_late_is_never_probed_and_a_hung_one_is_within_two_intervals(
        n, configured, late):
    interval = heartbeat_interval(n)
    limit = silence_limit(configured, interval)
    assert limit >= configured
    assert interval * (1 + late) < limit  # a heartbeat up to one interval late: not silent yet
    assert limit <= max(configured, 2 * interval + MARGIN_S)  # a hung worker is probed this soon
    assert silence_limit(configured, heartbeat_interval(n + 1)) >= limit  # more workers: never sooner


@pytest.mark.parametrize("n", [200, 256, 1000, 4000, 20_000])
def test_a_hung_worker_is_found_within_two_heartbeat_intervals_and_2_s(n):
    """Issue 39's bound, with a quarter second left for the scheduler's own lag, wherever the
    heartbeats (not the configured 3 s) set the silence limit."""
    interval = heartbeat_interval(n)
    assert worst_detection_s(3.0, interval) <= 2 * interval + 2.0 - 0.25


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="must be > 0"):
        silence_limit(0.0, 0.5)


@given(silent=st.dictionaries(st.text("abcdef", min_size=1, max_size=4), st.floats(0.0, 100.0), max_size=300),
       limit=st.floats(0.0, 50.0), cap=st.integers(1, 64))
def test_a_sweep_probes_the_longest_silent_first_and_never_more_than_its_cap(silent, limit, cap):
    chosen = to_probe(silent, limit, cap)
    over = {w for w, s in silent.items() if s > limit}
    assert len(chosen) == min(cap, len(over)) and set(chosen) <= over and len(set(chosen)) == len(chosen)
    left = over - set(chosen)
    assert all(silent[c] >= silent[w] for c in chosen for w in left)


def test_a_starved_scheduler_that_heard_nobody_does_not_probe_thousands_at_once():
    silent = {f"w{i}": 100.0 + i for i in range(4000)}
    assert to_probe(silent, 10.0) == [f"w{i}" for i in range(3999, 3999 - MAX_PROBES, -1)]
