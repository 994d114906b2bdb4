"""The data plane: ``ParamServer``, a WorkerPlugin on every worker.

It holds, per job, the table partitions this worker owns, the shards whose
data it holds, and the updates staged by shard attempts. A thread of its own
pulls work from the coordinator (``dscar_next``, a long poll), so no Dask task
is ever pinned to this worker. Parameter and shard bytes move worker to worker
through the ``dscar_*`` handlers below, as zero-copy frames; the scheduler only
ever sees ids and small dicts.

Exactly once: the rule lives where it is kept, in ``dscar.partition_store``
(staged updates, applied in shard order) and ``dscar.shard_store`` (pending
shard states, installed for the winning attempt only); the handlers here are
thin glue over those two stores.

Every message an attempt sends to another worker goes through a connection pool
of its own with a short connect timeout and a deadline (``dscar.rpc-timeout``),
so a dead or hung peer fails the attempt in seconds rather than blocking it.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np
import dask.config
from distributed import WorkerPlugin
from distributed.protocol import to_serialize
from distributed.protocol.pickle import loads
from distributed.utils import sync

from . import checkpoint as ckpt
from .comm import fast_fail_pool
from .inflight import Inflight
from .algorithm import Algorithm, DataMeta, TableSpec
from .partition_store import PartitionStore
from .partitions import TableLayout
from .shard_store import ShardEntry, ShardStore, fetch_sources
from .xp import select_namespace, to_device, to_host

logger = logging.getLogger("dscar.worker")

PLUGIN_NAME = "dscar-paramserver"
#: a pass whose updates here are at most this many bytes is applied on the event loop (tens of
#: microseconds), larger ones in a thread, so the loop keeps answering heartbeats and peers
INLINE_APPLY_BYTES = 256 * 1024
#: tables of at most this many bytes are read whole, all of them in one message per owner
SMALL_TABLE_BYTES = 1 << 20
SMALL = ("small tables",)  # the pull-cache key of ``read_small_tables``' answer


def rpc_timeout() -> float:
    """Seconds a worker-to-worker message may take before the attempt fails over (``dscar.rpc-timeout``)."""
    return float(dask.config.get("dscar.rpc-timeout", 10.0))


@dataclass
class Job:
    """One fit's state on one worker."""

    id: str
    algorithm: Algorithm
    meta: DataMeta
    specs: dict[str, TableSpec]
    layouts: dict[str, TableLayout]
    loader: Any  # FileData or None
    tol: float
    xp: ModuleType
    #: the partitions held here, their checkpointed copies and the updates staged here
    tables: PartitionStore
    #: the shards held here and the new states staged by attempts run here
    shards: ShardStore
    faults: list = field(default_factory=list)  # this worker's, from dscar.faults
    fired: set = field(default_factory=set)
    owners: dict[tuple[str, int], str] = field(default_factory=dict)
    pull_cache: dict[tuple, Any] = field(default_factory=dict)
    cache_run: int = -1  # the run id the cached pulls belong to (tables change only with a new run id)
    clock_seen: int = 0  # the newest clock this worker was given work in (fault points outside attempts)


