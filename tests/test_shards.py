"""The shard service state machine, every transition, without Dask."""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dscar.errors import ShardFailedError
from dscar.core.shards import LastNameSet, ShardQueue, ShardStatus


def queue(n=4, reloadable=False, **kw):
    q = ShardQueue(n, reloadable=reloadable, **kw)
    for i in range(n):
        q.set_holder(i, "a" if i < n // 2 else "b")
    q.begin_clock(1)
    return q


def test_begin_clock_puts_every_shard_in_todo():
    q = queue()
    assert q.counts() == {"todo": 4, "doing": 0, "done": 0}
    q.check()


def test_todo_to_doing_to_done_and_clock_completes():
    q = queue(2)
    a = q.next_shard("a", 0.0)
    assert q.status(a.shard) is ShardStatus.DOING
    assert q.commit(a.shard, a.attempt, "a")
    assert q.status(a.shard) is ShardStatus.DONE
    assert not q.complete
    b = q.next_shard("b", 0.0)
    assert q.commit(b.shard, b.attempt, "b")
    assert q.complete and q.next_shard("a", 0.0) is None
    q.check()


def test_next_shard_prefers_local_data():
    q = queue(4)
    assert q.next_shard("a", 0).shard in (0, 1)
    assert q.next_shard("b", 0).shard in (2, 3)


def test_a_worker_without_local_shards_steals_from_the_longest_backlog_and_the_data_moves_at_its_commit():
    q = ShardQueue(6, reloadable=False)
    for i in range(6):
        q.set_holder(i, "a" if i < 4 else "b")
    q.begin_clock(1)
    a = q.next_shard("c", 0)
    assert q.holder(a.shard) == "a" and a.fetch_from == "a"  # c copies; a keeps it until c commits
    local = q.next_shard("a", 0)
    assert local.fetch_from is None
    assert q.commit(a.shard, a.attempt, "c") and q.holder(a.shard) == "c"


def test_an_attempt_that_never_committed_leaves_the_shard_with_the_worker_that_has_its_data():
    """A steal handed out, then cut short (a failure, a loss elsewhere restarting the pass): the
    next attempt on the original holder runs from its own copy, and one elsewhere copies from it,
    never from the worker that may not have received the data (its late copy would be stale)."""
    q = ShardQueue(6, reloadable=False)
    for i in range(6):
        q.set_holder(i, "a" if i < 4 else "b")
    q.begin_clock(1)
    stolen = q.next_shard("c", 0)
    q.begin_clock(1, None)  # a rebuild pass after a loss: every attempt of the pass is void
    assert q.holder(stolen.shard) == "a"
    again = q.start_backup(q.next_shard("a", 0).shard, "d", 1)
    assert again.fetch_from == "a"
    failed = q.next_shard("c", 0)
    q.fail(failed.shard, failed.attempt, "c", "boom")
    assert q.holder(failed.shard) == "a" and q.next_shard("a", 0).fetch_from is None


def test_unplaced_shards_wait_unless_reloadable():
    q = ShardQueue(2, reloadable=False)
    q.begin_clock(1)
    assert q.next_shard("a", 0) is None and q.unplaced() == [0, 1]
    r = ShardQueue(2, reloadable=True)
    r.begin_clock(1)
    got = r.next_shard("a", 0)
    assert got is not None and got.fetch_from is None


def test_only_the_first_commit_wins_and_late_attempts_are_refused():
    q = queue(1, reloadable=True)
    a = q.next_shard("a", 0)
    q.worker_lost("a")  # the attempt goes back to TODO...
    b = q.next_shard("b", 0)
    assert b.attempt == a.attempt + 1
    assert not q.commit(a.shard, a.attempt, "a")  # ...and its late commit is refused
    assert q.commit(b.shard, b.attempt, "b")
    assert not q.commit(b.shard, b.attempt, "b")  # a second commit of the winner too
    assert q.committed() == [(0, b.attempt)]
    q.check()


def test_commit_of_an_unknown_attempt_or_wrong_worker_is_refused():
    q = queue(1)
    a = q.next_shard("a", 0)
    assert not q.commit(a.shard, a.attempt + 5, "a")
    assert not q.commit(a.shard, a.attempt, "b")
    assert q.commit(a.shard, a.attempt, "a")


def test_worker_lost_returns_doing_to_todo_and_forgets_its_data():
    q = queue(4)
    a = q.next_shard("a", 0)
    done = q.next_shard("a", 0)
    q.commit(done.shard, done.attempt, "a")
    requeued = q.worker_lost("a")
    assert [x.shard for x in requeued] == [a.shard]
    assert q.status(a.shard) is ShardStatus.TODO
    assert q.status(done.shard) is ShardStatus.DONE  # committed work is kept
    assert q.holder(a.shard) is None and q.held_by("a") == []
    q.check()


def test_failure_requeues_then_raises_with_every_failure_past_the_limit():
    q = queue(1, reloadable=True, max_failures=2)
    a = q.next_shard("a", 0)
    q.fail(a.shard, a.attempt, "a", "boom 1")
    assert q.status(0) is ShardStatus.TODO
    b = q.next_shard("a", 0)
    with pytest.raises(ShardFailedError) as e:
        q.fail(b.shard, b.attempt, "a", "boom 2")
    assert e.value.shard == 0 and len(e.value.failures) == 2 and "boom 2" in str(e.value)


def test_a_stale_failure_report_is_ignored():
    q = queue(1)
    a = q.next_shard("a", 0)
    q.commit(a.shard, a.attempt, "a")
    q.fail(a.shard, a.attempt, "a", "late")
    assert q.status(0) is ShardStatus.DONE


def test_a_late_report_of_lost_data_leaves_the_winners_holder_alone():
    """Issue 38 item 6: a stolen attempt that lost its shard's commit (a backup won, the pass was
    applied, the old holder dropped its copy) finds the data nowhere and says so; its shard's data
    is with the winner all the same. Only a live attempt's lost data makes the shard unheld."""
    q = queue(2)
    primary = q.next_shard("a", 0)
    backup = q.start_backup(primary.shard, "b", 1)
    assert q.commit(backup.shard, backup.attempt, "b")
    q.fail(primary.shard, primary.attempt, "a", "LookupError: on no live worker", lost_data=True)
    assert q.holder(primary.shard) == "b" and q.status(primary.shard) is ShardStatus.DONE
    live = q.next_shard("b", 2)
    q.fail(live.shard, live.attempt, "b", "LookupError: on no live worker", lost_data=True)
    assert q.holder(live.shard) is None and q.status(live.shard) is ShardStatus.TODO
    q.check()


def test_begin_clock_refuses_an_incomplete_clock():
    q = queue(2)
    q.next_shard("a", 0)
    with pytest.raises(RuntimeError):
        q.begin_clock(2)


def test_snapshot_restore_keeps_done_and_requeues_doing():
    q = queue(3)
    a = q.next_shard("a", 0)
    b = q.next_shard("b", 0)
    q.commit(b.shard, b.attempt, "b")
    r = ShardQueue.restore(q.snapshot())
    assert r.clock == 1
    assert r.status(b.shard) is ShardStatus.DONE and r.status(a.shard) is ShardStatus.TODO
    assert r.committed() == q.committed()
    r.check()


def test_committed_by_counts_per_worker():
    q = queue(4)
    for w in ("a", "a", "b", "b"):
        x = q.next_shard(w, 0)
        q.commit(x.shard, x.attempt, w)
    assert q.committed_by() == {"a": 2, "b": 2}


# ------------------------------------------------------------- backups, static


def test_a_backup_attempt_copies_and_the_first_commit_wins_and_holds_the_data():
    q = queue(2)
    primary = q.next_shard("a", 0)
    backup = q.start_backup(primary.shard, "b", 1)
    assert backup.backup and backup.fetch_from == "a" and q.holder(primary.shard) == "a"
    assert q.commit(backup.shard, backup.attempt, "b")
    assert q.holder(primary.shard) == "b"  # the winner holds the committed data and state
    assert not q.commit(primary.shard, primary.attempt, "a")
    q.check()


def test_primary_wins_over_a_backup():
    q = queue(2)
    primary = q.next_shard("a", 0)
    backup = q.start_backup(primary.shard, "b", 1)
    assert q.commit(primary.shard, primary.attempt, "a")
    assert not q.commit(backup.shard, backup.attempt, "b") and q.holder(primary.shard) == "a"


def test_losing_the_primary_keeps_the_shard_doing_while_its_backup_runs():
    q = queue(2)
    primary = q.next_shard("a", 0)
    backup = q.start_backup(primary.shard, "b", 1)
    q.worker_lost("a")
    assert q.status(primary.shard) is ShardStatus.DOING
    assert q.commit(backup.shard, backup.attempt, "b")
    q.check()


def test_a_failed_backup_leaves_the_primary_running():
    q = queue(2)
    primary = q.next_shard("a", 0)
    backup = q.start_backup(primary.shard, "b", 1)
    q.fail(backup.shard, backup.attempt, "b", "oops")
    assert q.status(primary.shard) is ShardStatus.DOING
    assert q.commit(primary.shard, primary.attempt, "a")


def test_failures_while_another_attempt_runs_are_not_counted_but_the_last_one_is():
    q = queue(1, max_failures=1)
    primary = q.next_shard("a", 0)
    for worker in ("b", "c", "d"):  # backups that keep failing while the primary runs: no error
        backup = q.start_backup(primary.shard, worker, 1)
        q.fail(backup.shard, backup.attempt, worker, "could not copy the data yet")
    assert q.status(0) is ShardStatus.DOING
    with pytest.raises(ShardFailedError) as e:  # the shard's own failure, with no attempt left, counts
        q.fail(primary.shard, primary.attempt, "a", "boom")
    assert e.value.failures == ["a: boom"]


def test_backups_only_for_doing_shards_and_not_twice_on_one_worker():
    q = queue(2)
    with pytest.raises(ValueError):
        q.start_backup(0, "b", 0)
    a = q.next_shard("a", 0)
    with pytest.raises(ValueError):
        q.start_backup(a.shard, "a", 0)


def test_static_sharding_never_moves_a_shard_but_serves_orphans():
    q = ShardQueue(4, reloadable=False, sharding="static")
    for i in range(4):
        q.set_holder(i, "a" if i < 2 else "b")
    q.begin_clock(1)
    got = [q.next_shard("a", 0).shard, q.next_shard("a", 0).shard]
    assert sorted(got) == [0, 1] and q.next_shard("a", 0) is None  # b's shards stay b's
    q.worker_lost("b")
    q.set_holder(2, "a")  # the driver placed b's orphans again
    assert q.next_shard("a", 0).shard == 2
    with pytest.raises(ValueError):
        ShardQueue(2, reloadable=True, sharding="random")


def test_snapshot_keeps_sharding_mode():
    q = ShardQueue(2, reloadable=True, sharding="static")
    q.begin_clock(3)
    assert ShardQueue.restore(q.snapshot()).sharding == "static"


# ------------------------------------------------------------- data phases
def phased(sizes=(2, 3), reloadable=True):
    q = ShardQueue(sum(sizes), reloadable=reloadable, phases=list(sizes))
    q.begin_clock(1)
    return q


def drain(q, worker="a"):
    """Run every shard the queue hands out to completion; return their ids in order."""
    done = []
    while (a := q.next_shard(worker, 0.0)) is not None:
        assert q.commit(a.shard, a.attempt, worker)
        done.append(a.shard)
    return done


def test_phases_hand_out_only_the_active_phases_shards_in_order():
    q = phased()
    assert q.active == range(0, 2) and q.counts() == {"todo": 2, "doing": 0, "done": 0}
    assert sorted(drain(q)) == [0, 1] and q.complete and not q.last_phase
    assert q.committed() == [(0, 0), (1, 0)]
    q.check()
    assert q.next_phase() == 1 and not q.complete and q.last_phase
    q.check()
    assert sorted(drain(q)) == [2, 3, 4] and q.complete
    assert [s for s, _ in q.committed()] == [2, 3, 4]  # only the active phase's commits are applied
    assert q.committed_by() == {"a": 3}
    with pytest.raises(RuntimeError, match="no phase after"):
        q.next_phase()
    q.begin_clock(2)
    assert q.phase == 0 and q.counts()["todo"] == 2
    q.check()


def test_next_phase_needs_the_active_phase_complete_and_sizes_must_add_up():
    q = phased()
    q.next_shard("a", 0.0)
    with pytest.raises(RuntimeError, match="not complete"):
        q.next_phase()
    with pytest.raises(ValueError, match="add up"):
        ShardQueue(4, reloadable=True, phases=[2, 3])
    with pytest.raises(ValueError, match="add up"):
        ShardQueue(4, reloadable=True, phases=[4, 0])


def test_restart_redoes_only_the_active_phase_with_fresh_attempt_numbers():
    q = phased()
    drain(q)
    q.next_phase()
    a = q.next_shard("a", 0.0)
    q.commit(a.shard, a.attempt, "a")
    q.next_shard("b", 0.0)
    q.restart_clock()
    q.check()
    assert [q.status(i).value for i in range(5)] == ["done", "done", "todo", "todo", "todo"]
    again = q.next_shard("a", 0.0)
    assert again.attempt >= 1  # the stale attempt 0 can never commit for the new one
    assert not q.commit(a.shard, a.attempt, "a")


def test_a_rebuild_pass_runs_every_phase_then_the_clock_goes_on_at_its_phase():
    q = phased()
    drain(q)
    q.next_phase()
    q.begin_clock(1, None)  # rebuild pass after a recovery in phase 1
    assert q.active == range(5) and q.last_phase
    assert sorted(drain(q)) == [0, 1, 2, 3, 4]
    q.begin_clock(1, 1)  # the interrupted phase again
    q.check()
    assert sorted(drain(q)) == [2, 3, 4] and q.complete


def test_worker_lost_requeues_only_active_attempts_and_snapshot_keeps_the_phase():
    q = phased(reloadable=False)
    for i in range(5):
        q.set_holder(i, "a" if i % 2 else "b")
    drain(q, "a")
    q.next_phase()
    a = q.next_shard("b", 0.0)
    lost = q.worker_lost("b")
    assert [x.shard for x in lost] == [a.shard] and q.status(a.shard) is ShardStatus.TODO
    q.check()
    r = ShardQueue.restore(q.snapshot())
    r.check()
    assert r.phase == 1 and r.phase_sizes == (2, 3) and r.counts() == q.counts()
    assert [r.status(i) for i in range(5)] == [q.status(i) for i in range(5)]


def test_a_backup_of_a_stolen_shard_copies_from_its_holder_too():
    q = queue(4)
    primary = q.next_shard("c", 0)  # c steals from a (or b): c copies the holder's data
    assert primary.fetch_from in ("a", "b")
    backup = q.start_backup(primary.shard, "d", 1)
    assert backup.fetch_from == primary.fetch_from  # the holder has it, whether c received it or not (hung)
    local = q.next_shard("a", 0)
    assert q.start_backup(local.shard, "d", 1).fetch_from == "a"


@pytest.mark.parametrize("seed", range(30))
def test_the_longest_running_index_lists_what_a_sort_of_the_running_attempts_lists(seed):
    """Random hand-outs (at times that may go back), backups, commits, failures, releases and losses:
    ``longest_running(n)`` gives each DOING shard with fewer than ``n`` attempts started, by its
    longest-running live attempt, oldest first: what sorting every running attempt gives."""
    rng = random.Random(seed)
    workers = [f"w{i}" for i in range(rng.randint(2, 6))]
    q = ShardQueue(rng.randint(4, 30), reloadable=True)
    q.begin_clock(1)
    t = 0.0
    for _ in range(300):
        t += rng.choice([1.0, 1.0, 1.0, -0.5])  # (a clock that goes back: out-of-order entries)
        op, w = rng.random(), rng.choice(workers)
        running = q.running()
        if op < 0.4:
            q.next_shard(w, t)
        elif op < 0.55 and running:
            a = rng.choice(running)
            if all(b.worker != w for b in q.running_attempts(a.shard)):
                q.start_backup(a.shard, w, t)
        elif op < 0.7 and running:
            a = rng.choice(running)
            q.commit(a.shard, a.attempt, a.worker)
        elif op < 0.8 and running:
            a = rng.choice(running)
            q.fail(a.shard, a.attempt, a.worker, "x", count=False)
        elif op < 0.88 and running:
            a = rng.choice(running)
            q.release(a.shard, a.attempt, a.worker)
        elif op < 0.92:
            q.worker_lost(w)
        elif q.complete:
            q.begin_clock(q.clock + 1)
        q.check()
        bound = rng.choice([None, 2, 3])
        oldest = {}
        for a in q.running():
            if bound is None or q.attempts_started(a.shard) < bound:
                if a.shard not in oldest or (a.started, a.attempt) < (oldest[a.shard].started, oldest[a.shard].attempt):
                    oldest[a.shard] = a
        got = list(q.longest_running(bound))
        assert sorted(got, key=lambda a: a.shard) == sorted(oldest.values(), key=lambda a: a.shard)
        assert [a.started for a in got] == sorted(a.started for a in got)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), stale_slack=st.sampled_from([0, 3, 64]))
