"""bench.lda's time-to-target arithmetic on given curves (the samplers themselves run in test_lda's quick bench)."""
import sys
import threading
import time

import pytest

import argparse

from bench.lda import (Run, SamplerCPU, _seed_list, clock_cpu_estimate, format_targets, format_time_to_target, targets,
                       time_targets, time_to_target, value_at)


def curve(*pts):
    return [tuple(p) for p in pts]


def test_time_to_target_interpolates_between_points_and_says_when_never():
    c = curve((0, 0.0, -10.0), (1, 1.0, -9.0), (2, 3.0, -8.0))
    assert time_to_target(c, -8.5) == pytest.approx(2.0)  # halfway from -9 (1 s) to -8 (3 s)
    assert time_to_target(c, -9.0) == 1.0 and time_to_target(c, -11.0) == 0.0
    assert time_to_target(c, -7.9) is None
    assert value_at(c, 2) == -8.0 and value_at(c, 5) is None


def run(sampler, pts):
    return Run(sampler, "c", 5, 20, 100, pts[-1][1], pts[-1][1], pts[-1][2], curve=curve(*pts))


def test_time_targets_pair_dscar_with_tomotopy_at_equal_cores():
    fast = [(0, 0, -10.0), (10, 1.0, -9.0), (20, 2.0, -8.0)]
    slow = [(0, 0, -10.0), (10, 2.0, -9.0), (20, 4.0, -8.0)]
    never = [(0, 0, -10.0), (10, 1.0, -9.5), (20, 2.0, -9.0)]
    by = {"lda": [run("lda", never)], "tomotopy-1t": [run("tomotopy-1t", slow)],
          "tomotopy-2t": [run("tomotopy-2t", fast)], "dscar-1w": [run("dscar-1w", fast)],
          "dscar-2w": [run("dscar-2w", slow)]}
    t = time_targets(by, 20)
    assert set(t) == {"tomotopy-1t@20", "lda@20"}
    goal = t["tomotopy-1t@20"]
    assert goal["target"] == -8.0 and goal["seconds"]["tomotopy-1t"] == 4.0 and goal["seconds"]["lda"] is None
    assert goal["dscar1_over_tomotopy1"] == 0.5 and goal["dscar2_over_tomotopy2"] == 2.0
    assert t["lda@20"]["target"] == -9.0 and t["lda@20"]["seconds"]["dscar-1w"] == 1.0
    by["dscar-2w"] = [run("dscar-2w", never)]
    assert time_targets(by, 20)["tomotopy-1t@20"]["dscar2_over_tomotopy2"] is None  # never reached: no ratio


def test_without_lda_the_targets_are_tomotopys_alone():
    """``--no-lda``: no ``lda`` run, so no ``lda@N`` target and no ratio against it; the rest as with it."""
    fast = [(0, 0, -10.0), (10, 1.0, -9.0), (20, 2.0, -8.0)]
    slow = [(0, 0, -10.0), (10, 2.0, -9.0), (20, 4.0, -8.0)]
    by = {"tomotopy-1t": [run("tomotopy-1t", slow)], "tomotopy-2t": [run("tomotopy-2t", fast)],
          "dscar-1w": [run("dscar-1w", fast)], "dscar-2w": [run("dscar-2w", slow)]}
    t = time_targets(by, 20)
    assert set(t) == {"tomotopy-1t@20"} and t["tomotopy-1t@20"]["dscar1_over_tomotopy1"] == 0.5
    entry = {"runs": {s: rs[0].row() for s, rs in by.items()}, "time_to_target": t, "time_to_target_cpu": t,
             "paired": {"dscar1_over_tomotopy1": [1.2], "dscar2_over_tomotopy2": [0.9]}}
    got = targets({"kernel": {"K": {}}, "corpora": {"c": entry}})["c"]
    assert got["dscar2_over_lda"] is None and got["dscar2_loglik_rel_diff_vs_lda"] is None
    text = format_targets({"kernel": {}, "c": got})
    assert "dscar 2 workers 0.90x tomotopy 2 threads" in text and "lda" not in text
    assert "time to tomotopy-1t@20, dscar / tomotopy at equal cores: 1 worker / 1 thread 0.50x" in text


def test_a_run_of_several_repeats_shows_each_repeats_ratio_and_its_seed():
    """The medians hide the spread between chains of different seeds: each repeat's ratio is printed."""
    fast = [(0, 0, -10.0), (20, 1.0, -8.0)]
    slow = [(0, 0, -10.0), (20, 3.0, -8.0)]
    by = {"lda": [run("lda", fast)], "tomotopy-1t": [run("tomotopy-1t", fast)] * 2,
          "tomotopy-2t": [run("tomotopy-2t", fast)] * 2, "dscar-1w": [run("dscar-1w", fast)] * 2,
          "dscar-2w": [run("dscar-2w", fast), run("dscar-2w", slow)]}
    text = format_time_to_target(time_targets(by, 20), 2, seeds=[1, 2])
    assert "by repeat (seeds 1 2): d1w/t1t 1.00x 1.00x; d2w/t2t 1.00x 3.00x" in text
    assert "by repeat" not in format_time_to_target(time_targets({k: v[:1] for k, v in by.items()}, 20), 1)
    assert _seed_list("1,2,3") == (1, 2, 3)
    for bad in ("1,x", "-1", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="seeds"):
            _seed_list(bad)


class Rec:
    def __init__(self, seconds, timings):
        self.seconds, self.timings = seconds, timings


def test_a_clocks_cpu_estimate_is_the_slowest_workers_step_cpu_plus_the_clocks_time_outside_its_steps():
    rec = Rec(0.50, {"a": {"compute_s": 0.40, "compute_cpu_s": 0.25}, "b": {"compute_s": 0.45, "compute_cpu_s": 0.20}})
    assert clock_cpu_estimate(rec) == pytest.approx(0.25 + (0.50 - 0.40))  # worker a used the most CPU
    assert clock_cpu_estimate(Rec(0.3, {})) == 0.3  # no step ran: the wall time


def test_time_targets_read_the_curve_they_are_given():
    wall = [(0, 0, -10.0), (20, 4.0, -8.0)]
    cpu = [(0, 0, -10.0), (20, 1.0, -8.0)]
    by = {s: [Run(s, "c", 5, 20, 100, 4.0, 4.0, -8.0, curve=curve(*wall),
                  cpu_curve=curve(*(cpu if s.startswith("dscar") else wall)))]
          for s in ("lda", "tomotopy-1t", "tomotopy-2t", "dscar-1w", "dscar-2w")}
    assert time_targets(by, 20)["tomotopy-1t@20"]["dscar1_over_tomotopy1"] == 1.0
    assert time_targets(by, 20, "cpu_curve")["tomotopy-1t@20"]["dscar1_over_tomotopy1"] == 0.25


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU from /proc")
def test_a_peers_cpu_leaves_out_the_threads_already_running():
    """The embedded clusters' threads live in the bench's process: a thread started before the meter
    spends 0.2 s of CPU while the calling thread waits; the process counts it, the meter does not."""
    go, spent, read = threading.Event(), threading.Event(), threading.Event()

    def busy():
        go.wait()
        start = time.thread_time()
        while time.thread_time() - start < 0.2:
            pass
        spent.set()
        read.wait()  # alive until the meter has read it

    worker = threading.Thread(target=busy)
    worker.start()
    meter = SamplerCPU()
    m0, p0 = meter(), time.process_time()
    go.set()
    spent.wait()
    m1, p1 = meter(), time.process_time()
    read.set()
    worker.join()
    assert p1 - p0 >= 0.2
    assert m1 - m0 < 0.1
