"""Monitor statistics, controller policies and fault specs, without Dask."""
import pytest

from dscar import InvalidInputError, faults
from dscar.core.monitor import ThroughputMonitor
from dscar.core.policies import (
    AdaptiveBatchPolicy, Backup, BackupPolicy, ControllerView, Restart, RestartPolicy, Running,
    SetBatchScale, make_policies,
)


def monitor_with(steps, **kw):
    """A monitor past every worker's warm-up (its first attempt, held apart) with these step times."""
    m = ThroughputMonitor(**kw)
    for w, times in steps.items():
        m.record(w, times[0])  # the warm-up
        for t in times:
            m.record(w, t)
    return m


def test_monitor_speeds_median_and_window():
    m = monitor_with({"a": [1.0, 1.0], "b": [1.0], "c": [4.0]}, window=2)
    assert m.speeds() == {"a": 1.0, "b": 1.0, "c": 0.25}
    assert m.median_step() == 1.0
    m.record("c", 1.0)
    m.record("c", 1.0)  # the window forgets the slow steps
    assert m.mean_step("c") == 1.0


@pytest.mark.parametrize("window", [1, 2, 5, 8])
def test_a_worker_s_typical_step_is_the_median_of_its_window_whatever_steps_leave_and_come(window):
    """``record`` sorts the window only when a step may move its middle pair: steps that repeat, tie with the
    middle, land on either side of it or cross it (few values, so many ties) leave the median a sort gives."""
    import random
    import statistics
    rng = random.Random(window)
    m = ThroughputMonitor(window=window)
    m.record("a", 9.0)  # the warm-up
    steps = []
    for i in range(400):
        step = rng.choice([0.5, 1.0, 1.0, 1.5, 2.0, 3.0]) if i % 50 < 40 else 1.0  # (runs of one value too)
        m.record("a", step)
        steps.append(step)
        assert m.mean_step("a") == statistics.median(steps[-window:]), i
    assert m.median_step() == m.mean_step("a")


def test_monitor_classifies_transient_then_persistent_then_recovered():
    m = monitor_with({"a": [1.0], "b": [1.0], "c": [3.0]}, window=1, fraction=0.5, persistent_after=3)
    assert m.end_clock() == {}  # one slow clock is not reported yet
    assert m.end_clock() == {"c": "transient"}
    assert m.end_clock() == {"c": "persistent"}
    assert [s.straggler for s in m.stats()] == [None, None, "persistent"]
    m.record("c", 1.0)
    assert m.end_clock() == {}


def test_a_worker_stuck_in_a_long_attempt_counts_as_slow():
    m = monitor_with({"a": [1.0], "b": [1.0], "c": [1.0]}, fraction=0.5)
    assert not m.is_slow("c", running_s=1.5)
    assert m.is_slow("c", running_s=2.5)


def test_a_slow_first_attempt_is_a_warm_up_not_a_straggler():
    """The first attempt compiles kernels (~0.4 s against 0.1 ms steps): it is not a speed."""
    m = ThroughputMonitor()
    m.record("a", 0.38)  # a compiled on its first step; b had its kernels already
    m.record("a", 0.0001)
    for _ in range(4):
        m.record("b", 0.0001)
    assert m.end_clock() == {} and m.end_clock() == {}
    assert m.mean_step("a") == 0.0001


def test_a_worker_stuck_in_its_warm_up_is_held_against_the_others_warm_ups():
    """A worker slowed 8x is still in its first attempt when the others have done many: it has
    recorded nothing, but its running item is evidence (and backups winning its shards hide no more)."""
    m = ThroughputMonitor()
    for w in ("a", "b"):
        m.record(w, 0.4)
        m.record(w, 0.001)
    assert not m.is_slow("c", running_s=0.5)  # not much longer than the others' warm-ups
    assert m.end_clock({"c": (3.0, 1)}) == {}
    assert m.end_clock({"c": (3.1, 1)}) == {"c": "transient"}
    assert m.end_clock({"c": (3.2, 1)}) == {"c": "persistent"}


def test_a_one_off_pause_is_no_straggler_however_many_short_clocks_it_spans():
    """A kernel loaded on first use stalls a worker ~0.3 s mid-run while the other finishes 30
    clocks of 10 ms: still running, but not for long enough to be stuck."""
    m = monitor_with({"a": [0.0005] * 8, "b": [0.0005] * 8})
    for i in range(30):
        assert m.end_clock({"a": (0.01 * (i + 1), 4)}) == {}
    assert m.end_clock({"a": (1.5, 4)}) == {} and m.end_clock({"a": (1.6, 4)}) == {"a": "transient"}


