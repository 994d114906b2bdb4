"""The worker's pure stores driven directly, no cluster: the exactly-once arithmetic of a pass."""
import numpy as np

from dscar.algorithm import TableSpec
from dscar.worker.partition_store import PartitionStore
from dscar.core.partitions import TableLayout
from dscar.worker.shard_store import ShardEntry, ShardStore

ME, OTHER = "tcp://me:1", "tcp://other:2"


def _store(rows: int = 6, parts: int = 2, kind: str = "param", dtype=np.float64) -> PartitionStore:
    spec = TableSpec("w", rows, trailing=(), kind=kind, dtype=np.dtype(dtype).name, n_parts=parts)
    store = PartitionStore({"w": spec}, {"w": TableLayout("w", rows, parts)}, np)
    for p, (a, b) in enumerate(store.layouts["w"].bounds):
        store.own("w", p, np.arange(a, b, dtype=dtype), checkpointed=True)
    return store


def _up(part: int, lo: int, values, rows=None):
    return ("w", part, lo, np.asarray(values, dtype=np.float64), None if rows is None else np.asarray(rows))


def test_apply_sums_in_shard_order_whatever_order_updates_arrive_in():
    """Float addition is not associative: the result must not depend on arrival order."""
    vals = [1e16, 1.0, -1e16, 1.0]
    results = []
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]):
        store = _store(rows=2, parts=1)
        fetched = {}
        for s in order:
            key = (1, s, 0)
            if s % 2:  # half run here, half collected from another worker
                store.stage(key, 7, [_up(0, 0, [vals[s], vals[s]])])
            else:
                fetched[key] = [_up(0, 0, [vals[s], vals[s]])]
        keys = [(1, s, 0) for s in order]
        store.apply_pass(7, keys, fetched, {"w"}, store.owned())
        results.append(store.parts[("w", 0)].copy())
    expected = np.zeros(2)
    for v in vals:
        expected += v
    for r in results:
        assert np.array_equal(r, expected)


def test_only_committed_keys_of_the_right_run_are_applied():
    store = _store()
    store.stage((3, 0, 0), 5, [_up(0, 0, [1, 1, 1])])  # committed
    store.stage((3, 0, 1), 5, [_up(0, 0, [10, 10, 10])])  # a losing backup of shard 0
    store.stage((3, 1, 0), 4, [_up(0, 0, [100, 100, 100])])  # committed key, but staged under another run
    before = store.parts[("w", 0)].copy()
    n = store.apply_pass(5, [(3, 0, 0), (3, 1, 0)], {}, set(), store.owned())
    assert n == 1
    assert np.array_equal(store.parts[("w", 0)], before + 1)


def test_reset_tables_start_from_zero_and_others_accumulate():
    store = _store()
    store.stage((1, 0, 0), 2, [_up(1, 0, [5, 5, 5])])
    store.apply_pass(2, [(1, 0, 0)], {}, {"w"}, store.owned())
    assert np.array_equal(store.parts[("w", 0)], np.zeros(3))
    assert np.array_equal(store.parts[("w", 1)], np.array([5.0, 5.0, 5.0]))
    store.stage((2, 0, 0), 3, [_up(1, 0, [1, 1, 1])])
    store.apply_pass(3, [(2, 0, 0)], {}, set(), store.owned())  # no reset: adds up
    assert np.array_equal(store.parts[("w", 1)], np.array([6.0, 6.0, 6.0]))


def test_an_older_runs_staged_updates_are_dropped_at_the_next_apply_and_never_applied():
    store = _store()
    store.stage((4, 0, 0), 1, [_up(0, 0, [1, 1, 1])])  # run 1 was redone: run 2 replaces it
    store.stage((4, 1, 0), 2, [_up(0, 0, [2, 2, 2])])
    before = store.parts[("w", 0)].copy()
    store.apply_pass(2, [(4, 1, 0)], {}, set(), store.owned())
    assert (4, 0, 0) not in store.staged and (4, 1, 0) in store.staged  # this pass's stay for other owners
    assert store.select_staged(1, [(4, 0, 0)], [("w", 0)])[0] == (4, 0, 0)
    store.apply_pass(2, [(4, 0, 0)], {}, set(), store.owned())  # even if named again, it is gone
    assert np.array_equal(store.parts[("w", 0)], before + 2)


