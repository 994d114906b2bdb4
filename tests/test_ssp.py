"""The stale-synchronous clock window (dscar.core.ssp): pure logic, no Dask."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dscar.core.clock import ClockError
from dscar.core.ssp import (ApplyBatch, ClockStatus, ClockWindow, RunClockEnd, ShardPhase, SkipClock,
                       StartRebuild, StartRecovery)


def _one(actions, kind):
    found = [a for a in actions if isinstance(a, kind)]
    assert len(found) == 1, actions
    return found[0]


def test_a_fast_shard_runs_ahead_up_to_the_staleness_and_clocks_end_in_order():
    w = ClockWindow(n_shards=2, staleness=2, limit=10)
    b = _one(w.commit(0, w.start(0), "fast", w.epoch), ApplyBatch)  # shard 0, clock 1
    assert b.updates == ((0, 1, "fast"),)
    assert w.start(1) == 1  # the slow worker's shard of clock 1 runs on
    w.batch_applied(b.batch)
    for clock in (2, 3):  # shard 0 runs clocks 2 and 3 while clock 1 is open
        assert w.start(0) == clock
        w.batch_applied(_one(w.commit(0, clock, "fast", w.epoch), ApplyBatch).batch)
    assert w.shard_clock(0) == 4 and w.startable() == []  # clock 4 > floor 0 + 1 + 2: it waits
    end = _one(w.batch_applied(_one(w.commit(1, 1, "slow", w.epoch), ApplyBatch).batch), RunClockEnd)
    assert end.clock == 1 and w.startable() == [1]  # shards run on during a clock end
    assert w.clock_end_done(1, w.epoch) and w.floor == 1
    w.go_on()
    assert w.startable() == [0, 1]  # clock 4 is open now, and the slow shard's clock 2


def test_staleness_zero_is_a_barrier():
    w = ClockWindow(n_shards=2, staleness=0, limit=5)
    w.batch_applied(_one(w.commit(0, w.start(0), "a", 0), ApplyBatch).batch)
    assert w.startable() == [1]  # shard 0's clock 2 waits for clock 1 to end
    w.start(1)
    end = _one(w.batch_applied(_one(w.commit(1, 1, "b", 0), ApplyBatch).batch), RunClockEnd)
    assert w.clock_end_done(end.clock, end.epoch)
    w.go_on()
    assert w.startable() == [0, 1]


def test_commits_waiting_while_a_batch_applies_go_in_the_next_batch_together():
    w = ClockWindow(n_shards=3, staleness=1, limit=5)
    for s in range(3):
        w.start(s)
    first = _one(w.commit(0, 1, "w0", 0), ApplyBatch)
    assert w.commit(1, 1, "w1", 0) == [] and w.commit(2, 1, "w2", 0) == []
    second = _one(w.batch_applied(first.batch), ApplyBatch)
    assert [u[0] for u in second.updates] == [1, 2]


def test_a_loss_that_restores_voids_running_attempts_and_waiting_commits_but_keeps_applied_updates():
    w = ClockWindow(n_shards=3, staleness=2, limit=9, has_rebuild=True)
    w.batch_applied(_one(w.commit(0, w.start(0), "a", 0), ApplyBatch).batch)  # (0, 1) applied
    w.start(0)  # (0, 2) runs
    w.start(1)
    b = _one(w.commit(1, 1, "b", 0), ApplyBatch)  # (1, 1) in flight
    w.start(2)
    assert _one(w.lose("c", restores=True), StartRecovery).epoch == 1
    assert (1, 1) in w.applied and w.skip_reasons[1]  # the batch in flight is written off: clock 1 skipped
    assert w.batch_applied(b.batch) == []
    assert w.commit(0, 2, "a", 0) == []  # read before the restore
    assert [w.phase(s) for s in range(3)] == [ShardPhase.TODO] * 3
    assert [w.shard_clock(s) for s in range(3)] == [2, 2, 1]  # applied updates stay
    assert w.startable() == []  # recovering
    rebuild = _one(w.recovered(), StartRebuild)
    assert w.startable() == [0, 1, 2]
    for s in range(3):
        assert w.start(s) == w.shard_clock(s)
    acts = []
    for s in range(3):
        acts += w.commit(s, 0, "a", rebuild.epoch)
    batch = _one(acts, ApplyBatch)
    assert batch.rebuild and len(batch.updates) == 3
    assert w.batch_applied(batch.batch) == [] and w.startable() == [0, 1, 2]
    assert w.start(2) == 1


def test_a_skipped_clock_finishes_without_its_clock_end_once_every_shard_moved_past_it():
    w = ClockWindow(n_shards=2, staleness=1, limit=5)
    w.start(0)
    b = _one(w.commit(0, 1, "a", 0), ApplyBatch)
    w.lose("a", restores=False)  # a held the update being applied: written off
    assert w.batch_applied(b.batch) == []
    w.start(1)
    acts = w.batch_applied(_one(w.commit(1, 1, "b", 0), ApplyBatch).batch)
    assert _one(acts, SkipClock).clock == 1 and w.finished[1] is ClockStatus.SKIPPED and w.floor == 1


def test_commits_wait_for_a_batch_of_min_batch_unless_needed_sooner():
    w = ClockWindow(n_shards=4, staleness=1, limit=5, min_batch=3)
    for s in range(4):
        w.start(s)
    assert w.commit(0, 1, "a", 0) == [] and w.commit(1, 1, "b", 0) == []  # two waiting, two running
    assert [u[0] for u in _one(w.flush(), ApplyBatch).updates] == [0, 1]  # an idle worker needs them
    w.batch_applied(1)
    assert w.commit(2, 1, "c", 0) == []
    b = _one(w.commit(3, 1, "d", 0), ApplyBatch)  # clock 1 wholly committed: its end waits for them
    assert [u[0] for u in b.updates] == [2, 3] and w.version == 1  # one batch applied, no clock end


def test_a_flush_waits_for_a_share_of_a_batch_while_attempts_still_run():
    """At scale some worker is always idle: a batch per flush would make a clock's batches (each an
    apply to every owner) grow with the workers. A flush sends once ``min_batch // flush_share`` wait."""
    w = ClockWindow(n_shards=8, staleness=1, limit=5, min_batch=16, flush_share=8)
    for s in range(8):
        w.start(s)
    assert w.commit(0, 1, "a", 0) == [] and w.flush() == []  # one waiting, seven running: not yet
    b = _one(w.commit(1, 1, "b", 0), ApplyBatch)  # two waiting: the flush asked for them is due now
    assert [u[0] for u in b.updates] == [0, 1]
    w.batch_applied(b.batch)
    assert w.commit(2, 1, "c", 0) == []  # (no flush asked since: it waits for min_batch)