def test_the_started_attempts_index_lists_what_the_running_ones_less_the_waiting_list(seed, stale_slack):
    """``longest_running(n, started_only=True)`` and ``oldest_started(n)`` (the index of the shards with
    a started attempt: it follows its shards when read, and leaves removed entries stale in its lists
    until ``stale_slack`` allows) against a filter of ``longest_running(n)``: every running shard, in
    the same order, less those whose every live attempt waits (``set_waiting``), on random hand-outs
    (at times that may go back), waits, unwaits, backups, commits, failures, releases, losses, reopens
    and passes, read at about one op in four, so that changes pile up between reads. A waiting attempt
    is what a batch member is when it is marked: its shard's one live attempt, no backup."""
    rng = random.Random(seed)
    workers = [f"w{i}" for i in range(6)]
    q = ShardQueue(40, reloadable=True)
    q.stale_slack = stale_slack
    for s in range(40):
        q.set_holder(s, workers[s % 4])
    q.begin_clock(1)
    waiting: set[tuple[int, int, str]] = set()
    t = 0.0
    for _ in range(400):
        t += rng.choice([1.0, 1.0, 1.0, -0.5])  # (a clock that goes back: out-of-order entries)
        op, w = rng.random(), rng.choice(workers)
        running = q.running()
        pick = rng.choice(running) if running else None
        if op < 0.25:
            q.next_shard(w, t)
        elif op < 0.4 and pick is not None:  # (a batch member: a TODO shard's first attempt, the only one then)
            if not pick.backup and q.running_attempts(pick.shard) == [pick]:
                q.set_waiting(pick.worker, [(pick.shard, pick.attempt)], [])
                waiting.add((pick.shard, pick.attempt, pick.worker))
        elif op < 0.47 and waiting:
            shard, attempt, worker = rng.choice(sorted(waiting))
            if rng.random() < 0.5:
                q.unwait(shard, attempt, worker)
            else:
                q.set_waiting(worker, [], [(shard, attempt)])
            waiting.discard((shard, attempt, worker))
        elif op < 0.48:
            q.clear_waiting()
            waiting.clear()
        elif op < 0.53 and pick is not None:
            if all(b.worker != w for b in q.running_attempts(pick.shard)):
                q.start_backup(pick.shard, w, t)
        elif op < 0.63 and pick is not None:
            q.commit(pick.shard, pick.attempt, pick.worker)
        elif op < 0.67 and pick is not None:
            q.fail(pick.shard, pick.attempt, pick.worker, "x", count=False)
        elif op < 0.71 and pick is not None:
            q.release(pick.shard, pick.attempt, pick.worker)
        elif op < 0.72:
            q.worker_lost(w)
        elif op < 0.74:
            q.reopen(rng.sample(range(40), 3))
        elif op < 0.75 and q.complete:
            q.begin_clock(q.clock + 1)
            waiting.clear()  # (no attempt lives on, and attempt numbers start again: a mark names a live attempt)
        if rng.random() < 0.25:
            for bound in (None, 2, 3):  # (the oldest first: it reads the index before the listing does)
                oldest = q.oldest_started(bound)
                shown = [a for a in q.longest_running(bound)
                         if any((a.shard, b.attempt, b.worker) not in waiting for b in q.running_attempts(a.shard))]
                assert list(q.longest_running(bound, started_only=True)) == shown
                assert oldest == ((shown[0], len(q.running_attempts(shown[0].shard))) if shown else None)
    q.check()


