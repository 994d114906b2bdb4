"""The parts a job's control state is composed of, each alone (pure: no Dask).

``dscar.core.events`` (the log), ``dscar.core.tally`` (what each clock did), ``dscar.core.losses`` (lost
workers and their recovery) and ``dscar.core.checkpoint_plan`` (checkpoints and memory copies):
their invariants, checked without a ``JobState`` around them.
"""
from __future__ import annotations

import math

import pytest

from hypothesis import example, given, settings
from hypothesis import strategies as st

from dscar.checkpoint import CheckpointConfig
from dscar.core.checkpoint_plan import Checkpoint, CheckpointPlanner, DropCopies, Mirror
from dscar.core.events import EventLog
from dscar.core.job import JobConfig, JobState
from dscar.core.ledger import INITIAL_STATE, RecoveryPlan
from dscar.core.losses import Losses, unreached_after_apply
from dscar.core.partitions import PartitionMap, TableLayout
from dscar.core.shards import ShardQueue
from dscar.core.tally import ClockTally


# ------------------------------------------------------------------- events
def test_the_first_failure_is_kept_and_logged_once():
    log = EventLog(lambda: 7)
    log.add(1.0, "started", workers=2)
    log.fail(2.0, "first")
    log.fail(3.0, "second")
    assert log.failed and log.error == "first"
    assert [e["kind"] for e in log.events] == ["started", "job-failed"]
    assert log.events[1] == {"time": 2.0, "clock": 7, "kind": "job-failed", "error": "first"}


def test_an_event_may_name_its_own_clock():
    log = EventLog(lambda: 7)
    log.add(1.0, "clock-end-skipped", clock=3, reason="loss")
    assert log.events == [{"time": 1.0, "clock": 3, "kind": "clock-end-skipped", "reason": "loss"}]


# -------------------------------------------------------------------- tally
def test_a_clock_counts_stages_commits_and_only_finite_objectives():
    tally = ClockTally()
    tally.begin(10.0)
    tally.book_stage(["shards", "shards:a"], 12.0)
    tally.book_stage([], 13.0)  # an untimed stage moves the stage start on
    tally.book_stage(["apply"], 13.5)
    assert tally.stage_s == {"shards": 2.0, "shards:a": 2.0, "apply": 0.5}
    tally.committed("w0", {"step_s": 0.25})
    tally.committed("w0", {"step_s": 0.5})
    tally.pass_counted({"w0": 2, "w1": 1})
    assert tally.timings == {"w0": {"step_s": 0.75}} and tally.shards_done == {"w0": 2, "w1": 1}
    tally.finished(1, {"objective": 3.0}, 14.0)
    tally.finished(2, {"objective": math.nan, "skipped": 1.0}, 15.0)
    assert tally.objectives == [(1, 3.0)] and tally.metrics["skipped"] == 1.0
    assert tally.finished_at == {1: 14.0, 2: 15.0}
    tally.begin(20.0)
    assert tally.shards_done == {} and tally.stage_s == {} and tally.clock_t0 == 20.0


def test_reports_read_ahead_of_the_driver_s_ask_stay_until_it_asks_for_a_newer_clock():
    tally = ClockTally()
    tally.reports.update({c: {"clock": c} for c in (1, 2, 3)})
    assert tally.report_for(3, drop_older=False) == {"clock": 3} and sorted(tally.reports) == [1, 2, 3]
    assert tally.report_for(2) == {"clock": 2} and sorted(tally.reports) == [2, 3]  # the ask for 2: 1 is held
    assert tally.report_for(4) is None and sorted(tally.reports) == [2, 3]


def test_finish_times_are_kept_for_the_newest_clocks_only():
    """A driver reading reports a few at a time times each clock by its finish time; the oldest are dropped."""
    from dscar.core.tally import FINISHED_KEPT
    tally = ClockTally()
    n = 3 * FINISHED_KEPT
    for c in range(1, n + 1):
        tally.finished(c, {"objective": 1.0}, float(c))
        assert len(tally.finished_at) <= 2 * FINISHED_KEPT
    assert all(tally.finished_at[c] == float(c) for c in range(n - FINISHED_KEPT + 1, n + 1))


def test_a_clock_s_timings_held_before_its_last_commits_hold_them_once_the_next_clock_begins():
    """BSP commits note their timings and a read sums them (``ClockTally.timings``): the dict a clock end ahead
    took (``EndingClock``) still gets the commits noted after it was read, as when each commit summed its own."""
    tally = ClockTally()
    tally.begin(0.0)
    tally.committed("w0", {"compute_s": 1.0})
    held = tally.timings
    tally.committed("w0", {"compute_s": 2.0})
    tally.committed("w1", None)
    tally.begin(1.0)
    tally.committed("w1", {"compute_s": 4.0})
    assert held == {"w0": {"compute_s": 3.0}, "w1": {}} and tally.timings == {"w1": {"compute_s": 4.0}}


