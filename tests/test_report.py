"""dscar.api.report: event lines in order with relative times, repeats grouped, the workers' fate (pure)."""
import pytest

from dscar.api import report

A, B, C, D = (f"tcp://127.0.0.1:{p}" for p in (1001, 1002, 1003, 1004))
T = 1_700_000_000.0


def ev(dt, kind, clock=None, **info):
    e = {"time": T + dt, "kind": kind, **info}
    if clock is not None:
        e["clock"] = clock
    return e


EVENTS = [  # deliberately not in time order: the driver appends its own events late
    ev(0.0, "job-started", 0, workers=(A, B, C), n_shards=12),
    ev(0.30, "fault-kill", 5, worker=B, point="start"),
    ev(0.29, "checkpoint-published", 4, version=4, bytes=4998),  # appended after the kill, published before it
    ev(0.05, "shard-moved", 1, shard=3, source=A, target=C),
    ev(0.10, "shard-moved", 2, shard=2, source=A, target=C),
    ev(0.11, "shard-moved", 2, shard=1, source=A, target=B),
    ev(0.12, "shard-moved", 2, shard=0, source=A, target=C),
    ev(0.20, "straggler", 4, worker=A, straggler="transient"),
    ev(0.31, "worker-lost", 5, worker=B, requeued=(1,)),
    ev(0.33, "recovery-done", 5, worker=B, seconds=0.0221),
    ev(0.35, "shards-replaced", shards=[1, 4]),
    ev(0.40, "worker-joined", 6, worker=D),
]


def test_lines_are_in_time_order_with_times_relative_to_the_start():
    lines = report.event_lines(EVENTS)
    kinds = [line.split()[4] for line in lines]
    assert kinds == ["job-started", "shard-moved", "shard-moved", "straggler", "checkpoint-published",
                     "fault-kill", "worker-lost", "recovery-done", "shards-replaced", "worker-joined"]
    assert lines[0].startswith("+   0.000s  clock   0  job-started")
    assert lines[5].startswith("+   0.300s  clock   5  fault-kill  worker=w1 point=start")
    assert "clock   -  shards-replaced  shards=[1,4]" in lines[8]


def test_repeats_in_one_clock_are_grouped_and_their_differences_listed():
    lines = report.event_lines(EVENTS)
    assert lines[1].endswith("clock   1  shard-moved  shard=3 source=w0 target=w2")
    assert lines[2].endswith("shard-moved x 3  shard=[2,1,0] source=w0 target=[w2,w1,w2]")
    groups = report.group(EVENTS)
    assert [g.count for g in groups if g.kind == "shard-moved"] == [1, 3]
    assert report.counts(EVENTS)["shard-moved"] == 4
    assert report.counts_line(EVENTS).startswith("events: shard-moved x 4, ")


def test_hidden_kinds_and_width():
    lines = report.event_lines(EVENTS, hide=report.ROUTINE_KINDS, width=40)
    assert not any("shard-moved" in line or "checkpoint-published" in line for line in lines)
    assert all(len(line) <= 40 for line in lines) and any(line.endswith("...") for line in lines)


def test_worker_names_follow_the_job_start_then_joiners():
    assert report.worker_names(EVENTS) == {A: "w0", B: "w1", C: "w2", D: "w3"}
    assert report.legend(EVENTS) == f"workers: w0={A} w1={B} w2={C} w3={D}"


def test_fate_counts_the_live_workers_at_the_end_and_the_losses_on_the_way():
    f = report.fate(EVENTS)
    assert f.started == [A, B, C] and f.lost == [(B, 5)] and f.joined == [D]
    assert f.live == [A, C, D] and f.recoveries == 1
    assert report.workers_phrase(EVENTS) == "3 of 4 worker(s) live (lost w1 at clock 5; joined w3; 1 recovery)"
    quiet = [e for e in EVENTS if e["kind"] not in ("worker-lost", "worker-joined", "recovery-done")]
    assert report.workers_phrase(quiet) == "3 worker(s)"
    # without a job-started event, the caller's starting workers count
    no_start = [e for e in EVENTS if e["kind"] != "job-started"]
    assert report.fate(no_start, [A, B, C]).live == [A, C, D]


def test_origin_falls_back_to_the_first_event():
    evs = [ev(2.0, "a", 1), ev(1.0, "b", 1)]
    assert report.origin(evs) == T + 1.0
    assert [round(e["t"], 6) for e in report.ordered(evs)] == [0.0, 1.0]
    assert report.origin([]) == 0.0 and report.event_lines([]) == []


def test_events_frame():
    pd = pytest.importorskip("pandas")
    df = report.events_frame(EVENTS)
    assert list(df.columns[:4]) == ["t", "clock", "kind", "worker"]
    assert len(df) == len(EVENTS) and df["t"].is_monotonic_increasing and df["t"].iloc[0] == 0.0
    lost = df[df["kind"] == "worker-lost"].iloc[0]
    assert lost["worker"] == "w1" and lost["worker_address"] == B and lost["clock"] == 5
    assert pd.isna(df[df["kind"] == "shards-replaced"]["clock"].iloc[0])
