"""The membership-churn benchmark: its pure figures, and --quick on worker processes (joins, retirements and
kills during a BSP fit) with the exactly-once audit clean and the figures in the table and the JSON."""
import json
import os

import pytest

from bench import elastic


def test_seconds_at_each_worker_count_come_from_the_samples_inside_the_window():
    live = [(0.0, 3), (1.0, 4), (3.0, 3), (4.0, 2), (10.0, 2)]
    assert elastic.time_at_counts(live, 0.5, 6.0) == {4: 2.0, 3: 1.0}  # from the first sample inside
    assert elastic.time_at_counts(live, 0.0, 10.0) == {3: 2.0, 4: 2.0, 2: 6.0}


def test_each_sampled_change_of_the_live_count_is_dated_by_the_event_that_made_it():
    """``dated_live``: a change between two samples moves back to the event between them that made it (an
    arrival for a rise; a hand-off's release or a loss for a fall); a change with none keeps its sample's time."""
    live = [(0.0, 3), (0.05, 3), (0.10, 4), (0.15, 4), (0.20, 3), (0.25, 2), (0.30, 3)]
    events = [{"kind": "worker-joined", "time": 0.07}, {"kind": "handoff", "time": 0.12},  # (before the fall's window)
              {"kind": "worker-lost", "time": 0.16}, {"kind": "handoff", "time": 0.24}, {"kind": "checkpoint-started", "time": 0.27}]
    dated, n = elastic.dated_live(live, events)
    assert dated == [(0.0, 3), (0.05, 3), (0.07, 4), (0.15, 4), (0.16, 3), (0.24, 2), (0.30, 3)]
    assert n == 3  # the last rise had no arrival between its samples
    assert elastic.time_at_counts(dated, 0.0, 0.30)[4] == pytest.approx(0.09)


def test_the_expected_rate_weights_each_reference_by_its_time():
    assert elastic.expected_rate({2: 3.0, 4: 1.0}, {2: 1.0, 4: 5.0}) == pytest.approx(2.0)
    assert elastic.expected_rate({1: 1.0}, {2: 1.0, 4: 5.0}) == 1.0  # no reference at 1: the nearest count's


def test_time_lost_is_each_clock_s_excess_over_a_reference_clock_summed_by_the_event_before_it():
    ticks = [(0.0, 1), (1.0, 2), (3.0, 3), (4.0, 4), (6.5, 5)]
    live = [(0.0, 2), (3.5, 4)]
    events = [{"kind": "join", "at": 2.0}, {"kind": "retire", "at": 5.0}]
    lost = elastic.lost_by_event(ticks, live, events, {2: 1.0, 4: 2.0})
    assert lost["none"] == {"events": 0, "clocks": 1, "lost_s": 0.0, "lost_s_landing": 0.0, "lost_s_per_event": None}
    # after the join: 2 s at 2 workers (1 s lost, in the clock it lands in), then 1 s of which half at 4 workers
    # (a failure-free clock: 1 / (0.5 * 1.0 + 0.5 * 2.0) s, so 1 / 3 s lost)
    assert lost["join"] == {"events": 1, "clocks": 2, "lost_s": 1.333, "lost_s_landing": 1.0, "lost_s_per_event": 1.333}
    # the retirement lands in a clock of 2.5 s at 4 workers (0.5 s each): 2.0 s lost
    assert lost["retire"]["lost_s"] == 2.0 and lost["retire"]["clocks"] == 1


def test_a_clock_s_failure_free_rate_weights_each_worker_count_by_its_time_in_the_clock():
    live = [(0.0, 3), (2.0, 2), (2.5, 2), (10.0, 3)]
    rates = {2: 1.0, 3: 1.5}
    assert elastic.rate_over(live, 0.5, 1.5, rates) == 1.5  # no sample inside: the count at its start
    assert elastic.rate_over(live, 1.0, 3.0, rates) == pytest.approx((1.0 * 1.5 + 1.0 * 1.0) / 2.0)
    assert elastic.rate_over(live, 9.0, 11.0, rates) == pytest.approx((1.0 * 1.0 + 1.0 * 1.5) / 2.0)