def test_a_2x_slower_worker_is_a_straggler_among_2_as_among_16():
    for n in (2, 16):
        steps = {f"w{i}": [0.02] * 8 for i in range(n - 1)}
        steps["slow"] = [0.04] * 8
        m = monitor_with(steps)
        assert m.end_clock() == {}, n  # confirmed at the second slow clock
        assert m.end_clock() == {"slow": "transient"}, n


def test_noise_is_no_straggler():
    """Millisecond steps that vary 3x, one pause in a window, and a healthy spread are not stragglers."""
    tiny = monitor_with({"a": [0.0005] * 8, "b": [0.0015] * 8})
    assert tiny.end_clock() == {}  # 3x, but a millisecond apart: below min_gap_s
    pause = monitor_with({"a": [0.02] * 7 + [0.5], "b": [0.02] * 8})
    assert pause.end_clock() == {}  # the median ignores one outlier
    spread = monitor_with({"a": [0.020] * 8, "b": [0.024] * 8, "c": [0.030] * 8})
    assert spread.end_clock() == {}


def test_monitor_rejects_bad_options():
    with pytest.raises(ValueError):
        ThroughputMonitor(fraction=1.5)
    with pytest.raises(ValueError):
        ThroughputMonitor(window=0)
    with pytest.raises(ValueError):
        ThroughputMonitor(confirm_after=4, persistent_after=3)


def view(monitor, todo=0, running=(), idle="d", stragglers=None):
    """A view as a job builds it: the running attempts the longest running first."""
    running = sorted(running, key=lambda r: -r.elapsed_s)
    return ControllerView(5, ["a", "b", "c", "d"], todo, running, monitor, stragglers or {}, idle)


def test_backup_only_when_the_queue_is_empty_and_an_attempt_is_late():
    m = monitor_with({"a": [1.0], "b": [1.0]})
    late = Running(shard=3, worker="c", elapsed_s=2.5, n_attempts=1)
    p = BackupPolicy(k=2.0)
    assert p.decide(view(m, running=[late])) == [Backup(3, "d")]
    assert p.decide(view(m, todo=1, running=[late])) == []  # work left in the queue
    assert p.decide(view(m, running=[Running(3, "c", 1.5, 1)])) == []  # not late yet
    assert p.decide(view(m, running=[Running(3, "c", 9.0, 3)])) == []  # three attempts already this clock
    assert p.decide(view(m, running=[Running(3, "d", 9.0, 1)])) == []  # never on its own worker
    assert p.decide(view(m, running=[Running(3, "c", 9.0, 2, ("c", "d"))])) == []  # nor beside its own attempt
    assert p.decide(view(ThroughputMonitor(), running=[late])) == []  # nothing measured yet


def test_backup_says_when_the_longest_running_attempt_turns_late_so_waiting_polls_need_not_look_on_a_timer():
    """``due_in``: the seconds until ``decide`` may back one up (the coordinator wakes a waiting poll
    then, not every 20 ms); never later than ``decide`` would."""
    m = monitor_with({"a": [1.0], "b": [1.0]})
    p = BackupPolicy(k=2.0)
    assert p.due_in(view(m, running=[Running(3, "c", 1.5, 1), Running(4, "c", 0.5, 1)])) == pytest.approx(0.5)
    assert p.due_in(view(m, running=[Running(3, "c", 2.5, 1)])) == 0.0  # late now
    assert p.decide(view(m, running=[Running(3, "c", 1.5 + 0.5 + 1e-9, 1)])) == [Backup(3, "d")]
    assert p.due_in(view(m, running=[Running(3, "c", 9.0, 3), Running(5, "c", 0.5, 1)])) == pytest.approx(1.5)
    assert p.due_in(view(m, todo=1, running=[Running(3, "c", 1.5, 1)])) is None  # work left in the queue
    assert p.due_in(view(m, running=[])) is None  # nothing running: no backup turns due by time
    assert p.due_in(view(ThroughputMonitor(), running=[Running(3, "c", 1.5, 1)])) is None  # nothing measured