def test_fetch_staged_answers_missing_for_a_key_staged_under_another_run():
    store = _store()
    store.stage((1, 0, 0), 3, [_up(0, 0, [1, 1, 1]), _up(1, 0, [2, 2, 2])])
    store.stage((1, 1, 0), 2, [_up(0, 0, [1, 1, 1])])
    missing, out = store.select_staged(3, [(1, 0, 0)], [("w", 1)])
    assert missing is None and [k for k, _ in out] == [(1, 0, 0)]
    assert [(t, p) for t, p, *_ in out[0][1]] == [("w", 1)]  # only the caller's partitions
    missing, out = store.select_staged(3, [[1, 0, 0], [1, 1, 0]], [("w", 0)])
    assert missing == (1, 1, 0) and out == []


def test_scatter_add_with_repeated_rows_adds_up():
    store = _store(rows=4, parts=1)
    store.apply_pass(1, [], {}, {"w"}, store.owned())
    store.stage((1, 0, 0), 1, [_up(0, 0, [1, 2, 3, 4], rows=[2, 2, 0, 2])])
    store.apply_pass(1, [(1, 0, 0)], {}, set(), store.owned())
    assert np.array_equal(store.parts[("w", 0)], np.array([3.0, 0.0, 7.0, 0.0]))


def test_a_partition_restored_during_the_pass_is_not_updated():
    store = _store()
    owned = store.owned()
    store.own("w", 0, np.full(3, 9.0), checkpointed=True)  # a restore replaced it meanwhile
    store.stage((1, 0, 0), 1, [_up(0, 0, [1, 1, 1])])
    assert store.apply_pass(1, [(1, 0, 0)], {}, set(), owned) == 0
    assert np.array_equal(store.parts[("w", 0)], np.full(3, 9.0))


def test_installing_states_keeps_only_the_winners_and_drops_other_copies():
    shards = ShardStore()
    held = ShardEntry({"x": np.zeros(2)}, {"z": np.array([0])})
    shards.put(0, held)
    shards.put(1, ShardEntry({"x": np.ones(2)}, {"z": np.array([1])}))  # a stale copy: another worker won
    shards.stage_state((2, 0, 0), held, {"z": np.array([5])})  # our primary: it won
    shards.stage_state((2, 0, 1), ShardEntry(held.data, dict(held.state)), {"z": np.array([6])})  # our losing backup
    shards.stage_state((3, 0, 0), held, {"z": np.array([7])})  # a later clock: stays pending
    shards.install([(0, 0, ME, 2), (1, 0, OTHER, 2)], ME, 2)
    assert sorted(shards.shards) == [0]
    assert shards.shards[0].state["z"][0] == 5
    assert list(shards.pending) == [(3, 0, 0)]


def test_a_primary_told_to_fetch_elsewhere_drops_its_stale_copy_and_a_backup_copies():
    shards = ShardStore()
    shards.put(0, ShardEntry({"x": np.zeros(2)}, {"z": np.array([1])}))
    mine = shards.claim(0, None, True)  # a backup on the holder: a copy of ours
    assert mine is not None and mine is not shards.shards[0] and 0 in shards.shards
    assert shards.claim(0, None, False) is shards.shards[0]  # the primary on the holder: ours
    assert shards.claim(0, OTHER, True) is None and 0 not in shards.shards  # ours is stale: the holder is OTHER


def test_a_peer_s_copy_however_late_leaves_the_holder_its_shard_until_another_attempt_is_installed():
    shards = ShardStore()
    held = ShardEntry({"x": np.zeros(2)}, {"z": np.array([1])})
    shards.put(0, held)
    assert shards.get(0) is held and shards.get(0) is held and shards.shards == {0: held}
    shards.install([(0, 2, ME, 4)], ME, 4)  # our attempt won (nothing pending here: a placement's entry stays)
    assert shards.shards == {0: held}
    shards.install([(0, 0, OTHER, 5)], ME, 5)  # the peer's attempt won: our copy is stale now
    assert shards.get(0) is None