@pytest.mark.parametrize("seed", range(30))
def test_the_holders_with_shards_to_start_come_from_the_index_as_a_scan_of_the_shards_says(seed):
    """Random tiers (SSP: a shard's tier is the clock of its next update), holders, hand-outs and
    commits: which workers hold TODO shards of a tier up to a limit (``holders_with_todo``: the polls
    a change wakes first, ``dscar.core.wake``) is what a scan of every shard says (``check`` asks at
    every tier present)."""
    rng = random.Random(seed)
    workers = [f"w{i}" for i in range(rng.randint(2, 6))]
    q = ShardQueue(rng.randint(3, 24), reloadable=rng.random() < 0.5)
    for s in range(q.n_shards):
        q.set_holder(s, rng.choice(workers + [None]))
    q.begin_clock(1)
    running = []
    for _ in range(150):
        op, w, s = rng.random(), rng.choice(workers), rng.randrange(q.n_shards)
        if op < 0.3:
            q.set_tier(s, rng.randint(0, 3))
        elif op < 0.45:
            q.set_holder(s, rng.choice(workers + [None]))
        elif op < 0.8:
            a = q.next_shard(w, 0.0, tier=rng.randint(0, 3))
            if a is not None:
                running.append(a)
        elif running:
            a = running.pop(rng.randrange(len(running)))
            q.commit(a.shard, a.attempt, a.worker)
        q.check()