def test_time_lost_after_a_join_is_split_by_where_the_joiner_was():
    ticks = [(0.0, 1), (1.0, 2), (3.0, 3), (4.0, 4), (5.0, 5), (6.0, 6)]
    live = [(0.0, 2), (3.5, 4)]
    events = [{"kind": "join", "at": 0.5}, {"kind": "retire", "at": 5.5}]
    fit_events = [{"kind": "worker-joined", "time": 3.5}]  # the joiner's process was up 3 s after the request
    phases = elastic.join_phases(ticks, live, events, fit_events, {2: 1.0, 4: 2.0})
    assert phases["starting"] == {"clocks": 2, "lost_s": 1.0}  # the clocks ending at 1.0 and 3.0, before it arrived: 0 s + 1 s
    assert phases["landing"]["clocks"] == 1 and phases["landing"]["lost_s"] == pytest.approx(1 - 1 / 1.5, abs=1e-3)
    assert phases["after"] == {"clocks": 1, "lost_s": 0.5}  # (4, 5] at 4 workers: 1 s for a 0.5 s clock
    # a join whose worker never arrived: every clock after it is "starting"
    assert elastic.join_phases(ticks, live, events, [], {2: 1.0, 4: 2.0})["starting"]["clocks"] == 4


def test_time_lost_after_an_event_is_split_by_the_clock_s_distance_from_it():
    ticks = [(0.0, 1), (1.0, 2), (2.5, 3), (3.5, 4), (4.5, 5), (5.5, 6), (7.0, 7), (8.0, 8)]
    live = [(0.0, 2), (1.5, 4), (6.0, 2)]
    events = [{"kind": "join", "at": 0.5}, {"kind": "retire", "at": 5.6}]
    fit_events = [{"kind": "worker-joined", "time": 1.5}]  # arrives in the clock (1.0, 2.5]
    lost = elastic.lost_by_distance(ticks, live, events, fit_events, {2: 1.0, 4: 1.0})
    # a clock lasts 1 s at either count: each clock's excess is its length less 1 s
    assert lost["join"] == {"starting": {"clocks": 1, "lost_s": 0.0, "lost_s_median": 0.0},
                            "landing": {"clocks": 1, "lost_s": 0.5, "lost_s_median": 0.5},
                            "next": {"clocks": 1, "lost_s": 0.0, "lost_s_median": 0.0},
                            "later": {"clocks": 2, "lost_s": 0.0, "lost_s_median": 0.0}}
    assert lost["retire"] == {"landing": {"clocks": 1, "lost_s": 0.5, "lost_s_median": 0.5},
                              "next": {"clocks": 1, "lost_s": 0.0, "lost_s_median": 0.0}}


def test_makespan_hands_whole_steps_to_the_first_free_worker():
    assert elastic.makespan(3, 12, 0.15, 0.0) == pytest.approx(0.45)  # 4 workers from the start: 3 rounds
    assert elastic.makespan(3, 12, 0.15, 10.0) == pytest.approx(0.6)  # too late: the joiner takes none
    assert elastic.makespan(3, 12, 0.15, 0.157) == pytest.approx(0.6)  # it takes 2: one old worker still runs 4
    assert elastic.makespan(2, 12, 0.15, 0.117) == pytest.approx(0.717)  # its 4th step ends last


def test_a_join_s_landing_clock_is_bounded_by_whole_shards_and_the_rest_is_over_the_ideal():
    ticks = [(0.0, 1), (1.0, 2), (1.9, 3), (2.4, 4)]
    live = [(0.0, 1), (1.1, 2)]
    rates = {1: 1 / 0.9, 2: 1 / 0.5}  # 4 steps of 0.2 s: 0.8 s of rounds + 0.1 s of the rest at 1 worker
    events = [{"kind": "join", "at": 0.5}]
    fit_events = [{"kind": "worker-joined", "time": 1.1, "worker": "j"}, {"kind": "worker-ready", "time": 1.15, "worker": "j"}]
    g = elastic.join_granularity(ticks, live, events, fit_events, rates, n_shards=4, step_s=0.2)
    ideal = elastic.makespan(1, 4, 0.2, 0.1) + 0.1  # from its arrival: its warm-up is the engine's
    fluid = 1 / elastic.rate_over(live, 1.0, 1.9, rates)
    assert g["joins"] == 1
    assert g["lost_s"] == pytest.approx(0.9 - fluid, abs=1e-3)
    assert g["bound_s"] == pytest.approx(ideal - fluid, abs=1e-3) and g["bound_s"] > 0
    assert g["over_ideal_s"] == pytest.approx(0.9 - ideal, abs=1e-3)
    assert g["gain_vs_old_s"] == pytest.approx(0.0, abs=1e-3)  # as slow as a clock at 1 worker
    assert elastic.join_granularity(ticks, live, events, [], rates, 4, 0.2)["joins"] == 0  # it never arrived