def test_a_worker_lost_without_partitions_voids_only_its_own_work():
    w = ClockWindow(n_shards=2, staleness=1, limit=5)
    w.start(0)
    w.start(1)
    b = _one(w.commit(0, 1, "a", 0), ApplyBatch)
    w.commit(1, 1, "b", 0)  # waits behind the batch in flight
    assert w.lose("b", restores=False) == []
    assert w.phase(1) is ShardPhase.TODO and w.phase(0) is ShardPhase.APPLYING and w.epoch == 0
    w.batch_applied(b.batch)
    assert w.skip_reasons == {}


def test_the_clock_end_is_held_until_the_cut_is_saved_and_a_stop_ends_the_window():
    w = ClockWindow(n_shards=1, staleness=3, limit=9)
    end = _one(w.batch_applied(_one(w.commit(0, w.start(0), "a", 0), ApplyBatch).batch), RunClockEnd)
    w.start(0)
    assert w.commit(0, 2, "a", 0) == []  # waits: no batch beside a clock end
    w.clock_end_done(end.clock, end.epoch)
    assert w.cut() == [1] and w.holding
    b = _one(w.go_on(), ApplyBatch)
    w.stop(1)
    assert w.batch_applied(b.batch) == [] and w.done and w.startable() == []


def test_an_attempt_from_before_a_restore_is_refused_even_when_its_worker_runs_the_shard_again():
    w = ClockWindow(n_shards=1, staleness=1, limit=5)
    w.start(0)
    w.lose("b", restores=True)
    w.recovered()
    w.start(0)  # the same shard, clock and worker, under the new epoch
    assert w.commit(0, 1, "a", 0) == [] and w.phase(0) is ShardPhase.RUNNING and not w.accepts(0, 1, 0)
    assert _one(w.commit(0, 1, "a", w.epoch), ApplyBatch).epoch == 2


