"""The clock state machine and the job's decisions, driven without a cluster.

``JobFuzz`` is a Hypothesis rule-based state machine: it plays the coordinator's
glue and the workers around a real ``JobState`` (clock machine, shard queue,
ownership map, checkpoint ledger) and fires commits, backups, late failures,
losses at every stage and losses during a recovery in any order, checking the
invariants of ``dscar.core.clock`` after every step.
"""
from __future__ import annotations


import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dscar.checkpoint import CheckpointConfig
from dscar.core.clock import Apply, ClockError, ClockMachine, Recover, RunClockEnd, Skip, Stage, StartPass
from dscar.core.job import ApplyPass, BeginClock, Checkpoint, JobConfig, JobState, Mirror, StartRecovery
from dscar.core.partitions import PartitionMap, TableLayout
from dscar.core.policies import BackupPolicy
from dscar.core.shards import ShardQueue

WORKERS = ["w0", "w1", "w2", "w3"]


# ----------------------------------------------------------- the machine alone
def test_a_clock_without_faults_runs_every_phase_then_the_clock_end():
    m = ClockMachine(n_phases=2)
    [p0] = m.begin(1)
    assert p0 == StartPass(m.run_id, 0) and m.stage is Stage.SHARDS
    [a] = m.pass_complete(m.run_id)
    assert isinstance(a, Apply) and a.reset_reductions and not a.reset_rebuild
    [p1] = m.applied(m.run_id)
    assert p1.data_phase == 1 and p1.run_id > p0.run_id
    [a] = m.pass_complete(m.run_id)
    assert not a.reset_reductions
    [end] = m.applied(m.run_id)
    assert isinstance(end, RunClockEnd) and m.stage is Stage.CLOCK_END
    assert m.clock_end_done(m.run_id) and m.stage is Stage.DONE and m.finished


def test_a_loss_before_anything_was_applied_redoes_the_first_pass_without_a_rebuild():
    """Nothing holds the data's contributions yet: the redone pass computes the rebuild tables
    itself (a rebuild pass as well would count them twice: Lasso's clock 1 adds its moments)."""
    m = ClockMachine(has_rebuild=True)
    m.begin(1)
    m.lose(restores=True)
    [redo] = m.recovered()
    assert redo.data_phase == 0 and redo.redo and m.stage is Stage.SHARDS
    m.applied(m.pass_complete(m.run_id)[0].run_id)
    m.clock_end_done(m.run_id)
    m.begin(2)
    m.lose(restores=True)  # now the tables hold clock 1's contributions: rebuild them
    [rebuild] = m.recovered()
    assert rebuild.data_phase is None and m.stage is Stage.REBUILD


def test_a_loss_in_a_pass_redoes_it_after_a_rebuild_and_stale_work_is_refused():
    m = ClockMachine(n_phases=2, has_rebuild=True)
    m.begin(1)
    m.applied(m.pass_complete(m.run_id)[0].run_id)  # phase 0 applied
    old = m.run_id
    [rec] = m.lose(restores=True)
    assert isinstance(rec, Recover) and m.recovering
    assert m.pass_complete(old) == [] and not m.accepts(old)  # nothing completes while recovering
    assert m.lose(restores=True) == []  # a second loss extends the recovery
    [rebuild] = m.recovered()
    assert rebuild.data_phase is None and rebuild.redo and m.stage is Stage.REBUILD
    [a] = m.pass_complete(m.run_id)
    assert a.reset_rebuild
    [again] = m.applied(m.run_id)
    assert again.data_phase == 1 and m.stage is Stage.SHARDS  # phase 0 is not redone


def test_a_loss_while_applying_skips_the_clock_and_its_clock_end():
    m = ClockMachine()
    m.begin(1)
    run = m.run_id
    m.pass_complete(run)
    m.lose(restores=True)
    assert m.applied(run) == []  # the apply that was under way reports too late
    [skip] = m.recovered()
    assert isinstance(skip, Skip) and m.stage is Stage.SKIPPED and m.finished
    assert not m.clock_end_done(m.run_id)
    m.begin(2)  # the next clock runs normally


def test_a_reduction_lost_after_an_earlier_phase_skips_the_clock_end():
    m = ClockMachine(n_phases=2)
    m.begin(1)
    m.applied(m.pass_complete(m.run_id)[0].run_id)
    m.lose(restores=True, reductions_lost=True)
    [redo] = m.recovered()
    assert redo.redo and redo.data_phase == 1
    m.pass_complete(m.run_id)
    [skip] = m.applied(m.run_id)
    assert isinstance(skip, Skip) and m.stage is Stage.SKIPPED


def test_the_clock_end_worker_lost_skips_the_clock():
    m = ClockMachine()
    m.begin(1)
    m.pass_complete(m.run_id)
    m.applied(m.run_id)
    run = m.run_id
    [skip] = m.clock_end_failed()
    assert isinstance(skip, Skip) and not m.clock_end_done(run)


def test_the_next_clock_begins_with_the_last_apply_and_its_applies_wait_for_that_clocks_end():
    m = ClockMachine(n_phases=2)
    m.begin(1)
    m.applied(m.pass_complete(m.run_id)[0].run_id)
    with pytest.raises(ClockError):
        m.apply_ahead()  # not applying
    m.pass_complete(m.run_id)
    with pytest.raises(ClockError):
        ClockMachine().apply_ahead()
    first = m.run_id
    m.apply_ahead()  # clock 1's last pass is being applied: clock 2 may begin now
    [start] = m.begin(2)
    assert m.ending == (1, first) and m.ending_applying and start.run_id > first
    assert m.pass_complete(m.run_id) == [] and m.held is not None  # clock 2's first apply waits for clock 1's end
    assert not m.ending_applied(m.run_id) and m.ending_applied(first) and not m.ending_applied(first)
    assert m.ended_ahead(first, ran=True)  # its clock end counts
    [held] = m.release_held()
    assert held.run_id == m.run_id and held.reset_reductions


def test_a_clock_end_ahead_whose_apply_was_cut_short_does_not_count():
    m = ClockMachine()
    m.begin(1)
    m.pass_complete(m.run_id)
    first = m.run_id
    m.apply_ahead()
    m.begin(2)
    assert not m.ended_ahead(first, ran=True)  # (reported before its apply ended: a loss cut it short)
    assert m.ending is None and not m.ending_applying


def test_transitions_out_of_order_are_refused():
    m = ClockMachine()
    with pytest.raises(ClockError):
        m.recovered()
    m.begin(1)
    with pytest.raises(ClockError):
        m.begin(2)  # clock 1 is not finished
    m.lose(restores=True)
    with pytest.raises(ClockError):
        m.begin(2)


def test_a_loss_that_takes_nothing_changes_nothing():
    m = ClockMachine()
    m.begin(1)
    run = m.run_id
    assert m.lose(restores=False) == [] and m.accepts(run) and not m.recovering