def test_losses_are_traced_to_what_the_driver_did_to_the_worker():
    events = [{"kind": "kill", "worker": "a", "at": 1.0}, {"kind": "retire", "worker": "b", "at": 2.0},
              {"kind": "kill", "worker": "c", "at": 3.0}, {"kind": "join", "at": 4.0}]
    fit_events = [{"kind": "worker-lost", "worker": "a", "clock": 3, "time": 1.1},
                  {"kind": "worker-joined", "worker": "d", "clock": 3, "time": 2.5},
                  {"kind": "worker-removed", "worker": "d", "reason": "no sign of life", "time": 3.5},
                  {"kind": "worker-lost", "worker": "d", "clock": 4, "time": 3.5},
                  {"kind": "worker-left", "worker": "b", "time": 2.2},
                  {"kind": "worker-lost", "worker": "a", "clock": 5, "time": 5.0}]
    c = elastic.losses_by_cause(fit_events, events)
    assert c["by_cause"] == {"kill": 2, "other": 1} and c["lost_twice"] == ["a"] and c["kills_without_loss"] == 1
    # d joined at clock 3 (1 s before its loss), 0.5 s after the kill of c
    assert c["untraced"] == [{"worker": "d", "clock": 4, "cause": "other", "removed": "no sign of life",
                              "joined_clock": 3, "joined_s_before_loss": 1.0, "s_since_last_kill": 0.5}]
    assert c["removed_by_dscar"] == 1


def test_the_layout_is_compared_with_the_reference_s_at_the_same_count():
    ticks = [(0.0, 1), (1.0, 2), (2.5, 3), (3.5, 4), (4.5, 5)]
    live = [(0.0, 2)]
    lay = lambda rows, shards: {"live": 2, "max_rows": rows, "max_parts": 1, "max_shards": shards, "owners": 2}
    layouts = [lay(6, 3), lay(6, 3), lay(8, 4), lay(6, 3), {**lay(9, 3), "owners": 1}]
    events = [{"at": 1.2}]  # lands in the clock (1.0, 2.5): left out of the excess
    out = elastic.layout_vs_reference(ticks, live, layouts, {2: lay(6, 3)}, {2: 1.0}, events)
    # the last clock's joiner owns nothing: not a layout
    assert out["per_count"][2] == {"clocks": 3, "max_rows": 6.67, "max_shards": 3.33, "above": 1,
                                   "reference_max_rows": 6, "reference_max_shards": 3}
    assert out["clocks"] == {"above": 0, "even": 2} and out["excess_s_per_clock"]["even"] == 0.0


def test_clocks_from_joining_to_owning_partitions_come_from_the_fit_s_events():
    events = [{"kind": "worker-joined", "worker": "a", "clock": 3}, {"kind": "worker-joined", "worker": "b", "clock": 4},
              {"kind": "partitions-taken-on", "workers": ["a", "b"], "clock": 5},
              {"kind": "partitions-taken-on", "workers": ["a", "c"], "clock": 9}]  # (evened out later: no join's)
    assert elastic.join_clocks(events) == [2, 1]


def test_references_before_and_after_are_averaged_and_their_spread_reported():
    runs = [{"workers": 2, "rate": 1.0, "per_clock_objective": 12.0}, {"workers": 2, "rate": 3.0, "per_clock_objective": 12.0}]
    merged = elastic.merge_references(runs)
    assert merged[2]["rate"] == 2.0 and merged[2]["rates"] == [1.0, 3.0] and merged[2]["spread"] == 1.0


