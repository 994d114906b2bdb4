"""The data plane: ``ParamServer``, a WorkerPlugin on every worker.

The worker side is split by role, as distributed's ``shuffle/`` is: per job, a
partition store (``dscar.worker.partition_store``: the table partitions this worker
owns and the updates staged by attempts run here), a shard store
(``dscar.worker.shard_store``: the shards whose data it holds) and a shard runner
(``dscar.worker.runner``: the worker's own thread that pulls and runs work). This
plugin is the glue: lifecycle, job install, the ``dscar_*`` handlers, peer
messaging, and moving array work (large applies, checkpoint snapshots and
writes) off the event loop. Parameter and shard bytes move worker to worker
through the handlers below, as zero-copy frames; the scheduler only ever sees
ids and small dicts.

Exactly once: the rule lives where it is kept, in ``dscar.worker.partition_store``
(staged updates, applied in shard order) and ``dscar.worker.shard_store`` (pending
shard states, installed for the winning attempt only); the handlers here are
thin glue over those two stores.

Every message to another worker goes through a connection pool of its own with
a short connect timeout and a deadline (``dscar.rpc-timeout``), and fails at once
when the coordinator reports that worker lost (``dscar_peer_lost``), as does every
later message to it until a worker joins at that address again (``dscar_peer_joined``).
"""
from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import os
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import Future
from types import ModuleType
from typing import Any, Callable

import numpy as np
import dask.config
from distributed import WorkerPlugin
from distributed.core import error_message, send_recv
from distributed.protocol import to_serialize
from distributed.protocol.pickle import loads

from .. import checkpoint as ckpt
from .. import heap
from .. import wire
from ..comm import fast_fail_pool
from ..errors import JobFailedError, RefusedCallError
from ..inflight import Inflight, timed_wait
from ..core.membership import (BUNDLED_OPS, WORKER_INSTALLING, WORKER_RUN_WRITES, Rule, key_digest, new_token, refusal, run_known,
                         run_refusal, same, worker_rule)
from .mirror_store import mirror_answer, part_key, shard_key
from .partition_store import PartitionStore
from ..core.partitions import TableLayout
from ..core.apply_plan import INLINE_BYTES
from ..core.protocol import extend_copy, handler_name
from .runner import Job, ShardRunner, read_inline
from .shard_store import ShardEntry, ShardStore
from ..xp import select_namespace, to_host

logger = logging.getLogger("dscar.worker")

PLUGIN_NAME = "dscar-paramserver"
#: a pass whose updates here are at most this many bytes is applied on the event loop (tens of
#: microseconds), larger ones in a thread, so the loop keeps answering heartbeats and peers
INLINE_APPLY_BYTES = 256 * 1024


def rpc_timeout() -> float:
    """Seconds a worker-to-worker message may take before the attempt fails over (``dscar.rpc-timeout``)."""
    return float(dask.config.get("dscar.rpc-timeout", 10.0))


#: the handlers a folded clock end tags with ``after`` (its run): each answers once the pass of that
#: run is applied here (``ParamServer._until_applied``), so the clock end reads and writes the tables
#: as they are after the pass, although it started before every owner had applied it
AFTER_APPLIED = frozenset({"pull", "pull_many", "summarize", "assign"})

#: the handlers a step of a clock that began with the previous clock's last apply tags with ``settled`` (that
#: apply's run): each answers once that apply ended here, applied or not (``ParamServer._until_applied``), so
#: the step reads the tables as the apply left them. ``copy_shard`` waits only where that apply may install a
#: new state of the shard here
AFTER_SETTLED = frozenset({"pull", "pull_many", "copy_shard"})


