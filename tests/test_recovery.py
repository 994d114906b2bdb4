"""Losing workers that own partitions: checkpoints, partial and full recovery, resume."""
import asyncio
import os
import signal
import threading
import time

import fsspec
import numpy as np
import pytest

import dscar
from dscar.algorithms.datasets import lasso_alpha_max, make_regression
from dscar.algorithms.lasso import LassoCD
from dscar import CheckpointConfig, faults
from dscar import checkpoint as ckpt
from conftest import RowCounter, row_data


def kinds(res):
    return [e["kind"] for e in res.events]


def counts_by_partition(res, n_rows, n_parts):
    from dscar.core.partitions import row_bounds

    out = []
    for a, b in row_bounds(n_rows, n_parts):
        vals = np.unique(res.params["count"][a:b])
        assert vals.size == 1, "a partition holds a torn mix of values"
        out.append(int(vals[0]))
    return out


def checkpointed_clocks(res):
    return {0} | {c["clock"] for c in res.checkpoints} | {
        e["clock"] for e in res.events if e["kind"] == "checkpoint-started"}


@pytest.mark.parametrize("recovery", ["partial", "full"])
@pytest.mark.parametrize("policy", ["full", "priority"])
@pytest.mark.parametrize("losses", [1, 2])
def test_after_losses_every_partition_has_one_live_owner_with_a_pre_loss_or_checkpointed_value(
        tmp_path, policy, recovery, losses):
    """RowCounter adds 1 per clock to every row: a partition's count tells which value it holds."""
    n_rows, n_parts, clocks = 80, 4, 8
    plan = [faults.lose(1, 5)] + ([faults.lose(2, 5)] if losses == 2 else [])
    cfg = CheckpointConfig(str(tmp_path), policy=policy, every=2, fraction=1.0 if policy == "full" else 0.5,
                           recovery=recovery)
    with dscar.Cluster(n_workers=4, processes=False) as cl:
        res = dscar.fit(RowCounter(n_parts=n_parts, sleep=0.01), row_data(n_rows), cl, n_shards=8,
                        max_clocks=clocks, checkpoint=cfg, faults=plan)
        owners = cl.client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.workers))
    assert res.n_clocks == clocks
    lost = {e["worker"] for e in res.events if e["kind"] == "worker-lost"}
    assert len(lost) == losses
    restored = [e for e in res.events if e["kind"] == "partition-restored"]
    final = {(e["table"], e["part"]): e["target"] for e in restored}  # a later restore supersedes one onto
    assert final and all(t not in lost for t in final.values())  # a worker lost right after it
    assert set(final.values()) <= set(owners)
    assert "recovery-done" in kinds(res) and "clock-restarted" in kinds(res)
    # every row holds a value it had: its pre-loss value, or a value it had when a checkpoint
    # saved it (priority saves some rows per version, so rows of one partition may differ)
    saved = checkpointed_clocks(res)
    counts = res.params["count"]
    assert np.all(counts == np.round(counts)) and counts.min() >= clocks - 5  # never zeros
    for count in np.unique(counts):
        lag = clocks - int(count)
        assert lag == 0 or (5 - 1 - lag) in saved, (np.unique(counts), saved)
    if policy == "full":
        counts_by_partition(res, n_rows, n_parts)  # a full save restores a partition from one file
    if recovery == "full":
        assert "rollback" in kinds(res)
    if recovery == "partial":
        assert counts.max() == clocks  # live partitions kept their current values


def test_a_simulated_loss_measures_the_perturbation_of_each_restored_partition(tmp_path):
    """RowCounter's counts are the clock number on every row: losing worker 1 at the start of clock
    7 loses counts of 6; restored from the version-v checkpoint (full, every 4 clocks: clock 4v) they
    are 4v, so ``||restored - lost||`` is (6 - 4v) sqrt(rows) per partition, ``||lost||`` 6 sqrt(rows)."""
    from dscar.core.partitions import row_bounds

    n_rows, n_parts = 60, 3
    cfg = CheckpointConfig(str(tmp_path), policy="full", every=4, recovery="partial")
    with dscar.Cluster(n_workers=3, processes=False) as cl:
        res = dscar.fit(RowCounter(n_parts=n_parts, sleep=0.01), row_data(n_rows), cl, n_shards=6,
                        max_clocks=9, checkpoint=cfg, faults=[faults.lose(1, 7)])
    restored = {e["part"]: e for e in res.events if e["kind"] == "partition-restored" and e["table"] == "count"}
    measured = [e for e in res.events if e["kind"] == "partition-perturbation"]
    assert restored and sorted(e["part"] for e in measured) == sorted(restored)
    for e in measured:
        a, b = row_bounds(n_rows, n_parts)[e["part"]]
        version = restored[e["part"]]["version"]
        assert e["perturbation"] == pytest.approx((6 - 4 * version) * np.sqrt(b - a)), e
        assert e["lost_norm"] == pytest.approx(6 * np.sqrt(b - a)), e
    [done] = [e for e in res.events if e["kind"] == "recovery-done"]
    assert done["perturbation"]["count"] == pytest.approx(np.sqrt(sum(e["perturbation"] ** 2 for e in measured)))
    assert set(done["perturbation"]) == {"count"}  # reduction tables are not state: not measured