def test_out_of_order_starts_are_refused():
    w = ClockWindow(n_shards=1, staleness=0, limit=1)
    w.start(0)
    with pytest.raises(ClockError):
        w.start(0)


# ------------------------------------------------------------------ stateful
def test_a_window_resumed_from_a_cut_starts_each_shard_after_its_own_clock_and_skips_the_clocks_it_reaches():
    """A checkpoint at the end of clock 4 held shard 1's update of clock 5 and shard 2's of clocks 5 and 6
    (staleness 2): resumed, shard 0 starts at 5, shard 1 at 6, shard 2 at 7 (once clock 4 + 1 + 2 >= 7),
    and clocks 5 and 6 are skipped (their reduction sums were not saved) without their clock ends."""
    w = ClockWindow(n_shards=3, staleness=2, floor=4, limit=8)
    w.resume_from([4, 5, 6])
    w.check()
    assert [w.shard_clock(s) for s in range(3)] == [5, 6, 7] and w.startable() == [0, 1, 2]
    handed = []
    while w.floor < w.limit:
        for shard in w.startable():
            clock = w.start(shard)
            handed.append((shard, clock))
            for a in w.commit(shard, clock, "a", w.epoch):
                if isinstance(a, ApplyBatch):
                    w.batch_applied(a.batch)
        while w.clock_end is not None or w.in_flight is not None:
            if w.in_flight is not None:
                w.batch_applied(w.in_flight.batch)
            else:
                assert w.clock_end not in (5, 6), "a clock the cut reaches ran its clock end"
                assert w.clock_end_done(w.clock_end, w.epoch)
                w.go_on()
        w.check()
    assert sorted(handed) == sorted({(s, c) for s in range(3) for c in range(5, 9)} - {(1, 5), (2, 5), (2, 6)})
    assert w.finished[5] is w.finished[6] is ClockStatus.SKIPPED
    assert w.finished[7] is w.finished[8] is ClockStatus.DONE


def test_a_cut_everywhere_at_the_checkpoints_clock_resumes_as_before_and_a_bad_cut_is_refused():
    w = ClockWindow(n_shards=2, staleness=1, floor=3, limit=6)
    w.resume_from([3, 3])
    assert [w.shard_clock(s) for s in range(2)] == [4, 4] and not w.skip_reasons
    w.check()
    with pytest.raises(ClockError, match="outside clocks 3 .. 4"):
        ClockWindow(n_shards=2, staleness=1, floor=3, limit=6).resume_from([3, 5])  # past the staleness
    with pytest.raises(ClockError, match="a cut of 1 shards"):
        ClockWindow(n_shards=2, staleness=1, floor=3, limit=6).resume_from([3])
    started = ClockWindow(n_shards=2, staleness=1, floor=3, limit=6)
    started.start(0)
    with pytest.raises(ClockError, match="after the window started"):
        started.resume_from([3, 4])


WORKERS = ["w0", "w1", "w2", "w3"]
OWNERS = {"w0": "param", "w1": "param", "w2": "reduction"}  # w3 owns nothing


