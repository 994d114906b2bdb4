"""The typed runner <-> coordinator messages (``dscar.core.protocol``) and the pure decisions behind
batched grants and commits: a worker gets its share of a pass in one work item, commits it in one
message, and its waiting members are asked back, not backed up."""
from __future__ import annotations

import pytest

from dscar.core.job import ApplyPass, JobConfig, JobState
from dscar.core.partitions import PartitionMap, TableLayout
from dscar.core.policies import BackupPolicy
from dscar.core.protocol import (IDLE, ClockEndItem, Commit, CommitAnswer, Finished, Member, Stopped, WorkItem,
                            handler_name)
from dscar.core.shards import ShardQueue

pytestmark = pytest.mark.pure

WORKERS = ["a", "b", "c", "d"]
PER_WORKER = 4


def _job(policies=()) -> JobState:
    n = PER_WORKER * len(WORKERS)
    pmap = PartitionMap([TableLayout("w", 8, len(WORKERS))])
    pmap.assign(WORKERS)
    queue = ShardQueue(n, reloadable=True)
    for s in range(n):
        queue.set_holder(s, WORKERS[s % len(WORKERS)])
    job = JobState(JobConfig("j", n, {"w": "param"}, [], [""]), queue, pmap, policies=list(policies))
    job.workers = list(WORKERS)
    return job


def _measure(job: JobState, steps: dict[str, float]) -> None:
    for w, step in steps.items():
        for _ in range(3):  # (the first record is a warm-up)
            job.monitor.record(w, step)


# --------------------------------------------------------------------------- messages
def test_a_work_item_goes_through_its_message_unchanged_and_its_members_carry_the_item_s_fields():
    item = WorkItem("shard", "j", 7, 3, 2, [["w", 0, "a"]],
                    [Member(1, 1, phase="user"), Member(5, 2, "b", True, None, {"file": "x"}, clock=4, seen=3,
                                                        mine=False)],
                    0.5, version=9, floor=1, read_floor=2)
    msg = item.to_msg()
    assert WorkItem.from_msg(msg) == item
    assert "restored" not in msg and "ckpt_url" not in msg  # absent, as before the types
    assert msg["shards"][0] == {"shard": 1, "attempt": 1, "fetch_from": None, "backup": False, "phase": "user"}
    first, second = item.attempts()
    assert first["clock"] == 3 and first["item"] == 7 and first["run"] == 2 and first["version"] == 9
    assert second["clock"] == 4 and second["fetch_from"] == "b" and second["state_file"] == {"file": "x"}
    end = ClockEndItem("j", 3, 2, [["w", 0, "a"]])
    assert ClockEndItem.from_msg(end.to_msg()) == end and end.to_msg()["op"] == "clock_end"
    assert IDLE == {"op": "idle"} and handler_name("next") == "dscar_next"


def test_a_commit_and_its_answer_go_through_their_messages_unchanged():
    commit = Commit("j", 3, 2, "a", [Finished(1, 1, 3, {"compute_s": 0.1}, {"w": [0]}), Finished(5, 2, 4)],
                    False, [[6, 1]], [Stopped(7, 1, 3, 0.25)])
    assert Commit.from_msg(**commit.to_msg()) == commit
    # a finished attempt without its own clock is of the commit's
    assert Commit.from_msg("j", 3, 2, "a", [{"shard": 1, "attempt": 1}]).commits == [Finished(1, 1, 3)]
    answer = CommitAnswer([True, False], {"op": "shard"})
    assert CommitAnswer.from_msg(answer.to_msg()) == answer
    # a commit that waits for the worker's next item says so (and its timeout); one that does not adds nothing
    waits = Commit("j", 3, 2, "a", [Finished(1, 1, 3)], wait=True, wait_timeout=2.5)
    assert Commit.from_msg(**waits.to_msg()) == waits and waits.to_msg()["wait"] is True
    assert Commit.from_msg(**Commit("j", 3, 2, "a", wait=True).to_msg()).wait_timeout is None
    assert "wait" not in commit.to_msg() and "wait_timeout" not in commit.to_msg()


# ------------------------------------------------------------------- batched grants
def test_equal_workers_each_get_their_share_of_the_pass_in_one_item():
    job = _job()
    job.begin(1, 0.0)
    _measure(job, {w: 0.1 for w in WORKERS})  # 100 ms steps: far over the batch's time target
    items = {w: job.next_item(w, 1.0) for w in WORKERS}
    for w, item in items.items():
        assert len(item["shards"]) == PER_WORKER, (w, item)
        assert all(job.queue.holder(m["shard"]) == w for m in item["shards"])  # its own shards
    assert job.queue.n_todo == 0


