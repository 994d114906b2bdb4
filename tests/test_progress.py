"""dscar.api.progress: the progress line from each clock's record and the new events (pure)."""
from dscar.api.driver import ClockRecord
from dscar.api.progress import ProgressLine

A, B, C = "tcp://a:1", "tcp://b:1", "tcp://c:1"


def rec(clock, seconds, objective, workers):
    return ClockRecord(clock, seconds, {"objective": objective}, {}, {}, {}, workers)


def test_the_line_follows_clocks_losses_checkpoints_and_stragglers():
    events = [{"time": 0.0, "clock": 0, "kind": "job-started", "workers": (A, B, C)}]
    line = ProgressLine()
    w3 = {A: {"straggler": None}, B: {"straggler": None}, C: {"straggler": None}}
    assert line.update(rec(1, 0.25, 12.5, w3), events) == \
        "obj=12.5 s/clock=0.25 workers=3/3 stragglers=0 ckpt=none recoveries=0"
    events.append({"time": 1.0, "clock": 1, "kind": "checkpoint-published", "version": 1, "bytes": 8})
    events.append({"time": 1.1, "clock": 2, "kind": "straggler", "worker": A, "straggler": "transient"})
    w3[A] = {"straggler": "transient"}
    assert line.update(rec(2, 0.5, 10.0, w3), events) == \
        "obj=10 s/clock=0.5 workers=3/3 stragglers=1 ckpt=v1 1 clock ago recoveries=0"
    events += [{"time": 2.0, "clock": 3, "kind": "worker-lost", "worker": B},
               {"time": 2.1, "clock": 3, "kind": "recovery-done", "worker": B}]
    w2 = {A: {"straggler": "persistent"}, C: {"straggler": None}}
    assert line.update(rec(3, 1.5, 9.0, w2), events) == \
        "obj=9 s/clock=1.5 workers=2/3 stragglers=1 ckpt=v1 2 clocks ago lost=1 recoveries=1"
    # events already read are not counted twice; a late, older checkpoint does not replace a newer one
    events += [{"time": 3.0, "clock": 4, "kind": "checkpoint-published", "version": 3, "bytes": 8},
               {"time": 3.1, "clock": 3, "kind": "checkpoint-published", "version": 2, "bytes": 8},
               {"time": 3.2, "clock": 4, "kind": "worker-joined", "worker": "tcp://d:1"}]
    assert line.update(rec(4, 0.3, 8.0, w2), events) == \
        "obj=8 s/clock=0.3 workers=3/4 stragglers=1 ckpt=v3 0 clocks ago lost=1 recoveries=1"
    assert line.seen == len(events) and line.lost == 1


def test_without_a_job_started_event_the_monitor_counts_the_workers():
    line = ProgressLine()
    assert line.update(rec(1, 0.1, 1.0, {A: {}, B: {}}), []).startswith("obj=1 s/clock=0.1 workers=2 stragglers=0")
