"""The data plane: ``ParamServer``, a WorkerPlugin on every worker.

It holds, per job, the table partitions this worker owns, the shards whose
data it holds, and the updates staged by shard attempts. A thread of its own
pulls work from the coordinator (``dscar_next``, a long poll), so no Dask task
is ever pinned to this worker. Parameter and shard bytes move worker to worker
through the ``dscar_*`` handlers below, as zero-copy frames; the scheduler only
ever sees ids and small dicts.

Exactly once: a shard attempt first stages its contributions at every owner,
then asks the coordinator to commit. At the end of the shard phase the
coordinator tells each owner which ``(shard, attempt)`` pairs committed; the
owner applies exactly those, in shard order (deterministic sums), and drops
the rest.
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
from distributed import WorkerPlugin
from distributed.protocol import to_serialize
from distributed.protocol.pickle import loads
from distributed.utils import sync

from . import checkpoint as ckpt
from .algorithm import Algorithm, DataMeta, TableSpec
from .partitions import TableLayout
from .xp import select_namespace, to_device, to_host

logger = logging.getLogger("dscar.worker")

PLUGIN_NAME = "dscar-paramserver"
BACKUP_FETCH_WAIT_S = 5.0  # how long a backup waits for the new holder of its shard to receive the data
BACKUP_ALT_WAIT_S = 0.5  # the same, when the primary's source can be asked next


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
    faults: list = field(default_factory=list)  # this worker's, from dscar.faults
    fired: set = field(default_factory=set)
    saved: dict[tuple[str, int], Any] = field(default_factory=dict)  # host copy: last checkpointed value
    parts: dict[tuple[str, int], Any] = field(default_factory=dict)
    staged: dict[tuple[int, int, int], list] = field(default_factory=lambda: defaultdict(list))
    shards: dict[int, "ShardEntry"] = field(default_factory=dict)
    owners: dict[tuple[str, int], str] = field(default_factory=dict)
    pull_cache: dict[tuple, Any] = field(default_factory=dict)
    cache_clock: tuple = (-1, -1, None)  # (clock, recovery epoch, pass) the cached pulls belong to
    committing: set = field(default_factory=set)  # shards whose commit is in flight: state not installed yet


@dataclass
class ShardEntry:
    """A shard's data and its committed state (e.g. topic assignments), held together."""

    data: dict[str, Any]
    state: dict[str, Any] = field(default_factory=dict)
    prev_state: dict[str, Any] | None = None  # the state before the last commit, while its clock may be run again
    state_clock: int = -1  # the clock whose commit installed ``state``


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
        for op in ("init", "pull", "stage", "apply", "assign", "put_shard", "take_shard", "end_job", "info", "adopt",
                   "checkpoint", "restore", "forget", "discard"):
            worker.handlers[f"dscar_{op}"] = getattr(self, f"_h_{op}")
        self._thread = threading.Thread(target=self._loop, name="dscar-loop", daemon=True)
        self._thread.start()

    def teardown(self, worker) -> None:
        self._stop.set()

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
                self.jobs[job_id] = Job(
                    id=job_id,
                    algorithm=d["algorithm"],
                    meta=d["meta"],
                    specs={t.name: t for t in d["tables"]},
                    layouts={t.name: TableLayout(t.name, t.n_rows, t.n_parts) for t in d["tables"]},
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
            arr = job.xp.asarray(job.algorithm.init_rows(spec_, a, b, job.xp), dtype=spec_.dtype)
            with self._lock:
                job.parts[(table, int(part))] = arr
                if spec_.kind == "param":
                    job.saved[(table, int(part))] = to_host(arr).copy()  # checkpoint 0
        return {"status": "OK", "device": device_of(self.xp)}

    async def _h_adopt(self, job_id: str, table: str, part: int, source: str) -> dict:
        """Become the owner of a partition: copy it from its current owner."""
        job = await self._ajob(job_id)
        a, b = job.layouts[table].bounds[part]
        r = await self.worker.rpc(source).dscar_pull(job_id=job_id, table=table, part=part, lo=0, hi=b - a)
        with self._lock:
            job.parts[(table, int(part))] = job.xp.asarray(r["data"])
        return {"status": "OK"}

    def _h_pull(self, job_id: str, table: str, part: int, lo: int = 0, hi: int = 0, rows=None) -> dict:
        with self._lock:
            arr = self.jobs[job_id].parts[(table, part)]
            if rows is None:
                out = to_host(arr[lo:hi]).copy()
            else:
                out = to_host(arr[self.jobs[job_id].xp.asarray(np.asarray(rows, dtype=np.int64))])
        return {"data": to_serialize(np.ascontiguousarray(out))}

    def _h_stage(self, job_id: str, key: list, updates: list) -> dict:
        job = self.jobs.get(job_id)
        if job is None:  # the job ended (a late attempt): nothing to stage into
            return {"status": "ended"}
        self._stage_local(job, tuple(key), updates)
        return {"status": "OK"}

    def _stage_local(self, job: Job, key: tuple, updates: list) -> None:
        with self._lock:
            missing = [(t, p) for t, p, *_ in updates if (t, int(p)) not in job.parts]
            if missing:
                raise KeyError(f"{self.worker.address} does not own partitions {missing}")
            for table, part, lo, data, rows in updates:
                rows = None if rows is None else np.asarray(rows, dtype=np.int64)
                job.staged[key].append((table, int(part), int(lo), np.array(data, copy=True), rows))

    def _h_apply(self, job_id: str, clock: int, committed: list, reset: list | None = None) -> dict:
        """Apply the committed attempts' staged updates of ``clock``; drop the rest.

        The tables named in ``reset`` start from zero (the coordinator names the reduction
        tables at a clock's first data phase, the rebuild tables in a rebuild pass).
        """
        job = self.jobs.get(job_id)
        if job is None:
            return {"applied": 0}
        wanted = {(clock, int(s), int(a)) for s, a in committed}
        reset = set(reset or ())
        with self._lock:
            for (table, part), arr in job.parts.items():
                if table in reset:
                    arr[...] = 0
            keys = sorted(k for k in job.staged if k[0] == clock)
            applied = 0
            for key in keys:
                ups = job.staged.pop(key)
                if key not in wanted:
                    continue
                for table, part, lo, data, rows in ups:
                    arr = job.parts[(table, part)]
                    if rows is None:
                        arr[lo : lo + data.shape[0]] += job.xp.asarray(data)
                    else:  # scatter-add: repeated rows add up
                        job.xp.add.at(arr, job.xp.asarray(rows), job.xp.asarray(data))
                    applied += 1
            for key in [k for k in job.staged if k[0] < clock]:
                del job.staged[key]  # leftovers of attempts that never committed
        return {"applied": applied}

    def _h_assign(self, job_id: str, table: str, part: int, lo: int, data) -> dict:
        self._assign_local(self.jobs[job_id], table, part, lo, data)
        return {"status": "OK"}

    def _assign_local(self, job: Job, table: str, part: int, lo: int, data) -> None:
        with self._lock:
            arr = job.parts[(table, part)]
            arr[lo : lo + data.shape[0]] = job.xp.asarray(data)

    async def _h_put_shard(self, job_id: str, shard: int, arrays: dict) -> dict:
        job = await self._ajob(job_id)
        prepared = job.algorithm.prepare_shard(dict(arrays), job.xp)
        with self._lock:
            job.shards[int(shard)] = ShardEntry(prepared)
        return {"status": "OK"}

    async def _h_take_shard(self, job_id: str, shard: int, keep: bool = False, wait: float = 0.0) -> dict:
        """Hand a shard's data and state to the worker that now runs it: moved, or copied for a backup.

        ``wait``: a backup copies from the shard's new holder, which may still be fetching the
        data itself; wait up to that long for it to arrive before answering ``missing``.
        """
        deadline = time.monotonic() + wait
        while True:
            with self._lock:
                job = self.jobs.get(job_id)
                busy = job is not None and int(shard) in job.committing  # its new state is on the way in
                entry = None if job is None or busy else (
                    job.shards.get(int(shard)) if keep else job.shards.pop(int(shard), None))
            if entry is not None or (not busy and time.monotonic() >= deadline):
                break
            await asyncio.sleep(0.005)
        if entry is None:
            return {"status": "missing"}
        host = {k: to_host(v) for k, v in entry.data.items()}
        state = {k: to_host(v) for k, v in entry.state.items()}
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
        wanted = set(map(int, state_shards or ()))
        while wanted & job.committing:  # a granted commit's state is on its way in: save that one
            await asyncio.sleep(0.002)
        snaps = []
        with self._lock:
            for (table, part), arr in sorted(job.parts.items()):
                if job.specs[table].kind != "param":
                    continue
                current = to_host(arr)
                saved = job.saved.get((table, part))
                if fraction >= 1 or saved is None:
                    rows, values = None, current.copy()
                else:
                    rows = ckpt.priority_rows(current, saved, fraction)
                    values = current[rows].copy()
                new_saved = current.copy() if saved is None else saved
                new_saved[rows if rows is not None else slice(None)] = values
                job.saved[(table, part)] = new_saved
                snaps.append((table, part, rows, values))
            states = {s: {k: to_host(v).copy() for k, v in job.shards[s].state.items()}
                      for s in sorted(map(int, state_shards or ())) if s in job.shards and job.shards[s].state}
        threading.Thread(target=self._write_checkpoint, args=(job, version, url, storage_options, snaps, states),
                         name=f"dscar-ckpt-{version}", daemon=True).start()
        return {"status": "OK", "parts": len(snaps)}

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
        with self._lock:
            job.parts[(table, int(part))] = job.xp.asarray(values)
            if spec_.kind == "param":
                job.saved[(table, int(part))] = values.copy()
        return {"status": "OK"}

    def _h_discard(self, job_id: str, clock: int, shards: list | None = None) -> dict:
        """Drop every update staged for ``clock`` (its active pass runs again after a recovery), and
        the state that pass's commits installed in ``shards`` (None: every shard)."""
        with self._lock:
            job = self.jobs.get(job_id)
            if job is not None:
                for key in [k for k in job.staged if k[0] == clock]:
                    del job.staged[key]
                redone = None if shards is None else set(map(int, shards))
                for s, entry in job.shards.items():  # state committed in the re-run pass: back to before
                    if (redone is None or s in redone) and entry.state_clock == clock and entry.prev_state is not None:
                        entry.state, entry.prev_state, entry.state_clock = entry.prev_state, None, -1
        return {"status": "OK"}

    def _h_forget(self, job_id: str) -> dict:
        """A simulated loss: drop everything this worker held for the job, as a crash would."""
        with self._lock:
            job = self.jobs.get(job_id)
            if job is not None:
                job.parts.clear()
                job.saved.clear()
                job.staged.clear()
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
                "shards": sorted(job.shards),
                "shard_state": {int(k): sorted(e.state) for k, e in job.shards.items()},
                "parts": sorted([t, p] for t, p in job.parts),
                "staged": len(job.staged),
                "device": device_of(self.xp),
            }

    # ------------------------------------------------------------ the loop
    def _call(self, method, **kw):
        return sync(self.worker.loop, method, **kw)

    def _loop(self) -> None:
        addr = self.worker.address
        while not self._stop.is_set():
            try:
                item = self._call(self.worker.scheduler.dscar_next, worker=addr, timeout=self.poll_timeout)
            except Exception as e:  # scheduler not ready, closing, or no coordinator yet
                if self._stop.is_set() or self.worker.status.name in ("closing", "closed", "closing_gracefully"):
                    return
                logger.debug("dscar_next failed: %r", e)
                time.sleep(0.2)
                continue
            op = item.get("op")
            if op in ("shard", "rebuild"):
                self._run_shard(item)
            elif op == "clock_end":
                self._run_clock_end(item)

    def _prepare(self, job: Job, item: dict) -> None:
        with self._lock:
            job.owners = {(t, int(p)): w for t, p, w in item["owners"]}
            key = (item["clock"], item.get("epoch", 0), item.get("pass", "end"))
            if job.cache_clock != key:  # a new clock, recovery or data phase: tables have changed
                job.pull_cache.clear()
                job.cache_clock = key

    def _run_shard(self, item: dict) -> None:
        job_id, clock, shard, attempt = item["job"], item["clock"], item["shard"], item["attempt"]
        sched = self.worker.scheduler
        lost_data = False
        try:
            job = self._job(job_id)
            self._prepare(job, item)
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
                time.sleep((slow - 1) * (t2 - t1))
                t2 = time.perf_counter()
            self._send_staged(job, (clock, shard, attempt), ctx.updates, ctx.phase)
            t3 = time.perf_counter()
            with self._lock:  # until the new state is installed, nobody may take the shard (take_shard waits)
                job.committing.add(shard)
            try:
                r = self._call(
                    sched.dscar_commit,
                    job_id=job_id,
                    clock=clock,
                    shard=shard,
                    attempt=attempt,
                    worker=self.worker.address,
                    timings={"data_s": t1 - t0, "pull_s": ctx.pull_s, "compute_s": t2 - t1 - ctx.pull_s,
                             "push_s": t3 - t2},
                )
                with self._lock:
                    if r["granted"]:
                        if ctx.new_state:
                            entry.prev_state, entry.state_clock = dict(entry.state), clock
                            entry.state = {**entry.state, **ctx.new_state}
                        job.shards[shard] = entry
                    # refused: another attempt won, or a recovery restarts the pass. The copy stays: if
                    # this worker is still the holder it is the shard's; if not, it is dropped as stale
                    # the next time this worker is sent to fetch the shard elsewhere (_shard_entry)
            finally:
                with self._lock:
                    job.committing.discard(shard)
        except _Stopped:
            return
        except Exception as e:
            logger.warning("dscar shard %s clock %s failed: %r", shard, clock, e)
            try:
                self._call(
                    sched.dscar_fail,
                    job_id=job_id,
                    clock=clock,
                    shard=shard,
                    attempt=attempt,
                    worker=self.worker.address,
                    error="".join(traceback.format_exception_only(type(e), e)).strip(),
                    lost_data=lost_data,
                )
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
        entry.prev_state, entry.state_clock = None, -1

    def _shard_entry(self, job: Job, shard: int, fetch_from: str | None, backup: bool,
                     fetch_alt: str | None = None) -> ShardEntry | None:
        """The shard's data and state: held here, taken from its holder, or read from the source.

        A copy held here while the coordinator names another holder is stale (an attempt of ours
        lost the commit to a backup elsewhere): it is dropped, never used.
        """
        with self._lock:
            entry = job.shards.get(shard)
            if entry is not None and fetch_from:
                del job.shards[shard]
                entry = None
        if entry is not None:
            return entry
        arrays, state = None, {}
        sources = [(fetch_from, 0.0)] if not backup else [
            (fetch_from, BACKUP_ALT_WAIT_S if fetch_alt else BACKUP_FETCH_WAIT_S), (fetch_alt, 0.0)]
        for source, wait in sources:
            if not source or arrays is not None:
                continue
            try:
                r = self._call(self.worker.rpc(source).dscar_take_shard, job_id=job.id, shard=shard, keep=backup,
                               wait=wait)
                if r["status"] == "OK":
                    arrays, state = r["arrays"], r["state"]
            except Exception as e:  # the holder is gone: fall back to the source
                logger.info("could not take shard %s from %s: %r", shard, source, e)
        if arrays is None and job.loader is not None:
            arrays = job.loader.load_shard(shard)
        if arrays is None:
            return None
        entry = ShardEntry(job.algorithm.prepare_shard(arrays, job.xp), {k: job.xp.asarray(v) for k, v in state.items()})
        if not backup:
            with self._lock:
                job.shards[shard] = entry
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

    def _inject(self, job: Job, clock: int, point: str, phase: str | None = None) -> None:
        for f in job.faults:
            if (f.kind in ("kill", "hang", "lose") and f.clock <= clock and f.point == point and f not in job.fired
                    and f.phase in (None, phase)):
                job.fired.add(f)
                self._report(job, clock, f"fault-{f.kind}", point=point)
                if f.kind == "kill":
                    self._die()
                elif f.kind == "lose":  # simulated loss: the coordinator recovers as from a crash
                    self._call(self.worker.scheduler.dscar_simulate_loss, job_id=job.id, worker=self.worker.address)
                    raise _Stopped
                else:
                    self._hang()

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
            time.sleep(0.05)
        raise _Stopped

    def _send_staged(self, job: Job, key: tuple, updates: list, phase: str | None = None) -> None:
        by_owner: dict[str, list] = defaultdict(list)
        for table, part, lo, data, rows in updates:
            by_owner[job.owners[(table, part)]].append([table, part, lo, data, rows])
        me = self.worker.address
        for i, (owner, ups) in enumerate(by_owner.items()):
            if i == 1:
                self._inject(job, key[0], "mid-push", phase)
            if owner == me:
                self._stage_local(job, key, ups)
            else:
                ups = [[t, p, lo, to_serialize(d), None if r is None else to_serialize(r)] for t, p, lo, d, r in ups]
                r = self._call(self.worker.rpc(owner).dscar_stage, job_id=job.id, key=list(key), updates=ups)
                if r.get("status") == "ended":
                    raise _Stopped  # nothing to commit into: drop this late attempt quietly

    def _run_clock_end(self, item: dict) -> None:
        job_id, clock = item["job"], item["clock"]
        sched = self.worker.scheduler
        try:
            job = self._job(job_id)
            self._prepare(job, item)
            t0 = time.perf_counter()
            metrics = job.algorithm.clock_end(ClockEnd(self, job, clock))
            metrics = {str(k): float(v) for k, v in dict(metrics).items()}
            if "objective" not in metrics:
                raise ValueError(f"{type(job.algorithm).__name__}.clock_end returned no 'objective'")
            self._call(
                sched.dscar_clock_done,
                job_id=job_id,
                clock=clock,
                worker=self.worker.address,
                metrics=metrics,
                seconds=time.perf_counter() - t0,
            )
        except Exception as e:
            logger.warning("dscar clock_end of clock %s failed: %r", clock, e)
            try:
                self._call(
                    sched.dscar_clock_failed,
                    job_id=job_id,
                    clock=clock,
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
                with self._lock:
                    pieces.append(job.parts[(table, part)][lo - a : hi - a].copy())
            else:
                r = self._call(self.worker.rpc(owner).dscar_pull, job_id=job.id, table=table, part=part, lo=lo - a, hi=hi - a)
                pieces.append(job.xp.asarray(r["data"]))
        if len(pieces) == 1:
            return pieces[0]
        return job.xp.concatenate(pieces) if pieces else job.xp.zeros((0, *job.specs[table].trailing))

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
                with self._lock:
                    vals = job.parts[(table, int(part))][job.xp.asarray(local)]
            else:
                r = self._call(self.worker.rpc(owner).dscar_pull, job_id=job.id, table=table, part=int(part),
                               rows=to_serialize(local))
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
                self._assign_local(job, table, part, lo - a, chunk)
            else:
                self._call(self.worker.rpc(owner).dscar_assign, job_id=job.id, table=table, part=part, lo=lo - a, data=to_serialize(chunk))


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
    """The ``ClockContext`` of a clock-end step: fresh pulls, assignments."""

    def __init__(self, server: ParamServer, job: Job, clock: int):
        self._server, self._job = server, job
        self.xp, self.clock, self.meta, self.tol = job.xp, clock, job.meta, job.tol

    def pull(self, table: str, start: int = 0, stop: int | None = None):
        return self._server.read_rows(self._job, table, start, stop)

    def pull_rows(self, table: str, rows):
        return self._server.read_row_set(self._job, table, rows)

    def assign(self, table: str, values, start: int = 0) -> None:
        self._server.write_rows(self._job, table, values, start)


def device_of(xp: ModuleType) -> str:
    return "gpu" if xp.__name__ == "cupy" else "cpu"