def test_a_slow_worker_s_share_is_by_its_speed_and_an_unmeasured_one_counts_as_fast_as_the_asker():
    job = _job()
    _measure(job, {"a": 0.1, "b": 0.1, "c": 0.1, "d": 0.4})
    assert job.dispatch.batch_size("a") == 5  # 16 shards x 10 / 32.5 shards a second
    assert job.dispatch.batch_size("d") == 1
    fresh = _job()
    _measure(fresh, {"a": 0.1})
    assert fresh.dispatch.batch_size("a") == PER_WORKER  # b, c, d not measured: a's speed each


def test_one_commit_of_a_batch_grants_each_attempt_as_single_commits_would_and_the_first_wins():
    job = _job()
    job.begin(1, 0.0)
    _measure(job, {w: 0.1 for w in WORKERS})
    items = {w: job.next_item(w, 1.0) for w in WORKERS}
    late = job.queue.start_backup(items["b"]["shards"][0]["shard"], "a", 1.5)  # a backs up one of b's
    granted, effects = job.commit_many("a", job.run_id, [(1, late.shard, late.attempt, None)], 2.0)
    assert granted == [True] and effects == []
    effects = []
    for w in WORKERS:
        ok, more = job.commit_many(w, job.run_id, [(1, m["shard"], m["attempt"], None) for m in items[w]["shards"]],
                                   3.0)
        assert ok == [not (w == "b" and m["shard"] == late.shard) for m in items[w]["shards"]]  # b lost that race
        effects += more
    assert [type(e) for e in effects] == [ApplyPass]  # the pass is complete: every shard committed once
    assert sorted(s for s, _, _ in effects[0].committed) == list(range(PER_WORKER * len(WORKERS)))


def test_a_batch_s_waiting_members_are_asked_back_not_backed_up():
    job = _job([BackupPolicy(k=2.0, max_attempts=2, min_s=0.0)])
    job.begin(1, 0.0)
    _measure(job, {w: 0.1 for w in WORKERS})
    items = {w: job.next_item(w, 1.0) for w in WORKERS}
    for w in ("a", "c", "d"):  # the others finish; b still runs its first member
        job.commit_many(w, job.run_id, [(1, m["shard"], m["attempt"], None) for m in items[w]["shards"]], 1.1)
    # long after b's members were handed out (10 x the median step): only its first is running for sure
    assert job.next_item("a", 2.0)["shards"][0]["shard"] == items["b"]["shards"][0]["shard"]  # a backup of it
    assert job.next_item("c", 2.0) is None
    victim, members = job.releasable("c")
    assert victim == "b" and members == [(m["shard"], m["attempt"]) for m in items["b"]["shards"][2:]]
    job.released("b", members, [], 2.0)  # b had started them all: asked once, they are running to the policy
    assert job.next_item("c", 2.0)["shards"][0]["backup"]


def test_the_handler_tables_name_every_handler_once_and_every_scheduler_op_has_a_caller_rule():
    from dscar.scheduler.coordinator import Coordinator
    from dscar.core.membership import SCHEDULER_RULES, WORKER_INSTALLING, WORKER_OPEN, WORKER_RUN_WRITES
    from dscar.worker.plugin import ParamServer

    scheduler_side = Coordinator().handlers()
    assert set(scheduler_side) == set(SCHEDULER_RULES)
    worker_side = ParamServer().handlers()
    assert WORKER_OPEN | WORKER_INSTALLING | WORKER_RUN_WRITES <= set(worker_side)
    for table in (scheduler_side, worker_side):
        assert all(f.__name__ == f"_h_{op}" for op, f in table.items())  # op -> its own handler


def test_a_batch_s_running_member_looks_late_only_once_the_batch_has_run_k_times_its_steps():
    job = _job([BackupPolicy(k=2.0, max_attempts=2, min_s=0.0)])
    job.begin(1, 0.0)
    _measure(job, {w: 0.1 for w in WORKERS})
    items = {w: job.next_item(w, 1.0) for w in WORKERS}
    for w in ("a", "c", "d"):
        job.commit_many(w, job.run_id, [(1, m["shard"], m["attempt"], {"compute_s": 0.1})
                                        for m in items[w]["shards"]], 1.3)
    job.released("b", [(m["shard"], m["attempt"]) for m in items["b"]["shards"][1:]], [], 1.3)  # all started
    # b's batch of 4 steps of 100 ms has run 0.7 s: 1.75 steps a member, under k = 2
    assert job.next_item("a", 1.7) is None
    backup = job.next_item("a", 1.9)  # 2.25 steps a member: late
    assert backup["shards"][0]["backup"] and job.queue.holder(backup["shards"][0]["shard"]) == "b"


def test_a_share_of_long_steps_goes_in_items_of_a_few_seconds_so_commits_still_show_progress():
    from dscar.core.dispatch import SHARE_MAX_S

    job = _job()
    _measure(job, {w: SHARE_MAX_S / 2 for w in WORKERS})
    assert job.dispatch.batch_size("a") == 2  # not its 4 shards: 2 steps' time at most