def test_the_memory_tier_restores_a_lost_partition_as_of_the_last_clock(tmp_path):
    """RowCounter adds 1 per clock to every row. From disk (10 % of the rows per clock) a lost partition
    would come back as a mix of old counts; from its buddy's memory it is the count of the last clock
    (or the one before, if that copy was still travelling), and the interrupted clock runs again."""
    n_rows, n_parts, clocks = 80, 4, 8
    cfg = CheckpointConfig(str(tmp_path), policy="priority", every=10, fraction=0.1, memory=True)
    with dscar.Cluster(n_workers=4, processes=False) as cl:
        res = dscar.fit(RowCounter(n_parts=n_parts, sleep=0.01), row_data(n_rows), cl, n_shards=8,
                        max_clocks=clocks, checkpoint=cfg, faults=[faults.lose(1, 5)])
    [plan] = [e for e in res.events if e["kind"] == "recovery-started"]
    restored = [e for e in res.events if e["kind"] == "partition-restored" and e["table"] == "count"]
    assert restored and all(e.get("tier") == "memory" and e["memory_clock"] >= 3 for e in restored), restored
    assert [[e["table"], e["part"]] for e in restored] == [x[:2] for x in plan["from_memory"]]
    counts = res.params["count"]
    assert counts.max() == clocks and counts.min() >= clocks - 1, np.unique(counts)


def test_published_manifests_only_name_durable_verified_files(tmp_path):
    cfg = CheckpointConfig(str(tmp_path), policy="priority", every=4, fraction=0.5, keep=10)
    with dscar.Cluster(n_workers=3, processes=False) as cl:
        res = dscar.fit(RowCounter(sleep=0.005), row_data(60), cl, n_shards=6, max_clocks=8, checkpoint=cfg)
    fs, root = ckpt.fs_and_root(str(tmp_path))
    versions = ckpt.list_versions(fs, root)
    assert versions == [c["version"] for c in res.checkpoints] and len(versions) == 4
    for v in versions:
        m = ckpt.load_manifest(fs, root, v)
        assert m["model"]["name"] == "rowcounter"
        for chain in m["chains"].values():
            for e in chain:
                ckpt.read_entry(fs, root, e)  # raises if missing or not matching its checksum
    # the newest manifest restores each row's newest saved value: with r = 0.5 every 2 clocks
    # and every row moving alike, half the rows were saved at clock 8, the others at clock 6
    last = ckpt.load_manifest(fs, root, versions[-1])
    assert last["clock"] == 8
    vals = np.concatenate([ckpt.apply_chain(fs, root, np.zeros(20), last["chains"][f"count/{p}"]) for p in range(3)])
    assert sorted(np.unique(vals)) == [6.0, 8.0] and (vals == 8.0).sum() == 30


def test_a_planted_corrupt_checkpoint_is_detected_and_an_older_one_used(tmp_path):
    cfg = CheckpointConfig(str(tmp_path), policy="full", every=2, keep=5)
    fs, root = ckpt.fs_and_root(str(tmp_path))
    stop = threading.Event()

    def corrupt_new_versions():  # every version after the first is damaged as soon as it is published
        while not stop.is_set():
            for v in ckpt.list_versions(fs, root):
                if v >= 2:
                    for chain in ckpt.load_manifest(fs, root, v)["chains"].values():
                        for e in chain:
                            with open(e["path"], "r+b") as f:
                                f.seek(-3, os.SEEK_END)
                                f.write(b"\x00\xff\x00")
            time.sleep(0.005)

    t = threading.Thread(target=corrupt_new_versions)
    t.start()
    try:
        with dscar.Cluster(n_workers=3, processes=False) as cl:
            res = dscar.fit(RowCounter(n_parts=3, sleep=0.03), row_data(60), cl, n_shards=6, max_clocks=10,
                            checkpoint=cfg, faults=[faults.lose(1, 8)])
    finally:
        stop.set()
        t.join()
    corrupt = [e for e in res.events if e["kind"] == "checkpoint-corrupt"]
    assert corrupt and all(e["version"] >= 2 for e in corrupt)
    restored = [e for e in res.events if e["kind"] == "partition-restored" and e["table"] == "count"]
    assert restored and all(e["version"] == 1 for e in restored)  # the clock-2 checkpoint
    lagging = [c for c in counts_by_partition(res, 60, 3) if c != 10]
    assert lagging == [10 - (8 - 1 - 2)]


def test_resume_skips_a_corrupt_newest_checkpoint(tmp_path):
    cfg = CheckpointConfig(str(tmp_path), policy="full", every=2, keep=5)
    fs, root = ckpt.fs_and_root(str(tmp_path))
    with dscar.Cluster(n_workers=2, processes=False) as cl:
        dscar.fit(RowCounter(), row_data(40), cl, n_shards=4, max_clocks=6, checkpoint=cfg)
        newest = ckpt.load_manifest(fs, root, ckpt.list_versions(fs, root)[-1])
        assert newest["clock"] == 6
        path = newest["chains"]["count/1"][0]["path"]
        with open(path, "r+b") as f:  # plant a corrupt file in the newest version
            f.seek(40)
            f.write(b"garbage")
        res = dscar.fit(RowCounter(), row_data(40), cl, n_shards=4, max_clocks=8, checkpoint=cfg, resume=True)
    corrupt = [e for e in res.events if e["kind"] == "checkpoint-corrupt"]
    assert corrupt and corrupt[0]["version"] == newest["version"]
    resumed = next(e for e in res.events if e["kind"] == "resumed")
    assert resumed["version"] == newest["version"] - 1 and res.history[0].clock == 5
    np.testing.assert_array_equal(res.params["count"], np.full(40, 8.0))