class ParamServer(WorkerPlugin):
    """Holds table partitions and shards; runs the worker's pull loop."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, poll_timeout: float = 1.0):
        self.poll_timeout = poll_timeout

    # ------------------------------------------------------------ lifecycle
    def setup(self, worker) -> None:
        self.worker = worker
        self.xp = select_namespace()
        self.jobs: dict[str, Job] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        #: worker-to-worker messages of attempts: a short connect timeout, so a dead peer fails fast
        self.peers = fast_fail_pool(worker.connection_args, server=worker, limit=64)
        self._peers_started = asyncio.ensure_future(self.peers.start())
        #: (job, shard, attempt) of the running batch's members not started yet (``dscar_release``)
        self._unstarted: set[tuple[str, int, int]] = set()
        #: messages waiting for a peer's answer (they fail at once when it is lost)
        self._inflight = Inflight()
        for op in ("init", "pull", "fetch_staged", "apply", "assign", "put_shard", "take_shard", "end_job", "info", "adopt",
                   "checkpoint", "restore", "forget", "peer_lost", "release", "pull_many"):
            worker.handlers[f"dscar_{op}"] = getattr(self, f"_h_{op}")
        self._thread = threading.Thread(target=self._loop, name="dscar-loop", daemon=True)
        self._thread.start()

    def teardown(self, worker) -> None:
        self._stop.set()
        worker.loop.add_callback(self.peers.close)

    # ---------------------------------------------------------------- jobs
    def _job(self, job_id: str) -> Job:
        with self._lock:
            job = self.jobs.get(job_id)
        if job is not None:
            return job
        spec = sync(self.worker.loop, self.worker.scheduler.dscar_job_spec, job_id=job_id)
        return self._install(job_id, spec)

    async def _ajob(self, job_id: str) -> Job:
        """``_job`` for handlers on the event loop."""
        job = self.jobs.get(job_id)
        if job is None:
            job = self._install(job_id, await self.worker.scheduler.dscar_job_spec(job_id=job_id))
        return job

    def _install(self, job_id: str, spec: bytes) -> Job:
        d = loads(spec)
        with self._lock:
            if job_id not in self.jobs:
                specs = {t.name: t for t in d["tables"]}
                layouts = {t.name: TableLayout(t.name, t.n_rows, t.n_parts) for t in d["tables"]}
                lock = threading.RLock()  # one per job: a pass applies to both stores at once
                self.jobs[job_id] = Job(
                    id=job_id,
                    algorithm=d["algorithm"],
                    meta=d["meta"],
                    specs=specs,
                    layouts=layouts,
                    tables=PartitionStore(specs, layouts, self.xp, lock),
                    shards=ShardStore(lock),
                    loader=d["loader"],
                    tol=d["tol"],
                    xp=self.xp,
                    faults=[f for f in d.get("faults", ()) if f.worker == self.worker.address],
                )
            return self.jobs[job_id]

    # ------------------------------------------------------------- handlers
    async def _h_init(self, job_id: str, parts: list) -> dict:
        """Create this worker's partitions from the algorithm's initial values."""
        job = await self._ajob(job_id)
        for table, part in parts:
            spec_ = job.specs[table]
            a, b = job.layouts[table].bounds[part]
            job.tables.own(table, part, job.algorithm.init_rows(spec_, a, b, job.xp), checkpointed=True)  # checkpoint 0
        return {"status": "OK", "device": device_of(self.xp)}

    async def _h_adopt(self, job_id: str, table: str, part: int, source: str) -> dict:
        """Become the owner of a partition: copy it from its current owner."""
        job = await self._ajob(job_id)
        a, b = job.layouts[table].bounds[part]
        r = await self.worker.rpc(source).dscar_pull(job_id=job_id, table=table, part=part, lo=0, hi=b - a)
        job.tables.own(table, part, r["data"])
        return {"status": "OK"}

    def _h_pull(self, job_id: str, table: str, part: int, lo: int = 0, hi: int = 0, rows=None) -> dict:
        job = self.jobs.get(job_id)
        out = None if job is None else job.tables.host_rows(table, part, lo, hi, rows)
        if out is None:  # a late attempt of an ended job, a moved partition
            return {"status": "missing"}
        return {"status": "OK", "data": to_serialize(out)}

    def _h_pull_many(self, job_id: str, parts: list) -> dict:
        """Whole partitions ``[[table, part], ...]`` held here (``read_small_tables``)."""
        job = self.jobs.get(job_id)
        out = None if job is None else job.tables.host_parts(parts)
        if out is None:
            return {"status": "missing"}
        return {"status": "OK", "data": [to_serialize(d) for d in out]}

    def _h_fetch_staged(self, job_id: str, run: int, keys: list, parts: list) -> dict:
        """The updates staged here by ``keys`` (committed attempts of pass ``run``) for the caller's
        partitions ``parts``: an owner collects them when it applies the pass."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "ended"}
        missing, selected = job.tables.select_staged(run, keys, parts)
        if missing is not None:
            return {"status": "missing", "key": list(missing)}
        return {"status": "OK", "updates": [
            [list(key), [[t, p, lo, to_serialize(d), None if r is None else to_serialize(r)] for t, p, lo, d, r in ups]]
            for key, ups in selected]}

    async def _h_apply(self, job_id: str, clock: int, run: int, committed: list, reset: list | None = None) -> dict:
        """Apply the pass of ``run``: the committed attempts' updates to the partitions owned here
        (collected from the workers that ran them, one message per worker) and their new shard
        states to the shards held here; drop everything else of the clock.

        ``committed``: ``[shard, attempt, worker]`` of every committed attempt. The tables named in
        ``reset`` start from zero (the reduction tables at a clock's first data phase, the rebuild
        tables in a rebuild pass). The array work runs off the event loop.
        """
        job = self.jobs.get(job_id)
        if job is None:
            return {"applied": 0}
        if await self._ainject(job, "apply"):
            return {"status": "stopped"}
        owned = job.tables.owned()  # the partitions as of now: one restored meanwhile is not this pass's to update
        me, parts = self.worker.address, [[t, p] for t, p in owned]
        by_worker: dict[str, list] = defaultdict(list)
        for shard, attempt, worker in committed:
            by_worker[worker].append([clock, int(shard), int(attempt)])
        updates: dict[tuple, list] = {}
        remote = [w for w in by_worker if w != me]
        if parts and remote:
            await self._peers_started
            replies = await asyncio.gather(*(
                self._apeer(w, "fetch_staged", job_id=job_id, run=run, keys=by_worker[w], parts=parts)
                for w in remote), return_exceptions=True)
            for w, r in zip(remote, replies):
                if isinstance(r, Exception) or r.get("status") != "OK":
                    return {"status": "source-lost", "worker": w, "error": repr(r)}
                for key, ups in r["updates"]:
                    updates[tuple(key)] = [(t, int(p), int(lo), np.asarray(d), None if rw is None else
                                            np.asarray(rw, dtype=np.int64)) for t, p, lo, d, rw in ups]
        args = (job, clock, run, committed, updates, set(reset or ()), owned)
        if job.tables.update_bytes(_keys(clock, committed), updates) <= INLINE_APPLY_BYTES:
            return self._apply(*args)  # a thread hop would cost more than the additions
        return await asyncio.to_thread(self._apply, *args)

    def _apply(self, job: Job, clock: int, run: int, committed: list, fetched: dict, reset: set,
               owned: dict) -> dict:
        """Apply the pass to both stores at once (their shared lock): updates, then shard states."""
        with job.tables.lock:
            applied = job.tables.apply_pass(run, _keys(clock, committed), fetched, reset, owned)
            job.shards.install(clock, committed, self.worker.address)
        return {"applied": applied}

    def _h_assign(self, job_id: str, table: str, part: int, lo: int, data) -> dict:
        self.jobs[job_id].tables.assign(table, part, lo, data)
        return {"status": "OK"}

    async def _h_put_shard(self, job_id: str, shard: int, arrays: dict) -> dict:
        job = await self._ajob(job_id)
        # off the event loop: a first call may compile a kernel for seconds, and heartbeats must flow
        prepared = await asyncio.to_thread(job.algorithm.prepare_shard, dict(arrays), job.xp)
        job.shards.put(shard, ShardEntry(prepared))
        return {"status": "OK"}

    async def _h_take_shard(self, job_id: str, shard: int, keep: bool = False, wait: float = 0.0) -> dict:
        """Hand a shard's data and state to the worker that now runs it: moved, or copied for a backup.

        ``wait``: a backup copies from the shard's new holder, which may still be fetching the
        data itself; wait up to that long for it to arrive before answering ``missing``.
        """
        deadline = time.monotonic() + wait
        while True:
            job = self.jobs.get(job_id)
            entry = None if job is None else job.shards.take(shard, keep)
            if entry is not None or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.005)
        if entry is None:
            return {"status": "missing"}
        host, state = entry.movable()
        return {"status": "OK", "arrays": to_serialize(host), "state": to_serialize(state)}

    async def _h_checkpoint(self, job_id: str, version: int, url: str, fraction: float,
                            storage_options: dict | None = None, state_shards: list | None = None) -> dict:
        """Snapshot this worker's param partitions and shard states now; write them in the background.

        Each partition saves all its rows (``fraction == 1``) or the ``fraction``
        that moved most since their last save; each shard of ``state_shards`` held
        here saves its whole state. When every file is written and fsynced, the
        coordinator is told (``dscar_ckpt_written``).
        """
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "unknown-job"}
        if await self._ainject(job, "checkpoint"):
            return {"status": "stopped"}
        snaps, states = await asyncio.to_thread(self._snapshot, job, fraction, state_shards)
        threading.Thread(target=self._write_checkpoint, args=(job, version, url, storage_options, snaps, states),
                         name=f"dscar-ckpt-{version}", daemon=True).start()
        return {"status": "OK", "parts": len(snaps)}

    def _snapshot(self, job: Job, fraction: float, state_shards: list | None) -> tuple[list, dict]:
        with job.tables.lock:
            return job.tables.snapshot(fraction), job.shards.states(state_shards or ())

    def _write_checkpoint(self, job: Job, version: int, url: str, storage_options, snaps: list, states: dict) -> None:
        files, error = [], None
        try:
            fs, root = ckpt.fs_and_root(url, storage_options)
            for table, part, rows, values in snaps:
                path = f"{ckpt.data_dir(root, version)}/{table}.p{part}.npz"
                entry = ckpt.write_file(fs, path, ckpt.encode(values, rows))
                entry.update(table=table, part=int(part), rows=int(values.shape[0]), partial=rows is not None)
                files.append(entry)
            if states:
                path = f"{ckpt.data_dir(root, version)}/state.s{min(states)}.npz"
                entry = ckpt.write_file(fs, path, ckpt.encode_states(states))
                entry.update(kind="state", shards=sorted(states))
                files.append(entry)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        try:
            self._call(self.worker.scheduler.dscar_ckpt_written, job_id=job.id, version=version,
                       worker=self.worker.address, files=files, error=error)
        except Exception:
            pass

    async def _h_restore(self, job_id: str, table: str, part: int, chain: list, url: str,
                         storage_options: dict | None = None) -> dict:
        """Own a partition restored from a checkpoint chain (checksums verified); empty chain: initial values."""
        job = await self._ajob(job_id)
        if await self._ainject(job, "recovery"):
            return {"status": "stopped"}
        spec_ = job.specs[table]
        a, b = job.layouts[table].bounds[part]

        def load():
            base = to_host(job.algorithm.init_rows(spec_, a, b, job.xp)).astype(spec_.dtype)
            if not chain:
                return base
            fs, _ = ckpt.fs_and_root(url, storage_options)
            return ckpt.apply_chain(fs, base, list(chain))

        try:
            values = await asyncio.to_thread(load)
        except ckpt.CorruptCheckpointError as e:
            return {"status": "corrupt", "error": str(e)}
        job.tables.own(table, part, values, checkpointed=True)
        return {"status": "OK"}

    def _h_forget(self, job_id: str) -> dict:
        """A simulated loss: drop everything this worker held for the job, as a crash would."""
        with self._lock:
            job = self.jobs.get(job_id)
            if job is not None:
                with job.tables.lock:
                    job.tables.clear()
                    job.shards.clear()
                job.pull_cache.clear()
        return {"status": "OK"}

    def _h_end_job(self, job_id: str) -> dict:
        with self._lock:
            self.jobs.pop(job_id, None)
        return {"status": "OK"}

    def _h_info(self, job_id: str) -> dict:
        with self._lock:
            job = self.jobs.get(job_id)
            if job is None:
                return {"known": False}
            return {
                "known": True,
                "shards": sorted(job.shards.shards),
                "shard_state": {int(k): sorted(e.state) for k, e in job.shards.shards.items()},
                "parts": sorted([t, p] for t, p in job.tables.parts),
                "staged": len(job.tables.staged),
                "device": device_of(self.xp),
            }

    # ------------------------------------------------------------ the loop
    def _call(self, method, **kw):
        return sync(self.worker.loop, method, **kw)

    def _peer(self, address: str, op: str, **kw) -> dict:
        """A message to another worker from the shard runner's thread, failing over in seconds."""
        return sync(self.worker.loop, self._apeer, address, op, **kw)

    async def _apeer(self, address: str, op: str, **kw) -> dict:
        """A message to another worker; it fails at once when the coordinator says that worker is
        gone (``dscar_peer_lost``: a hung peer never answers, and waiting for the deadline would
        stall the attempt, and its clock, for ``rpc_timeout()`` seconds)."""
        await self._peers_started
        return await self._inflight.call(address, getattr(self.peers(address), f"dscar_{op}")(**kw), rpc_timeout())

    def _h_peer_lost(self, address: str) -> dict:
        """``address`` left the cluster: every message waiting for it fails now."""
        self._inflight.cancel(address)
        return {"status": "OK"}

    def _loop(self) -> None:
        addr = self.worker.address
        item: dict | None = None
        while not self._stop.is_set():
            if item is None:
                try:
                    item = self._call(self.worker.scheduler.dscar_next, worker=addr, timeout=self.poll_timeout)
                except Exception as e:  # scheduler not ready, closing, or no coordinator yet
                    if self._stop.is_set() or self.worker.status.name in ("closing", "closed", "closing_gracefully"):
                        return
                    logger.debug("dscar_next failed: %r", e)
                    self._stop.wait(0.2)
                    continue
            op = item.get("op")
            if op in ("shard", "rebuild"):
                item = self._run_shards(item)  # the commit's answer carries the next item
            elif op == "clock_end":
                self._run_clock_end(item)
                item = None
            else:
                item = None

    def _prepare(self, job: Job, item: dict) -> None:
        with self._lock:
            job.owners = {(t, int(p)): w for t, p, w in item["owners"]}
            job.clock_seen = max(job.clock_seen, int(item["clock"]))
            if job.cache_run != item["run"]:  # a new pass, a redo or a recovery: tables have changed
                job.pull_cache.clear()
                job.cache_run = item["run"]

    def _run_shards(self, item: dict) -> dict | None:
        """Run a work item's attempts, then commit those that succeeded in one message; return
        the next work item the commit's answer carried (None: ask)."""
        common = {k: v for k, v in item.items() if k != "shards"}
        attempts = [{**common, **member} for member in item["shards"]]
        commits = []
        with self._lock:  # the members after the first may be released to another worker until they start
            self._unstarted = {(item["job"], a["shard"], a["attempt"]) for a in attempts[1:]}
        try:
            job = self._job(item["job"])
            self._prepare(job, item)
            for i, a in enumerate(attempts):
                with self._lock:
                    key = (item["job"], a["shard"], a["attempt"])
                    if i and key not in self._unstarted:
                        continue  # released: the coordinator gave it to another worker
                    self._unstarted.discard(key)
                timings = self._attempt(job, a)
                if timings is not None:
                    commits.append({"shard": a["shard"], "attempt": a["attempt"], "timings": timings})
        except _Stopped:
            return None
        except Exception as e:  # the job is unknown here: every attempt failed
            for a in attempts:
                self._fail(a, e)
            return None
        if not commits:
            return None
        try:
            r = self._call(self.worker.scheduler.dscar_commit, job_id=item["job"], clock=item["clock"],
                           run=item["run"], worker=self.worker.address, commits=commits)
        except Exception as e:
            for a in attempts:
                if any(c["shard"] == a["shard"] and c["attempt"] == a["attempt"] for c in commits):
                    self._fail(a, e)
            return None
        return r.get("next")

    def _h_release(self, job_id: str, members: list) -> dict:
        """Give back the batch members (``[shard, attempt]``) not started yet: an idle worker runs them."""
        with self._lock:
            out = [[int(s), int(a)] for s, a in members if (job_id, int(s), int(a)) in self._unstarted]
            self._unstarted.difference_update((job_id, s, a) for s, a in out)
        return {"released": out}

    def _attempt(self, job: Job, item: dict) -> dict | None:
        """Run one attempt and stage its results; its timings, or None when it failed (reported)."""
        clock, shard, attempt, run = item["clock"], item["shard"], item["attempt"], item["run"]
        lost_data = False
        try:
            self._inject(job, clock, "start", item.get("phase"))
            t0 = time.perf_counter()
            entry = self._shard_entry(job, shard, item.get("fetch_from"), item.get("backup", False),
                                      item.get("fetch_alt"))
            if entry is None:
                lost_data = not item.get("backup", False)  # a backup's miss: the primary still holds the data
                raise LookupError(f"the data of shard {shard} is on no live worker")
            if item.get("state_file"):  # a recovery restores this shard's state from a checkpoint
                self._restore_state(job, shard, entry, item)
            ctx = ShardStep(self, job, clock, shard, entry.state, item.get("batch_scale", 1.0), item.get("phase"))
            t1 = time.perf_counter()
            if item["op"] == "rebuild":
                job.algorithm.rebuild_step(ctx, entry.data)
            else:
                job.algorithm.shard_step(ctx, entry.data)
            t2 = time.perf_counter()
            slow = self._slowdown(job, clock)
            if slow > 1:
                self._stop.wait((slow - 1) * (t2 - t1))
                t2 = time.perf_counter()
            key = (clock, shard, attempt)
            job.shards.stage_state(key, entry, ctx.new_state)  # installed when the pass is applied, if it commits
            self._stage(job, key, run, ctx.updates, ctx.phase)
            t3 = time.perf_counter()
            return {"data_s": t1 - t0, "pull_s": ctx.pull_s, "compute_s": t2 - t1 - ctx.pull_s, "push_s": t3 - t2}
        except _Stopped:
            raise
        except Exception as e:
            self._fail(item, e, lost_data)
            return None

    def _fail(self, item: dict, error: BaseException, lost_data: bool = False) -> None:
        """Tell the coordinator an attempt failed (it counts toward the shard's failure limit)."""
        logger.info("dscar shard %s clock %s failed: %r", item["shard"], item["clock"], error)
        try:
            self._call(self.worker.scheduler.dscar_fail, job_id=item["job"], clock=item["clock"], run=item["run"],
                       shard=item["shard"], attempt=item["attempt"], worker=self.worker.address, lost_data=lost_data,
                       error="".join(traceback.format_exception_only(type(error), error)).strip())
        except Exception:
            pass

    def _restore_state(self, job: Job, shard: int, entry: ShardEntry, item: dict) -> None:
        """Replace the shard's state by its checkpointed one; a corrupt file leaves no state (the
        algorithm's rebuild step then re-creates it) and says so in an event."""
        try:
            fs, _ = ckpt.fs_and_root(item["ckpt_url"], item.get("storage_options"))
            state = ckpt.read_state(fs, item["state_file"], shard)
        except ckpt.CorruptCheckpointError as e:
            self._report(job, item["clock"], "checkpoint-corrupt", shard=shard, error=str(e))
            state = {}
        entry.state = {k: job.xp.asarray(v) for k, v in state.items()}

    def _shard_entry(self, job: Job, shard: int, fetch_from: str | None, backup: bool,
                     fetch_alt: str | None = None) -> ShardEntry | None:
        """The shard's data and state: held here, taken from its holder, or read from the source.

        A primary attempt told to fetch the shard elsewhere drops a copy held here: it is stale
        (an attempt of ours lost the commit to a backup). A backup copies, never takes: from the
        holder, or — while the holder is still receiving the shard from here — from our own copy.
        """
        me = self.worker.address
        entry = job.shards.claim(shard, fetch_from, backup, fetch_alt, me)
        if entry is not None:
            return entry
        arrays, state = None, {}
        for source, wait in fetch_sources(fetch_from, fetch_alt, backup, me):
            try:
                r = self._peer(source, "take_shard", job_id=job.id, shard=shard, keep=backup, wait=wait)
                if r["status"] == "OK":
                    arrays, state = r["arrays"], r["state"]
                    break
            except Exception as e:  # the holder is gone: fall back to the source
                logger.info("could not take shard %s from %s: %r", shard, source, e)
        if arrays is None and job.loader is not None:
            arrays = job.loader.load_shard(shard)
        if arrays is None:
            return None
        entry = ShardEntry(job.algorithm.prepare_shard(arrays, job.xp), {k: job.xp.asarray(v) for k, v in state.items()})
        if not backup:
            job.shards.put(shard, entry)
        return entry

    # -------------------------------------------------------------- faults
    def _slowdown(self, job: Job, clock: int) -> float:
        factor = 1.0
        for f in job.faults:
            if f.kind == "slow" and f.active(clock):
                factor = max(factor, f.factor)
                if f not in job.fired:
                    job.fired.add(f)
                    self._report(job, clock, "fault-slow", factor=f.factor, until=f.until)
        return factor

    def _due(self, job: Job, clock: int, point: str, phase: str | None = None) -> list:
        clock = max(clock, job.clock_seen)
        due = [f for f in job.faults if f.kind in ("kill", "hang", "lose") and f.clock <= clock and f.point == point
               and f not in job.fired and f.phase in (None, phase)]
        job.fired.update(due)
        return due

    def _inject(self, job: Job, clock: int, point: str, phase: str | None = None) -> None:
        """Injected faults due at ``point`` of the shard runner's thread (an attempt, a clock-end step)."""
        for f in self._due(job, clock, point, phase):
            info = {"point": point, **({"pid": os.getpid()} if f.kind == "hang" else {})}
            self._report(job, clock, f"fault-{f.kind}", **info)
            if f.kind == "kill":
                self._die()
            elif f.kind == "lose":  # simulated loss: the coordinator recovers as from a crash
                self._call(self.worker.scheduler.dscar_simulate_loss, job_id=job.id, worker=self.worker.address)
                raise _Stopped
            else:
                self._hang()

    async def _ainject(self, job: Job, point: str) -> bool:
        """Injected faults due at ``point`` of a handler (apply, checkpoint, restore); True: the
        handler must stop (this worker is being killed or lost)."""
        stop = False
        for f in self._due(job, job.clock_seen, point):
            info = {"point": point, **({"pid": os.getpid()} if f.kind == "hang" else {})}
            await self._areport(job, job.clock_seen, f"fault-{f.kind}", info)
            if f.kind == "kill":
                if not self._in_process():
                    os._exit(1)
                self._stop.set()
                self.worker.loop.add_callback(self.worker.close, nanny=False, executor_wait=False)
                stop = True
            elif f.kind == "lose":
                self.worker.loop.add_callback(self.worker.scheduler.dscar_simulate_loss, job_id=job.id,
                                              worker=self.worker.address)
                stop = True
            elif not self._in_process():  # in-process, a handler cannot hang without hanging every worker
                os.kill(os.getpid(), signal.SIGSTOP)
        return stop

    async def _areport(self, job: Job, clock: int, kind: str, info: dict) -> None:
        try:
            await asyncio.wait_for(self.worker.scheduler.dscar_event(job_id=job.id, clock=clock, kind=kind,
                                                                     worker=self.worker.address, info=info), 5)
        except Exception:
            pass

    def _report(self, job: Job, clock: int, kind: str, **info) -> None:
        try:
            self._call(self.worker.scheduler.dscar_event, job_id=job.id, clock=clock, kind=kind,
                       worker=self.worker.address, info=info)
        except Exception:
            pass

    def _in_process(self) -> bool:
        return self.worker.address.startswith("inproc://")

    def _die(self) -> None:
        if not self._in_process():
            os._exit(1)
        self._stop.set()  # in-process cluster: close this worker, keep the process
        self.worker.loop.add_callback(self.worker.close, nanny=False, executor_wait=False)
        raise _Stopped

    def _hang(self) -> None:
        if not self._in_process():
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        while not self._stop.is_set():  # in-process: only this worker's loop stops
            self._stop.wait(0.05)
        raise _Stopped

    def _stage(self, job: Job, key: tuple, run: int, updates: list, phase: str | None = None) -> None:
        """Keep the attempt's updates here until its pass is applied: the owners collect the
        committed ones then (one message per worker and pass, not one per shard and owner)."""
        job.tables.stage(key, run, updates)
        self._inject(job, key[0], "mid-push", phase)  # staged, not yet committed

    def _run_clock_end(self, item: dict) -> None:
        job_id, clock = item["job"], item["clock"]
        sched = self.worker.scheduler
        try:
            job = self._job(job_id)
            self._prepare(job, item)
            self._inject(job, clock, "clock-end")
            t0 = time.perf_counter()
            metrics = job.algorithm.clock_end(ClockEnd(self, job, clock))
            metrics = {str(k): float(v) for k, v in dict(metrics).items()}
            if "objective" not in metrics:
                raise ValueError(f"{type(job.algorithm).__name__}.clock_end returned no 'objective'")
            self._call(
                sched.dscar_clock_done,
                job_id=job_id,
                clock=clock,
                run=item["run"],
                worker=self.worker.address,
                metrics=metrics,
                seconds=time.perf_counter() - t0,
            )
        except _Stopped:
            return
        except Exception as e:
            logger.warning("dscar clock_end of clock %s failed: %r", clock, e)
            try:
                self._call(
                    sched.dscar_clock_failed,
                    job_id=job_id,
                    clock=clock,
                    run=item["run"],
                    worker=self.worker.address,
                    error="".join(traceback.format_exception(type(e), e, e.__traceback__)[-3:]).strip(),
                )
            except Exception:
                pass

    # --------------------------------------------------- table row access
    def read_rows(self, job: Job, table: str, start: int, stop: int | None):
        """Global rows ``[start, stop)`` of ``table``, gathered from their owners."""
        layout = job.layouts[table]
        stop = layout.n_rows if stop is None else stop
        pieces = []
        for part, lo, hi in layout.split(start, stop):
            a = layout.bounds[part][0]
            owner = job.owners[(table, part)]
            if owner == self.worker.address:
                pieces.append(job.tables.rows(table, part, lo - a, hi - a))
            else:
                r = _answered(self._peer(owner, "pull", job_id=job.id, table=table, part=part, lo=lo - a, hi=hi - a),
                              owner, table, part)
                pieces.append(job.xp.asarray(r["data"]))
        if len(pieces) == 1:
            return pieces[0]
        return job.xp.concatenate(pieces) if pieces else job.xp.zeros((0, *job.specs[table].trailing))

    def is_small(self, job: Job, table: str) -> bool:
        spec = job.specs[table]
        return spec.n_rows * int(np.prod(spec.trailing)) * np.dtype(spec.dtype).itemsize <= SMALL_TABLE_BYTES

    def read_small_tables(self, job: Job) -> dict[str, Any]:
        """Every small table (``SMALL_TABLE_BYTES``), whole: the partitions held here copied, the
        others fetched with one message per owner, all owners at once. A small model's shard step
        or clock end reads several tables, and one message per table and owner is a round trip each."""
        me = self.worker.address
        small = [t for t in job.specs if self.is_small(job, t)]
        pieces: dict[tuple[str, int], Any] = {}
        remote: dict[str, list] = defaultdict(list)
        for t in small:
            for p in range(job.layouts[t].n_parts):
                owner = job.owners[(t, p)]
                if owner == me:
                    pieces[(t, p)] = job.tables.rows(t, p, 0, None)
                else:
                    remote[owner].append((t, p))
        if remote:
            async def fetch():
                return await asyncio.gather(*(self._apeer(o, "pull_many", job_id=job.id, parts=[list(k) for k in keys])
                                              for o, keys in remote.items()))
            for (owner, keys), r in zip(remote.items(), sync(self.worker.loop, fetch)):
                r = _answered(r, owner, *keys[0])
                pieces.update((k, job.xp.asarray(d)) for k, d in zip(keys, r["data"]))
        return {t: job.xp.concatenate([pieces[(t, p)] for p in range(job.layouts[t].n_parts)]) for t in small}

    def read_row_set(self, job: Job, table: str, rows):
        """Arbitrary rows of ``table`` (in the order given), gathered from their owners."""
        layout, spec = job.layouts[table], job.specs[table]
        rows = np.asarray(to_host(rows), dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= layout.n_rows):
            raise IndexError(f"rows outside table {table!r} of {layout.n_rows} rows")
        out = job.xp.empty((rows.shape[0], *spec.trailing), dtype=spec.dtype)
        part_of = np.searchsorted([b for _, b in layout.bounds], rows, side="right")
        for part in np.unique(part_of):
            sel = np.flatnonzero(part_of == part)
            local = rows[sel] - layout.bounds[part][0]
            owner = job.owners[(table, int(part))]
            if owner == self.worker.address:
                vals = job.tables.row_set(table, int(part), local)
            else:
                r = _answered(self._peer(owner, "pull", job_id=job.id, table=table, part=int(part),
                                         rows=to_serialize(local)), owner, table, int(part))
                vals = job.xp.asarray(r["data"])
            out[job.xp.asarray(sel)] = vals
        return out

    def write_rows(self, job: Job, table: str, values, start: int) -> None:
        layout = job.layouts[table]
        values = to_host(values)
        for part, lo, hi in layout.split(start, start + values.shape[0]):
            a = layout.bounds[part][0]
            chunk = np.ascontiguousarray(values[lo - start : hi - start])
            owner = job.owners[(table, part)]
            if owner == self.worker.address:
                job.tables.assign(table, part, lo - a, chunk)
            else:
                self._peer(owner, "assign", job_id=job.id, table=table, part=part, lo=lo - a, data=to_serialize(chunk))