def test_ssp_clocks_count_apart_and_older_reports_go_once_a_newer_one_is_read():
    tally = ClockTally()
    tally.open(1, 5.0)
    tally.open(2, 6.0)
    tally.open(1, 9.0)  # (a later hand-out does not move the clock's start)
    tally.committed_in(1, "w0", {"step_s": 1.0})
    tally.committed_in(2, "w1", None)
    tally.committed_in(3, "w1", None)  # a clock never handed out counts nothing
    assert tally.started(1, 0.0) == 5.0 and tally.started(3, 8.0) == 8.0
    assert tally.close(1) == ({"w0": 1}, {"w0": {"step_s": 1.0}})
    assert tally.close(1) == ({}, {})
    tally.reports.update({1: {"c": 1}, 2: {"c": 2}})
    assert tally.report_for(3) is None and tally.report_for(2) == {"c": 2}
    assert set(tally.reports) == {2}


# ------------------------------------------------------------------- losses
def _losses(rebuild: bool) -> Losses:
    pmap = PartitionMap([TableLayout("x", 8, 2)])
    pmap.assign(["a", "b"])
    return Losses(pmap, EventLog(lambda: 1), rebuild)


def test_a_lost_holder_s_shard_states_need_restoring_only_with_a_rebuild_pass():
    plain = _losses(rebuild=False)
    assert not plain.needs_restore("a", owned=False, held=[0, 1]) and not plain.unrecovered
    assert plain.needs_restore("b", owned=True, held=[]) and plain.unrecovered == {"b"}
    rebuilt = _losses(rebuild=True)
    assert rebuilt.needs_restore("a", owned=False, held=[0, 1])
    assert rebuilt.unrecovered == {"a"} and rebuilt.lost_shards == {0, 1}


def test_a_lost_buddy_s_planned_copy_falls_back_to_the_file_or_the_initial_state():
    losses = _losses(rebuild=True)
    losses.restore_state = {0: {"memory": "b", "file": {"path": "s0"}}, 1: {"memory": "b"}, 2: {"memory": "c"}}
    losses.forget_memory("b")
    assert losses.restore_state == {0: {"path": "s0"}, 1: INITIAL_STATE, 2: {"memory": "c"}}


def test_a_kept_pass_s_states_recorded_older_come_from_the_buddy_that_keeps_them_as_of_its_base():
    """A sender lost after its buddy kept its copy, before it reported it: the record is a clock old, and
    the buddies asked say which clocks they keep (``states_kept``); a copy as of the base replaces the
    plan's, an older, equal or newer one changes nothing, nor does a lost buddy's, and the pass is kept
    only once every state is as of the base."""
    losses = _losses(rebuild=True)
    assert losses.states_behind() == [] and losses.states_kept("d", {0: 5}) == []  # (no pass kept)
    losses.keep(5)
    losses.restore_state = {0: {"memory": "b", "clock": 4, "file": {"path": "s0"}}, 1: {"memory": "c", "clock": 5},
                            2: {"memory": "b", "clock": 4}}
    assert losses.states_behind() == [0, 2]
    assert losses.states_kept("b", {0: 4, 2: 3}) == []  # what the records said already: nothing changes
    assert losses.states_kept("e", {0: 6}) == []  # newer than the pass's start: not what it read
    losses.lost.add("f")
    assert losses.states_kept("f", {0: 5}) == []  # a lost buddy's memory is gone
    assert losses.states_kept("d", {0: 5}) == [0]
    assert losses.restore_state[0] == {"memory": "d", "clock": 5, "file": {"path": "s0"}}
    assert losses.states_behind() == [2]
    assert losses.states_kept("c", {2: 5}) == [2]
    assert losses.states_behind() == [] and losses.exact()


@pytest.mark.parametrize("why", ["a partition came back inexact", "a state comes from a file", "one from none"])
def test_no_buddy_is_asked_when_the_pass_cannot_be_kept_whatever_it_answers(why):
    losses = _losses(rebuild=True)
    losses.keep(5)
    losses.restore_state = {0: {"memory": "b", "clock": 4}, 1: {"memory": "c", "clock": 5}}
    assert losses.states_behind() == [0]
    if why == "a partition came back inexact":
        losses.restored(("x", 0), "a", 3, 1.0)  # from checkpoint version 3
    else:
        losses.restore_state[1] = {"path": "s1"} if why == "a state comes from a file" else INITIAL_STATE
    assert losses.states_behind() == []


def test_the_states_to_confirm_are_asked_of_the_recorded_buddies_and_where_a_lost_sender_s_copy_went():
    job = _job_with_store()
    job.checkpoints.sent_to.update({"a": "b", "b": "c", "c": "a"})
    job.losses.keep(2)
    job.restore_state.update({0: {"memory": "a", "clock": 1}, 1: {"memory": "c", "clock": 2}})
    job.state_mirrors.update({0: ("a", 1), 1: ("c", 2)})
    job.lost.add("b")
    job.unrecovered.add("b")
    assert job.states_to_confirm() == {"a": [0], "c": [0]}  # (b's copy went to c; b itself is lost)
    assert job.states_kept("a", {0: 1}, 1.0) == []
    # the copy found is recorded as a report would be: the copy the record named before is dropped
    assert job.states_kept("c", {0: 2}, 1.0) == [DropCopies("a", shards=((0, 1),))]
    assert job.state_mirrors[0] == ("c", 2)
    assert job.states_to_confirm() == {} and job.losses.exact()
    assert [(e["kind"], e["buddy"], e["shards"], e["clock"]) for e in job.events] == [("state-copies-found", "c", [0], 2)]