def test_a_pass_applied_after_newer_work_arrived_here_is_stale_and_changes_nothing():
    """A loss during an apply moves the machine on; the old apply may still reach this worker after
    it ran an attempt of the next run. Installing it would drop the shard that attempt put here (and
    its staged state): the shard's holder would not have it."""
    from dscar.worker.runner import Job

    store = _store()
    shards = ShardStore(store.lock)
    job = Job(id="j", algorithm=None, meta=None, specs=store.specs, layouts=store.layouts, loader=None,
              tol=0.0, xp=np, tables=store, shards=shards)
    newer = ShardEntry({"x": np.zeros(2)}, {"z": np.array([1])})
    shards.put(0, newer)  # run 6's attempt copied shard 0 here ...
    shards.stage_state((3, 0, 4), newer, {"z": np.array([2])})  # ... and staged its new state
    job.run_seen = 6
    store.stage((3, 0, 1), 5, [_up(0, 0, [1, 1, 1])])
    before = store.parts[("w", 0)].copy()
    assert job.apply_pass(5, [(3, 0, 1)], [OTHER], {}, set(), store.owned(), ME, 3) == {"status": "stale"}
    assert shards.get(0) is newer and (3, 0, 4) in shards.pending
    assert np.array_equal(store.parts[("w", 0)], before)
    assert job.apply_pass(6, [(3, 0, 4)], [ME], {}, set(), store.owned(), ME, 3) == {"applied": 0}
    assert shards.get(0).state["z"][0] == 2 and not shards.pending


def test_memory_copies_keep_the_newest_and_go_with_a_crash():
    store = _store(kind="param")
    copies = store.param_copies()
    assert [(t, p) for t, p, _ in copies] == [("w", 0), ("w", 1)]
    copies[0][2][0] = 99.0  # a copy: the partition is untouched
    assert store.parts[("w", 0)][0] == 0.0
    from dscar.worker.mirror_store import MirrorStore, part_key, shard_key

    mirrors = MirrorStore()
    mirrors.keep(part_key("v", 3), 5, np.ones(2))
    mirrors.keep(part_key("v", 3), 4, np.zeros(2))  # late and older: ignored
    mirrors.keep(list(shard_key(3)), 4, {"z": np.arange(2)})  # (keys arrive as lists over the wire)
    clock, values = mirrors.get(["part", "v", 3])
    assert clock == 5 and values.tolist() == [1.0, 1.0]
    assert mirrors.get(shard_key(3))[1]["z"].tolist() == [0, 1]  # a shard's state: not a partition's
    assert not mirrors.discard(part_key("v", 3), 4)  # a newer copy than the one to drop: kept
    assert mirrors.discard(["part", "v", 3], 5) and mirrors.get(part_key("v", 3)) is None
    assert not mirrors.discard(part_key("v", 3), 5)  # (nothing left to drop)
    mirrors.clear()
    assert mirrors.get(shard_key(3)) is None


def _runner_with_steps(during=None, moved=()):
    """A shard runner whose steps do nothing but note the shard (``during(runner, shard)`` runs in
    each; the shards in ``moved`` say they moved their data or state), and the messages it sends the
    coordinator."""
    import threading

    from dscar.worker.runner import Job, ShardRunner

    store = _store()
    job = Job(id="j", algorithm=None, meta=None, specs=store.specs, layouts=store.layouts, loader=None,
              tol=0.0, xp=np, tables=store, shards=ShardStore(store.lock))
    calls, ran = [], []

    class Host:
        address, stop, in_process = ME, threading.Event(), True

        def job(self, job_id):
            return job

        def owners_known(self):
            return {} if job.owners_token is None else {job.id: job.owners_token}

        def call(self, op, **kw):
            calls.append((op, kw))
            return {"granted": [True] * len(kw.get("commits", ())), "next": None}

        def peer(self, address, op, **kw):  # the holder's copy of a shard
            calls.append((op, {"address": address, **kw}))
            return {"status": "OK", "arrays": {"x": np.arange(3.0)}, "state": {"z": np.zeros(3)}}

    runner = ShardRunner(Host())

    def attempt(_job, a):
        shard = a["shard"]
        ran.append(shard)
        if during is not None:
            during(runner, a["shard"])
        return {"compute_s": 0.0}, [], shard in moved

    runner._attempt = attempt
    return runner, calls, ran