@settings(max_examples=300)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "discard", "last"]),
                              st.sampled_from(["", "a", "b", "ab", "b0", "w1", "w10", "w2", "w9", "é", "\U0001f600"])),
                    max_size=60))
def test_a_last_name_set_gives_the_largest_of_its_names_after_any_adds_and_discards(ops):
    """``LastNameSet`` (the holders of one backlog size: the last one gives up a shard) against a plain
    set and ``max``, read at any point: the cached last name follows adds, and a discard of it is noticed."""
    names, plain = LastNameSet(), set()
    for op, name in ops:
        if op == "add":
            names.add(name)
            plain.add(name)
        elif op == "discard":
            names.discard(name)
            plain.discard(name)
        elif plain:
            assert names.last() == max(plain)
        assert set(names) == plain and len(names) == len(plain) and all(n in names for n in plain)
    if plain:
        assert names.last() == max(plain)


def test_a_backup_outlives_the_first_attempt_and_either_may_commit_whichever_goes_first():
    """A shard keeps its first live attempt on its record and a backup beside it: whichever of them
    fails or is lost, the other is the shard's live attempt, in start order, and may commit."""
    for gone in ("first", "backup"):
        q = queue(1)
        first = q.next_shard("a", 0.0)
        backup = q.start_backup(first.shard, "b", 1.0)
        assert q.running_attempts(0) == [first, backup]
        lost, kept = (first, backup) if gone == "first" else (backup, first)
        q.fail(0, lost.attempt, lost.worker, "x")
        q.check()
        assert q.running_attempts(0) == [kept] and q.running_attempt(0, lost.attempt) is None
        assert not q.commit(0, lost.attempt, lost.worker) and q.commit(0, kept.attempt, kept.worker)
        assert q.committed_attempt(0) == kept and q.running_attempts(0) == []
        q.check()