def test_a_memory_copy_s_buddy_is_remembered_per_sender_until_the_next_copy():
    planner = _planner()
    planner.clock_finished(1, 0.1, ["a", "b", "c"], set(), 1.0)
    assert planner.sent_to == {"a": "b", "b": "c", "c": "a"}
    planner.worker_lost("b", planned=False, now=2.0)
    planner.clock_finished(2, 0.1, ["a", "b", "c"], {"b"}, 2.0)
    assert planner.sent_to == {"a": "c", "b": "c", "c": "a"}  # (b's stays: what its recovery asks about)


def test_a_recovery_is_needed_until_no_partition_is_owned_by_a_lost_worker():
    losses = _losses(rebuild=True)
    owner = losses.pmap.owners[("x", 0)]
    losses.lost.add(owner)
    losses.needs_restore(owner, owned=True, held=[3])
    plan = RecoveryPlan(restores={("x", 0): "spare"}, states={3: INITIAL_STATE}, manifests=[], full=False)
    assert losses.planned(plan) == {owner} and losses.restore_state == {3: INITIAL_STATE} and not losses.lost_shards
    losses.unrecovered.clear()
    assert losses.needs_recovery  # the partition is still the lost worker's
    losses.restored(("x", 0), "spare", 0, 5.0)
    assert not losses.needs_recovery and losses.pmap.owners[("x", 0)] == "spare"
    assert losses.restored_rows == {"x": [(0, 4)]}
    assert losses.log.events[-1]["kind"] == "partition-restored"


# -------------------------------------------------------------- checkpoints
def _planner(memory: bool = True) -> CheckpointPlanner:
    pmap = PartitionMap([TableLayout("x", 8, 2), TableLayout("r", 2, 1)])
    pmap.assign(["a", "b"])
    queue = ShardQueue(2, reloadable=True)
    queue.set_holder(0, "a")
    queue.set_holder(1, "c")
    ckpt = CheckpointConfig("memory://m", policy="full", every=2, memory=memory)
    cfg = JobConfig("j", 2, {"x": "param", "r": "reduction"}, [], [""], ckpt)
    return CheckpointPlanner(cfg, pmap, queue, EventLog(lambda: 1))


def test_a_checkpoint_is_due_every_period_and_a_lost_owner_writes_nothing():
    planner = _planner(memory=False)
    assert planner.clock_finished(1, 0.1, ["a", "b", "c"], set(), 1.0) == []
    [ck] = planner.clock_finished(2, 0.1, ["a", "b", "c"], {"b"}, 2.0)
    assert isinstance(ck, Checkpoint) and "b" not in ck.writers and "a" in ck.writers
    assert planner.snapshotting == {"checkpoint"} and planner.ledger.pending
    assert planner.log.events[-1]["kind"] == "checkpoint-started"


def test_a_memory_copy_goes_round_the_live_workers_and_the_newest_report_wins():
    planner = _planner()
    [mirror] = planner.clock_finished(1, 0.1, ["c", "a", "b", "d"], {"d"}, 1.0)
    assert mirror == Mirror(1, {"a": "b", "b": "c", "c": "a"})  # every owner and holder, to the next live worker
    assert planner.mirrored("b", 3, [("x", 0)], [0]) == []
    # a late, older copy changes nothing, and goes where it is
    assert planner.mirrored("c", 2, [("x", 0)]) == [DropCopies("c", parts=(("x", 0, 2),))]
    assert planner.mirrors == {("x", 0): ("b", 3)} and planner.state_mirrors == {0: ("b", 3)}
    planner.worker_lost("b", planned=False, now=2.0)
    assert planner.mirrors == {} and planner.state_mirrors == {}


def test_a_memory_copy_recorded_elsewhere_leaves_the_old_holder_to_drop_its_own():
    """The ring changed (or a switch's old owner kept the partition): the holder the record named drops its
    copy, bounded by the clock it held (a newer one may have reached it since); the same holder's newer
    copy drops nothing."""
    planner = _planner()
    planner.mirrored("b", 3, [("x", 0), ("x", 1)], [0])
    assert planner.mirrored("b", 4, [("x", 0)], [0]) == []  # (the same holder: its store keeps the newest)
    assert planner.mirrored("c", 4, [("x", 0), ("x", 1)], [0]) == [
        DropCopies("b", parts=(("x", 0, 4), ("x", 1, 3)), shards=((0, 4),))]
    assert planner.mirrors == {("x", 0): ("c", 4), ("x", 1): ("c", 4)} and planner.state_mirrors == {0: ("c", 4)}