class ParamServer(WorkerPlugin):
    """Holds each job's stores and answers the ``dscar_*`` handlers; starts the shard runner
    (and is its ``RunnerHost``)."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, poll_timeout: float | None = None):
        self.poll_timeout = poll_timeout

    # ------------------------------------------------------------ lifecycle
    def setup(self, worker) -> None:
        self.worker = worker
        self.xp = select_namespace()
        self.jobs: dict[str, Job] = {}
        #: guards ``jobs``
        self._lock = threading.RLock()
        #: set when the worker stops: the runner's thread ends
        self.stop = threading.Event()
        #: an in-process cluster: injected faults close or stall this worker, not the process
        self.in_process = worker.address.startswith("inproc://")
        #: this process's own key: it proves to the coordinator that a call comes from this worker
        #: (registered with ``dscar_hello``, confirmed through ``dscar_confirm_key``)
        self.key = new_token()
        #: the coordinator has confirmed ``key`` (``register``)
        self.registered = False
        #: worker-to-worker messages of attempts: a short connect timeout, so a dead peer fails fast
        self.peers = fast_fail_pool(worker.connection_args, server=worker, limit=64)
        self._peers_started = asyncio.ensure_future(self.peers.start())
        #: messages waiting for a peer's answer (they fail at once when it is lost)
        self._inflight = Inflight()
        #: the runner thread's calls running on the loop (``_from_thread``): the loop keeps only
        #: weak references to its tasks, so one nobody else holds could be collected mid-call
        self._thread_calls: set[asyncio.Task] = set()
        #: (job, pass tag) -> the answer of this worker's combine step of that pass (``_combine``),
        #: once the apply message that names it came; a parent's fetch may come first and waits
        self._combines: dict[tuple[str, tuple[int, int]], asyncio.Future] = {}
        #: woken (their results set) whenever a BSP pass is applied here or will not be
        self._apply_waiters: list[asyncio.Future] = []
        #: job -> (run, the clock end folded into that pass's apply here): an apply sent again awaits it
        self._folded: dict[str, tuple[int, asyncio.Future]] = {}
        #: job -> (run, summarize) of a folded clock end's first read that waits here for that pass
        #: (``pull_many``'s ``summarize``): the apply's thread computes them once the pass is applied
        self._wanted_summaries: dict[str, tuple[int, list]] = {}
        #: job -> (``PartitionStore.version``, summarize, summaries) so computed: the read's answer
        #: takes them while the partitions are as they were (no thread hop after the apply)
        self._early_summaries: dict[str, tuple[int, list, list]] = {}
        #: (job, run) -> owner -> ``(ask, answer)``: an owner's answer to the first read of the clock end
        #: folded into this worker's apply of that pass, pushed once it applied it (``_h_first_read``)
        self._pushed: dict[tuple[str, int], dict[str, tuple[dict, dict]]] = {}
        #: (job, run, owner) -> the future a folded clock end's first read waits on for that owner's push
        self._push_waits: dict[tuple[str, int, str], asyncio.Future] = {}
        #: job -> this worker's copy of the stopping rule's history (``protocol.RuleHistory``), as sent
        #: with the folded clock ends it ran
        self._rule_copies: dict[str, list[dict[str, float]]] = {}
        for op, handler in self.handlers().items():
            worker.handlers[handler_name(op)] = self._guarded(op, handler)
        #: (job, table, part) -> a partition copied here for a join, owned from its switch (``adopt``)
        self._incoming: dict[tuple[str, str, int], np.ndarray] = {}
        #: (job, table, part) -> what this owner lent a joiner, until the switch asks what changed since
        self._lent: dict[tuple[str, str, int], np.ndarray] = {}
        self.runner = ShardRunner(self, self.poll_timeout)
        self._thread = threading.Thread(target=self.runner.loop, name="dscar-loop", daemon=True)
        self._thread.start()

    def handlers(self) -> dict[str, Callable]:
        """This worker's handlers by op (Dask's name: ``protocol.handler_name``); each one's caller
        rule is ``membership.worker_rule(op)``."""
        return {
            # a job's partitions and shards: set-up, pulls, a pass's apply, clock-end writes, moves
            "init": self._h_init, "warm_up": self._h_warm_up, "pull": self._h_pull, "pull_many": self._h_pull_many,
            "summarize": self._h_summarize, "fetch_staged": self._h_fetch_staged, "fetch_combined": self._h_fetch_combined,
            "apply": self._h_apply,
            "assign": self._h_assign, "put_shard": self._h_put_shard, "copy_shard": self._h_copy_shard,
            "adopt": self._h_adopt, "adopt_all": self._h_adopt_all, "lend": self._h_lend, "bundle": self._h_bundle,
            "forget_copy": self._h_forget_copy, "drop_shard": self._h_drop_shard, "end_job": self._h_end_job, "first_read": self._h_first_read,
            "clock_end_outcome": self._h_clock_end_outcome,
            # checkpoints, restores, memory copies, simulated losses
            "checkpoint": self._h_checkpoint, "restore": self._h_restore, "forget": self._h_forget,
            "perturbation": self._h_perturbation, "mirror": self._h_mirror, "keep_mirror": self._h_keep_mirror,
            "get_mirror": self._h_get_mirror, "drop_copies": self._h_drop_copies,
            "mirror_clocks": self._h_mirror_clocks, "pass_copies": self._h_pass_copies,
            # the shard runner's batch (``protocol``): members given back unstarted
            "release": self._h_release,
            # liveness, peers, keys
            "info": self._h_info, "stack": self._h_stack, "peer_lost": self._h_peer_lost,
            "peer_joined": self._h_peer_joined, "confirm_key": self._h_confirm_key,
        }

    def teardown(self, worker) -> None:
        self._stop_all()
        worker.loop.add_callback(self.peers.close)

    def _stop_all(self) -> None:
        """The runner stops, and with it every job's waits (``Job.ended``)."""
        self.stop.set()
        with self._lock:
            for job_id, job in self.jobs.items():
                job.ended.set()
                heap.release((id(self), job_id))

    # ---------------------------------------------------------------- jobs
    @property
    def address(self) -> str:
        return self.worker.address

    def job(self, job_id: str) -> Job:
        """The job's state here, installed from the coordinator's spec on first use (runner's thread)."""
        with self._lock:
            job = self.jobs.get(job_id)
        if job is not None:
            return job
        if not self.registered:
            self._from_thread(self._aregister)
        return self._install(job_id, self.call("job_spec", job_id=job_id, worker=self.address))

    async def _ajob(self, job_id: str) -> Job:
        """``job`` for handlers on the event loop (the spec is unpickled in a thread: it holds the
        algorithm, whose import may take seconds, and heartbeats must flow)."""
        job = self.jobs.get(job_id)
        if job is None:
            if not self.registered:  # (a driver's first message may come before the runner registered)
                await self._aregister()
            spec = await self._acall("job_spec", job_id=job_id, worker=self.address)
            job = await asyncio.to_thread(self._install, job_id, spec)
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
                    token=d["token"],
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
                    ssp=d.get("consistency") == "ssp",
                    inline_bytes=int(d.get("inline_bytes", INLINE_BYTES)),
                )
                heap.hold((id(self), job_id))  # (the heap's full collections skip what is here now)
            return self.jobs[job_id]

    # -------------------------------------------------------------- callers
    def _guarded(self, op: str, handler):
        """``handler`` behind the one check of its caller: a call about a job must carry the job's
        token (``membership.refusal``; a job new here is installed first, its token comes with
        it), and a parameter write a run the job has reached (``_run_refusal``). A refused call is
        answered with a ``RefusedCallError`` and reported to the coordinator (a ``forged-call``
        event), never handed on."""
        rule, installs, writes = worker_rule(op), op in WORKER_INSTALLING, op in WORKER_RUN_WRITES

        waits, settles = op in AFTER_APPLIED, op in AFTER_SETTLED

        async def guarded(comm, token: str | None = None, **kw):
            after = kw.pop("after", None) if waits else None
            settled = kw.pop("settled", None) if settles else None
            if rule is not Rule.OPEN:
                job_id = kw.get("job_id")
                job = self.jobs.get(job_id) if isinstance(job_id, str) else None
                if job is None and installs and isinstance(job_id, str):
                    job = await self._ajob(job_id)
                why = refusal(rule, job_token=None if job is None else job.token, token=token)
                if why is None and writes and job is not None:
                    why = await self._run_refusal(job, kw.get("run", -1))
                if why is not None:
                    return await self._refuse(op, getattr(comm, "peer_address", None), why, job)
            if after is not None:
                if op == "pull_many" and kw.get("summarize"):  # (a folded clock end's first read)
                    self._wanted_summaries[kw.get("job_id")] = (int(after), kw["summarize"])
                why = await self._until_applied(kw.get("job_id"), int(after))
                if why is not None:
                    return {"status": "not-applied", "error": why}
            if settled is not None and (op != "copy_shard" or self._may_install(kw.get("job_id"), kw.get("shard"))):
                why = await self._until_applied(kw.get("job_id"), int(settled), ended=True)
                if why is not None:
                    return {"status": "not-applied", "error": why}
            out = handler(**kw)
            return (await out) if inspect.isawaitable(out) else out

        guarded.__name__ = guarded.__qualname__ = handler_name(op)
        return guarded

    async def _until_applied(self, job_id: object, run: int, ended: bool = False) -> str | None:
        """None once the BSP pass of ``run`` (or a newer one) is applied here; otherwise why it is not:
        its apply was refused or cut short here, a newer run reached this worker, or it did not come
        within half ``rpc_timeout()`` (a bounded wait, answered before the reader's own deadline: a
        folded clock end then goes back to the item path). ``ended``: None once that apply ended here,
        whether it applied or not (a step of the next clock reads the tables as it left them)."""
        deadline = time.monotonic() + rpc_timeout() / 2
        while True:
            job = self.jobs.get(job_id) if isinstance(job_id, str) else None
            if job is None:
                return f"job {job_id} is not on {self.address}"
            if job.tables.applied_run >= run:
                return None
            if job.run_seen > run or job.applies_ended >= run:  # (ended, not applied: refused or cut short)
                return None if ended else f"pass {run} will not be applied on {self.address}"
            left = deadline - time.monotonic()
            if left <= 0:
                return f"pass {run} was not applied on {self.address} within {rpc_timeout() / 2} s"
            waiter = asyncio.get_running_loop().create_future()
            self._apply_waiters.append(waiter)
            try:
                await timed_wait(waiter, left, None)
            finally:
                if waiter in self._apply_waiters:
                    self._apply_waiters.remove(waiter)

    def _may_install(self, job_id: object, shard: object) -> bool:
        """Whether a BSP apply may still install a new state of ``shard`` here (an attempt run here staged one)."""
        job = self.jobs.get(job_id) if isinstance(job_id, str) else None
        return job is not None and any(k[1] == shard for k in list(job.shards.pending))

    def _applies_settled(self, job_id: str, run: int, applied: bool) -> None:
        """A BSP pass was applied here, or will not be: wake the reads waiting for it, and the shard
        runner where a work item waits for it (``runner.Job.wait_apply_ended``)."""
        if (job := self.jobs.get(job_id)) is not None:
            job.apply_ended(run)
        waiters, self._apply_waiters = self._apply_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def _run_refusal(self, job: Job, run: object) -> str | None:
        """Why a write tagged ``run`` must be refused (``membership.run_refusal``): a run newer than
        any this worker knows the job reached is checked with the coordinator, which alone issues
        runs (one question per new run, and only on a worker no work item of it reached yet)."""
        if run_known(run, max(job.run_seen, job.run_confirmed)):
            return None
        try:
            current = (await self._acall("run", job_id=job.id, worker=self.address)).get("run")
        except Exception as e:  # the coordinator is gone or refused us: nothing confirms the run
            logger.info("dscar: could not confirm run %r of job %s: %r", run, job.id, e)
            current = None
        why = run_refusal(run, current)
        if why is None:
            job.run_confirmed = max(job.run_confirmed, int(current))
        return why

    async def _refuse(self, op: str, caller: str | None, why: str, job: Job | None) -> dict:
        """The answer to a refused call, once the coordinator has its ``forged-call`` event."""
        logger.warning("dscar: refused dscar_%s from %s: %s", op, caller, why)
        if job is not None:
            await self._areport(job, job.clock_seen, "forged-call", {"handler": handler_name(op), "caller": caller,
                                                                      "reason": why})
        return error_message(RefusedCallError(f"{handler_name(op)} refused on {self.address}: {why}"), status="uncaught-error")

    def _h_confirm_key(self, digest: str) -> dict:
        """Whether this process holds the key whose hash is ``digest`` (the coordinator asks before
        it believes a worker's ``dscar_hello``)."""
        return {"status": "OK" if same(key_digest(self.key), digest) else "other"}

    def register(self) -> bool:
        """Register this worker's key with the coordinator (``dscar_hello``), from a thread other than
        the event loop; whether it is registered (not yet: the scheduler does not know this worker yet)."""
        return self._from_thread(self._aregister)

    async def _aregister(self) -> bool:
        self.registered = (await self._acall("hello", worker=self.address)).get("status") == "OK"
        return self.registered

    def _signed(self, kw: dict) -> dict:
        """``kw`` with the token of the job it names, when that job is installed here."""
        job = self.jobs.get(kw.get("job_id") or "")
        return kw if job is None else {**kw, "token": job.token}

    async def _acall(self, op: str, **kw) -> Any:
        """The scheduler's handler ``dscar_<op>``, as this worker: with its key and the job's token.

        Sent on a connection of the worker's pool to the scheduler (as ``worker.scheduler`` does) with
        offloading off for the call: every dscar message to the scheduler is small metadata, and
        distributed otherwise walks each outgoing message with ``dask.sizeof`` to decide whether to
        serialize it in a thread (``comm.fast_fail_pool``'s ``metadata_only``). A commit's walk cost
        more than its msgpack, on the loop that 32 hollow workers share, in the burst that ends a clock."""
        pool, address = self.worker.rpc, self.worker.scheduler.address
        comm = await pool.connect(address)
        comm.allow_offload = False
        try:
            return await send_recv(comm=comm, op=handler_name(op), key=self.key, serializers=pool.serializers,
                                   deserializers=pool.deserializers, **self._signed(kw))
        finally:
            comm.allow_offload = pool.allow_offload
            pool.reuse(address, comm)

    # ------------------------------------------------------------- handlers
    async def _h_warm_up(self, job_id: str) -> dict:
        """Load the algorithm's kernels before clock 1, off the event loop (a compile may take
        seconds, and heartbeats must flow). A job that ended before its joiner warmed up is no fault."""
        try:
            job = await self._ajob(job_id)
        except JobFailedError as e:
            return {"status": "ended", "error": str(e)}
        await asyncio.to_thread(job.algorithm.warm_up, job.xp)
        return {"status": "OK"}

    async def _h_init(self, job_id: str, parts: list) -> dict:
        """Create this worker's partitions from the algorithm's initial values, in a thread: a model's
        ``init_rows`` may take minutes on a loaded machine, and a worker whose event loop it held would
        stop heartbeating and be removed as hung."""
        job = await self._ajob(job_id)

        def create() -> None:
            for table, part in parts:
                spec_ = job.specs[table]
                a, b = job.layouts[table].bounds[part]
                job.tables.own(table, part, job.algorithm.init_rows(spec_, a, b, job.xp), checkpointed=True)  # checkpoint 0

        await asyncio.to_thread(create)
        return {"status": "OK", "device": device_of(self.xp)}

    async def _h_adopt(self, job_id: str, table: str, part: int, source: str, step: str = "whole") -> dict:
        """Become the owner of a partition, copied from its current owner ``source``.

        ``step`` "whole": copy it and own it at once (a hand-off or a restart, at a clock boundary).
        A join moves it in two steps, so the clock loop never waits for the whole copy: "copy" takes
        it while clocks run and keeps it aside, not owned (``source`` keeps what it lent: ``lend``);
        "switch", at a clock boundary, takes the rows that changed since the copy and owns it
        (``rows_resent`` says how many)."""
        job = await self._ajob(job_id)
        op, kw = self._adopt_ask(job, table, int(part), step)
        return await self._adopt_take(job, table, int(part), step, await self._apeer(source, op, job_id=job_id, **kw))

    def _adopt_ask(self, job: Job, table: str, part: int, step: str) -> tuple[str, dict]:
        """The message to a partition's owner that ``adopt`` step ``step`` sends: ``(op, kwargs)``."""
        if step == "switch":
            if (job.id, table, part) not in self._incoming:
                raise RuntimeError(f"partition {table}/{part} was not copied here before its switch")
            return "lend", {"table": table, "part": part, "step": "changes"}
        if step == "copy":
            return "lend", {"table": table, "part": part, "step": "copy"}
        a, b = job.layouts[table].bounds[part]
        return "pull", {"table": table, "part": part, "lo": 0, "hi": b - a, "holds": True}

    async def _adopt_take(self, job: Job, table: str, part: int, step: str, r: dict) -> dict:
        """``adopt`` step ``step`` of a partition, with the owner's answer ``r`` to ``_adopt_ask``."""
        if r.get("status") != "OK":
            raise RuntimeError(f"partition {table}/{part} is not on its owner any more: {r.get('status')}")
        key = (job.id, table, part)
        if step == "switch":
            base = self._incoming.pop(key)
            rows = np.asarray(r["rows"], dtype=np.int64)
            if len(rows):
                base[rows] = r["data"]
            await asyncio.to_thread(job.tables.own, table, part, base, holds=r.get("holds", ()))
            return {"status": "OK", "rows_resent": int(len(rows))}
        if step == "copy":
            self._incoming[key] = np.array(r["data"], copy=True)  # (writable: the switch patches it)
            a, b = job.layouts[table].bounds[part]
            return {"status": "OK", "rows": int(b - a)}
        await asyncio.to_thread(job.tables.own, table, part, r["data"], holds=r.get("holds", ()))
        return {"status": "OK"}

    def _h_lend(self, job_id: str, table: str, part: int, step: str, keep: int | None = None) -> dict:
        """The owner's side of a join's move (``adopt`` steps "copy" and "switch"). "copy": the
        partition's rows now, kept here as lent; "changes": the rows (local indices) that differ from
        what was lent and their values, the lent copy forgotten; "drop": the partition is the joiner's
        now (the coordinator switched its owner): this worker holds it no more, so no apply or
        checkpoint here touches it again. ``keep`` (a clock): its values stay here as the memory tier's
        copy of it as of that clock (``kept``), until its new owner's own copy lands at a buddy."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "missing"}
        key = (job_id, table, int(part))
        if step == "drop":
            self._lent.pop(key, None)
            values = job.tables.disown(table, int(part))
            kept = keep is not None and values is not None
            if kept:
                job.mirrors.keep(part_key(table, part), keep, to_host(values))
            return {"status": "OK", "kept": kept}
        b, e = job.layouts[table].bounds[part]
        with job.tables.lock:
            now = job.tables.host_rows(table, part, 0, e - b)
            if now is None:
                return {"status": "missing"}
            if step == "copy":
                self._lent[key] = now
                return {"status": "OK", "data": to_serialize(now)}
            lent = self._lent.pop(key, None)
            if lent is None:
                return {"status": "missing"}
            holds = job.tables.holds_of((table, int(part)))
        differ = now != lent  # (a NaN differs from itself: re-sent, harmlessly)
        rows = np.flatnonzero(differ.reshape(len(now), -1).any(axis=1)) if now.size else np.zeros(0, np.int64)
        return {"status": "OK", "rows": rows.tolist(), "data": to_serialize(np.ascontiguousarray(now[rows])),
                "holds": holds}

    def _h_forget_copy(self, job_id: str, table: str, part: int) -> dict:
        """Forget a join's copy of a partition that will not switch (``Elastic.switch_copies``: the
        partition moved meanwhile, or its new or old owner left): the copy kept here for it, as its new
        owner (``adopt`` step "copy") or as its old owner (``lend`` step "copy"), which would otherwise
        stay until the job ends, a partition's worth of memory each."""
        key = (job_id, table, int(part))
        with self._lock:
            dropped = sum(moving.pop(key, None) is not None for moving in (self._incoming, self._lent))
        return {"status": "OK", "dropped": dropped}

    def _h_drop_shard(self, job_id: str, shard: int, keep: int | None = None) -> dict:
        """Drop the copy of a shard now held by another worker (``Elastic.switch_copies`` or
        ``hand_off`` copied it there at a clock boundary): left here it would go stale, and an attempt
        here told to read the shard afresh (its holder lost) would run from it. ``keep`` (a clock): its
        state stays here as the memory tier's copy of it as of that clock (``kept``)."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "missing"}
        entry = job.shards.drop(int(shard))
        kept = keep is not None and entry is not None and bool(entry.state)
        if kept:
            job.mirrors.keep(shard_key(shard), keep, entry.host_state())
        return {"status": "OK", "dropped": int(entry is not None), "kept": kept}

    async def _h_adopt_all(self, job_id: str, parts: list, shards: list | None = None, step: str = "whole") -> dict:
        """Copies to this worker: partitions ``[[table, part, source], ...]`` as ``adopt`` step ``step``,
        shards ``[[shard, source], ...]`` copied with their state from ``source`` (a hand-off's: a worker
        Dask is retiring). One message to each source (``bundle``), the sources side by side: on a clock
        boundary's path, a message per copy would cost a round trip each (some 0.5-1 ms here, more
        across machines), and several at once to one worker would open a connection each. The answer:
        ``parts`` and ``shards``, each copy's answer in order (``status`` "OK", or why not)."""
        job = await self._ajob(job_id)
        shards = shards or []
        asks: list[tuple[str, Any]] = []  # (source, [op, kwargs] or the error that kept it from being asked)
        for table, part, source in parts:
            try:
                asks.append((source, list(self._adopt_ask(job, table, int(part), step))))
            except Exception as e:  # noqa: BLE001 - that copy fails, the others go on
                asks.append((source, e))
        asks += [(source, ["copy_shard", {"shard": int(shard)}]) for shard, source in shards]
        answers: list[Any] = [e for _, e in asks]
        by_source: dict[str, list[int]] = {}
        for i, (source, ask) in enumerate(asks):
            if not isinstance(ask, Exception):
                by_source.setdefault(source, []).append(i)

        async def ask(source: str, ix: list[int]) -> None:
            try:
                r = await self._apeer(source, "bundle", job_id=job_id, calls=[asks[i][1] for i in ix])
                got = r["answers"] if r.get("status") == "OK" else [r] * len(ix)
            except Exception as e:  # noqa: BLE001 - the source's copies fail, the others' go on
                got = [e] * len(ix)
            for i, a in zip(ix, got):
                answers[i] = a

        await asyncio.gather(*(ask(source, ix) for source, ix in by_source.items()))
        done: list[dict] = []
        for (table, part, _), r in zip(parts, answers):
            try:
                if isinstance(r, Exception):
                    raise r
                done.append(await self._adopt_take(job, table, int(part), step, r))
            except Exception as e:  # noqa: BLE001 - the coordinator does not switch it
                done.append({"status": f"failed: {e!r}"})

        def prepared(shard: int, r: Any) -> Any:  # (in a thread: the algorithm's preparation may take a while)
            if isinstance(r, Exception):
                return r
            if r.get("status") != "OK":
                return RuntimeError(f"shard {shard} is not on its holder any more: {r.get('status')}")
            try:
                return ShardEntry(job.algorithm.prepare_shard(dict(r["arrays"]), job.xp),
                                  {k: job.xp.asarray(v) for k, v in r["state"].items()})
            except Exception as e:  # noqa: BLE001 - that copy fails, the others go on
                return e

        entries = await asyncio.to_thread(
            lambda: [prepared(int(shard), r) for (shard, _), r in zip(shards, answers[len(parts):])])
        for (shard, _), entry in zip(shards, entries):
            if isinstance(entry, Exception):
                done.append({"status": f"failed: {entry!r}"})
            else:
                job.shards.put(int(shard), entry)
                done.append({"status": "OK"})
        return {"status": "OK", "parts": done[:len(parts)], "shards": done[len(parts):]}

    async def _h_bundle(self, job_id: str, calls: list) -> dict:
        """Several of one job's messages to this worker in one: ``calls`` ``[[op, kwargs], ...]``, each
        op one of ``membership.BUNDLED_OPS``, run in order here; their answers in order (``answers``;
        ``status`` "failed: ..." for one that raised or may not be bundled). A hand-off's or a join's
        copies then cost their source one message, not one each."""
        handlers = self.handlers()
        out = []
        for op, kw in calls:
            try:
                if op not in BUNDLED_OPS:
                    raise ValueError(f"{op!r} may not be bundled")
                r = handlers[op](job_id=job_id, **kw)
                out.append((await r) if inspect.isawaitable(r) else r)
            except Exception as e:  # noqa: BLE001 - that call's answer; the others go on
                out.append({"status": f"failed: {e!r}"})
        return {"status": "OK", "answers": out}

    def _h_pull(self, job_id: str, table: str, part: int, lo: int = 0, hi: int = 0, rows=None,
                clock: int | None = None, mine: list | None = None, holds: bool = False,
                race: list | None = None) -> dict:
        """Rows of a partition held here. ``mine``: ``[run, [[clock, shard, attempt], ...]]``, the
        caller's own SSP updates: the answer says which the rows hold (``held``); ``holds``: the
        answer lists every SSP update in the partition (an adopter takes them); ``race``: ``[run,
        clock, shard]`` of the attempt reading: ``lost-race`` when another attempt of its shard
        was applied here (``Job.lost_race``)."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "missing"}
        with job.tables.lock:
            if job.lost_race(race, (table, int(part))):
                return {"status": "lost-race"}
            out = job.tables.host_rows(table, part, lo, hi, rows, clock)
            if out is None:  # a late attempt of an ended job, a moved partition
                return {"status": "missing"}
            extra = {} if mine is None else {"held": job.tables.held((table, part), *mine)}
            if holds:
                extra["holds"] = job.tables.holds_of((table, part))
        return {"status": "OK", "data": to_serialize(out), **extra}

    def _h_pull_many(self, job_id: str, parts: list, clock: int | None = None, mine: list | None = None,
                     race: list | None = None, summarize: list | None = None):
        """Whole partitions ``[[table, part], ...]`` held here (``read_small_tables``); under SSP a
        reduction table's sums of ``clock``; ``mine`` and ``race`` as for ``pull`` (``held``: one
        list per partition). ``summarize``: ``[[table, [part, ...]], ...]``, a clock end's first
        read (``ShardRunner.clock_end_reads``): the answer also carries the algorithm's
        ``summarize`` of those partitions (``summaries``), computed off the event loop."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "missing"}
        with job.tables.lock:
            if any(job.lost_race(race, (t, int(p))) for t, p in parts):
                return {"status": "lost-race"}
            out = job.tables.host_parts(parts, clock)
            if out is None:
                return {"status": "missing"}
            extra = {} if mine is None else {"held": [job.tables.held(tuple(p), *mine) for p in parts]}
        answer = {"status": "OK", "data": wire.encode(out), **extra}
        return self._with_summaries(job, answer, summarize, clock) if summarize else answer

    async def _with_summaries(self, job: Job, answer: dict, summarize: list, clock: int | None) -> dict:
        """``answer`` with the summaries of ``summarize`` (``[[table, [part, ...]], ...]``): per table its
        parts and how many arrays each gave, and the arrays in that order."""
        def run() -> list | None:
            return [job.tables.summarize(t, parts, job.algorithm.summarize, clock) for t, parts in summarize]

        early = self._early_summaries.pop(job.id, None)
        if early is not None and clock is None and early[0] == job.tables.version and early[1] == summarize:
            got = early[2]
        else:
            got = await asyncio.to_thread(run)
        if any(g is None for g in got):
            return {"status": "missing"}
        return {**answer, "summaries": {"tables": [t for t, _ in summarize], "parts": [ps for _, ps in summarize],
                                        "counts": [[len(a) for a in g] for g in got],
                                        "data": wire.encode([x for g in got for a in g for x in a])}}

    async def _h_summarize(self, job_id: str, table: str, parts: list, clock: int | None = None) -> dict:
        """The algorithm's ``summarize`` of partitions ``parts`` of ``table`` held here (a clock end's
        ``summaries``), off the event loop; ``counts``: how many arrays each part gave."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "missing"}
        out = await asyncio.to_thread(job.tables.summarize, table, parts, job.algorithm.summarize, clock)
        if out is None:
            return {"status": "missing"}
        return {"status": "OK", "counts": [len(a) for a in out], "data": wire.encode([x for a in out for x in a])}

    def _h_fetch_staged(self, job_id: str, run: int, keys: list, parts: list) -> dict:
        """The updates staged here by ``keys`` (committed attempts of pass ``run``) for the caller's
        partitions ``parts``: an owner collects them when it applies the pass."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "ended"}
        missing, selected = job.tables.select_staged(run, keys, parts)
        if missing is not None:
            return {"status": "missing", "key": list(missing)}
        return {"status": "OK", **_encode_updates([(key, self.address, ups) for key, ups in selected])}

    def _combine_future(self, job_id: str, tag: tuple[int, int]) -> asyncio.Future | None:
        """The future of this worker's combine step of pass ``tag`` (made by whichever comes first:
        the apply message or a fetch); None when a newer pass of the job was combined here (stale)."""
        if any(j == job_id and t > tag for j, t in self._combines):
            return None
        for key in [k for k, f in self._combines.items() if k[0] == job_id and k[1] < tag and f.done()]:
            del self._combines[key]
        return self._combines.setdefault((job_id, tag), asyncio.get_running_loop().create_future())

    def _settle_combine(self, job_id: str, tag: tuple[int, int], answer: dict) -> None:
        fut = self._combine_future(job_id, tag)
        if fut is not None and not fut.done():
            fut.set_result(answer)

    async def _combine(self, job: Job, tag: tuple[int, int], combine: dict) -> None:
        """The combine step of a pass applied through a tree (``dscar.core.apply_plan``): this worker's
        committed attempts' updates (all partitions) and its children's combined sets, held here
        under the pass (``PartitionStore.hold_combined``) for the parent and the owners to fetch.
        A child that cannot be reached, or lacks a key, is answered as ``source-lost`` naming it
        (the coordinator removes it: a loss, as for a direct fetch)."""
        run = tag[0]
        try:
            missing, own = job.tables.select_staged(run, combine["keys"], None)
            if missing is not None:
                answer = {"status": "source-lost", "worker": self.address,
                          "error": f"committed attempt {list(missing)} is not staged on {self.address}"}
            else:
                entries = {key: (self.address, ups) for key, ups in own}
                children = combine.get("children", [])
                replies = await asyncio.gather(*(
                    self._apeer(w, "fetch_combined", job_id=job.id, tag=list(tag), height=h,
                                deadline=rpc_timeout() * (h + 1))
                    for w, h in children), return_exceptions=True)
                answer = {"status": "OK"}
                for (w, _), r in zip(children, replies):
                    if isinstance(r, dict) and r.get("status") in ("stale", "source-lost", "error"):
                        answer = r  # (a lost worker below the child, named by it)
                        break
                    if isinstance(r, Exception) or r.get("status") != "OK":
                        answer = {"status": "source-lost", "worker": w, "error": repr(r)}
                        break
                    for key, source, ups in _decode_updates(r):
                        if key in entries:
                            raise RuntimeError(f"the apply tree reached key {list(key)} twice at {self.address}")
                        entries[key] = (source, ups)
                if answer["status"] == "OK":
                    if len(entries) != int(combine["expect"]):
                        raise RuntimeError(f"the apply tree's combined set at {self.address} holds {len(entries)} "
                                           f"keys, not {combine['expect']}")
                    job.tables.hold_combined(tag, entries)
        except Exception as e:  # a bug: the owners fail the pass with it
            logger.exception("dscar: combine step of pass %s failed", tag)
            answer = {"status": "error", "error": f"combine step on {self.address} failed: {e!r}"}
        self._settle_combine(job.id, tag, answer)

    async def _h_fetch_combined(self, job_id: str, tag: list, height: int = 0, parts: list | None = None,
                                exclude: str | None = None) -> dict:
        """This worker's combined set of pass ``tag`` (waiting for its combine step, which waits on
        ``height`` levels below it): every key's updates to ``parts`` (None: all, for a parent),
        those staged by ``exclude`` left out."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "ended"}
        tag_ = (int(tag[0]), int(tag[1]))
        fut = self._combine_future(job_id, tag_)
        if fut is None:
            return {"status": "stale"}
        try:  # (the apply message that starts the step may still be on its way)
            answer = await asyncio.wait_for(asyncio.shield(fut), rpc_timeout() * (int(height) + 2))
        except asyncio.TimeoutError:
            return {"status": "source-lost", "worker": self.address, "error": "its apply message never came"}
        if answer.get("status") != "OK":
            return answer
        entries = job.tables.select_combined(tag_, parts, exclude)
        if entries is None:  # a newer pass replaced it
            return {"status": "stale"}
        return {"status": "OK", **_encode_updates(entries)}

    async def _fetch_updates(self, job: Job, tag: tuple[int, int], parts: list, fetch: list | None,
                             tree: dict | None) -> tuple[dict, dict | None]:
        """The committed attempts' updates to ``parts`` staged elsewhere: from each stager
        (``fetch``: ``[worker, keys]``) or from the tree's root (``tree``); ``(updates, None)``, or
        ``({}, answer)`` when the pass cannot be applied here (``source-lost``, ``stale``)."""
        updates: dict[tuple, list] = {}
        if fetch:
            await self._peers_started
            replies = await asyncio.gather(*(
                self._apeer(w, "fetch_staged", job_id=job.id, run=tag[0], keys=keys, parts=parts)
                for w, keys in fetch), return_exceptions=True)
            for (w, _), r in zip(fetch, replies):
                if isinstance(r, Exception) or r.get("status") != "OK":
                    return {}, {"status": "source-lost", "worker": w, "error": repr(r)}
                updates.update((key, ups) for key, _, ups in _decode_updates(r))
        if tree:
            root, me = tree["root"], self.address
            if root == me:
                fut = self._combine_future(job.id, tag)
                r = {"status": "stale"} if fut is None else await fut
                entries = job.tables.select_combined(tag, parts, me) if r.get("status") == "OK" else None
            else:
                try:
                    r = await self._apeer(root, "fetch_combined", job_id=job.id, tag=list(tag),
                                          height=int(tree["height"]), parts=parts, exclude=me,
                                          deadline=rpc_timeout() * (int(tree["height"]) + 2))
                except Exception as e:  # (the root is gone: as a direct fetch's source)
                    r = {"status": "source-lost", "worker": root, "error": repr(e)}
                entries = _decode_updates(r) if r.get("status") == "OK" else None
            if r.get("status") == "error":
                raise RuntimeError(r.get("error"))
            if r.get("status") == "stale":
                return {}, {"status": "stale"}
            if entries is None:
                return {}, {"status": "source-lost", "worker": r.get("worker", root), "error": repr(r)}
            if len(entries) != int(tree["expect"]):
                raise RuntimeError(f"the apply tree's root {root} sent {len(entries)} keys to {me}, "
                                   f"not {tree['expect']}")
            updates.update((key, ups) for key, _, ups in entries)
        return updates, None

    async def _h_apply(self, job_id: str, clock: int, run: int, committed: list, reset: list | None = None,
                       clocks: list | None = None, floor: int | None = None, phase: str | None = None,
                       batch: int | None = None, fetch: list | None = None, tree: dict | None = None,
                       combine: dict | None = None,
                       clock_end: dict | None = None, inline: list | None = None,
                       clock_shards: list | None = None, clock_end_at: str | None = None,
                       clock_end_ahead: bool = False) -> dict:
        """Apply the pass of ``run``: the committed attempts' updates to the partitions owned here
        and their new shard states to the shards held here; drop everything else of the clock.

        ``committed``: ``[shard, attempt, worker]`` of the committed attempts run here, with ``clock_shards``
        (``[[clock, [[lo, hi), ...]], ...]``, the pass's committed shards, or an SSP batch's per clock;
        ``clocks``: those of ``committed``, under SSP): the others' keys this worker needs come with their
        updates, and every other shard there was won elsewhere (a copy held here is dropped;
        ``apply_plan.batch_fields``). The tables named in
        ``reset`` start from zero (the reduction tables at a clock's first data phase, the rebuild
        tables in a rebuild pass). The array work runs off the event loop. Under SSP a batch spans
        clocks: ``clocks`` gives each attempt's, ``floor`` the newest finished clock, ``batch`` the
        batch. ``phase``: the data phase whose pass this is (an injected fault may name it).

        This worker's role in collecting the updates (``dscar.core.apply_plan.Role``): ``fetch``,
        ``[worker, keys]`` to fetch from each worker that staged some for the partitions here;
        ``tree``, ``{"root", "height", "expect"}`` to fetch them all from the tree's root instead;
        ``combine``, its combine step when it staged some for others (``_combine``); ``inline``,
        ``[key, table, part, payload]`` of the updates to its partitions that rode their commits
        (``runner.inline_updates``): applied from the message, fetched from nobody.

        ``clock_end``: a BSP clock's last pass, the clock-end item folded into this worker's apply
        (``dscar.core.schedule.BspSchedule._fold``): once the pass is applied here, this worker runs
        the clock end and answers with its outcome too (``clock_end``, ``protocol.ClockEndOutcome``).
        ``clock_end_at``: the worker that clock end is folded into (this is another owner): once the
        pass is applied here, this worker pushes it what its first read would ask of it (``_push_first_read``);
        ``clock_end_ahead``: that clock end runs ahead of the next clock, which this apply's answer may begin,
        so the summaries the push carries are computed after the answer, not before it.
        """
        job = self.jobs.get(job_id)
        tag = (int(run), int(clock if batch is None else batch))
        if job is None:
            if combine is not None:  # (its parent waits for it)
                self._settle_combine(job_id, tag, {"status": "ended"})
            self._push_first_read(job_id, run, clock_end_at, None)
            return {"applied": 0}
        if run < job.run_seen:  # the machine moved on (a loss): applying it now could undo newer work here
            if combine is not None:  # (its parent waits for it)
                self._settle_combine(job_id, tag, {"status": "stale"})
            if floor is None:
                self._applies_settled(job_id, run, False)
                self._push_first_read(job_id, run, clock_end_at, None)
            return {"status": "stale"}
        if await self._ainject(job, "apply", clock, phase):
            if combine is not None:  # (its parent waits for it)
                self._settle_combine(job_id, tag, {"status": "source-lost", "worker": self.address, "error": "stopped"})
            return {"status": "stopped"}
        if floor is None:  # BSP: the coordinator may send a pass again (a peer it could not reach answered a
            # probe); one that was applied here is not applied twice
            first_read = self._start_first_read(job, run, clock_end)
            ask = None if clock_end_at is None else self._first_read_ask(job, run, clock_end_at, not clock_end_ahead)
            async with job.apply_lock:
                if run <= job.tables.applied_run:
                    out = {"status": "OK", "applied": 0, "again": True}
                else:
                    try:
                        out = await self._apply_here(job, tag, clock, run, committed, reset, clocks, floor, fetch,
                                                     tree, combine, inline, clock_shards)
                    except BaseException:
                        self._applies_settled(job_id, run, False)
                        self._push_first_read(job_id, run, clock_end_at, None)
                        if first_read is not None:
                            first_read.cancel()
                        raise
                    self._applies_settled(job_id, run, "applied" in out)
            self._push_first_read(job_id, run, clock_end_at, ask if "applied" in out else None)
            if clock_end is not None and "applied" in out:
                if clock_end.get("ahead"):  # (answered now; its outcome is asked for apart: ``_h_clock_end_outcome``)
                    self._start_clock_end(job, run, clock_end, first_read)
                else:
                    out = {**out, "clock_end": await self._clock_end_here(job, run, clock_end, first_read)}
            elif first_read is not None:
                first_read.cancel()
            return out
        return await self._apply_here(job, tag, clock, run, committed, reset, clocks, floor, fetch, tree, combine,
                                      inline, clock_shards)

    async def _apply_here(self, job: Job, tag: tuple[int, int], clock: int, run: int, committed: list,
                          reset: list | None, clocks: list | None, floor: int | None, fetch: list | None,
                          tree: dict | None, combine: dict | None,
                          inline: list | None = None, clock_shards: list | None = None) -> dict:
        """``_h_apply``'s work once the pass is to be applied here."""
        job_id = job.id
        if combine is not None:
            asyncio.ensure_future(self._combine(job, tag, combine))
        owned = job.tables.owned()  # the partitions as of now: one restored meanwhile is not this pass's to update
        me, parts = self.worker.address, [[t, p] for t, p in owned]
        keys = [(int(c), int(s), int(a)) for (s, a, _), c in zip(committed, clocks or [clock] * len(committed))]
        workers = [w for _, _, w in committed]
        updates, failed = await self._fetch_updates(job, tag, parts, fetch, tree) if parts else ({}, None)
        if failed is not None:
            return failed
        for key, table, part, payload in inline or ():
            if (table, int(part)) in owned:  # (one restored since the pass began is not this pass's to update)
                updates.setdefault(tuple(int(k) for k in key), []).extend(read_inline(table, part, payload))
        if clock_shards is not None:  # the rest: the keys fetched, then the shards won elsewhere
            own = set(keys)
            keys += [k for k in updates if k not in own]
            done = {k[:2] for k in keys}
            keys += [(int(c), s, -1) for c, ranges in clock_shards for lo, hi in ranges for s in range(int(lo), int(hi))
                     if (int(c), s) not in done]
            workers += [""] * (len(keys) - len(workers))  # (not this worker: its copies of them go)
        args = (run, keys, workers, updates, set(reset or ()), owned, me, clock if floor is None else floor, floor)
        if job.tables.update_bytes(keys, updates) <= INLINE_APPLY_BYTES:
            out = job.apply_pass(*args)  # a thread hop would cost more than the additions
        elif floor is None:
            out = await asyncio.to_thread(self._apply_then_summarize, job, run, args)
        else:
            out = await asyncio.to_thread(job.apply_pass, *args)
        if "applied" in out and floor is None:  # (an SSP batch is no pass: a batch's members run on)
            self.runner.pass_applied(job_id)
        return out

    def _start_first_read(self, job: Job, run: int, item: dict | None) -> Future | None:
        """The first read of the clock end folded into the apply of ``run`` (``ShardRunner.clock_end_reads``),
        started now, as the apply begins, so the clock end finds its answers waiting instead of asking
        after this worker's apply. An owner the coordinator told of this clock end (``item["pushers"]``)
        pushes its answer once it applied the pass (``_h_first_read``): nothing is sent to it, unless its
        push asks what this read does not (another owner map) or does not come (then it is asked, as the
        others are: each answers once it applied the pass). None where no clock end is folded, or it ran
        here already (an apply sent again)."""
        if item is None or (self._folded.get(job.id) or (None,))[0] == run:
            return None
        owners = {(t, int(p)): w for t, p, w in item["owners"]}
        calls = self.runner.clock_end_reads(job, owners, None, run)
        if not calls:
            return None
        pushers = set(item.get("pushers", ()))

        async def one(address: str, op: str, kw: dict) -> Any:
            if address in pushers:
                try:
                    ask, answer = await self._inflight.call(address, self._pushed_by(job.id, run, address),
                                                            rpc_timeout())
                except Exception:  # noqa: BLE001 - gone, or late: asked below (which fails at once if it is gone)
                    ask = None
                if ask is not None and (_as_lists([ask["parts"], ask["summarize"]]) == [kw["parts"], kw["summarize"]]
                                        or answer.get("status") == "not-applied"):  # (the read's answer too)
                    return answer
            return await self._apeer(address, op, **kw)

        async def read() -> dict[str, Any]:
            replies = await asyncio.gather(*(one(a, op, kw) for a, op, kw in calls), return_exceptions=True)
            return dict(zip([a for a, _, _ in calls], replies))

        return asyncio.run_coroutine_threadsafe(read(), asyncio.get_running_loop())

    async def _pushed_by(self, job_id: str, run: int, owner: str) -> tuple[dict, dict]:
        """``owner``'s push of its answer to the first read of pass ``run`` (``_h_first_read``), once it comes."""
        got = self._pushed.get((job_id, run), {}).pop(owner, None)
        if got is not None:
            return got
        fut = self._push_waits[(job_id, run, owner)] = asyncio.get_running_loop().create_future()
        try:
            return await fut
        finally:
            if self._push_waits.get((job_id, run, owner)) is fut:
                del self._push_waits[(job_id, run, owner)]

    def _h_first_read(self, job_id: str, run: int, owner: str, ask: dict, answer: dict) -> dict:
        """``owner`` applied pass ``run`` and pushes what the first read of the clock end folded into this
        worker's apply of it asks of it (``ask``: ``pull_many``'s ``parts`` and ``summarize``), with its
        answer (that of ``pull_many``; ``not-applied`` where the pass was not applied there)."""
        run = int(run)
        job = self.jobs.get(job_id)
        # (a clock end running ahead of the next clock reads pass ``run`` while this worker runs newer ones)
        if job is None or (run < job.run_seen and (self._folded.get(job_id) or (None,))[0] != run):
            return {"status": "stale"}
        fut = self._push_waits.pop((job_id, run, owner), None)
        if fut is not None and not fut.done():
            fut.set_result((ask, answer))
        else:
            for key in [k for k in self._pushed if k[0] == job_id and k[1] < run]:  # (older passes': unread)
                del self._pushed[key]
            self._pushed.setdefault((job_id, run), {})[owner] = (ask, answer)
        return {"status": "OK"}

    def _first_read_ask(self, job: Job, run: int, reader: str, in_apply: bool = True) -> dict:
        """What the first read of the clock end folded into ``reader``'s apply of ``run`` asks of this
        worker, as this worker's owner map says (``ShardRunner.clock_end_reads``); the summaries it asks
        are computed in the apply's thread once the pass is applied (``_apply_then_summarize``), or, not
        ``in_apply`` (a clock end ahead of the next clock, which the apply's answer begins), after it. A map
        that lacks a partition (a joiner given no work item yet) asks nothing: the reader then asks itself."""
        try:
            calls = self.runner.clock_end_reads(job, job.owners, None, run, reader=reader)
        except KeyError:
            calls = []
        mine = [kw for a, _, kw in calls if a == self.address]
        ask = {"parts": mine[0]["parts"], "summarize": mine[0]["summarize"]} if mine else {"parts": [], "summarize": []}
        if ask["summarize"] and in_apply:
            self._wanted_summaries[job.id] = (int(run), ask["summarize"])
        return ask

    def _push_first_read(self, job_id: str, run: int, reader: str | None, ask: dict | None) -> None:
        """Push ``reader`` this worker's answer to its folded clock end's first read of pass ``run``
        (``ask``; None: the pass was not applied here, said so), in the background: one message where
        the read would have cost two, and sent as soon as the pass is applied here."""
        if reader is None:
            return

        async def push() -> None:
            if ask is None:
                answer: Any = {"status": "not-applied", "error": f"pass {run} was not applied on {self.address}"}
            else:
                answer = self._h_pull_many(job_id, ask["parts"], None, summarize=ask["summarize"] or None)
                if inspect.isawaitable(answer):
                    answer = await answer
            try:
                await self._apeer(reader, "first_read", job_id=job_id, run=int(run), owner=self.address,
                                  ask=ask or {"parts": [], "summarize": []}, answer=answer)
            except Exception:  # noqa: BLE001 - the reader asks instead once its wait ends
                pass

        asyncio.ensure_future(push())

    def _apply_then_summarize(self, job: Job, run: int, args: tuple) -> dict:
        """A BSP pass applied (``Job.apply_pass``, off the event loop), then in the same thread the
        summaries that a folded clock end's first read waiting here asks (``_wanted_summaries``), so
        its answer goes as the apply ends, without another hop to a thread. A summary that raises is
        left to the read, which computes it again and answers with the error."""
        out = job.apply_pass(*args)
        wanted = self._wanted_summaries.get(job.id)
        if "applied" in out and wanted is not None and wanted[0] == run:
            self._wanted_summaries.pop(job.id, None)  # (the loop may drop it meanwhile: a job's end)
            try:
                with job.tables.lock:
                    got = [job.tables.summarize(t, parts, job.algorithm.summarize, None) for t, parts in wanted[1]]
                    self._early_summaries[job.id] = (job.tables.version, wanted[1], got)
            except Exception:  # noqa: BLE001 - the read computes it again and answers with it
                pass
        return out

    async def _clock_end_here(self, job: Job, run: int, item: dict, first_read: Future | None = None) -> dict:
        """The outcome of the clock end folded into the apply of ``run`` (``ShardRunner.clock_end_here``,
        off the event loop); an apply of the same pass sent again gets the same one, never a second run.
        ``first_read``: its first read, sent as the apply began (``_start_first_read``)."""
        return await asyncio.shield(self._start_clock_end(job, run, item, first_read))

    def _start_clock_end(self, job: Job, run: int, item: dict, first_read: Future | None = None) -> asyncio.Future:
        """The clock end folded into the apply of ``run``, started once (``_clock_end_here``)."""
        folded = self._folded.get(job.id)
        if folded is None or folded[0] != run:
            folded = self._folded[job.id] = (run, asyncio.ensure_future(asyncio.to_thread(
                self._clock_end_and_rule, job, item, first_read)))
            if first_read is not None:  # (an answer it did not read stops waiting)
                folded[1].add_done_callback(lambda _: first_read.cancel())
        elif first_read is not None:
            first_read.cancel()
        return folded[1]

    async def _h_clock_end_outcome(self, job_id: str, run: int) -> dict:
        """The outcome of the clock end folded into this worker's apply of ``run`` and told to run ahead
        of the next clock (the apply answered before it ran: ``BspSchedule.applied``), once it ran."""
        folded = self._folded.get(job_id)
        if job_id not in self.jobs or folded is None or folded[0] != int(run):
            return {"not_run": f"no clock end of run {run} ran on {self.address}"}
        return await asyncio.shield(folded[1])

    def _clock_end_and_rule(self, job: Job, item: dict, first_read: Future | None = None) -> dict:
        """The folded clock end's outcome; with the item's ``rule`` (the history this worker lacks), the
        stopping rule evaluated on the history with its metrics (``stop``), so the coordinator can
        begin the next clock without asking the driver. A rule that raises is left to the driver,
        which raises it as it would have."""
        out = self.runner.clock_end_here(item, first_read)
        if "metrics" not in out or item.get("rule") is None:
            return out
        copy = self._rule_copies.setdefault(job.id, [])
        if not extend_copy(copy, item["rule"]):
            return out
        try:
            stop = bool(job.algorithm.converged([*copy, dict(out["metrics"])], job.tol))
        except Exception:  # noqa: BLE001 - the driver evaluates it again and raises it
            return out
        return {**out, "stop": stop}

    def _h_assign(self, job_id: str, run: int, chunks: list, arrays: dict) -> dict:
        """A clock end's rows for partitions owned here: ``chunks`` ``[[table, part, lo], ...]``, their
        rows in ``arrays`` (``wire.encode``); nothing from a run older than this worker has seen
        (a late clock end must not overwrite what a recovery restored)."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "ended"}
        if run < job.run_seen:
            return {"status": "stale"}
        try:
            for (table, part, lo), data in zip(chunks, wire.decode(arrays)):
                job.tables.assign(table, int(part), int(lo), data)
        except KeyError:  # the partition moved (a recovery): the clock end fails, its clock is skipped
            return {"status": "missing"}
        return {"status": "OK"}

    async def _h_put_shard(self, job_id: str, shard: int, arrays: dict) -> dict:
        job = await self._ajob(job_id)
        # off the event loop: a first call may compile a kernel for seconds, and heartbeats must flow
        prepared = await asyncio.to_thread(job.algorithm.prepare_shard, dict(arrays), job.xp)
        job.shards.put(shard, ShardEntry(prepared))
        return {"status": "OK"}

    def _h_copy_shard(self, job_id: str, shard: int, race: list | None = None) -> dict:
        """A copy of a shard's data and state for an attempt on another worker; ours stays held
        until the pass is applied (``ShardStore.install`` drops it if that attempt committed).
        ``race`` as for ``pull``: ``lost-race`` when another attempt of the shard was applied here
        (the state here is newer than the attempt's, or gone with the loser's copy)."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "missing"}
        with job.tables.lock:
            if job.lost_race(race):
                return {"status": "lost-race"}
            entry = job.shards.get(shard)
            if entry is None:
                return {"status": "missing"}
            host, state = entry.movable()
        return {"status": "OK", "arrays": to_serialize(host), "state": to_serialize(state)}

    async def _h_checkpoint(self, job_id: str, version: int, url: str, fraction: float,
                            storage_options: dict | None = None, state_shards: list | None = None,
                            whole: list | None = None, max_chain: int = ckpt.MAX_CHAIN) -> dict:
        """Snapshot this worker's param partitions and shard states now; write them in the background.

        Each partition saves all its rows (``fraction == 1``, or it is one of
        ``whole``: ``[table, part]`` whose chain is at ``max_chain``, paid for by its next
        ``max_chain - 1`` saves) or the ``fraction``
        that moved most since their last save; each shard of ``state_shards`` held
        here saves its whole state. When every file is written and fsynced, the
        coordinator is told (``dscar_ckpt_written``).
        """
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "unknown-job"}
        if await self._ainject(job, "checkpoint"):
            return {"status": "stopped"}
        whole_parts = {(str(t), int(p)) for t, p in whole or ()}
        snaps, states, unsaved = await asyncio.to_thread(self._snapshot, job, fraction, state_shards, whole_parts,
                                                         max_chain)
        threading.Thread(target=self._write_checkpoint, args=(job, version, url, storage_options, snaps, states),
                         name=f"dscar-ckpt-{version}", daemon=True).start()
        return {"status": "OK", "parts": len(snaps), "unsaved_sq": unsaved}

    def _snapshot(self, job: Job, fraction: float, state_shards: list | None,
                  whole: set[tuple[str, int]], max_chain: int) -> tuple[list, dict, float]:
        with job.tables.lock:
            snaps, unsaved = job.tables.snapshot(fraction, whole, max_chain)
            return snaps, job.shards.states(state_shards or ()), unsaved

    def _write_checkpoint(self, job: Job, version: int, url: str, storage_options, snaps: list, states: dict) -> None:
        """This worker's one file of ``version`` (its partitions' saved rows and its shards' states),
        written and fsynced; then the coordinator is told its entries (``dscar_ckpt_written``)."""
        files, error, t0 = [], None, time.perf_counter()
        try:
            fs, root = ckpt.fs_and_root(url, storage_options)
            parts = []
            for table, part, rows, values in snaps:
                a, b = job.layouts[table].bounds[part]
                parts.append((table, part, rows, values, b - a))
            data, entries = ckpt.encode_file(parts, states)
            if entries:
                name = hashlib.sha1(self.worker.address.encode()).hexdigest()[:12]
                written = ckpt.write_file(fs, root, f"{ckpt.data_dir(root, version)}/{name}.bin", data)
                files = [{**e, "path": written["path"]} for e in entries]  # each entry has its range's checksum
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        try:
            self.call("ckpt_written", job_id=job.id, version=version, worker=self.worker.address, files=files,
                      error=error, seconds=time.perf_counter() - t0)
        except Exception:
            pass

    async def _h_restore(self, job_id: str, table: str, part: int, chain: list, url: str, run: int = -1,
                         storage_options: dict | None = None, mirror_from: str | None = None) -> dict:
        """Own a partition restored from a checkpoint chain (checksums verified); empty chain: initial
        values. ``mirror_from``: from that buddy's memory copy instead (``missing`` if it has none,
        ``source-gone`` if the buddy cannot be reached: the coordinator then tries the disk; this
        worker is fine). ``run``: the recovery's run id: older work (a late clock end's assign, a
        pass) is stale here. The array work runs off the event loop."""
        job = await self._ajob(job_id)
        job.run_seen = max(job.run_seen, int(run))
        if await self._ainject(job, "recovery"):
            return {"status": "stopped"}
        spec_ = job.specs[table]
        if mirror_from == self.address:  # (its own memory copy: read here, not sent to itself)
            r = mirror_answer(job.mirrors.get(part_key(table, part)))
        elif mirror_from is not None:
            try:
                r = await self._apeer(mirror_from, "get_mirror", job_id=job_id, key=part_key(table, part))
            except (OSError, asyncio.TimeoutError) as e:  # (CommClosedError is an OSError)
                return {"status": "source-gone", "source": mirror_from, "error": repr(e)}
        if mirror_from is not None:
            if r.get("status") != "OK":
                return {"status": "missing"}
            # not the disk's baseline: the next priority checkpoint writes this partition whole
            await asyncio.to_thread(lambda: job.tables.own(
                table, part, job.xp.asarray(np.array(r["value"], dtype=spec_.dtype))))
            return {"status": "OK", "clock": r["clock"]}
        a, b = job.layouts[table].bounds[part]

        def load():
            base = to_host(job.algorithm.init_rows(spec_, a, b, job.xp)).astype(spec_.dtype)
            if chain:
                fs, root = ckpt.fs_and_root(url, storage_options)
                base = ckpt.apply_chain(fs, root, base, list(chain))
            job.tables.own(table, part, base, checkpointed=True)

        try:
            await asyncio.to_thread(load)
        except ckpt.CorruptCheckpointError as e:
            return {"status": "corrupt", "error": str(e)}
        except OSError as e:  # a file of the chain cannot be read (gone, unreadable): an older version next
            return {"status": "corrupt", "error": f"{type(e).__name__}: {e}"}
        return {"status": "OK"}

    # ------------------------------------------------------------ memory tier
    async def _h_mirror(self, job_id: str, clock: int, buddy: str) -> dict:
        """Copy this worker's param partitions and shard states now; send them to ``buddy`` in the
        background (the coordinator records them once the buddy has them: ``dscar_mirrored``)."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "missing"}

        def take() -> list[tuple[tuple, Any]]:
            with job.tables.lock:  # partitions and shard states of one moment
                return ([(part_key(t, p), a) for t, p, a in job.tables.param_copies()]
                        + [(shard_key(s), st) for s, st in job.shards.states(list(job.shards.shards)).items()])

        copies = await asyncio.to_thread(take)
        asyncio.ensure_future(self._send_mirror(job_id, clock, buddy, copies))
        return {"status": "OK"}

    async def _send_mirror(self, job_id: str, clock: int, buddy: str, copies: list) -> bool:
        """``copies`` (``[(key, value), ...]`` as of ``clock``) kept at ``buddy``, then reported; whether both
        were done."""
        try:
            r = await self._apeer(buddy, "keep_mirror", job_id=job_id, clock=clock,
                                  copies=[[list(k), to_serialize(v)] for k, v in copies])
            if r.get("status") != "OK":
                return False  # the job ended, or the buddy has not joined it yet: no copy there
            await self._acall(
                "mirrored", job_id=job_id, worker=self.address, buddy=buddy, clock=clock,
                parts=[[k[1], k[2]] for k, _ in copies if k[0] == "part"],
                shards=[k[1] for k, _ in copies if k[0] == "shard"])
            return True
        except Exception as e:  # the buddy is gone: the coordinator keeps the older copy's record
            logger.info("dscar: memory copy to %s failed: %r", buddy, e)
            return False

    async def _h_pass_copies(self, job_id: str, to: list) -> dict:
        """Send memory copies kept here on to other workers (a hand-off: this worker leaves, or now owns what
        it kept a copy of: ``CheckpointPlanner.handed_copies``). ``to``: ``[[worker, parts, shards], ...]``
        (``parts`` as ``[table, part]``). Each goes as a memory copy of the clock it holds, reported as any
        (``_send_mirror``), and leaves this worker once reported (a worker standing by stays, and its records
        went: nothing else would drop them); answered once every one is kept there or failed."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "missing"}
        sends: list[tuple[int, list]] = []
        for dest, parts, shards in to:
            by_clock: dict[int, list] = {}
            for key in [part_key(t, p) for t, p in parts] + [shard_key(s) for s in shards]:
                if (held := job.mirrors.get(key)) is not None:
                    by_clock.setdefault(held[0], []).append((key, held[1]))
            sends += [(dest, clock, copies) for clock, copies in sorted(by_clock.items())]
        sent = await asyncio.gather(*(self._send_mirror(job_id, clock, dest, copies) for dest, clock, copies in sends))
        for (_, clock, copies), ok in zip(sends, sent):
            for key, _ in copies if ok else ():
                job.mirrors.discard(key, clock)
        return {"status": "OK", "sent": sum(len(copies) for (_, _, copies), ok in zip(sends, sent) if ok)}

    def _h_keep_mirror(self, job_id: str, clock: int, copies: list) -> dict:
        job = self.jobs.get(job_id)  # (not installed here: the job ended, or this worker joined it late)
        if job is None:
            return {"status": "missing"}
        for key, value in copies:
            job.mirrors.keep(key, clock, value)
        return {"status": "OK"}

    def _h_drop_copies(self, job_id: str, parts: list = (), shards: list = ()) -> dict:
        """The memory copies kept here that no record names any more (``checkpoint_plan.DropCopies``): each
        partition's (``[table, part, clock]``) and shard state's (``[shard, clock]``) of that clock or older."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "OK", "dropped": 0}
        keys = [(part_key(t, p), c) for t, p, c in parts] + [(shard_key(s), c) for s, c in shards]
        return {"status": "OK", "dropped": sum(job.mirrors.discard(k, int(c)) for k, c in keys)}

    def _h_mirror_clocks(self, job_id: str, shards: list) -> dict:
        """The clocks of the shard states' memory copies kept here, ``[[shard, clock], ...]`` (a recovery
        asks before it decides whether a kept pass goes on: ``Losses.states_kept``)."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "missing"}
        got = [(int(s), job.mirrors.get(shard_key(s))) for s in shards]
        return {"status": "OK", "clocks": [[s, held[0]] for s, held in got if held is not None]}

    def _h_get_mirror(self, job_id: str, key: list) -> dict:
        """A memory copy kept here (``mirror_store.part_key`` / ``shard_key``), for a recovery."""
        job = self.jobs.get(job_id)
        return mirror_answer(None if job is None else job.mirrors.get(key), to_serialize)

    async def _h_forget(self, job_id: str) -> dict:
        """A simulated loss: drop everything this worker held for the job, as a crash would; keep
        the param partitions aside (``Job.forgotten``) for measuring their restore."""
        job = self.jobs.get(job_id)
        if job is not None:
            await asyncio.to_thread(self._forget, job)
        return {"status": "OK"}

    def _forget(self, job: Job) -> None:
        with self._lock, job.tables.lock:
            job.forgotten = {k: to_host(v).copy() for k, v in job.tables.parts.items()
                             if job.specs[k[0]].kind == "param"}
            job.tables.clear()
            job.shards.clear()
            job.mirrors.clear()
            job.pull_cache.clear()
        job.forgot.set()

    async def _h_perturbation(self, job_id: str, table: str, part: int, owner: str) -> dict:
        """How far the restore of a partition this worker lost (a simulated loss) is from what was
        lost: ``||restored - lost||`` and ``||lost||``, the restored values read from ``owner``.
        The restore may finish before this worker has forgotten: it waits for that first."""
        job = self.jobs.get(job_id)
        if job is None or not await asyncio.to_thread(job.forgot.wait, rpc_timeout()):
            return {"status": "missing"}
        lost = job.forgotten.pop((table, int(part)), None)  # measured once; the copy goes
        if lost is None:
            return {"status": "missing"}
        r = await self._apeer(owner, "pull", job_id=job_id, table=table, part=int(part), lo=0, hi=lost.shape[0])
        if r.get("status", "OK") != "OK":
            return {"status": "missing"}

        def norms() -> dict:
            d = (np.asarray(r["data"], dtype=np.float64) - lost).reshape(-1)
            return {"perturbation": float(np.sqrt(d @ d)),
                    "lost_norm": float(np.linalg.norm(lost.astype(np.float64).reshape(-1)))}

        return {"status": "OK", **await asyncio.to_thread(norms)}

    def _h_end_job(self, job_id: str) -> dict:
        heap.release((id(self), job_id))
        with self._lock:
            job = self.jobs.pop(job_id, None)
            for moving in (self._incoming, self._lent):  # a join's move the job ended before
                for key in [k for k in moving if k[0] == job_id]:
                    del moving[key]
        self._folded.pop(job_id, None)
        self._rule_copies.pop(job_id, None)
        self._wanted_summaries.pop(job_id, None)
        self._early_summaries.pop(job_id, None)
        for key in [k for k in self._pushed if k[0] == job_id]:
            del self._pushed[key]
        if job is not None:
            job.ended.set()
        return {"status": "OK"}

    def _h_stack(self, limit: int = 8) -> dict:
        """Where this worker's runner thread stands: its innermost ``limit`` frames, innermost last
        (a stalled job's report)."""
        frame = sys._current_frames().get(self._thread.ident)
        frames = [] if frame is None else traceback.extract_stack(frame)[-limit:]
        return {"stack": [f"{os.sep.join(f.filename.split(os.sep)[-2:])}:{f.lineno} in {f.name}" for f in frames]}

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

    # ------------------------------------------------ messages (RunnerHost)
    def _from_thread(self, afunc: Callable[..., Any], *args, **kw) -> Any:
        """``await afunc(*args, **kw)`` on the worker's event loop, from another thread (the runner's).

        Handed over with one thread-safe callback that starts it as a task, not with
        ``distributed.utils.sync``, whose tornado coroutine waits a loop turn (``gen.moment``) before
        it starts the call; and the answer reaches the thread as the call ends, not a turn later in
        the task's done callback (``asyncio.run_coroutine_threadsafe``'s). In the bursts that end and
        begin a clock a turn of the loop 32 hollow workers share is each of their commits'."""
        loop = self.worker.loop.asyncio_loop
        if asyncio._get_running_loop() is loop:  # (it would wait for itself for ever)
            raise RuntimeError("called from the thread of the worker's event loop")
        answer: Future = Future()

        async def run() -> None:
            try:
                answer.set_result(await afunc(*args, **kw))
            except asyncio.CancelledError:  # (the loop is closing): the thread sees a cancelled call
                answer.cancel()
                raise
            except BaseException as e:  # noqa: BLE001 - raised in the thread that called
                answer.set_exception(e)

        coro = run()

        def start() -> None:
            task = loop.create_task(coro)
            self._thread_calls.add(task)
            task.add_done_callback(self._thread_calls.discard)

        try:
            loop.call_soon_threadsafe(start)
        except RuntimeError:  # the loop is closed
            coro.close()
            raise
        return answer.result()

    def call(self, op: str, **kw):
        """The scheduler's handler ``dscar_<op>``, from a thread other than the event loop."""
        return self._from_thread(self._acall, op, **kw)

    def peer(self, address: str, op: str, **kw) -> dict:
        """A message to another worker from the shard runner's thread, failing over in seconds."""
        return self._from_thread(self._apeer, address, op, **kw)

    def peer_all(self, calls: list[tuple[str, str, dict]]) -> list[dict]:
        """``peer`` to several workers at once: ``(address, op, kwargs)`` each, answers in order."""
        async def gather():
            return await asyncio.gather(*(self._apeer(a, op, **kw) for a, op, kw in calls))
        return self._from_thread(gather)

    def closing(self) -> bool:
        return self.worker.status.name in ("closing", "closed", "closing_gracefully")

    def close_worker(self) -> None:
        """An injected kill on an in-process cluster: close this worker, keep the process."""
        self._stop_all()
        self.worker.loop.add_callback(self.worker.close, nanny=False, executor_wait=False)

    async def _apeer(self, address: str, op: str, deadline: float | None = None, **kw) -> dict:
        """A message to another worker; it fails at once when the coordinator says that worker is
        gone (``dscar_peer_lost``: a hung peer never answers, and waiting for the deadline would
        stall the attempt, and its clock, for ``rpc_timeout()`` seconds). ``deadline``: seconds, when
        the answer waits on further messages (an apply tree's combine steps below ``address``)."""
        await self._peers_started
        return await self._inflight.call(address, getattr(self.peers(address), handler_name(op))(**self._signed(kw)),
                                         rpc_timeout() if deadline is None else deadline)

    def owners_known(self) -> dict[str, str]:
        """Job -> the token of the owners map held here (``Job.owners_token``): each request says it, so
        the coordinator leaves the map out of the next item while it is the same (``PartitionMap.for_item``)."""
        with self._lock:
            return {job_id: job.owners_token for job_id, job in self.jobs.items() if job.owners_token is not None}

    def peer_gone(self, address: str) -> bool:
        """Whether the coordinator said ``address`` is gone (``dscar_peer_lost``; safe from the runner's thread)."""
        return self._inflight.is_gone(address)

    def _h_peer_lost(self, address: str, generation: int) -> dict:
        """``address`` left the cluster: every message waiting for it fails now, and every later one
        at once (a stale owner map or memory buddy would otherwise wait out the deadline)."""
        self._inflight.cancel(address, generation)
        return {"status": "OK"}

    def _h_peer_joined(self, address: str, generation: int) -> dict:
        """A worker joined at a removed worker's address: messages to it are sent again."""
        self._inflight.revive(address, generation)
        return {"status": "OK"}

    def _h_release(self, job_id: str, members: list, item: int) -> dict:
        """Give back the batch members (``[shard, attempt]``) of work item ``item`` not started yet:
        an idle worker runs them."""
        return self.runner.release(job_id, members, item)

    # ------------------------------------------------------------- faults
    async def _ainject(self, job: Job, point: str, clock: int = 0, phase: str | None = None) -> bool:
        """Injected faults due at ``point`` of a handler (apply, checkpoint, restore) in ``clock`` (or
        the newest clock this worker was given work in; an apply's is the pass's, which reaches every
        worker: ``phase`` is its data phase); True: the handler must stop (being killed or lost)."""
        stop = False
        clock = max(clock, job.clock_seen)
        for f in ShardRunner.due(job, clock, point, phase):
            info = {"point": point, **({"pid": os.getpid()} if f.kind == "hang" else {})}
            await self._areport(job, clock, f"fault-{f.kind}", info)
            if f.kind == "kill":
                if not self.in_process:
                    os._exit(1)
                self.close_worker()
                stop = True
            elif f.kind == "lose":
                self.worker.loop.add_callback(self._acall, "simulate_loss", job_id=job.id, worker=self.worker.address)
                stop = True
            elif not self.in_process:  # in-process, a handler cannot hang without hanging every worker
                os.kill(os.getpid(), signal.SIGSTOP)
        return stop

    async def _areport(self, job: Job, clock: int, kind: str, info: dict) -> None:
        try:
            await asyncio.wait_for(self._acall("event", job_id=job.id, clock=clock, kind=kind,
                                               worker=self.worker.address, info=info), 5)
        except Exception:
            pass