class WindowFuzz(RuleBasedStateMachine):
    """Random interleavings of starts, commits, batches, clock ends, stops and losses with several
    clocks open. The model checks what the window promises its readers and the applied updates."""

    @initialize(n=st.integers(1, 5), s=st.integers(0, 3), rebuild=st.booleans(), limit=st.integers(1, 10),
                min_batch=st.integers(1, 3), flush_share=st.integers(1, 3), floor=st.integers(0, 3),
                ahead=st.lists(st.integers(0, 3), max_size=5))
    def setup(self, n, s, rebuild, limit, min_batch, flush_share, floor, ahead):
        """A new fit (``floor`` 0), or a resume from a checkpoint of clock ``floor`` whose cut has shard
        ``i`` ``ahead[i]`` clocks past it (at most ``s``): those updates were applied by the earlier fit."""
        self.w = ClockWindow(n_shards=n, staleness=s, has_rebuild=rebuild, limit=floor + limit, min_batch=min_batch,
                             flush_share=flush_share, floor=floor)
        cut = [floor + min(s, ahead[i]) if i < len(ahead) else floor for i in range(n)]
        if floor:
            self.w.resume_from(cut)
        self.first_floor = floor
        self.lost: set[str] = set()
        self.running: list[tuple[int, int, str, int]] = []  # (shard, clock, worker, epoch)
        self.batch: ApplyBatch | None = None
        self.end: RunClockEnd | None = None
        self.times_applied: dict[tuple[int, int], int] = {}
        self.whole: dict[tuple[int, int], bool] = {}  # applied by every owner (not written off)
        self.recovery = False
        self.ended: list[int] = []
        self.must_skip: set[int] = set()
        self.current: dict[int, tuple[int, str, int]] = {}  # shard -> its running attempt (one at a time)
        #: (shard, clock) -> (epoch, the table version before its batch); clock -> the same for its clock end
        self.version_of: dict[tuple[int, int], tuple[int, int]] = {}
        self.end_version: dict[int, tuple[int, int]] = {}
        self.writer_of: dict[tuple[int, int], str] = {}  # (shard, clock) -> the worker whose update was applied whole
        if floor:  # what the earlier fit applied: a resume must hand none of it out again
            self.times_applied = {(i, c): 1 for i in range(n) for c in range(1, cut[i] + 1)}
            self.whole = dict.fromkeys(self.times_applied, True)
            self.must_skip = set(range(floor + 1, max(cut) + 1))  # their reductions are not in the checkpoint
            self.handle(self.w.allow(self.w.limit))  # (the job's ``begin``: skips what only the cut reached)

    def live(self):
        return [x for x in WORKERS if x not in self.lost]

    def handle(self, actions):
        for a in actions:
            if isinstance(a, ApplyBatch):
                assert self.batch is None, "two batches in flight"
                if not a.rebuild:
                    for shard, clock, worker in a.updates:
                        key = (shard, clock)
                        self.times_applied[key] = self.times_applied.get(key, 0) + 1
                        assert self.times_applied[key] == 1, f"{key} put in two batches"
                        assert worker not in self.lost
                self.batch = a
            elif isinstance(a, RunClockEnd):
                assert self.end is None and self.batch is None
                assert all(self.whole.get((s, a.clock)) for s in range(self.w.n_shards)), "clock end too early"
                self.end = a
            elif isinstance(a, StartRecovery):
                self.recovery = True
            elif isinstance(a, (SkipClock, StartRebuild)):
                pass

    @precondition(lambda self: hasattr(self, "w") and self.w.startable() and self.live())
    @rule(pick=st.integers(0, 100), who=st.integers(0, 3))
    def start(self, pick, who):
        w = self.w
        shard = w.startable()[pick % len(w.startable())]
        worker = self.live()[who % len(self.live())]
        clock = w.start(shard)
        self.current[shard] = (clock, worker, w.epoch)
        if w.rebuilding is None:
            assert clock <= w.floor + 1 + w.staleness  # the window bound
            for c in range(self.first_floor + 1, clock - w.staleness):  # reads see every update of clocks <= t - s - 1
                assert w.finished.get(c) in (ClockStatus.DONE, ClockStatus.SKIPPED), (clock, c)
            assert all(self.times_applied.get((shard, c)) == 1 for c in range(1, clock))  # its own earlier updates
            # a copy of the tables as new as the read floor and the shard's own update holds all of that:
            # newer than the version before each of those changes (within an epoch: a new one clears every copy)
            need = max(w.read_floor(shard), w.own_update(shard)[0])
            assert need <= w.version
            before = [v for (j, c), (e, v) in self.version_of.items() if e == w.epoch
                      and (c <= clock - w.staleness - 1 or (j, c) == (shard, clock - 1))]
            before += [v for c, (e, v) in self.end_version.items() if e == w.epoch and c <= clock - w.staleness - 1]
            assert all(v < need for v in before), (need, before)
            seen, writer = w.own_update(shard)  # whose attempt the tables hold (its worker may have it written back)
            assert writer is None or self.writer_of.get((shard, clock - 1)) == writer, (shard, clock, writer)
        self.running.append((shard, clock, worker, w.epoch))

    @precondition(lambda self: getattr(self, "running", None))
    @rule(i=st.integers(0, 100), roll=st.integers(0, 4))
    def finish(self, i, roll):
        fail = roll == 0
        shard, clock, worker, epoch = self.running.pop(i % len(self.running))
        if worker in self.lost:
            return
        current = self.current.get(shard) == (clock, worker, epoch)
        if fail:
            if current:  # the shard queue gives a shard back only when its last attempt failed
                self.w.give_back(shard)
            return
        was = self.w.phase(shard)
        assert self.w.accepts(shard, clock, epoch) == (current and was is ShardPhase.RUNNING
                                                       and epoch == self.w.epoch and not self.w.recovering
                                                       and (self.w.rebuilding is not None or clock <= self.w.limit))
        self.handle(self.w.commit(shard, clock, worker, epoch))
        if was is ShardPhase.RUNNING and self.w.phase(shard) is not ShardPhase.RUNNING:
            assert epoch == self.w.epoch, "a commit of work read before a restore was granted"

    @precondition(lambda self: getattr(self, "batch", None) is not None and not self.w.recovering)
    @rule()
    def batch_applied(self):
        b, self.batch = self.batch, None
        taken = b.batch == getattr(self.w.in_flight, "batch", None)
        if taken and not b.rebuild:
            for shard, clock, worker in b.updates:
                self.whole[(shard, clock)] = True
                self.writer_of[(shard, clock)] = worker
                self.version_of[(shard, clock)] = (self.w.epoch, self.w.version)
        self.handle(self.w.batch_applied(b.batch))

    @precondition(lambda self: getattr(self, "end", None) is not None and not self.w.recovering)
    @rule(stop=st.booleans())
    def clock_end_reports(self, stop):
        e, self.end = self.end, None
        version = self.w.version
        if self.w.clock_end_done(e.clock, e.epoch):
            self.ended.append(e.clock)
            self.end_version[e.clock] = (self.w.epoch, version)
            if stop:
                self.w.stop(e.clock)
        self.handle(self.w.go_on())

    @precondition(lambda self: hasattr(self, "w") and len(self.lost) < 3)
    @rule(x=st.sampled_from(WORKERS), clock_end_worker=st.booleans(), roll=st.integers(0, 5))
    def lose(self, x, clock_end_worker, roll):
        if x in self.lost or roll:  # a loss in one of six tries: runs get several clocks deep between
            return
        w = self.w
        self.lost.add(x)
        kind = OWNERS.get(x)
        in_flight = w.in_flight
        written_off = in_flight is not None and (kind is not None or any(u[2] == x for u in in_flight.updates))
        if written_off:
            self.batch = None
        if kind is not None:
            self.end = None  # a restore skips the clock end under way
        if kind is not None:  # a restore: open clocks that had updates applied cannot count
            self.must_skip |= {c for (_, c), whole in self.whole.items() if whole and c > w.floor}
        self.handle(w.lose(x, restores=kind is not None, reductions_lost=kind == "reduction",
                           owned_in_flight=kind is not None and in_flight is not None))
        for shard, (clock, worker, epoch) in list(self.current.items()):
            if worker == x:  # its attempts are gone: the queue gives their shards back
                del self.current[shard]
                self.w.give_back(shard)
        if clock_end_worker and self.end is not None:
            e, self.end = self.end, None
            self.handle(w.clock_end_failed(e.clock))

    @precondition(lambda self: getattr(self, "recovery", False))
    @rule()
    def recovered(self):
        self.recovery = False
        self.handle(self.w.recovered())

    @precondition(lambda self: hasattr(self, "w") and self.batch is None)
    @rule()
    def idle_worker_flushes(self):
        self.handle(self.w.flush())

    @precondition(lambda self: hasattr(self, "w"))
    @rule(more=st.integers(0, 3))
    def allow(self, more):
        self.handle(self.w.allow(self.w.limit + more))

    @invariant()
    def window_is_consistent(self):
        if hasattr(self, "w"):
            self.w.check()

    @invariant()
    def done_clocks_had_every_update_applied_once_and_whole(self):
        if hasattr(self, "w"):
            for c, status in self.w.finished.items():
                if status is ClockStatus.DONE:
                    assert all(self.times_applied.get((s, c)) == 1 and self.whole.get((s, c))
                               for s in range(self.w.n_shards)), c
            assert self.ended == sorted(set(self.ended))
            assert not self.must_skip & set(self.ended), "a clock whose applied updates a restore took back ended"

    @invariant()
    def the_job_can_always_go_on(self):
        if not hasattr(self, "w") or self.w.done:
            return
        w = self.w
        assert (self.recovery or w.startable() or self.running or self.batch is not None
                or self.end is not None or w.floor >= w.limit), w