def test_a_hand_off_passes_a_leaver_s_copies_and_its_takers_own_ones_to_the_owners_buddies_among_the_stayers():
    """Owners after the hand-off: a owns x0 and x2, c owns x1 and x3; shard 0 held by a, 1 by c. b leaves. Its
    copies of x0 and shard 0 (a's: b was a's buddy) go to a's buddy among the stayers a, c, d: c; the copy of
    x1 that c keeps (c took x1 from b, whose buddy it was) goes to c's buddy, d; those on d and the copy of
    x2 on c stay (d is x3's owner's buddy: nothing to do; c is not x2's owner)."""
    pmap = PartitionMap([TableLayout("x", 8, 4)])
    pmap.assign(["a", "b", "c", "d"])
    pmap.owners.update({("x", 0): "a", ("x", 1): "c", ("x", 2): "a", ("x", 3): "c"})
    queue = ShardQueue(2, reloadable=True)
    queue.set_holder(0, "a")
    queue.set_holder(1, "c")
    ckpt = CheckpointConfig("memory://m", policy="full", every=2, memory=True)
    planner = CheckpointPlanner(JobConfig("j", 2, {"x": "param"}, [], [""], ckpt), pmap, queue, EventLog(lambda: 1))
    planner.mirrored("b", 3, [("x", 0)], [0])
    planner.mirrored("c", 3, [("x", 1), ("x", 2)], [1])  # (c now holds shard 1 and owns x1: those two move)
    planner.mirrored("d", 3, [("x", 3)])
    assert planner.handed_copies({"b"}, ["a", "c", "d"]) == {
        "b": {"c": ([("x", 0)], [0])},
        "c": {"d": ([("x", 1)], [1])},
    }
    assert planner.handed_copies({"b"}, ["c"]) == {}  # one worker stays: it has no buddy
    pmap.owners[("x", 0)] = "b"  # (x0's hand-off failed: it goes the loss's way, its copy stays; shard 0's moves)
    assert planner.handed_copies({"b"}, ["a", "c", "d"]) == {"b": {"c": ([], [0])}, "c": {"d": ([("x", 1)], [1])}}


def test_of_two_copies_as_new_the_one_away_from_its_owner_stays_recorded():
    """A leaver's copy of its partition, late to the buddy that took the partition at the hand-off, reports
    after the copy that taker passed on: the record stays with the passed copy, and the late one goes."""
    planner = _planner()
    owner = planner.pmap.owners[("x", 0)]
    planner.mirrored("d", 3, [("x", 0)])  # (the passed copy)
    assert planner.mirrored(owner, 3, [("x", 0)]) == [DropCopies(owner, parts=(("x", 0, 3),))]
    assert planner.mirrors[("x", 0)] == ("d", 3)
    holder = planner.queue.holder(0)
    planner.mirrored("d", 3, [], [0])
    assert planner.mirrored(holder, 3, [], [0]) == [DropCopies(holder, shards=((0, 3),))]
    assert planner.mirrored(owner, 4, [("x", 0)]) == [DropCopies("d", parts=(("x", 0, 3),))]  # (a newer one wins)
    assert planner.mirrors[("x", 0)] == (owner, 4)


#: what reaches a holder: (holder, key, clock); keys are ("x", part) partitions or shard numbers. Each
#: holder gets a key's copy of a clock once (one owner sends it at that clock's end, or keeps it at a switch)
_COPIES = st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from([("x", 0), ("x", 1), 0, 1]),
                             st.integers(0, 4)), min_size=1, max_size=24, unique=True)


@settings(max_examples=300, deadline=None)
@given(copies=_COPIES, data=st.data())
def test_whatever_order_the_reports_and_drops_come_in_each_holder_ends_with_just_the_copies_recorded_for_it(copies, data):
    """Memory copies reach holders in any order (each holder keeps the newest of a key,
    ``MirrorStore.keep``); their reports reach the planner in any order, and each drop it asks for reaches
    its holder at any later point (``MirrorStore.discard``, bounded by clock). Once all have arrived, every
    holder holds exactly the copies the records name for it, of the recorded clock: one copy of each key."""
    from dscar.worker.mirror_store import MirrorStore, part_key, shard_key

    def skey(key):  # (the store's key of a partition or a shard)
        return part_key(*key) if isinstance(key, tuple) else shard_key(key)

    planner = _planner()
    stores = {w: MirrorStore() for w in "abcd"}
    reports = data.draw(st.permutations(range(len(copies))))
    pending: list[tuple] = []  # (holder, store key, clock) of drops sent, not yet arrived
    arrived = 0  # copies reach their holders in order; their reports go in the drawn order, each after its copy
    for i in reports:
        while arrived <= i:
            w, key, clock = copies[arrived]
            stores[w].keep(skey(key), clock, None)
            arrived += 1
        w, key, clock = copies[i]
        drops = planner.mirrored(w, clock, [key] if isinstance(key, tuple) else [], [] if isinstance(key, tuple) else [key])
        pending += [(d.holder, part_key(t, p), c) for d in drops for t, p, c in d.parts]
        pending += [(d.holder, shard_key(s), c) for d in drops for s, c in d.shards]
        while pending and data.draw(st.booleans()):
            w, key, clock = pending.pop(data.draw(st.integers(0, len(pending) - 1)))
            stores[w].discard(key, clock)
    for w, key, clock in pending:
        stores[w].discard(key, clock)
    records = {**planner.mirrors, **planner.state_mirrors}
    for w, store in stores.items():
        assert {k: c for k, (c, _) in store.copies.items()} == {
            skey(k): c for k, (holder, c) in records.items() if holder == w}, w