def _batch_item(n: int, item: int = 1) -> dict:
    return {"op": "shard", "job": "j", "item": item, "clock": 3, "run": 5, "owners": [], "batch_scale": 1.0,
            "shards": [{"shard": s, "attempt": 0, "fetch_from": None, "backup": False} for s in range(n)]}


def test_batch_members_not_started_when_their_pass_is_applied_are_skipped():
    """A straggler's batch whose other members were won by backups: once the pass is applied they
    can never commit (and their data may be gone from here), so the runner does not start them."""
    runner, calls, ran = _runner_with_steps(lambda r, shard: shard == 1 and r.pass_applied("j"))
    runner._run_shards(_batch_item(4))
    assert ran == [0, 1]
    [(op, kw)] = calls
    assert op == "commit" and [c["shard"] for c in kw["commits"]] == [0, 1] and kw["released"] == []


def test_batch_members_of_a_run_voided_by_an_owner_s_loss_fail_without_running_their_step():
    """A kill voids the run; the worker hears of the loss at once but of the new run only with its next
    item: the rest of a batch handed out before the loss is reported failed, not run (each step would
    be run for nothing and hold back the requeued shards)."""
    dead = "tcp://dead:1"
    runner, calls, ran = _runner_with_steps()
    host = runner.host
    gone: set[str] = set()
    host.peer_gone = lambda address: address in gone
    answer = host.call
    run = {"run": 5}
    host.call = lambda op, **kw: dict(run) if op == "run" else answer(op, **kw)

    def loss_during_the_first(r, shard):
        if shard == 0:
            gone.add(dead)
            run["run"] = 7  # the coordinator voided run 5

    runner._attempt = lambda job, a: (ran.append(a["shard"]), loss_during_the_first(runner, a["shard"]),
                                      ({"compute_s": 0.0}, [], False))[-1]
    item = {**_batch_item(4), "owners": [["w", 0, ME], ["w", 1, dead]]}
    runner._run_shards(item)
    assert ran == [0]  # the others were not run
    fails = [kw for op, kw in calls if op == "fail"]
    assert [kw["shard"] for kw in fails] == [1, 2, 3] and all("voided by the loss of tcp://dead:1" in kw["error"]
                                                               for kw in fails)
    # an owner gone but the run still current (the coordinator has not voided it): the members run
    calls.clear()
    ran.clear()
    run["run"] = 5
    runner._attempt = lambda job, a: (ran.append(a["shard"]), ({"compute_s": 0.0}, [], False))[-1]
    runner._run_shards({**_batch_item(3, item=2), "owners": [["w", 0, ME], ["w", 1, dead]]})
    assert ran == [0, 1, 2] and not [op for op, _ in calls if op == "fail"]


def test_a_backup_keeps_the_shard_it_copied_since_its_commit_makes_its_worker_the_holder():
    """A loss may void the pass before it is applied; it then runs again from the committed
    attempt's worker, which must hold the shard then (with its state as of the pass's start)."""
    runner, calls, _ = _runner_with_steps()
    job = runner.host.job("j")
    job.algorithm = type("Prepare", (), {"prepare_shard": staticmethod(lambda arrays, xp: dict(arrays))})()
    entry = runner._shard_entry(job, 2, fetch_from="holder", backup=True)
    assert calls == [("copy_shard", {"address": "holder", "job_id": "j", "shard": 2})]
    assert job.shards.get(2) is entry and entry.state["z"].tolist() == [0.0, 0.0, 0.0]


def test_members_given_back_while_the_batch_runs_are_skipped_and_named_in_its_commit():
    """The coordinator may stop waiting for the release's answer (a busy machine): the commit tells
    it again which members this worker gave back, so none is left running nowhere."""
    answers = []
    runner, calls, ran = _runner_with_steps(
        lambda r, shard: shard == 0 and answers.append(r.release("j", [[2, 0], [3, 0]], item=1)))
    runner._run_shards(_batch_item(4))
    assert answers == [{"released": [[2, 0], [3, 0]]}] and ran == [0, 1]
    [(op, kw)] = calls
    assert [c["shard"] for c in kw["commits"]] == [0, 1] and kw["released"] == [[2, 0], [3, 0]]
    assert runner.release("j", [[1, 0]], item=1) == {"released": []}  # that item is done here