def test_a_resume_numbers_its_versions_past_every_version_the_store_shows(tmp_path):
    """The newest manifest cannot be read (the resume passes over it) and an abandoned version left
    a data folder with no manifest: the resumed fit writes neither name again, so the unreadable
    manifest is kept as it was for a person to look at and no file lands among another run's."""
    cfg = CheckpointConfig(str(tmp_path), policy="full", every=2, keep=5)
    fs, root = ckpt.fs_and_root(str(tmp_path))
    with dscar.Cluster(n_workers=2, processes=False) as cl:
        dscar.fit(RowCounter(), row_data(40), cl, n_shards=4, max_clocks=6, checkpoint=cfg)
        newest = ckpt.list_versions(fs, root)[-1]
        with open(ckpt.manifest_path(root, newest), "r+b") as f:
            f.truncate(10)
        torn = bytes(open(ckpt.manifest_path(root, newest), "rb").read())
        abandoned = newest + 2
        os.makedirs(ckpt.data_dir(root, abandoned))
        res = dscar.fit(RowCounter(), row_data(40), cl, n_shards=4, max_clocks=10, checkpoint=cfg, resume=True)
    assert [e["version"] for e in res.events if e["kind"] == "checkpoint-skipped"] == [newest]
    assert next(e for e in res.events if e["kind"] == "resumed")["version"] == newest - 1
    written = [c["version"] for c in res.checkpoints]
    assert written and min(written) == abandoned + 1, written
    assert open(ckpt.manifest_path(root, newest), "rb").read() == torn
    np.testing.assert_array_equal(res.params["count"], np.full(40, 10.0))


def test_resume_refuses_a_linked_newest_version_and_uses_the_older_one(tmp_path):
    """The newest version's data folder moved outside the store and a link put in its place (the
    same bytes: every checksum would match): the resume passes over that version with an event,
    restores the one before, and nothing outside the store is used, changed or deleted, though
    retention runs at every checkpoint of the resumed fit."""
    import shutil

    store, outside = tmp_path / "store", tmp_path / "outside"
    cfg = CheckpointConfig(str(store), policy="full", every=2, keep=2)
    fs, root = ckpt.fs_and_root(str(store))
    with dscar.Cluster(n_workers=2, processes=False) as cl:
        dscar.fit(RowCounter(), row_data(40), cl, n_shards=4, max_clocks=6, checkpoint=cfg)
        newest = ckpt.list_versions(fs, root)[-1]
        assert ckpt.load_manifest(fs, root, newest)["clock"] == 6
        shutil.move(ckpt.data_dir(root, newest), outside)
        os.symlink(outside, ckpt.data_dir(root, newest))
        before = {p.name: p.read_bytes() for p in outside.iterdir()}
        res = dscar.fit(RowCounter(), row_data(40), cl, n_shards=4, max_clocks=12, checkpoint=cfg, resume=True)
    skipped = [e for e in res.events if e["kind"] == "checkpoint-skipped"]
    assert [e["version"] for e in skipped] == [newest] and "symbolic link" in skipped[0]["error"], skipped
    resumed = next(e for e in res.events if e["kind"] == "resumed")
    assert resumed["version"] == newest - 1 and res.history[0].clock == 5
    np.testing.assert_array_equal(res.params["count"], np.full(40, 12.0))
    assert len(res.checkpoints) >= 3  # retention ran past the linked folder's version, and said it left it alone
    assert any(e["error"].startswith(f"{ckpt.data_dir(root, newest)}: a symbolic link, left alone")
               for e in res.events if e["kind"] == "checkpoint-corrupt")
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before
    assert os.path.islink(ckpt.data_dir(root, newest))


def lasso_problem():
    X, y, _ = make_regression(3000, 80, 12, rho=0.5, seed=4)
    return X, y, 0.01 * lasso_alpha_max(X, y)