def test_without_a_store_nothing_is_ever_due_and_reports_change_nothing():
    pmap = PartitionMap([TableLayout("x", 8, 2)])
    pmap.assign(["a"])
    planner = CheckpointPlanner(JobConfig("j", 1, {"x": "param"}, [], [""]), pmap, ShardQueue(1, reloadable=True),
                                EventLog(lambda: 1))
    assert planner.clock_finished(5, 0.1, ["a"], set(), 1.0) == []
    planner.checkpoint_written(1, "a", [], None, 1.0)
    planner.published(1, 1.0)
    planner.worker_lost("a", planned=False, now=1.0)
    planner.writer_lost("a", 1.0)
    assert planner.status(5) is None and planner.log.events == []


# ------------------------------------------- decisions the coordinator used to make itself
def _job_with_store() -> "JobState":
    from dscar.core.job import JobState

    pmap = PartitionMap([TableLayout("x", 8, 2), TableLayout("r", 2, 1)])
    pmap.assign(["a", "b"])
    queue = ShardQueue(2, reloadable=True)
    ckpt = CheckpointConfig("memory://m", policy="full", every=1, recovery="full")
    job = JobState(JobConfig("j", 2, {"x": "param", "r": "reduction"}, [], [""], ckpt), queue, pmap)
    job.workers = ["a", "b", "c"]
    return job


def test_a_restarted_worker_s_partition_goes_to_the_least_loaded_worker_not_lost():
    job = _job_with_store()
    assert job.adopter(["a", "c"]) == "c"  # c owns nothing
    job.lost.add("c")
    assert job.adopter(["a", "c"]) == "a" and job.adopter(["c"]) is None
    job.partition_moved(("x", 0), "b", "a", 1.0)
    job.restart_begun("b", 1.0)
    assert job.pmap.owners[("x", 0)] == "a"
    assert [e["kind"] for e in job.events] == ["partition-moved", "worker-restart"]


def test_a_placement_on_a_worker_gone_or_lost_is_not_recorded():
    job = _job_with_store()
    job.lost.add("b")
    job.placed([[0, "a"], [1, "b"]], {"a", "b"})
    job.placed([[1, "d"]], {"a", "b"})
    assert job.queue.holder(0) == "a" and job.queue.holder(1) is None


def test_a_reduction_partition_is_restored_from_zero_and_a_param_one_from_the_checkpoint():
    job = _job_with_store()
    manifest = {"version": 3, "clock": 2, "chains": {"x/0": [{"path": "p", "offset": 0}],
                                                     "r/0": [{"path": "q", "offset": 0}]}}
    assert [v for v, _, _ in job.restore_sources(("x", 0), [manifest], None, ["a"], set())] == [3, 0]
    assert [v for v, _, _ in job.restore_sources(("r", 0), [manifest], None, ["a"], set())] == [0]


def test_a_full_recovery_round_rolls_back_and_the_last_round_says_it_is_done():
    job = _job_with_store()
    job.begin(1, 0.0)
    job.lose("b", 0.5)
    plan, covered = job.start_recovery_round(["a"], 1.0)
    assert covered == {"b"} and plan.full
    for key, target in plan.restores.items():
        job.restored(key, target, plan.version, 1.5)
    job.end_recovery_round(plan, covered, 2.0, 1.0, 0)
    kinds = [e["kind"] for e in job.events]
    # (the clock restarts as the recovery ends: the machine's actions come before the closing event)
    assert kinds[kinds.index("recovery-started"):] == (
        ["recovery-started"] + ["partition-restored"] * len(plan.restores) + ["rollback", "clock-restarted",
                                                                              "recovery-done"])
    assert not job.recovering


def test_a_worker_s_event_is_logged_in_the_clock_it_names():
    job = _job_with_store()
    job.worker_event(1.0, 4, "fault-injected", "a", {"fault": "kill"})
    assert job.events == [{"time": 1.0, "clock": 4, "kind": "fault-injected", "worker": "a", "fault": "kill"}]