def test_a_release_that_comes_before_its_work_item_gives_the_members_back_when_it_comes():
    """The coordinator hands a batch, then an idle worker asks for some of it back before the
    batch's answer reached this runner: it gives them back all the same and skips them, so the
    idle worker is not left waiting behind a step that may block for long."""
    runner, calls, ran = _runner_with_steps()
    assert runner.release("j", [[2, 0], [3, 0]], item=7) == {"released": [[2, 0], [3, 0]]}
    runner._run_shards(_batch_item(4, item=6))  # an older item of the job is not touched by it
    assert ran == [0, 1, 2, 3] and calls[-1][1]["released"] == []
    ran.clear()
    runner._run_shards(_batch_item(4, item=7))
    assert ran == [0, 1]
    assert [c["shard"] for c in calls[-1][1]["commits"]] == [0, 1] and calls[-1][1]["released"] == [[2, 0], [3, 0]]
    ran.clear()
    runner._run_shards(_batch_item(4, item=8))  # given back once: a later item runs whole
    assert ran == [0, 1, 2, 3]


def test_snapshot_saves_the_rows_that_moved_most_and_remembers_them():
    store = _store(rows=4, parts=1)
    store.stage((1, 0, 0), 1, [_up(0, 0, [0, 5, 0, 1])])
    store.apply_pass(1, [(1, 0, 0)], {}, set(), store.owned())
    [(table, part, rows, values)], unsaved = store.snapshot(0.25)
    assert (table, part) == ("w", 0) and list(rows) == [1] and list(values) == [6.0]
    assert unsaved == 5.0**2 + 1.0**2  # the change not saved before this save
    assert np.array_equal(store.saved[("w", 0)], np.array([0.0, 6.0, 2.0, 3.0]))


def test_the_stores_import_no_dask():
    """Pure: decided and tested without a cluster (``dscar/__init__`` itself imports Dask, so read the source)."""
    import ast
    import inspect

    import dscar.worker.mirror_store
    import dscar.worker.partition_store
    import dscar.worker.shard_store

    for mod in (dscar.worker.partition_store, dscar.worker.shard_store, dscar.worker.mirror_store):
        tree = ast.parse(inspect.getsource(mod))
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level]
        assert not [n for n in names if n.split(".")[0] in ("dask", "distributed")], mod.__name__


def test_a_whole_save_writes_every_row_and_the_next_saves_pay_for_it():
    store = _store(rows=40, parts=1)
    store.parts[("w", 0)] += np.arange(40.0)
    ((_, _, rows, values),), _ = store.snapshot(0.25, {("w", 0)}, max_chain=7)
    assert rows is None and np.array_equal(values, store.parts[("w", 0)])
    # 40 rows, 30 beyond this save's share of 10: the next max_chain - 1 = 6 saves repay 5 each
    written = []
    for _ in range(7):
        store.parts[("w", 0)] += np.arange(40.0)
        ((_, _, rows, _),), _ = store.snapshot(0.25, max_chain=7)
        written.append(len(rows))
    assert written == [5] * 6 + [10]


def test_a_shard_moves_with_its_device_sparse_arrays():
    """CuPy's sparse matrices are arrays to move (found on a GPU: a sparse Lasso / MLR shard that
    moved lost its X); a cache a step keeps with the data stays behind."""
    from dscar.xp import is_array

    csr = type("csr_matrix", (), {"__module__": "cupyx.scipy.sparse._csr"})()
    assert is_array(csr) and is_array(np.zeros(2)) and not is_array({"gram": np.zeros(2)})
    entry = ShardEntry(data={"X": np.ones((2, 2)), "cache": {"gram": np.eye(2)}})
    assert set(entry.movable()[0]) == {"X"}


def test_a_pass_applied_here_settles_every_attempt_of_its_run_and_older_bsp():
    """Issue 38 item 6 (BSP): once the pass of run 5 is applied, an attempt of run 5 (a backup that lost)
    reading these rows would read the winner's update: the store says it lost; run 6 has not."""
    store = _store()
    store.stage((3, 0, 0), 5, [_up(0, 0, [1, 1, 1])])
    assert not store.settled(("w", 0), 5, 3, 0, ssp=False)
    store.apply_pass(5, [(3, 0, 0)], {}, set(), store.owned())
    assert store.settled(("w", 0), 5, 3, 1, ssp=False) and store.settled(None, 4, 3, 1, ssp=False)
    assert not store.settled(("w", 0), 6, 3, 0, ssp=False)