def test_the_driver_keeps_the_worker_count_within_one_of_the_start_and_covers_every_kind():
    d = elastic.ChurnDriver(None, None, list(elastic.KINDS), 9, 3, seed=1)
    assert sorted(d.choose(3) for _ in range(3)) == sorted(elastic.KINDS)  # one round: every kind
    assert {d.choose(2) for _ in range(5)} == {"join"}  # at 2 = 3 - 1: no retirement, no kill
    assert "join" not in {d.choose(4) for _ in range(5)}  # at 4 = 3 + 1: no join
    assert {d.choose(3, 4) for _ in range(5)} <= {"retire", "kill"}  # 3 live and a join on its way: none more
    assert {d.choose(2, 3) for _ in range(5)} == {"join"}  # 2 live (one restarting): no retirement, no kill
    assert d.choose(2, 4) is None  # 2 live and 2 joins on their way: wait for them


def test_finer_shards_cut_the_same_step_work_per_clock():
    assert elastic.work_s(elastic.N_SHARDS) == elastic.WORK_S
    for n in (12, 24, 48):
        assert n * elastic.work_s(n) == pytest.approx(elastic.STEP_WORK_S)


def test_events_come_right_after_a_clock_s_end_or_at_a_uniform_point_of_a_clock():
    import random

    rng = random.Random(0)
    assert elastic.event_delay("boundary", rng, 0.6) == 0.0
    delays = [elastic.event_delay("random", rng, 0.6) for _ in range(2000)]
    assert all(0.0 <= d <= 0.6 for d in delays)
    assert min(delays) < 0.05 and max(delays) > 0.55 and abs(sum(delays) / len(delays) - 0.3) < 0.03  # uniform
    assert elastic.event_delay("random", rng, 0.0) == 0.0  # no clock measured yet
    with pytest.raises(ValueError, match="event_at"):
        elastic.event_delay("midway", rng, 0.6)


def test_a_worker_dask_is_retiring_no_longer_counts_as_live():
    """dscar lets Dask retire a worker once it has handed off: from then it works no more, though the
    scheduler keeps it until its process has closed."""
    from types import SimpleNamespace

    from distributed.core import Status

    workers = {w: SimpleNamespace(status=Status.running) for w in ("a", "b", "c")}
    d = elastic.ChurnDriver(SimpleNamespace(scheduler=SimpleNamespace(workers=workers)), None, ["retire"], 1, 3, seed=0)
    assert d.working() == 3
    workers["b"].status = Status.closing_gracefully
    assert d.working() == 2
    workers["c"].status = Status.closed
    assert d.working() == 1


def test_the_timing_of_events_draws_apart_from_their_kinds():
    """The same seed draws the same kinds whether events come at a clock's end or at a random point of it."""
    a = elastic.ChurnDriver(None, None, list(elastic.KINDS), 9, 3, seed=4)
    b = elastic.ChurnDriver(None, None, list(elastic.KINDS), 9, 3, seed=4, event_at="random")
    for _ in range(3):
        elastic.event_delay(b.event_at, b.delay_rng, 0.5)
    assert [a.choose(3) for _ in range(6)] == [b.choose(3) for _ in range(6)]


def test_a_kind_not_allowed_now_stays_in_its_round_so_four_events_cover_every_kind():
    """The quick run's 4 events once had no kill: a retirement left 2 live while a join was on its way,
    the kill was not allowed then, and its round was dropped for a new one. Here joins arrive two
    events after they are asked for (a loaded machine), and every kind still comes in 4 events."""
    for seed in range(40):
        d = elastic.ChurnDriver(None, None, list(elastic.KINDS), 9, 3, seed=seed)
        live, coming, kinds = 3, [], []
        while len(kinds) < 4:
            live += sum(1 for t in coming if t <= len(kinds))
            coming = [t for t in coming if t > len(kinds)]
            kind = d.choose(live, live + len(coming))
            if kind is None:  # waits for the joins on their way
                coming = [len(kinds)] * len(coming)
                continue
            kinds.append(kind)
            if kind == "join":
                coming.append(len(kinds) + 1)
            else:
                live -= 1
        assert set(kinds) == set(elastic.KINDS), (seed, kinds)