# ----------------------------------------------------------------- dispatch
def test_an_idle_worker_asks_back_the_later_half_of_the_biggest_batch_of_a_live_worker():
    job = _job_with_store()
    d = job.dispatch
    d.set_batched("a", [(0, 1), (1, 1), (2, 1), (3, 1)])
    d.set_batched("b", [(4, 1), (5, 1), (6, 1), (7, 1), (8, 1)])
    d.set_batched("c", [])  # (an empty batch is not kept)
    assert "c" not in d.batched
    job.lost.add("b")
    assert d.ask_back("c") == ("a", [(2, 1), (3, 1)])
    assert d.ask_back("a") is None  # (its own members are not asked back of it)
    d.attempt_started("a", 0, 1)
    assert d.batched["a"] == [(1, 1), (2, 1), (3, 1)]
    d.forget("a")
    assert d.ask_back("c") is None


def test_the_dispatch_and_the_monitor_keep_a_worker_in_one_record_and_the_former_dicts_read_it():
    """A hand-out and a commit read what is a worker's in one record (``dscar.core.workers``), the monitor's
    table and the dispatch's; ``last_seen``, ``running_items``, ``item_of`` and ``batched`` show the workers
    whose field is set, as the dicts they were did."""
    job = _job_with_store()
    d, m = job.dispatch, job.monitor
    assert d.records is m.records
    m.record("a", 1.0)  # (its warm-up)
    m.record("a", 2.0)
    d.set_batched("a", [(1, 1), (2, 1)])
    d.records["a"].running = (0.5, 3)
    record = d.records["a"]
    assert (record.warmup, list(record.steps), record.mean, record.members, record.running) == (
        1.0, [2.0], 2.0, [(1, 1), (2, 1)], (0.5, 3))
    assert dict(d.running_items) == {"a": (0.5, 3)} and dict(d.batched) == {"a": [(1, 1), (2, 1)]}
    assert "a" not in d.last_seen and d.last_seen.get("a", -1.0) == -1.0 and len(d.item_of) == 0
    with pytest.raises(KeyError):
        d.item_of["a"]
    d.attempt_started("a", 1, 1)
    d.attempt_started("a", 2, 1)
    d.item_done("a")
    assert "a" not in d.batched and "a" not in d.running_items and len(d.running_items) == 0
    m.forget("a")
    assert m.mean_step("a") is None and m.n_measured() == 0 and record.steps is None and m.stats() == []
    d._batch_index.check()


def test_members_worth_less_than_a_release_are_not_asked_back():
    """Steps of microseconds (bench.overhead's): the victim runs its later half before a release's round
    trip would move it, so nothing is asked; the same members at a measured step that makes them worth
    ``ASK_BACK_MIN_S`` are asked, and so are they before any measurement, and for an asker never measured
    (a joiner: it runs some, and is measured)."""
    from dscar.core.dispatch import ASK_BACK_MIN_S

    job = _job_with_store()
    d = job.dispatch
    d.set_batched("a", [(0, 1), (1, 1), (2, 1), (3, 1)])
    assert d.ask_back("c") == ("a", [(2, 1), (3, 1)])  # (unmeasured)
    for _ in range(2):  # (the first step is a warm-up)
        job.monitor.record("a", ASK_BACK_MIN_S / 4)  # 2 members: half the least worth asking
    assert d.ask_back("c") == ("a", [(2, 1), (3, 1)])  # (c never ran a step)
    for _ in range(2):
        job.monitor.record("c", 1.0)
    assert d.ask_back("c") is None
    job.monitor.forget("a")
    for _ in range(2):
        job.monitor.record("a", ASK_BACK_MIN_S / 2)
    assert d.ask_back("c") == ("a", [(2, 1), (3, 1)])


def test_a_batch_holds_about_the_target_s_worth_of_steps_and_one_before_a_measurement():
    from dscar.core.dispatch import BATCH_TARGET_S, MAX_BATCH

    job = _job_with_store()
    assert job.dispatch.batch_size("a") == 1
    for _ in range(10):
        job.monitor.record("a", BATCH_TARGET_S / 4)
        job.monitor.record("b", BATCH_TARGET_S / 1e6)
    assert job.monitor.mean_step("a") is not None
    assert job.dispatch.batch_size("a") == 4 and job.dispatch.batch_size("b") == MAX_BATCH


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.floats(1e-12, 50.0)), max_size=40),
       st.integers(1, 6), st.integers(1, 400))
def test_a_batch_s_size_is_the_straightforward_rule_of_the_measured_steps(records, n_workers, n_shards):
    """``Dispatch.batch_size`` writes min / max as comparisons (every hand-out asks): it gives what the
    rule as written in its docstring gives, for any measured steps."""
    from dscar.core.dispatch import BATCH_TARGET_S, MAX_BATCH, SHARE_MAX_S

    job = JobState(JobConfig("j", n_shards, {"x": "param"}, [], [""]), ShardQueue(n_shards, reloadable=True),
                   PartitionMap([TableLayout("x", 4, 1)]))
    job.workers = ["a", "b", "c", "d", "e", "f"][:n_workers]
    for worker, step in records:
        job.monitor.record(worker, step)
    monitor = job.monitor
    for worker in ["a", "b", "c", "d"]:
        step = monitor.mean_step(worker)
        if step is not None:  # its share of the pass: its speed's share, the unmeasured counted as fast as it
            speed = 1.0 / step
            total = monitor.total_speed() + max(0, n_workers - monitor.n_measured()) * speed
            share = round(n_shards * speed / total) if total > 0 else 1
        want = 1 if step is None else max(1, min(MAX_BATCH, max(int(BATCH_TARGET_S / step), min(
            share, int(SHARE_MAX_S / step)))))
        assert job.dispatch.batch_size(worker) == want, (worker, step)