TestWindowFuzz = WindowFuzz.TestCase
TestWindowFuzz.settings = settings(max_examples=300, stateful_step_count=100, deadline=None,
                                   suppress_health_check=[HealthCheck.too_slow])


def test_no_attempt_of_a_clock_shares_an_epoch_with_the_rebuild_commits_of_its_shard():
    """The rebuild pass's commits are applied tagged with each shard's next clock (the worker records
    them per shard: ``ShardStore.lost``); were that clock's attempts handed out under the rebuild's
    epoch, every one would read as an attempt that lost to them (bench.chaos --kinds kill-clock
    --seed 38 hung: every attempt after the recovery stopped)."""
    from dscar.worker.shard_store import ShardStore

    w = ClockWindow(n_shards=2, staleness=1, has_rebuild=True, limit=5)
    for shard in (0, 1):
        w.batch_applied(_one(w.commit(shard, w.start(shard), "a", w.epoch), ApplyBatch).batch)
    _one(w.lose("b", restores=True), StartRecovery)
    rebuild = _one(w.recovered(), StartRebuild)
    w.start(0), w.start(1)
    w.commit(0, 0, "a", rebuild.epoch)
    batch = _one(w.commit(1, 0, "a", rebuild.epoch), ApplyBatch)
    assert batch.rebuild and batch.epoch == rebuild.epoch
    store = ShardStore()
    store.install([(s, 0, "a", w.shard_clock(s)) for s, _, _ in batch.updates], "a", 0, batch.epoch)
    w.batch_applied(batch.batch)
    clock = w.start(0)
    assert clock == 2 and w.epoch > rebuild.epoch
    assert not store.lost(0, w.epoch, clock)  # the attempt runs; under the rebuild's epoch it would not
    assert store.lost(0, rebuild.epoch, clock)
    w.check()