@pytest.fixture(scope="module")
def quick_run(quick_bench):
    return quick_bench("elastic")


@pytest.mark.timeout(600)
def test_quick_churn_commits_every_shard_update_exactly_once_and_reports_its_figures(quick_run):
    stdout, d, png = quick_run
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    s = d["summary"]
    assert d["quick"] is True and s["events"] == 4 and s["driver_error"] is None
    assert set(s["event_kinds"]) == set(elastic.KINDS)  # a join, a retirement and a kill at least
    a = s["audit"]
    assert a["lost"] == 0 and a["applied_twice"] == 0 and a["violations"] == 0, a
    assert a["checked_clocks"] == s["clocks"] - s["skipped_clocks"] > 0
    # the updates kept in the final model: all of them but those a recovery rolled back to a checkpoint
    assert 0 < s["final_objective"] <= s["reference_objective"]
    # the figures: goodput against references at the worker counts seen, hand-offs from the events, rework
    w = d["workers"]  # references at W - 1, W and W + 1, before and after the churn fit
    assert set(map(int, d["references"])) == {w - 1, w, w + 1}
    assert all(len(r["rates"]) == 2 for r in d["references"].values())
    # of the churn fit's model, as wide (a narrower one is a faster model: its updates ride their commits)
    assert {r["columns"] for r in d["references"].values()} == {elastic.churn_clocks(s["events"])}
    assert set(s["lost_by_event"]) <= {"none", *elastic.KINDS}
    assert 0 < s["goodput"] and s["clock_rate"] > 0 and s["expected_rate"] > 0
    assert s["handoffs"] == s["event_kinds"]["retire"] == len(s["handoff_s"]) and s["left"] >= s["handoffs"]
    assert s["losses"] >= s["event_kinds"]["kill"] and s["recoveries"] >= 1
    assert sum(e["kind"] == "worker-lost" for e in s["membership_events"]) == s["losses"]
    assert s["rework_per_event"] == pytest.approx((s["skipped_clocks"] + s["rolled_back_clocks"]) / s["events"], abs=1e-3)
    m = s["memory_copies"]  # (each recorded copy is held where recorded; a stale one is dropped once its
    assert 0 < m["recorded"] <= m["held"]  # replacement's report is in: test_elastic checks that it goes)
    for label in ("goodput", "hand-offs", "rework", "exactly-once audit", "lost 0, applied twice 0", "load average",
                  "memory copies at end"):
        assert label in stdout
    # each clock kept to look at again: the churn fit's and the references', and the layout at each clock's end
    assert [c["clock"] for c in d["clocks"]] == list(range(1, s["clocks"] + 1))
    assert all(c["seconds"] > 0 and "shards" in c["stage_s"] and c["timings"]["compute_s"] > 0 for c in d["clocks"]
               if not c["skipped"])
    assert sum(sum(c["shards_per_worker"].values()) for c in d["clocks"] if not c["skipped"]) == \
        s["shards"] * (s["clocks"] - s["skipped_clocks"])
    assert all(r["clock_records"] and len(r["clock_records"]) == 2 * r["clocks"] for r in d["references"].values())
    assert len(d["layouts"]) == len(d["ticks"])
    assert all(0 <= lay["away"] <= s["shards"] and lay["split"] >= 0 for lay in d["layouts"] if lay)
    # a fit that placed everything itself keeps each shard with its rows, and a row range's partitions together
    assert all(r["layout"]["away"] == 0 and r["layout"]["split"] == 0 for r in d["references"].values())