_NAMES = ["a", "ab", "b", "w00010", "w00009", "w0001", "tcp://h:9", "tcp://h:10", "\u00e9"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["set", "start", "forget", "reset", "lose", "ask"]),
                          st.sampled_from(_NAMES), st.integers(0, 6)), max_size=80))
@example([("set", "a", 2), ("set", "ab", 2), ("ask", "b", 0)])  # (a name's prefix sorts before it)
def test_asking_back_from_the_batch_index_picks_what_a_scan_of_every_worker_would(ops):
    """``Dispatch.ask_back`` (a heap with lazy deletion, ``BatchIndex``) against the scan it replaces:
    the worker with the most members (ties: the last name), not the asker, not lost."""
    job = _job_with_store()
    d = job.dispatch
    for op, w, n in ops:
        if op == "set":
            d.set_batched(w, [(s, 1) for s in range(n)])
        elif op == "start" and d.batched.get(w):
            d.attempt_started(w, *d.batched[w][min(n, len(d.batched[w]) - 1)])
        elif op == "forget":
            d.forget(w)
        elif op == "reset":
            job.batched = {}
        elif op == "lose":
            job.lost.add(w)
        live = {v: m for v, m in d.batched.items() if v != w and v not in job.lost and m}
        victim = max(live, key=lambda v: (len(live[v]), v)) if live else None
        assert d.ask_back(w) == (None if victim is None else (victim, live[victim][len(live[victim]) // 2:]))
        d._batch_index.check()


def _former_decide(policy, view) -> list:
    """``BackupPolicy.decide`` as it was before the view kept an index of the started attempts: every
    running shard, the longest running first, until the first one that is not late."""
    from dscar.core.policies import Backup

    med = view.monitor.median_step()
    if view.todo or view.idle_worker is None or med is None:
        return []
    late_after = max(policy.k * med, policy.min_s)
    for r in view.longest_running(policy.max_attempts):
        if r.elapsed_s <= late_after:
            break
        if r.worker != view.idle_worker and view.idle_worker not in r.workers:
            return [Backup(r.shard, view.idle_worker)]
    return []


def _former_due_in(policy, view) -> float | None:
    med = view.monitor.median_step()
    if view.todo or med is None:
        return None
    for r in view.longest_running(policy.max_attempts):
        return max(0.0, max(policy.k * med, policy.min_s) - r.elapsed_s)
    return None


_WORKERS = ["a", "b", "c", "d", "e"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["hand", "start", "commit", "fail", "release", "backup", "lose",
                                           "pass", "reopen", "end", "step", "time"]),
                          st.sampled_from(_WORKERS), st.integers(0, 5)), max_size=120),
       st.sampled_from([0, 2, 64]), st.integers(1, 4))