def _answered(reply: dict, owner: str, table: str, part: int) -> dict:
    """A pull's answer, or a ``LookupError`` when the owner no longer holds the partition (its job ended,
    the partition moved): the attempt fails and is retried or dropped like any other."""
    if reply.get("status", "OK") != "OK":
        raise LookupError(f"{owner} no longer holds {table}/{part}")
    return reply


class _Stopped(Exception):
    """This attempt stops quietly: the worker was stopped by an injected fault, or its job ended."""


class ShardStep:
    """The ``ShardContext`` of one attempt: cached pulls, staged adds, staged state."""

    def __init__(self, server: ParamServer, job: Job, clock: int, shard: int, state: dict, batch_scale: float,
                 phase: str | None = None):
        self._server, self._job = server, job
        self.xp, self.clock, self.shard, self.meta, self.tol = job.xp, clock, shard, job.meta, job.tol
        self.phase = phase  # the data phase of the clock this step runs in (None: the algorithm has none)
        self.state = dict(state)  # the shard's state as of its last commit (read-only)
        self.batch_scale = float(batch_scale)  # this worker's share of a fixed global batch
        self.new_state: dict = {}
        self.updates: list = []
        self.pull_s = 0.0

    def set_state(self, name: str, value) -> None:
        """Replace the shard's state ``name``; kept only if this attempt commits."""
        self.new_state[name] = value

    def pull(self, table: str, start: int = 0, stop: int | None = None):
        """Rows of ``table`` as of this clock's (data phase's) start (cached for it; do not mutate)."""
        key = (table, start, stop)
        cache = self._job.pull_cache
        if key not in cache:
            t0 = time.perf_counter()
            if self._server.is_small(self._job, table):  # every small table at once, then slices of it
                if SMALL not in cache:
                    cache[SMALL] = self._server.read_small_tables(self._job)
                cache[key] = cache[SMALL][table][start:stop]
            else:
                cache[key] = self._server.read_rows(self._job, table, start, stop)
            self.pull_s += time.perf_counter() - t0
        return cache[key]

    def add(self, table: str, values, start: int = 0) -> None:
        """Add ``values`` to rows ``[start, start + len(values))`` of ``table`` if this attempt commits."""
        layout = self._job.layouts[table]
        values = to_host(values)
        if values.shape[1:] != self._job.specs[table].trailing:
            raise ValueError(f"add to {table!r}: rows of shape {values.shape[1:]}, table rows are {self._job.specs[table].trailing}")
        for part, lo, hi in layout.split(start, start + values.shape[0]):
            a = layout.bounds[part][0]
            self.updates.append((table, part, lo - a, np.ascontiguousarray(values[lo - start : hi - start]), None))

    def pull_rows(self, table: str, rows):
        """Rows ``rows`` (any order, repeats allowed) of ``table`` as of this clock's start."""
        t0 = time.perf_counter()
        out = self._server.read_row_set(self._job, table, rows)
        self.pull_s += time.perf_counter() - t0
        return out

    def add_rows(self, table: str, rows, values) -> None:
        """Add ``values[i]`` to row ``rows[i]`` of ``table`` if this attempt commits (repeats add up)."""
        layout, spec = self._job.layouts[table], self._job.specs[table]
        rows, values = np.asarray(to_host(rows), dtype=np.int64), to_host(values)
        if rows.ndim != 1 or values.shape != (rows.shape[0], *spec.trailing):
            raise ValueError(f"add_rows to {table!r}: {rows.shape[0]} rows need values of shape "
                             f"{(rows.shape[0], *spec.trailing)}, got {values.shape}")
        if rows.size and (rows.min() < 0 or rows.max() >= layout.n_rows):
            raise IndexError(f"add_rows to {table!r}: rows outside 0..{layout.n_rows - 1}")
        part_of = np.searchsorted([b for _, b in layout.bounds], rows, side="right")
        for part in np.unique(part_of):
            sel = part_of == part
            a = layout.bounds[part][0]
            self.updates.append((table, int(part), 0, np.ascontiguousarray(values[sel]), rows[sel] - a))