def test_backup_picks_the_latest_attempt():
    m = monitor_with({"a": [1.0]})
    runs = [Running(1, "a", 3.0, 1), Running(2, "b", 5.0, 1)]
    assert BackupPolicy().decide(view(m, running=runs)) == [Backup(2, "d")]
    runs.append(Running(4, "c", 7.0, 3))  # the latest, but three attempts already: the next one
    assert BackupPolicy().decide(view(m, running=runs)) == [Backup(2, "d")]


def test_a_job_s_view_lists_the_running_shards_longest_running_first_and_builds_only_those_read():
    """The view a job gives the policies (``Dispatch.view``): each running shard's longest-running
    attempt, in the order they started, with its shard's attempt count and workers; the backup policy
    reads up to the first one it backs up, and never the shards that have all their attempts (an idle
    poll at a pass's tail is not O(W), however many stragglers' shards are backed up already)."""
    from dscar.core.dispatch import RunningAttempts
    from dscar.core.shards import ShardQueue

    q = ShardQueue(40, reloadable=True)
    for s in range(40):
        q.set_holder(s, f"w{s % 8}")
    q.begin_clock(1)
    for t in range(40):
        q.next_shard(f"w{t % 8}", float(t))
    q.start_backup(5, "w7", 50.0)
    q.start_backup(2, "w3", 51.0)
    q.start_backup(2, "w4", 52.0)
    q.commit(0, 0, "w0")
    q.check()
    running = RunningAttempts(q, now=60.0)
    assert len(running) == 39
    listed = list(running)
    assert [r.shard for r in listed] == list(range(1, 40))
    assert [r.elapsed_s for r in listed] == sorted((r.elapsed_s for r in listed), reverse=True)
    assert listed[0] == Running(1, "w1", 59.0, 1, ("w1",))
    assert listed[4] == Running(5, "w5", 55.0, 2, ("w5", "w7"))
    assert [r.shard for r in running.longest_running(3)][:3] == [1, 3, 4]  # shard 2 has 3 attempts
    m = monitor_with({"a": [1.0]})
    read = []

    class Counting(RunningAttempts):
        def longest_running(self, fewer_attempts_than=None):
            for r in super().longest_running(fewer_attempts_than):
                read.append(r.shard)
                yield r

    v = ControllerView(1, [], 0, Counting(q, 60.0), m, {}, "w1")
    assert BackupPolicy().decide(v) == [Backup(3, "w1")]  # shard 1 is its own, shard 2 has its 3 attempts
    assert read == [1, 1, 3]  # (the first twice: once to see whether any is late, ``oldest_elapsed``)


def test_adaptive_batch_is_proportional_to_speed_with_mean_one():
    m = monitor_with({"a": [1.0], "b": [1.0], "c": [1.0], "d": [4.0]})
    (action,) = AdaptiveBatchPolicy().decide(view(m))
    assert isinstance(action, SetBatchScale)
    s = action.scales
    assert sum(s.values()) / 4 == pytest.approx(1.0)
    assert s["a"] == pytest.approx(4 * s["d"])


def test_restart_only_persistent_stragglers_and_at_most_max_restarts():
    p = RestartPolicy(max_restarts=1)
    m = ThroughputMonitor()
    assert p.decide(view(m, stragglers={"c": "transient"})) == []
    assert p.decide(view(m, stragglers={"c": "persistent"})) == [Restart("c", "persistent straggler")]
    assert p.decide(view(m, stragglers={"b": "persistent"})) == []


def test_policies_by_name_instance_default_and_unknown():
    assert [p.name for p in make_policies(None)] == ["backup"]
    assert make_policies([]) == []
    b = BackupPolicy(k=3)
    assert make_policies(["adaptive", b])[1] is b
    with pytest.raises(InvalidInputError, match="unknown policy 'fastest'"):
        make_policies(["fastest"])
    with pytest.raises(InvalidInputError):
        BackupPolicy(k=0)