def test_the_backup_policy_decides_from_the_started_attempts_index_what_it_did_stepping_over_every_member(
        ops, stale_slack, look_every):
    """The view a job gives the backup policy (``Dispatch.view``: the queue's index of the shards with a
    started attempt, ``ShardQueue.set_waiting``; ``oldest_elapsed``) against the one it replaces (every
    running shard, the batch members that have not started stepped over one by one) on random hand-outs,
    starts, commits, failures, releases, backups, losses, passes and times (ties included): the same
    shards in the same order, the same backups for every idle worker, the same ``due_in``. The index
    follows its shards when read, every ``look_every`` operations here, and keeps removed entries
    stale until ``stale_slack`` allows (0: a list is rebuilt once a quarter of it is stale)."""
    from dscar.core.dispatch import RunningAttempts
    from dscar.core.job import JobState
    from dscar.core.policies import BackupPolicy, ControllerView

    pmap = PartitionMap([TableLayout("x", 8, 2)])
    pmap.assign(["a", "b"])
    queue = ShardQueue(12, reloadable=True)
    queue.stale_slack = stale_slack
    for s in range(12):
        queue.set_holder(s, _WORKERS[s % 4])
    policy = BackupPolicy(k=2.0, min_s=0.0)
    job = JobState(JobConfig("j", 12, {"x": "param"}, [], [""]), queue, pmap, policies=[policy])
    job.workers = list(_WORKERS)
    d, now = job.dispatch, 0.0
    queue.begin_clock(1)
    for i, (op, w, n) in enumerate(ops):
        live = [a for a in queue.running() if a.worker == w]
        members = d.batched.get(w, [])
        if op == "hand":
            batch = [a] if (a := queue.next_shard(w, now)) else []
            while batch and len(batch) <= n and (b := queue.next_shard(w, now, local_only=True)):
                batch.append(b)
            if batch:
                d.set_batched(w, [(b.shard, b.attempt) for b in batch[1:]])
                d.records[w].running = (now, len(batch))
        elif op == "start" and members:
            d.attempt_started(w, *members[n % len(members)])
        elif op == "commit" and live:
            queue.commit(live[n % len(live)].shard, live[n % len(live)].attempt, w)
        elif op == "fail" and live:
            queue.fail(live[n % len(live)].shard, live[n % len(live)].attempt, w, "x", count=False)
        elif op == "release" and members:
            d.released(w, members[n % len(members):], members[n % len(members):][::2], now)
        elif op == "backup":
            doing = [a.shard for a in queue.running() if all(b.worker != w for b in queue.running_attempts(a.shard))]
            if doing:
                queue.start_backup(doing[n % len(doing)], w, now)
        elif op == "lose":
            queue.worker_lost(w)
            d.forget(w)
        elif op == "pass":
            job.batched = {} if n % 2 else {v: list(m) for v, m in d.batched.items()}
            queue.begin_clock(queue.clock)
        elif op == "reopen":
            done = [s for s in range(12) if queue.committed_attempt(s) is not None]
            queue.reopen(done[n % len(done):][:2] if done else [])
        elif op == "end":
            d.item_done(w)
        elif op == "step":
            job.monitor.record(w, 0.5 + n)
        elif op == "time":
            now += n / 2
        if i % look_every:
            continue  # (the index reads nothing: its shards' changes wait)
        new = d.view(job.workers, now)
        former = RunningAttempts(queue, now, d._waiting, d._item_size)
        for fewer in (None, 2, 3):
            shown = list(former.longest_running(fewer))
            assert list(new.running.longest_running(fewer)) == shown
            assert new.running.oldest_elapsed(fewer) == (shown[0].elapsed_s if shown else None)
        for idle in job.workers:
            views = [ControllerView(job.clock, job.workers, queue.n_todo, running, job.monitor, {}, idle)
                     for running in (new.running, former)]
            assert policy.decide(views[0]) == _former_decide(policy, views[1])
            assert policy.due_in(views[0]) == _former_due_in(policy, views[1])
        queue.check()


def test_an_idle_poll_at_a_pass_s_tail_does_not_step_over_the_batch_members_waiting():
    """A pass's tail as an in-process fit had it (64 workers, items of 16 shards, each item's first
    committed, the rest not known to have started until each commits): the backup policy's view
    looks at none of the 960 members (it stepped over all of them on every idle poll: ~2.6 ms)."""
    from dscar.core.job import JobState
    from dscar.core.policies import Backup, BackupPolicy

    workers, size = [f"w{i}" for i in range(64)], 16
    pmap = PartitionMap([TableLayout("x", 8, 2)])
    pmap.assign(workers[:2])
    queue = ShardQueue(len(workers) * size, reloadable=True)
    for s in range(len(workers) * size):
        queue.set_holder(s, workers[s // size])
    job = JobState(JobConfig("j", len(workers) * size, {"x": "param"}, [], [""]), queue, pmap,
                   policies=[BackupPolicy()])
    job.workers, d = workers, job.dispatch
    queue.begin_clock(1)
    for i, w in enumerate(workers):
        batch = [queue.next_shard(w, i * 1e-3, local_only=True) for _ in range(size)]
        d.set_batched(w, [(a.shard, a.attempt) for a in batch[1:]])
        d.records[w].running = (0.0, size)
        queue.commit(batch[0].shard, batch[0].attempt, w)
        job.monitor.record(w, 1.0)
        job.monitor.record(w, 1.0)
    looked = []
    d._waiting = lambda a: looked.append(a) or type(d)._waiting(d, a)
    view = d.view(workers, 100.0, "w0")
    assert BackupPolicy().decide(view) == [] and BackupPolicy().due_in(view) is None
    assert list(view.running) == [] and looked == []
    d.attempt_started("w3", *d.batched["w3"][0])  # (its commit says so): the one shard shown
    assert [r.shard for r in d.view(workers, 100.0, "w0").running] == [3 * size + 1] and looked == []
    assert BackupPolicy().decide(d.view(workers, 100.0, "w0")) == [Backup(3 * size + 1, "w0")]


@pytest.mark.parametrize("job_current, batched, last_try, silent, expected", [
    (True, False, False, [], None),                 # all answered: the pass is sent again
    (True, False, False, ["b"], ["b"]),             # a silent one is lost
    (True, True, False, [], ["a", "b"]),            # an SSP batch is not sent twice: the loss skips the clock
    (True, False, True, [], ["a", "b"]),            # nor a pass out of tries
    (False, False, False, [], []),                  # the job ended: healthy workers stay
    (False, True, True, [], []),
    (False, False, False, ["b"], ["b"]),            # (a silent one is still lost)
])
def test_an_apply_that_missed_workers_takes_out_only_those_whose_loss_serves_the_job(
        job_current, batched, last_try, silent, expected):
    assert unreached_after_apply(["a", "b"], silent, job_current=job_current, batched=batched,
                                 last_try=last_try) == expected