@pytest.mark.timeout(600)
def test_churn_on_hollow_workers_commits_every_shard_update_exactly_once(quick_bench):
    """``--hollow W``: the same churn on hollow workers (the real plugins, sleeping steps, many workers a
    process; a kill ends a one-worker process, a join starts one), references on the same cluster."""
    stdout, d, png = quick_bench("elastic", "--hollow", "6")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    s = d["summary"]
    assert d["hollow"] == 6 and s["events"] == 4 and s["driver_error"] is None and s["unsettled_events"] == 0
    assert set(s["event_kinds"]) == set(elastic.KINDS)
    assert s["shards"] == elastic.HOLLOW_SHARDS_PER_WORKER * 6 and s["step_s"] == elastic.HOLLOW_STEP_S
    a = s["audit"]
    assert a["lost"] == 0 and a["applied_twice"] == 0 and a["violations"] == 0, a
    assert a["checked_clocks"] == s["clocks"] - s["skipped_clocks"] > 0
    assert set(map(int, d["references"])) == {5, 6, 7}
    assert s["handoffs"] == s["event_kinds"]["retire"] and s["losses"] >= s["event_kinds"]["kill"] >= 1
    assert s["joined"] >= s["event_kinds"]["join"] and s["recoveries"] >= 1
    assert 0 < s["final_objective"] <= s["reference_objective"] and 0 < s["goodput"]
    assert "exactly-once audit" in stdout and "goodput" in stdout


def test_pull_bound_phases_split_clocks_by_the_state_at_their_end_and_count_rows_served_per_clock():
    # (time, clocks, workers, owners) at each clock's end
    ticks = [(0.0, 1, 2, 2), (1.0, 2, 2, 2), (2.0, 3, 2, 2), (3.0, 4, 3, 2), (4.5, 5, 3, 2), (6.0, 6, 3, 3),
             (6.5, 7, 3, 3), (7.0, 8, 3, 3)]
    served = {"a": [(0.5, 7), (1.5, 100), (2.5, 300), (6.7, 50)], "b": [(1.2, 200)], "c": [(6.2, 10), (6.8, 30)]}
    phases = elastic.pull_phases(ticks, served)
    # before: clocks (0,1) and (1,2) end at 2 workers; the first left out
    assert phases["before"]["clocks"] == 1 and phases["before"]["clock_s_median"] == 1.0
    assert phases["before"]["rows_served_per_clock"] == {"a": 100.0, "b": 200.0}
    assert phases["before"]["max_owner_rows_per_clock"] == 200.0
    # joined: (2,3) and (3,4.5) end at 3 workers, 2 owners: the first left out
    assert phases["joined"]["clocks"] == 1 and phases["joined"]["clock_s_median"] == 1.5
    assert phases["joined"]["rows_served_per_clock"] == {}
    # owning: (4.5,6), (6,6.5), (6.5,7) end with 3 owners: the first left out
    assert phases["owning"]["clocks"] == 2 and phases["owning"]["rows_served_per_clock"] == {"a": 25.0, "c": 20.0}
    assert elastic.arrival_to_owning(ticks) == 2  # the third worker seen at clock 4's end, owning at clock 6's
    assert elastic.arrival_to_owning(ticks[:4]) is None


_STARTS_SCRIPT = """
import json, os, sys, time
import dask
from distributed import Client, LocalCluster
from bench.elastic import start_method_config

def how():
    return {"parent": os.getppid(), "models": "bench.worker_models" in sys.modules,
            "plugin": "dscar.worker.plugin" in sys.modules}

if __name__ == "__main__":
    with dask.config.set(start_method_config(sys.argv[1])):
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as lc, \\
                Client(lc) as c:
            lc.scale(2)  # a joiner, started after the cluster as the churn driver's joins are
            c.wait_for_workers(2, timeout=60)
            print(json.dumps({"me": os.getpid(), "workers": list(c.run(how).values())}))
"""


@pytest.mark.processes
@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_the_bench_s_workers_joiners_too_start_by_its_start_method(tmp_path, method):
    """``--start-method forkserver`` (the default): every worker process, a joiner started after the
    cluster too, forks from one forkserver that imported the bench's models and dscar's worker before
    (no worker ran a job here); "spawn": each is a fresh interpreter started by its nanny in the bench's process
(which imports them as it loads the bench's main module again)."""
    import subprocess
    import sys

    script = tmp_path / "starts.py"
    script.write_text(_STARTS_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, timeout=150,
                         cwd=root, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [root, *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    workers = got["workers"]
    assert len(workers) == 2, got
    parents = {w["parent"] for w in workers}
    if method == "forkserver":
        assert len(parents) == 1 and got["me"] not in parents, got  # one forkserver, not the nannies' process
        assert all(w["models"] and w["plugin"] for w in workers), got
    else:
        assert parents == {got["me"]}, got