def test_fault_specs_resolve_and_validate():
    ws = ["tcp://a", "tcp://b"]
    got = faults.resolve([faults.slow(1, 4.0, clock=2, until=3), faults.kill("tcp://a", 5)], ws)
    assert got[0].worker == "tcp://b" and got[0].active(2) and got[0].active(3) and not got[0].active(4)
    with pytest.raises(InvalidInputError, match="factor must be >= 1"):
        faults.resolve([faults.slow(0, 0.5)], ws)
    with pytest.raises(InvalidInputError, match="aimed at worker 2, but the cluster has 2"):
        faults.resolve([faults.kill(2, 1)], ws)
    with pytest.raises(InvalidInputError, match="not a worker"):
        faults.resolve([faults.hang("tcp://zzz", 1)], ws)
    with pytest.raises(InvalidInputError, match="clock must be >= 1"):
        faults.resolve([faults.kill(0, 0)], ws)
    with pytest.raises(InvalidInputError, match="only .* belong to a data phase"):  # it could never fire
        faults.resolve([faults.kill(0, 1, point="checkpoint", phase="item")], ws)
    assert faults.resolve([faults.kill(0, 1, point="apply", phase="item")], ws)[0].phase == "item"


def test_unfired_faults_are_those_without_an_event_of_their_worker_kind_and_point():
    a, b = "tcp://a", "tcp://b"
    plan = [faults.kill(a, 3), faults.slow(b, 4.0, clock=2), faults.lose(b, 5), faults.lose(b, 9), faults.hang(a, 7),
            faults.kill(b, 2, point="checkpoint"), faults.kill(b, 3)]
    events = [{"kind": "fault-slow", "worker": b, "clock": 2}, {"kind": "fault-lose", "worker": b, "clock": 6, "point": "start"},
              {"kind": "fault-kill", "worker": b, "clock": 3, "point": "start"},  # b's kill at start, not a's
              {"kind": "unfired-fault", "worker": a, "clock": 9}, {"kind": "worker-lost", "worker": a}]
    # b's first loss fired (at a later clock: it is due from clock 5), its second did not; b's start kill fired,
    # its checkpoint kill (due earlier) did not
    assert faults.unfired(plan, events) == [faults.kill(b, 2, point="checkpoint"), faults.kill(a, 3),
                                            faults.hang(a, 7), faults.lose(b, 9)]
    more = [{"kind": "fault-kill", "worker": a, "point": "start"}, {"kind": "fault-hang", "worker": a, "point": "start"},
            {"kind": "fault-lose", "worker": b, "point": "start"}, {"kind": "fault-kill", "worker": b, "point": "checkpoint"}]
    assert faults.unfired(plan, events + more) == []
    assert faults.unfired([], events) == []


def test_why_a_fault_did_not_fire():
    w = "tcp://w"
    lost_at_4 = [{"kind": "worker-lost", "worker": w, "clock": 4}, {"kind": "worker-lost", "worker": "tcp://x", "clock": 1}]
    assert faults.why_unfired(faults.kill(w, 6), lost_at_4, 9) == "its worker was lost at clock 4, before it was due"
    assert faults.why_unfired(faults.kill(w, 6), [], 3) == "the fit stopped at clock 3"
    assert faults.why_unfired(faults.kill(w, 2, point="checkpoint"), [], 8) == \
        "no 'checkpoint' point of tcp://w was reached in clocks 2..8"
    assert faults.why_unfired(faults.kill(w, 2, point="recovery"), lost_at_4, 8) == \
        "no 'recovery' point of tcp://w was reached in clocks 2..4 (it was lost at clock 4)"
    assert faults.why_unfired(faults.slow(w, 4.0, clock=2, until=3), [], 8) == "no shard step of tcp://w ran in clocks 2..3"
    assert faults.fire_point(faults.slow(w, 2.0)) is None and faults.fire_point(faults.hang(w, 1)) == "start"


def test_fault_cli_forms():
    assert faults.parse("slow", "1:4") == faults.slow(1, 4.0)
    assert faults.parse("slow", "0:8:2:4") == faults.slow(0, 8.0, 2, 4)
    assert faults.parse("kill", "2:3") == faults.kill(2, 3)
    assert faults.parse("hang", "0:1") == faults.hang(0, 1)
    assert faults.parse("kill", "1:3:checkpoint") == faults.kill(1, 3, point="checkpoint")
    assert faults.parse("hang", "0:2:mid-push") == faults.hang(0, 2, point="mid-push")
    with pytest.raises(InvalidInputError, match="POINT one of start"):
        faults.parse("kill", "1:3:later")
    with pytest.raises(InvalidInputError, match="W:CLOCK"):
        faults.parse("kill", "x")
    with pytest.raises(InvalidInputError, match="W:FACTOR"):
        faults.parse("slow", "1")