@pytest.mark.timeout(240)
def test_real_kill_under_partial_recovery_reaches_the_same_objective(tmp_path):
    X, y, alpha = lasso_problem()
    algo = LassoCD(alpha, tol=1e-8, max_working_set=8, working_set_start=8)
    with dscar.Cluster(n_workers=3) as cl:
        base = dscar.fit(algo, {"X": X, "y": y}, cl, n_shards=6, max_clocks=300)
    with dscar.Cluster(n_workers=3) as cl:
        cfg = CheckpointConfig(str(tmp_path), policy="priority", every=4, fraction=0.25, recovery="partial")
        res = dscar.fit(algo, {"X": X, "y": y}, cl, n_shards=6, max_clocks=300, checkpoint=cfg,
                        faults=[faults.kill(1, base.n_clocks // 2, point="apply")])
    assert base.converged and res.converged
    assert abs(res.objective - base.objective) <= 1e-7 * base.objective
    k = kinds(res)
    for kind in ("fault-kill", "worker-lost", "recovery-started", "partition-restored", "recovery-done",
                 "rebuild-done"):
        assert kind in k, kind
    rework = res.n_clocks - base.n_clocks  # can be negative: a restored partition changes the block path
    assert abs(rework) <= base.n_clocks // 2, (rework, base.n_clocks)


def test_resume_continues_from_the_newest_checkpoint(tmp_path):
    X, y, alpha = lasso_problem()
    algo = LassoCD(alpha, tol=1e-9, max_working_set=8, working_set_start=8)
    cfg = CheckpointConfig(str(tmp_path), policy="full", every=3)
    with dscar.Cluster(n_workers=2, processes=False) as cl:
        whole = dscar.fit(algo, {"X": X, "y": y}, cl, n_shards=4, max_clocks=300)
        first = dscar.fit(algo, {"X": X, "y": y}, cl, n_shards=4, max_clocks=9, checkpoint=cfg)
        assert not first.converged and first.checkpoints[-1]["clock"] == 9
        second = dscar.fit(algo, {"X": X, "y": y}, cl, n_shards=4, max_clocks=300, checkpoint=cfg, resume=True)
        assert second.converged and second.history[0].clock == 10 and "resumed" in kinds(second)
        np.testing.assert_allclose(second.params["w"], whole.params["w"], atol=1e-8)
        assert second.history[-1].clock == whole.n_clocks  # resuming costs no clock
        with pytest.raises(dscar.InvalidInputError, match="other hyperparameters"):
            dscar.fit(LassoCD(alpha * 2, max_working_set=8, working_set_start=8), {"X": X, "y": y}, cl,
                      n_shards=4, checkpoint=cfg, resume=True)
        with pytest.raises(dscar.InvalidInputError, match="holds checkpoints of model 'lasso'"):
            dscar.fit(RowCounter(), row_data(40), cl, n_shards=4, checkpoint=cfg, resume=True)
        with pytest.raises(dscar.InvalidInputError, match="nothing to resume"):
            dscar.fit(algo, {"X": X, "y": y}, cl, n_shards=4, checkpoint=str(tmp_path / "empty"), resume=True)


@pytest.mark.parametrize(
    "cfg, match",
    [
        (lambda p: CheckpointConfig(str(p / "file" / "sub")), "not writable"),
        (lambda p: CheckpointConfig(str(p), fraction=0.0), "fraction r"),
        (lambda p: CheckpointConfig(str(p), fraction=1.01), "fraction r"),
        (lambda p: CheckpointConfig(str(p), every=0), "interval C"),
        (lambda p: 42, "checkpoint must be"),
    ],
)
def test_bad_checkpoint_options_raise_before_training(inproc, tmp_path, cfg, match):
    (tmp_path / "file").write_text("x")
    with pytest.raises(dscar.InvalidInputError, match=match):
        dscar.fit(RowCounter(), row_data(20), inproc, n_shards=2, checkpoint=cfg(tmp_path))
    assert inproc.client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.plugins["dscar-coordinator"].jobs)) == 0


def test_resume_needs_a_location(inproc):
    with pytest.raises(dscar.InvalidInputError, match="resume=True needs"):
        dscar.fit(RowCounter(), row_data(20), inproc, n_shards=2, resume=True)


class ShardClock(dscar.Algorithm):
    """Test model with shard state: each shard counts its own clocks in its state ``n``, and the
    table ``seen`` holds, per shard, the sum the state implies. A step checks the two agree, so a
    restored state the tables do not match (or the reverse) fails the job."""

    name = "shardclock"
    data_names = ("row",)

    def tables(self, meta):
        return [dscar.TableSpec("seen", meta.n_shards, n_parts=2)]

    def _n(self, ctx):
        return int(dscar.to_host(ctx.state["n"])[0]) if "n" in ctx.state else 0

    def shard_step(self, ctx, data):
        time.sleep(0.01)
        n, seen = self._n(ctx), int(dscar.to_host(ctx.pull("seen"))[ctx.shard])
        if n != seen:
            raise AssertionError(f"shard {ctx.shard}: state n={n} but the table says {seen}")
        ctx.set_state("n", np.array([n + 1]))
        ctx.add("seen", np.ones(1), start=ctx.shard)

    def rebuild_tables(self):
        return ["seen"]

    def rebuild_step(self, ctx, data):
        ctx.add("seen", np.array([float(self._n(ctx))]), start=ctx.shard)

    def clock_end(self, ctx):
        return {"objective": float(dscar.to_host(ctx.pull("seen")).sum())}

    def converged(self, history, tol):
        return False


@pytest.mark.parametrize("policy, recovery", [("priority", "partial"), ("full", "full")])
def test_shard_states_are_checkpointed_and_restored_with_the_tables(tmp_path, policy, recovery):
    n_shards, clocks, loss = 8, 9, 6
    cfg = CheckpointConfig(str(tmp_path), policy=policy, every=2, fraction=0.5 if policy == "priority" else 1.0,
                           recovery=recovery)
    with dscar.Cluster(n_workers=3, processes=False) as cl:
        res = dscar.fit(ShardClock(), row_data(4 * n_shards), cl, n_shards=n_shards, max_clocks=clocks,
                        checkpoint=cfg, faults=[faults.lose(1, loss)])
    assert res.n_clocks == clocks
    kinds_ = kinds(res)
    assert {"worker-lost", "recovery-done", "rebuild-done"} <= set(kinds_)
    manifests = [ckpt.load_manifest(fsspec.filesystem("file"), str(tmp_path), v)
                 for v in ckpt.list_versions(fsspec.filesystem("file"), str(tmp_path))]
    assert manifests and all(len(m["states"]) == n_shards for m in manifests)  # every shard's state saved
    restored = next(e for e in res.events if e["kind"] == "recovery-started")["shard_states"]
    assert restored, "the lost worker's shards took their states from the checkpoint"
    seen = res.params["seen"]
    # every shard's count is the clocks it ran: all for the live ones (partial), fewer where a
    # checkpointed state was restored -- never zero, never more than the clocks run
    assert seen.min() >= 1 and seen.max() <= clocks
    if recovery == "partial":
        assert sorted(np.flatnonzero(seen < clocks)) == sorted(set(restored) & set(np.flatnonzero(seen < clocks)))
        assert (seen == clocks).sum() >= n_shards - len(restored)
    else:
        assert "rollback" in kinds_ and (seen < clocks).all()  # every state rolled back with the tables


def test_a_full_rollback_to_checkpoint_0_restarts_every_shard_state(tmp_path):
    """Full recovery before the first checkpoint rolls the tables back to their initial values, and every
    shard's state with them, the survivors' too: a state kept from after the version is no rollback (an
    LDA shard keeping its assignments made a "traditional" loss cost nothing)."""
    n_shards, clocks, loss = 8, 7, 4
    cfg = CheckpointConfig(str(tmp_path), policy="full", every=100, recovery="full")
    with dscar.Cluster(n_workers=3, processes=False) as cl:
        res = dscar.fit(ShardClock(), row_data(4 * n_shards), cl, n_shards=n_shards, max_clocks=clocks,
                        checkpoint=cfg, faults=[faults.lose(1, loss)])
    start = next(e for e in res.events if e["kind"] == "recovery-started")
    assert start["version"] == 0 and start["shard_states"] == list(range(n_shards))
    # the clocks after the loss count from zero in every shard (ShardClock fails a step whose state and
    # table disagree): the loss clock, cut short, is run again, and then the rest
    np.testing.assert_array_equal(res.params["seen"], np.full(n_shards, clocks - loss + 1.0))


def test_the_memory_tier_restores_lost_shard_states_as_of_the_last_clock(tmp_path):
    """From disk (a quarter of the shard states per clock) a lost shard's count would come back up to
    four clocks old; from the buddy's memory it is the last clock's (or the one before, if that copy
    was still travelling), and the tables are rebuilt to match it."""
    n_shards, clocks, loss = 8, 9, 6
    cfg = CheckpointConfig(str(tmp_path), policy="priority", every=4, fraction=0.25, memory=True)
    with dscar.Cluster(n_workers=3, processes=False) as cl:
        res = dscar.fit(ShardClock(), row_data(4 * n_shards), cl, n_shards=n_shards, max_clocks=clocks,
                        checkpoint=cfg, faults=[faults.lose(1, loss)])
    start = next(e for e in res.events if e["kind"] == "recovery-started")
    assert start["shard_states"] and [s for s, _, _ in start["states_from_memory"]] == start["shard_states"]
    assert all(c >= loss - 2 for _, _, c in start["states_from_memory"]), start
    seen = res.params["seen"]
    assert seen.max() == clocks and seen.min() >= clocks - 1, seen


@pytest.mark.parametrize("seed", range(3))
def test_shard_state_stays_with_the_winning_attempt_under_backups_and_steals(seed):
    """A slowed worker loses commits to backups elsewhere and later steals those shards back:
    it must fetch the winner's state, never reuse its own stale copy (ShardClock checks).

    Slowed 8x or 16x: its one attempt a clock (80+ ms) then outlives the others' run through the
    other 11 shards (~55 ms), so a backup is due in most clocks. At 4x (40 ms) the straggler rule
    usually leaves nothing to back up, and 1 run in ~130 had no backup in 10 clocks."""
    rng = np.random.default_rng(seed)
    slow = [faults.slow(int(rng.integers(0, 3)), float(rng.choice([8.0, 16.0])))]
    with dscar.Cluster(n_workers=3, processes=False) as cl:
        res = dscar.fit(ShardClock(), row_data(48), cl, n_shards=12, max_clocks=10, faults=slow,
                        policies=[dscar.core.policies.BackupPolicy(k=1.5)])
    assert res.n_clocks == 10
    assert "backup-attempt" in kinds(res)
    np.testing.assert_array_equal(res.params["seen"], np.full(12, 10.0))


def test_an_owner_lost_while_the_model_is_gathered_is_recovered_and_the_gather_retried(inproc, tmp_path, monkeypatch):
    """The fit's last step gathers the param tables from their owners. An owner lost right then (here a
    simulated loss, as a kill would be) is recovered by the coordinator, and the driver asks for the
    owners again instead of failing the fit."""
    from dscar.api.driver import _Run

    real = _Run._gather_from
    lost = []

    async def gather_once_lost(self, owner):
        if not lost:  # the first gather: one owner is lost under it
            victim = sorted(set(owner.values()))[-1]
            lost.append(victim)
            await self._scall("simulate_loss", worker=victim)
            raise OSError(f"{victim} went away")
        return await real(self, owner)

    monkeypatch.setattr(_Run, "_gather_from", gather_once_lost)
    cfg = CheckpointConfig(str(tmp_path), policy="full", every=1)
    res = dscar.fit(RowCounter(n_parts=2), row_data(40), inproc, n_shards=4, max_clocks=3, checkpoint=cfg)
    kinds = [e["kind"] for e in res.events]
    assert lost and kinds.count("worker-lost") == 1 and "recovery-done" in kinds, kinds
    # the lost owner's partition comes back from the clock-3 checkpoint: every row counted 3 times
    np.testing.assert_array_equal(res.params["count"], np.full(40, 3.0))


def test_a_loss_after_the_last_clock_is_reported_with_the_model_it_returns():
    """The model gathered after such a loss is the one recovery restored: a model-restored event says so."""
    from dscar.api.driver import _Run

    run = object.__new__(_Run)
    run.events = [{"time": 5.0, "kind": "worker-lost", "worker": "a"}, {"time": 9.0, "kind": "worker-lost", "worker": "b"}]
    run._last_report_at = 7.0
    run._note_late_recovery(12)
    [e] = [e for e in run.events if e["kind"] == "model-restored"]
    assert e["workers"] == ["b"] and e["clock"] == 12
    run.events, run._last_report_at = [{"time": 5.0, "kind": "worker-lost", "worker": "a"}], 7.0
    run._note_late_recovery(12)
    assert not any(e["kind"] == "model-restored" for e in run.events)


def test_priority_chains_stay_short_old_files_go_and_the_checkpoint_restores_the_model(tmp_path):
    """A priority checkpoint every clock for 24 clocks with ``max_chain`` 3: chains are made whole
    in turn, retention deletes the files no kept manifest names, and a resume from the newest
    version restores a model at least as good as the one 8 clocks before it."""
    X, y, alpha = lasso_problem()
    algo = LassoCD(alpha, tol=1e-12, max_working_set=8, working_set_start=8)
    cfg = CheckpointConfig(str(tmp_path), policy="priority", every=10, fraction=0.1, max_chain=3)
    with dscar.Cluster(n_workers=2, processes=False) as cl:
        first = dscar.fit(algo, {"X": X, "y": y}, cl, n_shards=4, max_clocks=24, checkpoint=cfg)
        fs, root = ckpt.fs_and_root(cfg.url)
        versions = ckpt.list_versions(fs, root)
        m = ckpt.load_manifest(fs, root, versions[-1])
        assert m["clock"] == 24 and m["version"] == 24  # a checkpoint a clock (the flush publishes the last)
        chains = list(m["chains"].values())
        assert chains and all(len(c) <= 4 for c in chains)  # max_chain, plus a version's wait for its turn
        # a chain starts with a whole save, or has not reached max_chain since the initial values
        # (a partition of a row or two saves a row every few versions)
        assert all(not c[0]["partial"] or len(c) < 3 for c in chains)
        assert not m["chains"]["w/0"][0]["partial"] and not m["chains"]["w/1"][0]["partial"]
        kept = set()
        for v in versions:
            mv = ckpt.load_manifest(fs, root, v)
            kept |= {e["path"] for e in [*(e for c in mv["chains"].values() for e in c), *mv["states"].values()]}
        on_disk = {p for p in fs.find(root) if p.endswith(".bin")}
        assert {fs._strip_protocol(p) for p in kept} == {fs._strip_protocol(p) for p in on_disk}
        # a file per writer (2) and version without deletion; the chains name at most 4 versions'
        # files each (a tiny partition's chain may be short in entries but reach far back)
        assert len(on_disk) < m["version"], (len(on_disk), m["version"])
        second = dscar.fit(algo, {"X": X, "y": y}, cl, n_shards=4, max_clocks=25, checkpoint=cfg, resume=True)
        assert second.history[0].clock == 25
        assert second.history[0].objective <= first.history[16 - 1].objective


@pytest.mark.parametrize("when", ["before-the-restore", "while-serving-the-copy"])
def test_a_memory_buddy_lost_after_the_plan_sends_the_restore_to_disk_and_keeps_the_restorer(tmp_path, monkeypatch, when):
    """The race of an owner and its buddy dying together, made certain: worker 1 is killed, and the
    buddy the recovery plan names for its partitions' memory copies is lost after the plan: before any
    restore is sent (the coordinator skips its copy) or while it serves the first copy to a restoring
    worker (that worker reports the source gone). Either way the partitions come from disk onto
    live workers that stay; only the two dead workers leave the job."""
    from bench.worker_models import ExactlyOnce
    from dscar.scheduler.coordinator import Coordinator
    from dscar.worker.plugin import ParamServer

    lost_buddies: list[str] = []
    if when == "before-the-restore":
        original = Coordinator._restore

        async def restore_once_the_buddy_is_gone(self, job, restores, manifests, from_memory=None):
            for buddy in sorted({b for b, _ in (from_memory or {}).values()}):
                if not lost_buddies and buddy in self.scheduler.workers:
                    lost_buddies.append(buddy)
                    await self.scheduler.remove_worker(buddy, stimulus_id="test-buddy-gone", close=True)
            return await original(self, job, restores, manifests, from_memory)

        monkeypatch.setattr(Coordinator, "_restore", restore_once_the_buddy_is_gone)
    else:
        serve = ParamServer._h_get_mirror

        async def die_while_serving_the_first_copy(self, job_id, key):
            if key[0] == "part" and not lost_buddies:
                lost_buddies.append(self.address)
                self.close_worker()  # its comms close: the restoring worker's message fails
                await asyncio.Event().wait()
            return serve(self, job_id, key)

        monkeypatch.setattr(ParamServer, "_h_get_mirror", die_while_serving_the_first_copy)
    clocks, n_shards = 8, 8
    cfg = CheckpointConfig(str(tmp_path), policy="full", every=2, recovery="partial", memory=True)
    # killed in clock 6's apply, which every owner gets (a kill at a step's start waits for a step, and on a
    # busy machine the other workers may run all of its shards), and which overlaps no clock end that takes
    # memory copies: clock 4's are whole. Clock 5's would overlap clock 4's end, which takes them (a clock
    # begins with its previous clock's apply): killed then, they are not whole and the plan rightly names none
    with dscar.Cluster(n_workers=4, processes=False) as cl:
        res = dscar.fit(ExactlyOnce(clocks, work_s=0.01), {"x": np.arange(n_shards, dtype=np.float64)}, cl,
                        n_shards=n_shards, max_clocks=clocks, checkpoint=cfg,
                        faults=[faults.kill(1, 6, point="apply")])
    assert lost_buddies, "the plan named no memory copy: nothing was tested"
    assert res.n_clocks == clocks
    lost = {e["worker"] for e in res.events if e["kind"] == "worker-lost"}
    assert len(lost) == 2 and lost_buddies[0] in lost
    assert all(e["worker"] in lost for e in res.events if e["kind"] == "worker-removed")
    [first] = [e for e in res.events if e["kind"] == "recovery-started"][:1]
    from_memory = {(t, p) for t, p, b, _ in first["from_memory"] if b == lost_buddies[0]}
    assert from_memory
    restored = {(e["table"], e["part"]): e for e in res.events if e["kind"] == "partition-restored"}
    gone = [e for e in res.events if e["kind"] == "restore-source-gone"]
    assert all(e["source"] == lost_buddies[0] and e["target"] not in lost for e in gone), gone
    assert bool(gone) == (when == "while-serving-the-copy")
    # from disk (a checkpoint version, or checkpoint 0) on the live worker first asked; while the buddy
    # was closing, copies it had served already were restored from its memory
    to_disk = from_memory if when == "before-the-restore" else {(e["table"], e["part"]) for e in gone}
    for key in to_disk:
        assert "version" in restored[key] and restored[key]["target"] not in lost, restored[key]
    for e in gone:
        assert restored[e["table"], e["part"]]["target"] == e["target"]
    checked = [rec for rec in res.history if "violations" in rec.metrics]
    assert checked and all(rec.metrics["violations"] == 0 for rec in checked), [r.metrics for r in checked]


#: fits in a row of ``test_owner_and_its_memory_buddy_killed_together_...`` (the acceptance runs 20:
#: ``DSCAR_BUDDY_KILL_RUNS=20 python -m pytest -n0 tests/test_recovery.py -k buddy_killed``)
BUDDY_KILL_RUNS = int(os.environ.get("DSCAR_BUDDY_KILL_RUNS", "1"))


def owner_and_buddy(dask_scheduler, min_manifests: int):
    """``(owner, buddy)`` once the running job has ``min_manifests`` complete manifests and an owner
    whose param partition's memory copy is on another live worker; None until then."""
    coord = dask_scheduler.plugins["dscar-coordinator"]
    for job in coord.jobs.values():
        if job.ledger is None or len(job.ledger.newest_first()) < min_manifests or job.lost or job.recovering:
            continue
        for key, (buddy, _) in sorted(job.mirrors.items()):
            owner = job.pmap.owners.get(key)
            if owner is not None and owner != buddy and {owner, buddy} <= set(dask_scheduler.workers):
                return owner, buddy
    return None


@pytest.mark.timeout(240)
@pytest.mark.parametrize("run", range(BUDDY_KILL_RUNS))
def test_owner_and_its_memory_buddy_killed_together_restore_from_disk_and_no_live_worker_is_removed(tmp_path, run):
    """Issue 38 item 1: the owner of a partition and the buddy holding its memory copy are SIGKILLed at
    the same moment (4 worker processes, memory tier, full checkpoints every 2 clocks, partial
    recovery). The survivor restoring the partition cannot get the copy: that is the source gone, not
    the survivor, so the partition comes from disk (or checkpoint 0) and no live worker is removed;
    the fit finishes every clock with exactly-once intact (``bench.worker_models.ExactlyOnce``)."""
    from bench.worker_models import ExactlyOnce, check_final

    clocks, n_shards = 14, 8
    cfg = CheckpointConfig(str(tmp_path), policy="full", every=2, recovery="partial", memory=True)
    killed: list[tuple[str, str]] = []
    with dscar.Cluster(n_workers=4) as cl:
        cl.client.wait_for_workers(4)
        pids = cl.client.run(os.getpid)
        done = threading.Event()

        def kill_both_once_two_manifests_exist():
            while not done.is_set():
                pair = cl.client.run_on_scheduler(owner_and_buddy, min_manifests=2)
                if pair is not None:
                    for w in pair:  # both at once: no message of the engine between the two signals
                        os.kill(pids[w], signal.SIGKILL)
                    killed.append(pair)
                    return
                done.wait(0.05)

        killer = threading.Thread(target=kill_both_once_two_manifests_exist, daemon=True)
        killer.start()
        try:
            res = dscar.fit(ExactlyOnce(clocks, work_s=0.02), {"x": np.arange(n_shards, dtype=np.float64)}, cl,
                            n_shards=n_shards, max_clocks=clocks, checkpoint=cfg, progress=False)
        finally:
            done.set()
            killer.join(10)
    assert killed, "the fit ended before two manifests and a memory copy existed: nothing was tested"
    owner, buddy = killed[0]
    assert res.n_clocks == clocks
    lost = {e["worker"] for e in res.events if e["kind"] == "worker-lost"}
    assert {owner, buddy} <= lost, (lost, killed)
    # no restore target was removed: a removal for a restore names a worker killed here (under heavy
    # load the hang watch may also remove a worker a Nanny is restarting: a loss of its own, recovered)
    removed = [e for e in res.events if e["kind"] == "worker-removed"]
    assert all(e["worker"] in (owner, buddy) for e in removed if e["reason"].startswith("restore")), removed
    assert not [e for e in res.events if e["kind"] == "restore-failed"]
    restored = [e for e in res.events if e["kind"] == "partition-restored"]
    assert restored and all(e["target"] not in lost for e in restored[-len(restored):])
    assert not [e for e in restored if e.get("tier") == "memory" and e.get("memory_clock") is not None
                and any(g["kind"] == "restore-source-gone" and g["table"] == e["table"] and g["part"] == e["part"]
                        and g["source"] not in lost for g in res.events)]
    checked = [rec for rec in res.history if "violations" in rec.metrics]
    assert checked and all(rec.metrics["violations"] == 0 for rec in checked), [r.metrics for r in checked]
    last = res.history[-1]
    assert check_final(res.params["seen"], last.clock, "violations" in last.metrics) == 0


def test_a_loss_whose_partitions_come_back_from_memory_keeps_the_pass(tmp_path):
    """A loss in the first data pass, every lost partition and shard state restored from a buddy's copy
    of the clock's start (``dscar.core.clock``, a kept pass): the live workers' commits stay and only
    the lost worker's shards run again; ShardClock's steps check every state against the table, and
    every shard is counted once per clock (no clock cut short, no rebuild needed)."""
    n_shards, clocks, loss = 8, 9, 6
    cfg = CheckpointConfig(str(tmp_path), policy="full", every=100, memory=True)
    with dscar.Cluster(n_workers=3, processes=False) as cl:
        res = dscar.fit(ShardClock(), row_data(4 * n_shards), cl, n_shards=n_shards, max_clocks=clocks,
                        checkpoint=cfg, faults=[faults.lose(1, loss)])
    kinds = [e["kind"] for e in res.events]
    assert "pass-kept" in kinds and "rebuild-started" not in kinds and "clock-restarted" not in kinds, kinds
    assert not [e for e in res.events if e["kind"] == "shard-failed" and not e["late"]]
    np.testing.assert_array_equal(res.params["seen"], np.full(n_shards, float(clocks)))


def test_a_kept_pass_goes_on_when_the_buddy_holds_copies_whose_report_never_came(tmp_path, monkeypatch):
    """A sender reports its memory copy once its buddy has kept it (``dscar_mirrored``); a sender lost in
    between leaves the record a clock older than the copy. The recovery asks each buddy which shard states
    it keeps (``Losses.states_kept``) and keeps the pass, as it would with the reports in: here no report
    comes from the clock before the loss on, and the lost worker's shard states are recorded a clock old."""
    from distributed.protocol import to_serialize

    from dscar.worker.plugin import ParamServer

    n_shards, clocks, loss = 8, 9, 6
    sent = ParamServer._send_mirror

    async def kept_unreported(self, job_id, clock, buddy, copies):
        if clock < loss - 1:
            return await sent(self, job_id, clock, buddy, copies)
        await self._apeer(buddy, "keep_mirror", job_id=job_id, clock=clock,
                          copies=[[list(k), to_serialize(v)] for k, v in copies])

    monkeypatch.setattr(ParamServer, "_send_mirror", kept_unreported)
    cfg = CheckpointConfig(str(tmp_path), policy="full", every=100, memory=True)
    with dscar.Cluster(n_workers=3, processes=False) as cl:
        res = dscar.fit(ShardClock(), row_data(4 * n_shards), cl, n_shards=n_shards, max_clocks=clocks,
                        checkpoint=cfg, faults=[faults.lose(1, loss)])
    kinds = [e["kind"] for e in res.events]
    lost = [e for e in res.events if e["kind"] == "worker-lost"]
    assert lost and lost[0]["requeued"], lost  # (the lost worker held shards: their states came back)
    assert "pass-kept" in kinds and "rebuild-started" not in kinds and "clock-restarted" not in kinds, kinds
    found = [s for e in res.events if e["kind"] == "state-copies-found" for s in e["shards"]]
    [started] = [e for e in res.events if e["kind"] == "recovery-started"]
    assert started["states_from_memory"] and sorted(found) == sorted(started["shard_states"]), (found, started)
    np.testing.assert_array_equal(res.params["seen"], np.full(n_shards, float(clocks)))