def _encode_updates(entries: list) -> dict:
    """``[(key, worker that staged it, updates), ...]`` as a message: the arrays in one ``wire`` frame."""
    arrays = [a for _, _, ups in entries for _, _, _, d, r in ups for a in ((d,) if r is None else (d, r))]
    return {"arrays": wire.encode(arrays),
            "updates": [[list(key), source, [[t, p, lo, r is not None] for t, p, lo, _, r in ups]]
                        for key, source, ups in entries]}


def _decode_updates(reply: dict) -> list[tuple[tuple, str, list]]:
    """``_encode_updates``'s entries back from a message."""
    arrays = iter(wire.decode(reply["arrays"]))
    return [(tuple(int(k) for k in key), source,
             [(t, int(p), int(lo), next(arrays), next(arrays).astype(np.int64, copy=False) if has_rows else None)
              for t, p, lo, has_rows in ups])
            for key, source, ups in reply["updates"]]


def device_of(xp: ModuleType) -> str:
    return "gpu" if xp.__name__ == "cupy" else "cpu"


def _as_lists(x: Any) -> Any:
    """``x`` with its tuples as lists (a message's arrays arrive as tuples), to compare with what was built here."""
    return [_as_lists(y) for y in x] if isinstance(x, (list, tuple)) else x