def test_under_ssp_only_an_applied_update_of_the_same_shard_and_clock_or_a_finished_clock_settles():
    store = _store()
    store.stage((3, 0, 0), 1, [_up(0, 0, [1, 1, 1])])
    store.apply_pass(1, [(3, 0, 0)], {}, set(), store.owned(), floor=1)
    assert store.settled(("w", 0), 1, 3, 0, ssp=True)  # shard 0's clock-3 update is in w/0: a backup lost
    assert not store.settled(("w", 0), 1, 3, 1, ssp=True)  # shard 1 of clock 3 may still commit
    assert not store.settled(("w", 0), 1, 4, 0, ssp=True)  # shard 0's next clock too
    assert not store.settled(("w", 0), 2, 3, 0, ssp=True)  # a later epoch (a redo after a loss)
    assert store.settled(("w", 1), 1, 1, 5, ssp=True)  # clock 1 has finished: every shard of it is in
    assert not store.settled(None, 1, 3, 0, ssp=True)


def test_the_shard_store_knows_which_attempts_lost_to_an_applied_commit():
    """A commit applied here, installed (the winner) or dropped (a loser's copy), settles that shard's
    attempts of its run and clock and older: a copy of it now is not what they started from."""
    shards = ShardStore()
    entry = ShardEntry({"x": np.zeros(2)}, {"z": np.zeros(2)})
    shards.put(0, entry)
    shards.put(1, ShardEntry({"x": np.ones(2)}))
    shards.stage_state((3, 0, 0), entry, {"z": np.ones(2)})
    assert not shards.lost(0, 5, 3)
    shards.install([(0, 0, ME, 3), (1, 1, OTHER, 3)], ME, drop_through=0, run=5)
    assert shards.lost(0, 5, 3) and shards.lost(1, 5, 3) and shards.lost(0, 4, 9)
    assert not shards.lost(0, 6, 3) and not shards.lost(0, 5, 4) and not shards.lost(2, 5, 3)
    shards.clear()
    assert not shards.lost(0, 5, 3)


def test_a_memory_copy_of_a_shard_state_unlike_the_declared_one_is_not_used():
    """The memory tier's copy is checked against the model's ``StateSpec`` as a disk copy is: a buddy
    whose copy has another dtype or shape (a bug, a stale or forged copy) costs the state, reported
    as ``checkpoint-corrupt``, and the shard's rebuild re-creates it; it is never read as the state."""
    import dscar
    from dscar.worker.shard_store import ShardEntry

    runner, calls, _ = _runner_with_steps()
    job = runner.host.job("j")
    job.algorithm = type("Declares", (), {"shard_state": staticmethod(
        lambda data: {"z": dscar.StateSpec("int32", (3,))})})()
    copies = {"buddy-a": {"z": np.arange(3, dtype=np.float64)}, "buddy-b": {"z": np.arange(3, dtype=np.int32)}}
    runner.host.peer = lambda address, op, **kw: calls.append((op, address)) or {"status": "OK",
                                                                              "value": copies[address]}
    item = {"clock": 4, "state_file": {"memory": "buddy-a", "clock": 3, "file": None}}
    entry = ShardEntry({"x": np.zeros(3)}, {"z": np.full(3, 7, np.int32)})
    runner._restore_state(job, 1, entry, item)
    assert entry.state == {}
    [(op, kw)] = [c for c in calls if c[0] == "event"]
    assert kw["kind"] == "checkpoint-corrupt" and "memory copy on buddy-a" in kw["info"]["error"]
    assert "'z' is float64 (3,), the model declares int32 (3,)" in kw["info"]["error"]
    runner._restore_state(job, 1, entry, {**item, "state_file": {"memory": "buddy-b", "clock": 3, "file": None}})
    assert entry.state["z"].tolist() == [0, 1, 2]