# ------------------------------------------------------------ batches
def _two_worker_job(n_shards: int = 8) -> JobState:
    pmap = PartitionMap([TableLayout("x", 8, 2)])
    pmap.assign(["a", "b"])
    queue = ShardQueue(n_shards, reloadable=False)
    for s in range(n_shards):
        queue.set_holder(s, "a" if s < n_shards // 2 else "b")
    job = JobState(JobConfig("j", n_shards, {"x": "param"}, [], [""]), queue, pmap)
    job.workers = ["a", "b"]
    return job


def _run_clock(job: JobState, clock: int, step_s: float) -> list[list[int]]:
    """One clock with ``a`` taking items until none is left; ``b`` never asks. The batches ``a`` got."""
    job.begin(clock, 0.0)
    batches = []
    while (item := job.next_item("a", 0.0)) is not None and item["op"] == "shard":
        batches.append([m["shard"] for m in item["shards"]])
        for m in item["shards"]:
            job.commit("a", clock, item["run"], m["shard"], m["attempt"], 0.0, {"compute_s": step_s})
    return batches


def test_short_steps_come_in_batches_of_the_workers_own_shards_and_long_steps_as_its_share_of_the_pass():
    job = _two_worker_job()
    # measured after its second step (the first is a warm-up)
    assert _run_clock(job, 1, 0.001) == [[0], [1], [2, 3], [7], [6], [5], [4]]
    job.applied(job.machine.run_id, 0.0)
    job.clock_end_done(job.next_item("b", 0.0) and "b", job.machine.run_id, {"objective": 1.0}, 0.0, 0.0)
    # b's shards moved to a in clock 1: all 8 are a's own now; 0.01 s / 0.001 s allows batches of 10
    assert _run_clock(job, 2, 0.001) == [[0, 1, 2, 3, 4, 5, 6, 7]]
    # long steps: once measured, the worker's share of the pass in one item (b, not measured, counts
    # as fast as a: a's share is 4), so a's own 2 and 3 together; another's shards move one by one
    slow = _two_worker_job()
    assert _run_clock(slow, 1, 0.05) == [[0], [1], [2, 3], [7], [6], [5], [4]]
    # ... at most ~2 s of steps an item (a commit comes that often): 1.5 s steps one by one
    slower = _two_worker_job()
    assert _run_clock(slower, 1, 1.5) == [[0], [1], [2], [3], [7], [6], [5], [4]]


def test_an_idle_worker_gets_back_the_batch_members_not_started_yet():
    job = _two_worker_job()
    _run_clock(job, 1, 0.001)
    job.applied(job.machine.run_id, 0.0)
    job.clock_end_done(job.next_item("b", 0.0) and "b", job.machine.run_id, {"objective": 1.0}, 0.0, 0.0)
    job.begin(2, 0.0)
    item = job.next_item("a", 0.0)
    assert [m["shard"] for m in item["shards"]] == list(range(8))
    assert job.next_item("b", 0.0) is None  # nothing TODO: b may only ask a for some back
    victim, members = job.releasable("b")
    assert victim == "a" and [s for s, _ in members] == [4, 5, 6, 7]  # the later half of those not started
    job.released("a", members, [m for m in members if m[0] != 4], 1.0)  # a had started shard 4 meanwhile
    assert job.events[-1]["kind"] == "batch-released" and job.events[-1]["shards"] == [5, 6, 7]
    assert job.releasable("b") is None  # released shards are TODO: b takes them, one by one
    for shard in (7, 6, 5):
        got = job.next_item("b", 0.0)
        assert [m["shard"] for m in got["shards"]] == [shard] and got["shards"][0]["fetch_from"] == "a"
    att = {m["shard"]: m["attempt"] for m in item["shards"]}
    n_events = len(job.events)
    job.released("a", [(5, att[5])], [(5, att[5])], 1.5)  # a's commit names what it gave back again
    assert len(job.events) == n_events and [a.worker for a in job.queue.running_attempts(5)] == ["b"]
    assert job.item_of == {"a": item["item"], "b": got["item"]} and got["item"] == item["item"] + 3
    assert job.releasable("b") == ("a", [(2, att[2]), (3, att[3])])  # 1..3 not asked yet; 4..7 never again
    # a's late commit of a released attempt is refused; its other members commit
    assert not job.commit("a", 2, item["run"], 5, item["shards"][5]["attempt"], 1.0)[0]
    assert job.commit("a", 2, item["run"], 4, item["shards"][4]["attempt"], 1.0)[0]


def test_with_the_memory_tier_every_clock_end_copies_each_owner_to_the_next_worker_before_reporting():
    from dscar.core.job import Mirror

    pmap = PartitionMap([TableLayout("x", 8, 3), TableLayout("r", 2, 1)])
    pmap.assign(["a", "b", "c"])
    queue = ShardQueue(2, reloadable=True)
    ckpt = CheckpointConfig("memory://m", policy="priority", every=10, fraction=0.1, memory=True)
    job = JobState(JobConfig("j", 2, {"x": "param", "r": "reduction"}, [], [""], ckpt), queue, pmap)
    job.workers = ["a", "b", "c"]
    job.begin(1, 0.0)
    for w in ("a", "b"):
        m = job.next_item(w, 0.0)["shards"][0]
        job.commit(w, 1, job.machine.run_id, m["shard"], m["attempt"], 0.0, {"compute_s": 1.0})  # (items of 1)
    job.applied(job.machine.run_id, 0.0)
    job.next_item("a", 0.0)  # the clock-end step
    effects = job.clock_end_done("a", job.machine.run_id, {"objective": 1.0}, 0.0, 0.0)
    [mirror] = [e for e in effects if isinstance(e, Mirror)]
    assert mirror.clock == 1 and mirror.buddies == {"a": "b", "b": "c", "c": "a"}
    assert job.machine.finished and not job.report_ready  # not before every owner has taken its copy
    assert job.snapshotting == {"checkpoint", "mirror"}  # (a priority checkpoint is due every clock here)
    job.snapshotting.discard("checkpoint")
    assert not job.report_ready
    job.snapshotting.discard("mirror")
    assert job.report_ready
    job.mirrored("c", 1, [["x", 1]], 0.0, shards=[0])
    job.mirrored("c", 0, [["x", 1]], 0.0, shards=[0])  # an older copy's late report changes nothing
    assert job.mirrors == {("x", 1): ("c", 1)} and job.state_mirrors == {0: ("c", 1)}
    job.lose("c", 0.0)
    assert job.mirrors == {} and job.state_mirrors == {}  # c's memory went with it


def test_a_shard_state_planned_from_a_buddy_lost_before_the_shard_ran_comes_from_the_file_or_is_none():
    """Found by bench.chaos (a hang, then a second loss): the restored shard's attempt asked the hung
    buddy for the copy and waited out the message deadline (10 s) per shard."""
    from dscar.core.ledger import INITIAL_STATE

    pmap = PartitionMap([TableLayout("x", 8, 3)])
    pmap.assign(["a", "b", "c"])
    ckpt = CheckpointConfig("memory://m", policy="full", every=10, memory=True)
    job = JobState(JobConfig("j", 2, {"x": "param"}, ["x"], [""], ckpt), ShardQueue(2, reloadable=True), pmap)
    job.workers = ["a", "b", "c"]
    job.state_mirrors = {0: ("c", 3), 1: ("c", 3)}
    for s in (0, 1):
        job.queue.set_holder(s, "a")
    job.lose("a", 0.0)
    plan = job.plan_recovery(["b", "c"])
    assert plan.states == {0: {"memory": "c", "clock": 3, "file": None}, 1: {"memory": "c", "clock": 3, "file": None}}
    job.recovery_planned(plan, 0.0)
    job.restore_state[1] = {**job.restore_state[1], "file": {"path": "v1/states"}}  # shard 1 was saved too
    job.lose("c", 0.0)  # the buddy goes before either shard ran
    assert job.restore_state == {0: INITIAL_STATE, 1: {"path": "v1/states"}}


def test_a_shard_whose_only_copy_went_with_an_unapplied_commit_has_its_state_restored():
    """Found by bench.chaos (stop 23, a monkey kill): the lost worker had committed, not yet applied, an
    attempt of a shard it had fetched; its commit is voided (the holder unset), and the state it held must
    still come back from the checkpoint, or the next attempt starts from none."""
    pmap = PartitionMap([TableLayout("x", 8, 2)])
    pmap.assign(["a", "b"])
    ckpt = CheckpointConfig("memory://m", policy="full", every=10)
    job = JobState(JobConfig("j", 2, {"x": "param"}, ["x"], [""], ckpt), ShardQueue(2, reloadable=True), pmap)
    job.workers = ["a", "b"]
    job.queue.set_holder(0, "a")
    job.queue.set_holder(1, "b")
    job.begin(1, 0.0)
    item = job.next_item("b", 0.0)  # b takes its own shard 1 and commits it; shard 0 still runs on a
    assert [m["shard"] for m in item["shards"]] == [1]
    assert job.commit("b", 1, item["run"], 1, item["shards"][0]["attempt"], 0.0)[0]
    job.lose("b", 0.0)
    assert 1 in job.lost_shards and job.queue.holder(1) is None


def _take_all(job: JobState, worker: str) -> dict | None:
    """``worker`` runs and commits every shard it is handed until something else than a shard comes."""
    while (item := job.next_item(worker, 0.0)) is not None and item["op"] in ("shard", "rebuild"):
        for m in item["shards"]:
            job.commit(worker, item["clock"], item["run"], m["shard"], m["attempt"], 0.0,
                       rebuild=item["op"] == "rebuild")
        if job.machine.stage is Stage.APPLY:
            return item
    return item


@pytest.mark.parametrize("memory", [False, True])
def test_a_rebuild_pass_names_the_rows_a_checkpoint_restored_until_it_is_applied(memory):
    """``ShardContext.restored`` (ALS re-solves those rows): the rows of the partitions put back from a
    checkpoint, in every rebuild item until the rebuild pass is applied; a buddy's memory copy is not
    listed (here one older than the clock's start: an exact one keeps the pass, with no rebuild)."""
    pmap = PartitionMap([TableLayout("x", 8, 2)])  # rows [0, 4) and [4, 8)
    pmap.assign(["a", "b"])
    ckpt = CheckpointConfig("memory://m", policy="full", every=10, memory=memory)
    job = JobState(JobConfig("j", 2, {"x": "param"}, ["x"], [""], ckpt), ShardQueue(2, reloadable=True), pmap)
    job.workers = ["a", "b"]
    job.begin(1, 0.0)
    assert _take_all(job, "a")["op"] == "shard"
    job.applied(job.machine.run_id, 0.0)
    job.clock_end_done(job.next_item("a", 0.0) and "a", job.machine.run_id, {"objective": 1.0}, 0.0, 0.0)
    job.begin(2, 0.0)
    job.lose("b", 0.0)
    plan = job.plan_recovery(["a"])
    covered = job.recovery_planned(plan, 0.0)
    for key, target in plan.restores.items():
        job.restored(key, target, plan.version, 0.0, memory_clock=0 if memory else None)
    job.recovered(covered, 0.0)
    item = _take_all(job, "a")
    assert item["op"] == "rebuild"
    assert item.get("restored") == (None if memory else {"x": [[4, 8]]})
    job.applied(job.machine.run_id, 0.0)
    assert not job.restored_rows
    item = job.next_item("a", 0.0)
    assert item["op"] == "shard" and "restored" not in item


def _kept_pass_job() -> JobState:
    """Three workers each holding two shards, a memory tier, clock 1 done with every partition copied
    to its buddy, clock 2 begun."""
    pmap = PartitionMap([TableLayout("x", 9, 3)])
    pmap.assign(["a", "b", "c"])
    queue = ShardQueue(6, reloadable=True)
    ckpt = CheckpointConfig("memory://m", policy="full", every=10, memory=True)
    job = JobState(JobConfig("j", 6, {"x": "param"}, [], [""], ckpt), queue, pmap)
    job.workers = ["a", "b", "c"]
    job.begin(1, 0.0)
    for w in "abc" * 2:
        m = job.next_item(w, 0.0)["shards"][0]
        job.commit(w, 1, job.machine.run_id, m["shard"], m["attempt"], 0.0, {"compute_s": 1.0})  # (items of 1)
    job.applied(job.machine.run_id, 0.0)
    job.clock_end_done(job.next_item("a", 0.0) and "a", job.machine.run_id, {"objective": 1.0}, 0.0, 0.0)
    for owner, buddy in zip("abc", "bca"):
        job.mirrored(buddy, 1, [list(k) for k in pmap.owned_by(owner)], 0.0)
    job.begin(2, 0.0)
    return job


def _restore_all(job: JobState, memory_clock: int | None) -> list:
    plan = job.plan_recovery([w for w in job.workers if w not in job.lost])
    covered = job.recovery_planned(plan, 0.0)
    for key, target in plan.restores.items():
        job.restored(key, target, plan.version, 0.0, memory_clock=memory_clock)
    return job.recovered(covered, 0.0)


@pytest.mark.parametrize("exact", [True, False])
def test_a_loss_keeps_the_pass_only_when_every_restore_is_a_memory_copy_of_the_clocks_start(exact):
    """A kill in the first data pass, its partition restored from its buddy's copy of clock 1 (what the
    pass reads): the live workers' commits stay, their running attempt commits during the recovery,
    and only the lost worker's shards run again, under the same run id; each shard is applied once.
    A copy of an older clock is not what the pass read: the pass runs again from its start."""
    job = _kept_pass_job()
    run = job.machine.run_id
    lost_c = job.next_item("c", 0.0)["shards"]  # its own shards (c ran them in clock 1)
    committed_a, running_a = job.next_item("a", 0.0)["shards"]
    assert job.commit("a", 2, run, committed_a["shard"], committed_a["attempt"], 0.0)[0]
    done = {committed_a["shard"]}
    for m in job.next_item("b", 0.0)["shards"]:
        assert job.commit("b", 2, run, m["shard"], m["attempt"], 0.0)[0]
        done.add(m["shard"])
    job.lose("c", 0.0)
    assert job.machine.recovering and job.machine.run_id == run  # (kept until the restores say otherwise)
    assert job.next_item("a", 0.0) is None  # nothing is handed out while the partitions come back
    granted, _ = job.commit("a", 2, run, running_a["shard"], running_a["attempt"], 0.0)
    assert granted  # its updates are staged on a, computed from what the pass reads
    effects = _restore_all(job, memory_clock=1 if exact else 0)
    if not exact:
        assert job.machine.run_id > run and job.queue.counts()["done"] == 0
        assert any(e["kind"] == "clock-restarted" for e in job.events)
        return
    assert job.machine.run_id == run and not effects
    assert [e for e in job.events if e["kind"] == "pass-kept"][0]["committed"] == 4
    todo = set()
    while (item := job.next_item("b", 0.0)) is not None and item["op"] == "shard":
        for m in item["shards"]:
            todo.add(m["shard"])
            granted, effects = job.commit("b", 2, item["run"], m["shard"], m["attempt"], 0.0)
            assert granted and item["run"] == run
    assert todo == {m["shard"] for m in lost_c} and not todo & (done | {running_a["shard"]})
    [apply] = [e for e in effects if isinstance(e, ApplyPass)]
    assert sorted(s for s, _, _ in apply.committed) == list(range(6)) and apply.run_id == run


# ------------------------------------------------------------ the job, fuzzed
class JobFuzz(RuleBasedStateMachine):
    """Plays coordinator and workers around a real JobState; checks exactly-once and the clock rules."""

    @initialize(phases=st.sampled_from([(6,), (3, 3)]), rebuild=st.booleans(),
                policy=st.sampled_from(["full", "priority"]), recovery=st.sampled_from(["partial", "full"]),
                backups=st.booleans(), step_s=st.sampled_from([0.0005, 0.05]), fold=st.booleans(),
                memory=st.booleans(), ahead=st.booleans(), with_apply=st.booleans())
    def setup(self, phases, rebuild, policy, recovery, backups, step_s=0.05, fold=False, memory=False, ahead=False,
              with_apply=False):
        n_shards = sum(phases)
        names = ["a", "b"][: len(phases)] if len(phases) > 1 else [""]
        layouts = [TableLayout("x", 8, 4), TableLayout("r", 4, 2)]
        pmap = PartitionMap(layouts)
        pmap.assign(WORKERS)
        queue = ShardQueue(n_shards, reloadable=True, max_failures=3, phases=list(phases))
        ckpt = CheckpointConfig("memory://fuzz", policy=policy, every=2, fraction=0.5, recovery=recovery,
                                memory=memory)
        cfg = JobConfig("job", n_shards, {"x": "param", "r": "reduction"}, ["x"] if rebuild else [], names, ckpt)
        self.job = JobState(cfg, queue, pmap, policies=[BackupPolicy(k=0.001)] if backups else [])
        self.job.workers = list(WORKERS)
        self.job.schedule.fold_clock_end = fold  # the clock end folded into the last apply (``BspSchedule._fold``)
        self.folds = 0  # folded clock ends that reported
        if ahead and fold:  # a clock end that only reads runs while the next clock begins (``BspSchedule.applied``)
            s = self.job.schedule
            s.ahead_ok = s.auto_begin = True
            s.auto_until = 6
            s.with_apply_ok = with_apply
        self.ahead_out: dict | None = None  # the fold item of the clock end running ahead, until it reports
        self.ahead_value: dict | None = None  # the tables as that clock end reads them
        self.begin_ahead: int | None = None  # the clock a ``BeginClock(ahead=True)`` begins, once carried out
        self.aheads = 0  # clock ends that ran ahead of the next clock and counted
        self.withdrawn = 0  # clocks begun ahead and withdrawn (the clock end said stop)
        #: the coordinator tells the job each apply it sends (``JobState.applying``): the next clock may begin with it
        self.with_apply = with_apply and ahead and fold
        self.with_applies = 0  # clocks begun with their previous clock's apply
        #: attempts taken while that apply was under way: their worker takes them up once it applied (its
        #: reads are the tables as that apply left them), and sees their run only then
        self.parked: dict[tuple[int, int], str] = {}
        self.now = 1.0
        self.inflight: dict[tuple[int, int], dict] = {}  # (shard, attempt) -> item, running on item["worker"]
        self.given_late: dict[str, list[tuple[int, int]]] = {}  # released unheard: its batch's commit names them
        self.clock_end: dict | None = None
        self.staged: dict[tuple[int, int, int], int] = {}  # (clock, shard, attempt) -> run id staged under
        self.applies: list[ApplyPass] = []
        self.applied: dict[tuple[int, int], int] = {}  # (clock, shard) -> times applied
        self.clock_end_ran: set[int] = set()
        self.skipped: set[int] = set()
        self.plan = None
        self.restored_since: dict[str, list[list[int]]] = {}  # rows restored since the last applied rebuild
        self.recovery_started = False
        self.last_run = 0
        self.failures: dict[tuple[int, int], int] = {}
        self.step_s = step_s  # short steps: a worker's own shards come in batches
        self.batches = 0  # work items with more than one attempt
        self.released = 0  # batch members given back unstarted
        self.released_unheard = 0  # of them, those the coordinator heard of from the batch's commit
        # where shard data lives, as the workers' shard stores (dscar.worker.shard_store) keep it
        self.has: dict[str, set[int]] = {w: set() for w in WORKERS}  # shards in each worker's store
        self.pending: set[tuple[str, int, int, int]] = set()  # (worker, clock, shard, attempt) staged there
        self.run_seen = {w: -1 for w in WORKERS}  # the newest run id each worker was given work in
        self.copies_checked = 0
        # what the param table's partitions hold, as value ids: a new id whenever a partition changes
        # (an apply, a clock end, a restore from disk); a memory copy holds the id it was taken with
        self.value = {("x", p): 0 for p in range(4)}
        self.new_value = 1
        self.copies: dict[tuple[tuple[str, int], int], int] = {}  # (key, clock) -> the id the buddy holds
        self.mirrors_sent: list[tuple[int, dict[str, str], dict]] = []  # memory copies on their way
        self.reads: dict[tuple[int, int, int], dict] = {}  # (clock, shard, attempt) -> the ids it read
        self.kept = 0  # losses whose pass went on (``pass-kept``)

    # ------------------------------------------------------------ glue
    def change(self, keys) -> None:
        for key in keys:
            self.value[key], self.new_value = self.new_value, self.new_value + 1

    def tick(self) -> float:
        self.now += 0.01
        return self.now

    def live(self) -> list[str]:
        return [w for w in WORKERS if w not in self.job.lost]

    def handle(self, effects) -> None:
        for e in effects:
            if isinstance(e, ApplyPass):
                self.applies.append(e)
                begun = self.job.applying(e.run_id, self.tick())  # (``Coordinator._apply_pass`` as it sends it)
                assert self.with_apply or not begun
                self.with_applies += bool(begun)
                self.handle(begun)
            elif isinstance(e, StartRecovery):
                self.recovery_started = True
            elif isinstance(e, Mirror):  # each owner snapshots its param partitions now; they arrive later
                parts = {o: [k for k in self.value if self.job.pmap.owners[k] == o] for o in e.buddies}
                self.mirrors_sent.append((e.clock, dict(e.buddies), {o: {k: self.value[k] for k in ks}
                                                                     for o, ks in parts.items()}))
                self.handle(self.job.snapshotted("mirror", self.tick()))
            elif isinstance(e, Checkpoint):
                for w, shards in e.writers.items():
                    files = [{"table": t, "part": p, "bytes": 1, "path": f"{e.version}/{t}{p}"}
                             for (t, p) in self.job.pmap.owned_by(w) if t == "x"]
                    if shards:
                        files.append({"kind": "state", "shards": shards, "bytes": 1, "path": f"{e.version}/s"})
                    self.job.checkpoint_written(e.version, w, files, None, self.tick())
                self.handle(self.job.snapshotted("checkpoint", self.tick()))  # (as ``Coordinator._checkpoint``)
            elif isinstance(e, BeginClock):
                assert e.ahead, e  # (the fuzz's folded clock ends evaluate no stopping rule)
                self.begin_ahead = e.clock
        if self.job.machine.stage is Stage.SKIPPED:
            self.skipped.add(self.job.clock)

    # ----------------------------------------------------------- rules
    @precondition(lambda self: hasattr(self, "job") and not self.job.failed and not self.job.machine.recovering
                  and self.job.machine.stage in (Stage.IDLE, Stage.DONE, Stage.SKIPPED) and self.job.clock < 6
                  and self.begin_ahead is None)
    @rule()
    def begin(self):
        self.handle(self.job.begin(self.job.clock + 1, self.tick()))

    @rule(w=st.sampled_from(WORKERS))
    def take(self, w):
        if w in self.job.lost:
            return
        self.name_given_late(w)  # (a worker asks once its batch is committed)
        item = self.job.next_item(w, self.tick())
        if item is None:
            return
        item["worker"] = w
        parked = self.job.machine.ending_applying  # (the worker takes it up once its apply is done)
        if not parked:
            self.run_seen[w] = max(self.run_seen[w], item["run"])
        if item["op"] == "clock_end":
            self.clock_end = item
            return
        if item["op"] == "rebuild":  # its steps see every row restored since the last applied rebuild
            assert item.get("restored", {}) == self.restored_since, (item.get("restored"), self.restored_since)
        self.batches += len(item["shards"]) > 1
        for member in item["shards"]:
            self.reads[(item["clock"], member["shard"], member["attempt"])] = dict(self.value)  # a batch's attempts commit, fail or are lost one by one
            attempt = {**item, **member}
            del attempt["shards"]
            attempt["holder"] = self.job.queue.holder(member["shard"])  # at hand-out
            self.inflight[(member["shard"], member["attempt"])] = attempt
            if parked:
                self.parked[(member["shard"], member["attempt"])] = w

    def take_up_parked(self) -> None:
        """The apply the parked attempts waited for ended: their workers take them up, reading the tables now."""
        for key, w in self.parked.items():
            item = self.inflight.get(key)
            if item is not None:
                self.reads[(item["clock"], item["shard"], item["attempt"])] = dict(self.value)
                self.run_seen[w] = max(self.run_seen[w], item["run"])
        self.parked = {}

    def runnable(self) -> list[tuple[int, int]]:
        return [k for k in sorted(self.inflight) if k not in self.parked]

    def run_attempt(self, item: dict) -> None:
        """The attempt gets its shard as ``ShardStore.claim`` and the runner do; an attempt of the
        open pass must find it where the queue said (the holder), unless that worker was lost."""
        w, shard = item["worker"], item["shard"]
        source = item["fetch_from"] or item["holder"]
        if item["fetch_from"]:
            self.has[w].discard(shard)  # a stale copy
        current = item["run"] == self.job.machine.run_id and self.job.machine.handing_out  # its pass is open
        if source is not None and source not in self.job.lost and current:
            assert shard in self.has[source], f"shard {shard}: {source} should hold it and does not ({item})"
            self.copies_checked += 1
        self.has[w].add(shard)  # held here from now on, a backup's copy too (the holder keeps its copy)
        self.pending.add((w, item["clock"], shard, item["attempt"]))

    @precondition(lambda self: getattr(self, "inflight", None))
    @rule(i=st.integers(0, 50))
    def stage_and_commit(self, i):
        keys = self.runnable()
        if not keys:
            return
        key = keys[i % len(keys)]
        item = self.inflight.pop(key)
        self.run_attempt(item)
        self.name_given_late(item["worker"])
        self.staged[(item["clock"], item["shard"], item["attempt"])] = item["run"]
        granted, effects = self.job.commit(item["worker"], item["clock"], item["run"], item["shard"],
                                           item["attempt"], self.tick(), {"compute_s": self.step_s},
                                           rebuild=item["op"] == "rebuild")
        self.handle(effects)

    @precondition(lambda self: getattr(self, "inflight", None))
    @rule(w=st.sampled_from(WORKERS), give=st.integers(0, 3), unheard=st.booleans())
    def idle_worker_takes_back(self, w, give, unheard=False):
        """``w`` finds nothing to do: a batch's worker gives back up to ``give`` members it had not
        started (here: any still in flight), the others count as started. ``unheard``: the answer
        comes too late, so the coordinator hears of them only from the batch's commit (its worker
        still runs another of its attempts)."""
        ask = self.job.releasable(w)
        if ask is None:
            return
        victim, members = ask
        back = [m for m in members if m in self.inflight and self.inflight[m]["worker"] == victim][:give]
        unheard = unheard and any(v["worker"] == victim and k not in back for k, v in self.inflight.items())
        for m in back:
            del self.inflight[m]
            self.parked.pop(m, None)
        self.released += len(back)
        if unheard:
            self.given_late.setdefault(victim, []).extend(back)
            self.released_unheard += len(back)
            self.job.released(victim, members, [], self.tick())
        else:
            self.job.released(victim, members, back, self.tick())

    def name_given_late(self, w: str) -> None:
        """``w``'s commit names the members it gave back (``released``): ``_h_commit``."""
        back = self.given_late.pop(w, [])
        if back:
            self.job.released(w, back, back, self.tick())

    @precondition(lambda self: getattr(self, "inflight", None))
    @rule(i=st.integers(0, 50))
    def attempt_fails(self, i):
        keys = self.runnable()
        if not keys:
            return
        key = keys[i % len(keys)]
        if self.failures.get(key[:1] + (self.job.clock,), 0) >= 1:
            return  # one failure per shard and clock: the limit of 3 is tested in test_shards
        item = self.inflight.pop(key)
        self.run_attempt(item)  # (it failed after getting its data)
        self.name_given_late(item["worker"])  # (its batch's commit, or one with released members only)
        self.failures[key[:1] + (self.job.clock,)] = 1
        self.job.attempt_failed(item["worker"], item["clock"], item["run"], item["shard"], item["attempt"],
                                "boom", self.tick())

    @precondition(lambda self: getattr(self, "applies", None))
    @rule(installed=st.sets(st.sampled_from(WORKERS)), folded_ran=st.booleans())
    def owners_apply(self, installed, folded_ran=True):
        """The owners apply; a clock end folded into the apply (``ApplyPass.clock_end``) reports with
        its worker's answer (``folded_ran``) or did not run there (an owner that had not applied in
        time, a stop): then the item path hands it out."""
        e = self.applies.pop(0)
        ending = self.job.schedule.ending
        with_apply = ending is not None and ending.run == e.run_id and self.job.machine.ending_applying
        if any(w in self.job.lost for _, _, w in e.committed):
            # an owner cannot collect a lost worker's updates: its apply fails (the loss decided);
            # the workers in ``installed`` needed none and applied
            self.install(e, [w for w in installed if w in self.live()])
            if with_apply:  # (``Coordinator._apply``: cut short; the clock end's outcome is asked all the same)
                self.job.apply_cut(e.run_id, self.tick(), "a worker was lost")
                self.take_up_parked()
                self.ahead_out, self.ahead_value = dict(e.clock_end), dict(self.value)
            return
        self.install(e, self.live())
        current = with_apply or e.run_id == self.job.machine.run_id and self.job.machine.stage is Stage.APPLY
        for shard, attempt, _ in e.committed:
            run = self.staged.get((e.clock, shard, attempt))
            assert run == e.run_id, f"an attempt of run {run} applied in run {e.run_id}"
            if current:  # what it read is what the tables hold now: no loss changed them under it
                assert self.reads[(e.clock, shard, attempt)] == self.value, \
                    (e.clock, shard, attempt, self.reads[(e.clock, shard, attempt)], self.value)
            if not e.rebuild:  # the rebuild pass's contributions are not the clock's updates
                self.applied[(e.clock, shard)] = self.applied.get((e.clock, shard), 0) + 1
        done = len([ev for ev in self.job.events if ev["kind"] == "rebuild-done"])
        if current:
            self.change(self.value)
        ahead = e.clock_end is not None and bool(e.clock_end.get("ahead"))
        self.handle(self.job.applied(e.run_id, self.tick(), ahead=ahead))
        if with_apply:
            self.take_up_parked()
        if len([ev for ev in self.job.events if ev["kind"] == "rebuild-done"]) > done:
            self.restored_since = {}
        ending = self.job.schedule.ending
        if ahead and ending is not None and ending.clock == e.clock:  # (its worker answered the apply first)
            self.ahead_out, self.ahead_value = dict(e.clock_end), dict(self.value)
            return
        if e.clock_end is not None:
            assert not e.rebuild and e.clock_end["run"] == e.run_id
            if folded_ran and e.clock_end["worker"] in self.live():  # (a lost worker answers nothing)
                self.clock_end_reports(dict(e.clock_end))
            else:
                self.handle(self.job.unfold_clock_end(e.clock_end["worker"], self.now))

    def install(self, e: ApplyPass, workers: list[str]) -> None:
        """``ShardStore.install`` on ``workers`` (each ignores a pass older than its newest work)."""
        for x in workers:
            if e.run_id < self.run_seen[x]:
                continue
            for shard, attempt, winner in e.committed:
                if winner != x:
                    self.has[x].discard(shard)
                elif (x, e.clock, shard, attempt) in self.pending:
                    self.has[x].add(shard)
            self.pending = {p for p in self.pending if p[0] != x or p[1] > e.clock}

    @precondition(lambda self: getattr(self, "clock_end", None) is not None)
    @rule()
    def clock_end_reports(self, folded: dict | None = None):
        if folded is None:
            item, self.clock_end = self.clock_end, None
        else:
            item = folded
        before = self.job.machine.stage
        effects = self.job.clock_end_done(item["worker"], item["run"], {"objective": 1.0}, 0.0, self.tick())
        if before is Stage.CLOCK_END and self.job.machine.stage is Stage.DONE:
            self.change(self.value)  # (a clock end may write the tables; the memory copy is taken after it)
            self.clock_end_ran.add(item["clock"])
            self.folds += folded is not None
            clock = item["clock"]
            for s in range(self.job.queue.n_shards):
                assert self.applied.get((clock, s), 0) == 1, (clock, s, self.applied)
        self.handle(effects)

    @precondition(lambda self: getattr(self, "ahead_out", None) is not None)
    @rule(ran=st.booleans(), stop=st.sampled_from([False, False, True, None]))
    def ahead_reports(self, ran=True, stop=False):
        """The clock end that ran ahead gives its outcome (``Coordinator._ahead_outcome``), or none (``ran``
        False, or its worker was lost): it read the tables as its clock left them, unless a loss meanwhile
        restored some (then its clock is skipped); ``stop`` True or None withdraws the clock begun after it."""
        item, self.ahead_out = self.ahead_out, None
        clock = item["clock"]
        if ran and item["worker"] in self.live():
            effects = self.job.clock_end_done(item["worker"], item["run"], {"objective": 1.0}, 0.0, self.tick(),
                                              clock, stop)
        else:
            effects = self.job.unfold_clock_end(item["worker"], self.tick())
        assert self.job.schedule.ending is None
        report = self.job.tally.reports.get(clock) or self.job.schedule._report_of(*self.job.schedule.ended_report[1])
        if report["skipped"]:
            self.skipped.add(clock)
        else:
            assert self.value == self.ahead_value, "the tables changed under a clock end running ahead"
            self.clock_end_ran.add(clock)
            self.aheads += 1
            for s in range(self.job.queue.n_shards):
                assert self.applied.get((clock, s), 0) == 1, (clock, s, self.applied)
        if self.job.clock == clock and self.job.machine.stage is Stage.DONE and report["next_begun"] is False \
                and not report["skipped"]:
            self.withdrawn += self.begin_ahead is None
            self.begin_ahead = None
        self.handle(effects)

    @precondition(lambda self: getattr(self, "begin_ahead", None) is not None)
    @rule()
    def coordinator_begins_ahead(self):
        """``Coordinator._auto_begin`` of a ``BeginClock(ahead=True)``: once no recovery runs, unless the
        clock end's report said not to (or the clock is begun already)."""
        if self.job.machine.recovering:
            return
        clock, self.begin_ahead = self.begin_ahead, None
        s = self.job.schedule
        if not self.job.failed and s.next_begun and s.clock == clock - 1:
            self.handle(self.job.begin(clock, self.tick()))

    @precondition(lambda self: getattr(self, "mirrors_sent", None))
    @rule()
    def mirror_arrives(self):
        """The oldest memory copy on its way reaches its buddies (a lost buddy's never counts)."""
        clock, buddies, values = self.mirrors_sent.pop(0)
        for owner, buddy in buddies.items():
            for key, v in values[owner].items():
                self.copies[(key, clock)] = v
            if values[owner]:
                self.job.mirrored(buddy, clock, [list(k) for k in values[owner]], self.tick())

    @precondition(lambda self: hasattr(self, "job") and len(self.live()) > 1 and len(self.job.lost) < 3)
    @rule(w=st.sampled_from(WORKERS))
    def lose(self, w):
        if w in self.job.lost:
            return
        self.inflight = {k: v for k, v in self.inflight.items() if v["worker"] != w}
        self.parked = {k: x for k, x in self.parked.items() if x != w}
        self.given_late.pop(w, None)
        self.has[w].clear()
        if self.clock_end is not None and self.clock_end["worker"] == w:
            self.clock_end = None
        self.handle(self.job.lose(w, self.tick()))

    @precondition(lambda self: getattr(self, "recovery_started", False) and self.plan is None
                  and not self.job.clock_end_ahead)
    @rule()
    def recovery_plans(self):
        plan = self.job.plan_recovery(self.live())
        self.plan = (plan, self.job.recovery_planned(plan, self.tick()))

    @precondition(lambda self: getattr(self, "plan", None) is not None)
    @rule()
    def recovery_restores(self):
        (plan, covered), self.plan = self.plan, None
        for key, target in plan.restores.items():
            if target not in self.job.lost:  # a target lost meanwhile: the next round re-plans it
                buddy, clock = plan.from_memory.get(key, (None, None))
                if buddy is not None and buddy not in self.job.lost:  # the buddy's copy
                    self.value[key] = self.copies[(key, clock)]
                    self.job.restored(key, target, 0, self.tick(), memory_clock=clock)
                    continue
                if key in self.value:
                    self.change([key])
                self.job.restored(key, target, plan.version, self.tick())
                self.restored_since.setdefault(key[0], []).append(list(self.job.pmap.layouts[key[0]].bounds[key[1]]))
        kept = len([ev for ev in self.job.events if ev["kind"] == "pass-kept"])
        effects = self.job.recovered(covered, self.tick())
        self.kept += len([ev for ev in self.job.events if ev["kind"] == "pass-kept"]) > kept
        if not self.job.machine.recovering:
            self.recovery_started = False
        self.handle(effects)

    # ------------------------------------------------------ invariants
    @invariant()
    def queue_is_consistent(self):
        if hasattr(self, "job") and self.job.clock:
            self.job.queue.check()
            self.job.machine.check()

    @invariant()
    def run_ids_only_grow(self):
        if hasattr(self, "job"):
            assert self.job.machine.run_id >= self.last_run
            self.last_run = self.job.machine.run_id

    @invariant()
    def skipped_clocks_never_ran_their_clock_end(self):
        if hasattr(self, "job"):
            assert not (self.skipped & self.clock_end_ran), (self.skipped, self.clock_end_ran)

    @invariant()
    def every_partition_has_one_live_owner_once_recovered(self):
        if hasattr(self, "job") and not self.job.machine.recovering and not self.job.failed:
            assert not any(w in self.job.lost for w in self.job.pmap.owners.values()), self.job.pmap.owners

    @invariant()
    def the_job_can_always_go_on(self):
        """No stage waits for something that can no longer happen."""
        if not hasattr(self, "job") or self.job.failed:
            return
        m = self.job.machine
        if m.ending_applying:
            assert any(a.run_id == m.ending[1] for a in self.applies), "an apply the next clock began with is lost"
        elif self.job.schedule.ending is not None:
            assert self.ahead_out is not None, "a clock end runs ahead and nobody asks its outcome"
        if m.recovering:
            assert self.recovery_started, "recovering, but no recovery is under way"
            return
        if m.stage is Stage.APPLY:
            assert any(a.run_id == m.run_id for a in self.applies) or (
                m.held is not None and (self.ahead_out is not None or self.job.snapshotting)), \
                "waits for an apply nobody carries out"
        elif m.stage is Stage.ENDING:
            assert (self.ahead_out is not None or m.ending_applying) and self.begin_ahead is not None, \
                "ending, but nothing ends it"
        elif m.stage in (Stage.SHARDS, Stage.REBUILD):
            running = {(a.shard, a.attempt) for a in self.job.queue.running()}
            named_later = {m for back in self.given_late.values() for m in back}
            assert running <= set(self.inflight) | named_later, "an attempt the queue waits for runs nowhere"
            assert self.job.queue.counts()["todo"] or running, "a pass with nothing to do that is not complete"
        elif m.stage is Stage.CLOCK_END:
            w = self.job.clock_end_worker
            assert w is None or (self.clock_end is not None and self.clock_end["worker"] == w), \
                "the clock-end step was handed to a worker that no longer runs it"

    @invariant()
    def the_job_never_fails_while_workers_remain(self):
        if hasattr(self, "job"):
            assert not self.job.failed, self.job.error


TestJobFuzz = JobFuzz.TestCase
TestJobFuzz.settings = settings(max_examples=200, stateful_step_count=80, deadline=None,
                                suppress_health_check=[HealthCheck.too_slow])


def _random_run(f: JobFuzz, rnd, steps: int, reached: set[str]) -> None:
    """One seeded random walk over the same rules, every invariant checked after every step."""
    for _ in range(steps):
        m = f.job.machine
        moves = [("take", lambda: f.take(rnd.choice(WORKERS)))]
        if not m.recovering and m.stage in (Stage.IDLE, Stage.DONE, Stage.SKIPPED) and f.job.clock < 6 \
                and f.begin_ahead is None:
            moves.append(("begin", f.begin))
        if f.inflight:
            moves += [("commit", lambda: f.stage_and_commit(rnd.randrange(50)))] * 4
            if rnd.random() < 0.1:
                moves.append(("fail", lambda: f.attempt_fails(rnd.randrange(50))))
            moves.append(("take-back", lambda: f.idle_worker_takes_back(rnd.choice(WORKERS), rnd.randrange(4),
                                                                        rnd.random() < 0.3)))
        if f.applies:
            moves.append(("apply", lambda: f.owners_apply({w for w in WORKERS if rnd.random() < 0.5},
                                                          folded_ran=rnd.random() < 0.7)))
        if f.clock_end is not None:
            moves.append(("clock_end", f.clock_end_reports))
        if f.ahead_out is not None:
            moves.append(("ahead", lambda: f.ahead_reports(rnd.random() < 0.9, rnd.choice([False, False, False, True, None]))))
        if f.begin_ahead is not None:
            moves.append(("begin-ahead", f.coordinator_begins_ahead))
        if f.mirrors_sent:
            moves.append(("mirror", f.mirror_arrives))
        if len(f.live()) > 1 and len(f.job.lost) < 3 and rnd.random() < 0.08:
            moves.append((f"lose@{m.stage.value}" + ("+recovering" if m.recovering else "")
                          + ("+ending-apply" if m.ending_applying else ""),
                          lambda: f.lose(rnd.choice(WORKERS))))
        if f.recovery_started and f.plan is None and not f.job.clock_end_ahead:
            moves.append(("plan", f.recovery_plans))
        if f.plan is not None:
            moves.append(("restore", f.recovery_restores))
        name, move = rnd.choice(moves)
        move()
        reached.add(name)
        for check in (f.queue_is_consistent, f.run_ids_only_grow, f.skipped_clocks_never_ran_their_clock_end,
                      f.every_partition_has_one_live_owner_once_recovered, f.the_job_can_always_go_on,
                      f.the_job_never_fails_while_workers_remain):
            check()
    if f.skipped:
        reached.add("skipped")
    reached.update(f"done:{c}" for c in f.clock_end_ran)
    if f.folds:
        reached.add("folded")
    if f.kept:
        reached.add("kept")
    if f.aheads:
        reached.add("ahead")
    if f.withdrawn:
        reached.add("withdrawn")
    if f.with_applies:
        reached.add("with-apply")


def test_seeded_walks_reach_every_stage_and_fault_and_keep_the_invariants():
    """Many seeded random walks (they reach deep states that short Hypothesis runs rarely do),
    and a check that they reached what they are meant to test: losses at every stage, losses
    during a recovery, skipped clocks, completed clocks after losses, passes kept through a loss."""
    import random

    reached: set[str] = set()
    for seed in range(400):
        rnd = random.Random(seed)
        f = JobFuzz()
        f.setup(phases=rnd.choice([(6,), (3, 3)]), rebuild=rnd.random() < 0.5,
                policy=rnd.choice(["full", "priority"]), recovery=rnd.choice(["partial", "full"]),
                backups=rnd.random() < 0.5, step_s=rnd.choice([0.0005, 0.05]), fold=rnd.random() < 0.5,
                memory=rnd.random() < 0.5, ahead=rnd.random() < 0.5, with_apply=rnd.random() < 0.5)
        _random_run(f, rnd, 160, reached)
        if f.batches:
            reached.add("batch")
        if f.released:
            reached.add("released")
        if f.released_unheard:
            reached.add("released-unheard")
        if f.copies_checked:
            reached.add("copied")
    for want in ("batch", "released", "released-unheard", "copied", "lose@shards", "lose@apply", "lose@clock-end", "lose@rebuild", "skipped", "restore", "fail",
                 "done:4", "folded", "kept", "ahead", "withdrawn", "lose@ending", "with-apply"):
        assert want in reached, sorted(reached)
    assert any(k.endswith("+recovering") for k in reached), sorted(reached)
    assert any(k.endswith("+ending-apply") for k in reached), sorted(reached)


def test_a_late_attempt_still_tells_its_workers_speed():
    """A straggler whose shards were all backed up finishes after the pass is complete: its commit is
    refused, but its step time still reaches the monitor (else the worker it is for stays unseen)."""
    job = _two_worker_job(2)
    for w in "ab":
        job.monitor.record(w, 0.01)  # past their warm-ups
    job.begin(1, 0.0)
    slow = job.next_item("b", 0.0)["shards"][0]  # b runs shard 1 ...
    mine = job.next_item("a", 0.0)["shards"][0]
    assert job.commit("a", 1, job.machine.run_id, mine["shard"], mine["attempt"], 0.01, {"compute_s": 0.01})[0]
    backup = job.queue.start_backup(slow["shard"], "a", 0.02)  # ... and a backs it up and wins
    granted, _ = job.commit("a", 1, job.machine.run_id, slow["shard"], backup.attempt, 0.03, {"compute_s": 0.01})
    assert granted and job.machine.stage is Stage.APPLY
    ok, _ = job.commit("b", 1, job.machine.run_id, slow["shard"], slow["attempt"], 0.5, {"compute_s": 0.5})
    assert not ok and job.monitor.mean_step("b") == 0.5


def test_a_late_report_of_lost_data_in_the_next_phase_leaves_the_winners_holder():
    """Issue 38 item 6 ("the data of shard N is on no live worker" with no loss): a's backup of shard 1
    (held by b) lost to b's attempt; the pass was applied and the clock's next data phase began before
    the backup asked b for the shard, which b no longer gave. Its report that it found the data
    nowhere says nothing of the shard now: it stays with b (it was unset, and the shard waited to be
    placed again)."""
    pmap = PartitionMap([TableLayout("x", 8, 2)])
    pmap.assign(["a", "b"])
    queue = ShardQueue(4, reloadable=False, phases=[2, 2])
    for s in range(4):
        queue.set_holder(s, "a" if s % 2 == 0 else "b")
    job = JobState(JobConfig("j", 4, {"x": "param"}, [], ["user", "item"]), queue, pmap)
    job.workers = ["a", "b"]
    job.begin(1, 0.0)
    run1 = job.machine.run_id
    mine = job.next_item("b", 0.0)["shards"][0]  # shard 1, b's own
    own = job.next_item("a", 0.0)["shards"][0]  # shard 0, a's own
    assert job.commit("a", 1, run1, own["shard"], own["attempt"], 0.01)[0]
    late = job.queue.start_backup(mine["shard"], "a", 0.02)  # a backs shard 1 up, to copy it from b ...
    assert job.commit("b", 1, run1, mine["shard"], mine["attempt"], 0.03)[0]  # ... and b wins
    job.applied(run1, 0.04)
    assert job.machine.run_id > run1 and job.machine.stage is Stage.SHARDS  # the "item" phase
    job.attempt_failed("a", 1, run1, late.shard, late.attempt, "LookupError: the data of shard 1 is on no live "
                       "worker", 0.05, lost_data=True)
    assert job.queue.holder(1) == "b"


def test_an_attempt_that_ends_after_its_clock_still_tells_its_workers_speed():
    """With backups, an 8x-slowed worker's attempts are all won by others, and each ends after its
    whole clock did (the next clock has begun): its refused commit must still reach the monitor,
    or backup + restart never see the straggler (bench.monitor's mitigation run)."""
    job = _two_worker_job(2)
    for w in "ab":
        job.monitor.record(w, 0.01)  # past their warm-ups
    job.begin(1, 0.0)
    slow = job.next_item("b", 0.0)["shards"][0]
    run1 = job.machine.run_id
    mine = job.next_item("a", 0.0)["shards"][0]
    assert job.commit("a", 1, run1, mine["shard"], mine["attempt"], 0.01, {"compute_s": 0.01})[0]
    backup = job.queue.start_backup(slow["shard"], "a", 0.02)
    assert job.commit("a", 1, run1, slow["shard"], backup.attempt, 0.03, {"compute_s": 0.01})[0]
    job.applied(job.machine.run_id, 0.04)
    job.clock_end_done(job.next_item("a", 0.05) and "a", job.machine.run_id, {"objective": 1.0}, 0.0, 0.05)
    job.begin(2, 0.06)
    assert job.machine.clock == 2
    ok, _ = job.commit("b", 1, run1, slow["shard"], slow["attempt"], 0.5, {"compute_s": 0.4, "data_s": 0.1})
    assert not ok and job.monitor.mean_step("b") == 0.4
    # a rebuild-pass attempt is other work: it tells nothing of the worker's shard steps
    ok, _ = job.commit("b", 1, run1, slow["shard"], slow["attempt"], 0.6, {"compute_s": 9.0}, rebuild=True)
    assert not ok and job.monitor.mean_step("b") == 0.4


def test_a_worker_that_never_finishes_is_reported_though_backups_close_its_clocks():
    """b takes a shard and never commits; backups on a close every clock without it. Its running
    item is the evidence: at two clock ends in a row it is a straggler, though it recorded nothing."""
    job = _two_worker_job(2)
    job.monitor.record("a", 0.01)  # a is past its warm-up; b has not finished anything
    stuck = None
    for clock, t in ((1, 0.0), (2, 2.0)):  # b's item has run 1.5 s, then 3.5 s: past stuck_after_s
        job.begin(clock, t)
        if stuck is None:
            stuck = job.next_item("b", t)["shards"][0]
        while (item := job.next_item("a", t)) is not None and item["op"] == "shard":
            for m in item["shards"]:
                job.commit("a", clock, item["run"], m["shard"], m["attempt"], t, {"compute_s": 0.01})
        if clock == 1:
            backup = job.queue.start_backup(stuck["shard"], "a", t)
            job.commit("a", 1, job.machine.run_id, stuck["shard"], backup.attempt, t, {"compute_s": 0.01})
        job.applied(job.machine.run_id, t + 1.5)
        job.clock_end_done(job.next_item("a", t + 1.5) and "a", job.machine.run_id, {"objective": 1.0}, 0.0,
                           t + 1.5)
    assert [e["worker"] for e in job.events if e["kind"] == "straggler"] == ["b"]
    assert job.stragglers == {"b": "transient"}


def _simulate_clock(steps: dict[str, float], n_shards: int = 32, sharding: str = "dynamic") -> tuple[float, dict]:
    """One clock of a job whose workers take ``steps[w]`` seconds a shard, in virtual time: each
    worker asks for work when free (a refused one asks again when another commits). The time the
    last commit lands, and the shards each worker committed."""
    import heapq
    import itertools

    pmap = PartitionMap([TableLayout("x", 8, len(steps))])
    pmap.assign(sorted(steps))
    queue = ShardQueue(n_shards, reloadable=True, sharding=sharding)
    if sharding == "static":
        for s in range(n_shards):
            queue.set_holder(s, sorted(steps)[s % len(steps)])
    job = JobState(JobConfig("j", n_shards, {"x": "param"}, [], [""]), queue, pmap)
    job.workers = sorted(steps)
    for w, s in steps.items():
        job.monitor.record(w, s)  # the warm-up
        job.monitor.record(w, s)
    job.begin(1, 0.0)
    order = itertools.count()
    events = [(0.0, next(order), "ask", w, None) for w in sorted(steps)]
    waiting: list[str] = []
    done = {w: 0 for w in steps}
    end = 0.0
    while events:
        t, _, kind, w, member = heapq.heappop(events)
        if kind == "ask":
            item = job.next_item(w, t)
            if item is None or item["op"] != "shard":
                waiting.append(w)
                continue
            for k, m in enumerate(item["shards"]):
                heapq.heappush(events, (t + (k + 1) * steps[w], next(order), "commit", w, (m, item["run"])))
            continue
        m, run = member
        assert job.commit(w, 1, run, m["shard"], m["attempt"], t, {"compute_s": steps[w]})[0]
        done[w] += 1
        end = max(end, t)
        for v in [w, *waiting]:  # a commit is a change: the long polls answer again
            heapq.heappush(events, (t, next(order), "ask", v, None))
        waiting.clear()
    assert sum(done.values()) == n_shards
    return end, done


def test_a_straggler_starts_no_shard_the_others_would_finish_before_it():
    """One of 4 workers 4x and 8x slower (bench.stragglers' synthetic-32): without the rule it takes
    a shard at the pass's tail and the clock waits for it (s = 4: 3 shards, 0.36 s; s = 8: 2, 0.48 s)."""
    fast = {"a": 0.03, "b": 0.03, "c": 0.03}
    end, done = _simulate_clock({**fast, "d": 0.12})
    assert done["d"] == 2 and end <= 0.301  # ideal: 32 shards at capacity 3.25 -> 0.295 s
    end, done = _simulate_clock({**fast, "d": 0.24})
    assert done["d"] == 1 and end <= 0.331  # ideal 0.307; 31 shards on 3 workers: 11 steps
    # a straggler still gets one attempt a clock, so a recovered one is measured again (a backup,
    # where the policy is on, then cuts that attempt's tail)
    end, done = _simulate_clock({**fast, "d": 5.0})
    assert done["d"] == 1
    # a healthy cluster's noise changes nothing: every worker works to the end
    end, done = _simulate_clock({"a": 0.03, "b": 0.036, "c": 0.027, "d": 0.033})
    assert min(done.values()) >= 7 and end <= 0.3
    # static sharding: every shard waits for its holder, however slow
    end, done = _simulate_clock({**fast, "d": 0.12}, sharding="static")
    assert done["d"] == 8


def test_microsecond_steps_are_never_held_back():
    """A trivial algorithm's steps differ by 2x from noise alone; leaving one worker out would move
    its shard's data to another for a saving of microseconds (bench.overhead saw such copies)."""
    def held_back(step_a: float, step_b: float) -> bool:
        pmap = PartitionMap([TableLayout("x", 8, 2)])
        pmap.assign(["a", "b"])
        job = JobState(JobConfig("j", 2, {"x": "param"}, [], [""]), ShardQueue(2, reloadable=True), pmap)
        job.workers = ["a", "b"]
        for w, step in (("a", step_a), ("b", step_b)):
            job.monitor.record(w, step)  # the warm-up
            job.monitor.record(w, step)
        job.begin(1, 0.0)
        job.next_item("a", 0.0)  # one shard left
        return job.dispatch.leave_to_others("b")

    assert held_back(0.020, 0.050)  # 20 ms: a finishes the last shard 10 ms before b would
    assert not held_back(20e-6, 50e-6)


def test_a_shard_moves_only_where_that_beats_waiting_for_its_holder():
    """Delay scheduling: a worker out of shards of its own takes another's only if it would finish it,
    data move included, before the holder would (ALS on 2 workers moved an 80 ms shard in 200-350 ms
    every other clock for a few ms of imbalance). A straggler's shards still move."""
    def moved(step_b: float, move_s: float | None, now: float = 0.0, b_commits: bool = False) -> bool:
        job = _two_worker_job(4)  # a holds 0, 1; b holds 2, 3
        for w, step in (("a", 0.08), ("b", step_b)):
            job.monitor.record(w, step)  # the warm-up
            job.monitor.record(w, step)
        job.move_s = move_s
        job.begin(1, 0.0)
        # each worker's share of the pass comes in one item: a's own 0 and 1, b's own 2 and 3 (only 2
        # where b is so slow that its share is 1)
        b_item = [m["shard"] for m in job.next_item("b", 0.0)["shards"]]
        assert b_item == ([2, 3] if step_b < 0.2 else [2])
        item = job.next_item("a", 0.0)
        assert [(m["shard"], m["fetch_from"]) for m in item["shards"]] == [(0, None), (1, None)]
        for m in item["shards"]:
            job.commit("a", 1, item["run"], m["shard"], m["attempt"], 0.0, {"compute_s": 0.08})
        if 3 in b_item:  # a ran out: b gives back shard 3, not started (ask_back)
            job.released("b", [(3, 0)], [(3, 0)], 0.0)
        if b_commits:  # b finished shard 2 at 0.0 and has not asked again since
            job.commit("b", 1, job.machine.run_id, 2, 0, 0.0, {"compute_s": step_b})
        item = job.next_item("a", now)  # b's shard 3 is the only one left
        return item is not None and item["shards"][0]["fetch_from"] == "b"

    assert moved(0.08, None)  # no move measured yet: take it
    assert not moved(0.08, 0.2)  # 0.2 + 0.08 s here against 1.5 x 0.08 s at its holder
    assert moved(0.64, 0.2)  # an 8x straggler: 0.28 s against 0.96 s
    assert moved(0.08, 0.01)  # a cheap move still balances a pass's tail
    # a holder held back at the pass's tail (a straggler: the others are to run its shards) however
    # costly the move (it would wait forever otherwise: found on a loaded machine)
    assert moved(1.0, 2.0)
    # a holder that is late: its item ran over twice its step (hung?), or it stopped asking for work
    assert not moved(0.08, 0.2, now=0.15) and moved(0.08, 0.2, now=0.17)
    assert not moved(0.08, 0.2, now=0.07, b_commits=True) and moved(0.08, 0.2, now=0.09, b_commits=True)


def test_the_cost_of_moving_a_shard_is_measured_from_moved_attempts_only():
    job = _two_worker_job(4)
    job.begin(1, 0.0)
    own = job.next_item("a", 0.0)["shards"][0]
    job.commit("a", 1, job.machine.run_id, own["shard"], own["attempt"], 0.0, {"data_s": 0.001, "compute_s": 0.01})
    assert job.move_s is None  # a's own shard: no move
    job.next_item("a", 0.0)
    other = job.next_item("a", 0.0)["shards"][0]
    assert other["fetch_from"] == "b"
    job.commit("a", 1, job.machine.run_id, other["shard"], other["attempt"], 0.0, {"data_s": 0.3, "compute_s": 0.01})
    assert job.move_s == 0.3


def test_a_bsp_attempt_stopped_as_a_lost_race_while_still_live_runs_again_uncounted():
    """A wrong lost-race verdict under BSP: the shard goes back to TODO, nothing counts against it,
    and the event says the attempt was live (``late`` False); a stop of an attempt whose pass was
    applied is ``late`` and changes nothing."""
    job = _two_worker_job(2)
    job.begin(1, 0.0)
    run = job.machine.run_id
    m = job.next_item("a", 0.0)["shards"][0]
    for _ in range(job.queue.max_failures + 1):
        job.attempt_failed("a", 1, run, m["shard"], m["attempt"], "lost race", 0.1, stopped=True)
        again = next(x for x in job.next_item("a", 0.2)["shards"] if x["shard"] == m["shard"])
        assert again["attempt"] > m["attempt"]
        m = again
    assert not job.failed and not [e for e in job.events if e["kind"] == "shard-failed"]
    assert [e["late"] for e in job.events if e["kind"] == "attempt-stopped"] == [False] * (job.queue.max_failures + 1)


def test_a_bsp_backup_stopped_while_its_pass_is_applied_is_a_late_stop_not_a_wrong_verdict():
    """An owner applies the pass (same run id until every owner has) and a backup reading there
    stops: the shard's attempt is beaten, so the stop is ``late``, not a wrong verdict."""
    job = _two_worker_job(2)
    job.begin(1, 0.0)
    run1 = job.machine.run_id
    mine = job.next_item("b", 0.0)["shards"][0]
    own = job.next_item("a", 0.0)["shards"][0]
    assert job.commit("a", 1, run1, own["shard"], own["attempt"], 0.01)[0]
    backup = job.queue.start_backup(mine["shard"], "a", 0.02)
    assert job.commit("b", 1, run1, mine["shard"], mine["attempt"], 0.03)[0]
    assert job.machine.stage is Stage.APPLY and job.machine.run_id == run1
    job.attempt_failed("a", 1, run1, backup.shard, backup.attempt, "lost race", 0.04, stopped=True)
    [e] = [e for e in job.events if e["kind"] == "attempt-stopped"]
    assert e["late"] and job.queue.status(mine["shard"]).value == "done"