class ClockEnd:
    """The ``ClockContext`` of a clock-end step: fresh pulls (of the tables as this step left
    them), assignments."""

    def __init__(self, server: ParamServer, job: Job, clock: int):
        self._server, self._job = server, job
        self.xp, self.clock, self.meta, self.tol = job.xp, clock, job.meta, job.tol
        self._small: dict[str, Any] | None = None  # the small tables, read once until an assign

    def pull(self, table: str, start: int = 0, stop: int | None = None):
        if self._server.is_small(self._job, table):
            if self._small is None:
                self._small = self._server.read_small_tables(self._job)
            return self._small[table][start:stop].copy()  # the caller may change its copy
        return self._server.read_rows(self._job, table, start, stop)

    def pull_rows(self, table: str, rows):
        return self._server.read_row_set(self._job, table, rows)

    def assign(self, table: str, values, start: int = 0) -> None:
        self._server.write_rows(self._job, table, values, start)
        self._small = None


def _keys(clock: int, committed: list) -> list[tuple[int, int, int]]:
    """The ``(clock, shard, attempt)`` keys of a pass's committed ``[shard, attempt, worker]``."""
    return [(clock, int(s), int(a)) for s, a, _ in committed]


def device_of(xp: ModuleType) -> str:
    return "gpu" if xp.__name__ == "cupy" else "cpu"