def test_an_attempt_stopped_as_a_lost_race_is_named_in_its_item_s_commit():
    """A lost-race stop reports no failure but is not silent: the item's commit names it (sent even
    when nothing else of the item commits), so a wrong verdict costs one attempt, never the fit."""
    from dscar.worker.runner import LostRace

    def loses(runner, shard):
        if shard in (1, 2):
            raise LostRace("another attempt was applied here")

    runner, calls, ran = _runner_with_steps(loses)
    runner._run_shards(_batch_item(3))
    assert ran == [0, 1, 2]
    [(op, kw)] = calls
    assert op == "commit" and [c["shard"] for c in kw["commits"]] == [0]
    assert [(s["shard"], s["attempt"], s["clock"]) for s in kw["stopped"]] == [(1, 0, 3), (2, 0, 3)]
    assert all(s["seconds"] >= 0 for s in kw["stopped"])

    runner, calls, _ = _runner_with_steps(lambda r, shard: loses(r, shard + 1))
    runner._run_shards(_batch_item(1))
    [(op, kw)] = calls
    assert op == "commit" and kw["commits"] == [] and [s["shard"] for s in kw["stopped"]] == [0]


def test_a_commit_reports_the_partitions_its_updates_touched_and_owners_of_others_skip_its_worker():
    from dscar.core.apply_plan import merge_touched, touches
    from dscar.worker.partition_store import touched_parts

    ups = [_up(1, 0, [1.0]), _up(1, 2, [1.0]), ("stats", 0, 0, np.ones(1), None)]
    assert touched_parts(ups, {"w": 4, "stats": 1}) == {"w": [1], "stats": None}  # None: every partition
    assert touched_parts([], {"w": 4}) == {}
    merged: dict = {}
    merge_touched(merged, {"w": (1,)})  # as a message carries it: tuples
    merge_touched(merged, {"w": [3]})
    assert merged == {"w": {1, 3}}
    assert touches(merged, [("w", 3)]) and not touches(merged, [("w", 0), ("w", 2), ("stats", 0)])
    merge_touched(merged, {"w": None})
    assert merged == {"w": None} and touches(merged, [("w", 0)])
    assert touches(None, [("w", 0)])  # unknown: fetch
    assert not touches({}, [("w", 0)])  # an attempt that staged nothing


def test_a_read_spanning_several_owners_asks_them_all_at_once():
    """Rows of partitions held by W-1 other workers cost one round trip (``peer_all``), not W-1 in a row."""
    import threading

    from dscar.worker.runner import Job, ShardRunner

    store = _store(rows=9, parts=3)
    for p in (1, 2):
        store.parts.pop(("w", p))  # held by others
    job = Job(id="j", algorithm=None, meta=None, specs=store.specs, layouts=store.layouts, loader=None,
              tol=0.0, xp=np, tables=store, shards=ShardStore(store.lock),
              owners={("w", 0): ME, ("w", 1): OTHER, ("w", 2): "tcp://third:3"})
    batches = []

    class Host:
        address, stop, in_process = ME, threading.Event(), True

        def peer(self, address, op, **kw):
            raise AssertionError("one peer at a time")

        def peer_all(self, calls):
            batches.append([(a, op) for a, op, _ in calls])
            out = []
            for _, _, kw in calls:
                a = 3 * kw["part"]
                vals = np.arange(a, a + 3.0)
                out.append({"status": "OK", "data": vals[kw["lo"]:kw["hi"]] if kw.get("rows") is None
                            else vals[np.asarray(kw["rows"].data)]})
            return out

    runner = ShardRunner(Host())
    got = runner.read_rows(job, "w", 1, 8)
    np.testing.assert_array_equal(got, np.arange(1.0, 8.0))
    got[:] = -1  # (the pieces are written into a new array: the reader's copy, not the partition)
    np.testing.assert_array_equal(runner.read_rows(job, "w", 0, 9), np.arange(9.0))
    np.testing.assert_array_equal(runner.read_row_set(job, "w", [8, 0, 4, 2]), [8.0, 0.0, 4.0, 2.0])
    assert batches == [[(OTHER, "pull"), ("tcp://third:3", "pull")]] * 3


def test_a_clock_end_that_could_not_reach_a_peer_names_it_in_its_failure():
    """The coordinator removes a peer the clock end could not reach (if it does not answer a probe
    either) before it handles the failure, so a worker that died under a clock end costs the clock,
    not the fit (bench.chaos seed 902 run 9: ``clock_end of clock 5 failed``, a reset connection)."""
    from dscar.inflight import PeerUnreachable

    runner, calls, _ = _runner_with_steps()
    job = runner.host.job("j")

    def clock_end(ctx):
        try:
            raise PeerUnreachable("tcp://dead", "ConnectionResetError(104)")
        except PeerUnreachable as e:
            raise RuntimeError("the model's own wrapping") from e

    job.algorithm = type("Ends", (), {"clock_end": staticmethod(clock_end)})()
    job.pull_cache = type("Cache", (), {"prepare": staticmethod(lambda item: None)})()
    job.ssp = False
    runner._inject = lambda *a, **k: None
    item = {"job": "j", "clock": 5, "run": 7, "owners": []}
    runner._run_clock_end(item)
    [(op, kw)] = calls
    assert op == "clock_failed" and kw["unreachable"] == "tcp://dead" and kw["clock"] == 5
    calls.clear()
    job.algorithm = type("Ends", (), {"clock_end": staticmethod(lambda ctx: 1 / 0)})()
    runner._run_clock_end(item)
    [(op, kw)] = calls
    assert op == "clock_failed" and "unreachable" not in kw and "ZeroDivisionError" in kw["error"]


def test_a_commit_says_which_attempts_moved_their_shard_so_the_coordinator_sends_their_pass_everywhere():
    runner, calls, _ = _runner_with_steps(moved={1})
    runner._run_shards(_batch_item(3))
    [(op, kw)] = calls
    assert op == "commit" and [c.get("moved", False) for c in kw["commits"]] == [False, True, False]


class _Steps:
    """The algorithm of ``_attempt``'s tests: its step sets a state when told to."""

    def __init__(self, set_state: bool = False):
        self.set_state = set_state

    def prepare_shard(self, arrays, xp):
        return dict(arrays)

    def shard_step(self, ctx, data):
        if self.set_state:
            ctx.set_state("z", np.ones(1))


def test_an_attempt_moved_its_shard_when_it_ran_from_a_copy_a_backup_s_entry_or_set_a_state():
    """``Finished.moved``: only an attempt on the shard's holder, from the held entry, that set no
    state leaves every shard store as its pass's apply would (then a worker with no partition needs
    no apply message: ``apply_plan.apply_receivers``)."""
    runner, calls, _ = _runner_with_steps()
    del runner._attempt  # (the real one)
    job = runner.host.job("j")
    job.algorithm = _Steps()
    job.shards.put(0, ShardEntry({"x": np.zeros(2)}, {}))
    item = {"op": "shard", "clock": 3, "run": 5, "shard": 0, "attempt": 0, "fetch_from": None, "backup": False}
    assert runner._attempt(job, item)[2] is False  # the holder, from its entry
    assert runner._attempt(job, {**item, "attempt": 1, "backup": True})[2] is True  # a backup runs from a copy
    assert runner._attempt(job, {**item, "shard": 2, "fetch_from": "holder"})[2] is True  # copied here
    job.algorithm = _Steps(set_state=True)
    assert runner._attempt(job, {**item, "attempt": 2})[2] is True  # a new state


def test_a_work_item_of_a_newer_run_drops_what_older_runs_staged_and_older_clocks_pending_states():
    """A worker sent no apply (nothing to apply there) still drops what it staged: every pass older
    than the item's run was applied or voided."""
    from dscar.worker.runner import Job

    store = _store()
    shards = ShardStore(store.lock)
    job = Job(id="j", algorithm=None, meta=None, specs=store.specs, layouts=store.layouts, loader=None,
              tol=0.0, xp=np, tables=store, shards=shards)
    entry = ShardEntry({"x": np.zeros(2)}, {})
    store.stage((3, 0, 1), 5, [_up(0, 0, [1, 1, 1])])
    store.stage((4, 0, 1), 6, [_up(0, 0, [1, 1, 1])])
    shards.stage_state((3, 0, 1), entry, {})
    shards.stage_state((4, 0, 1), entry, {})
    job.settle_before(6, 4)
    assert list(store.staged) == [(4, 0, 1)] and list(shards.pending) == [(4, 0, 1)]
