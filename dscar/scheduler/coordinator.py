"""The control plane's Dask side: ``Coordinator``, a SchedulerPlugin.

Every decision is made by ``dscar.core.job.JobState`` (pure); this plugin only
carries decisions out: it answers the workers' and the driver's RPCs, fans the
apply and checkpoint messages out to the workers, restores partitions during a
recovery, and watches the workers' heartbeats. Its handlers move only ids,
timings, file names and scalar metrics, and never block the event loop: waiting
is done with long polls, each woken only when its answer may have changed (``dscar.core.wake``).

Protocol of a pass (the messages: ``dscar.core.protocol``): the worker asks
``dscar_next`` (a long poll, woken by new work or a job's end, not by a timer)
for its first work item, a batch of one or more shard attempts (its own shards,
its share of the pass by its measured speed: ``Dispatch.batch_size``). It runs
them, staging each attempt's updates on itself, then one ``dscar_commit`` answers
which commits are granted *and* carries its next work item (under BSP the answer waits
for one, as ``dscar_next`` would: one round trip a batch). When a pass is
complete every live worker is told to apply it (``dscar_apply``): owners collect
the committed attempts' updates from the workers that ran them, holders install
the committed shard state.

Liveness: a crashed worker is removed by the scheduler at once (its comm
closes). A hung one (SIGSTOP, a stuck event loop) stops heartbeating; the
coordinator probes any worker silent for ``dscar.hang-timeout`` seconds
(default 3 s; heartbeats come every 0.5 s on clusters of up to 10 workers), or
for two of Dask's heartbeat intervals where those are longer (a large cluster's:
``dscar.core.liveness``), at most ``liveness.MAX_PROBES`` a sweep, and
removes it if it cannot answer within 1.5 s, instead of waiting for distributed's
ttl sweep, which runs only every ttl; a starved but live worker answers, late.
Shard steps run on the worker's own thread, so heartbeats flow while kernels run.
A job whose workers all answer while it stops moving on for ``dscar.core.stall-timeout``
seconds (default 60) is reported once: a ``job-stalled`` event with its state and the
innermost frames of the runner threads holding it (``dscar.core.stall``, ``dscar_stack``).

Membership: workers Dask retires hand off at a clock boundary, joiners take partitions copied while clocks
run, standby workers rejoin as a job needs them; the coordinator's ``elastic`` part does it
(``dscar.scheduler.elastic``), at the boundaries ``_begin`` reaches.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from functools import partial
from typing import Any, Callable, Coroutine, NamedTuple

import dask.config
from distributed import SchedulerPlugin
from distributed.core import error_message
from distributed.protocol.pickle import loads
from distributed.scheduler import heartbeat_interval

from ..core.apply_plan import (DIRECT_PER_WORKER, FANIN, ApplyPlan, apply_receivers, batch_fields, merge_touched,
                               plan_apply)
from .. import heap
from ..checkpoint import CheckpointConfig
from ..comm import fast_fail_pool
from ..core.elastic import setting_up, workers_wanted
from ..errors import JobFailedError, RefusedCallError
from ..inflight import Inflight, resolve, timed_wait
from ..core.job import (ApplyPass, BeginClock, Checkpoint, DropCopies, JobConfig, JobState, Mirror, RestartWorker,
                        StartRecovery)
from ..core.liveness import PROBE_TIMEOUT_S, SWEEP_S, silence_limit, to_probe
from ..core.losses import unreached_after_apply
from ..core.membership import DEFAULT_LEASE_S, SCHEDULER_RULES, Lease, Rule, key_digest, refusal, same
from ..core.monitor import ThroughputMonitor
from ..core.protocol import IDLE, ClockEndOutcome, Commit, CommitAnswer, handler_name
from ..core.partitions import PartitionMap, TableLayout, data_homes, placement_plan, shard_homes
from ..core.shards import ShardQueue
from ..core.wake import IDLE_RECHECK_S, MOVE_RECHECK_S, WaitLine, Woken, commit_wakes, owners, recheck_s
from ..core.stall import StallWatch, workers_to_ask
from .elastic import Elastic

logger = logging.getLogger("dscar.coordinator")

PLUGIN_NAME = "dscar-coordinator"
RPC_TIMEOUT_S = 30.0  # a coordinator -> worker message that takes longer means a hung worker
APPLY_TRIES = 3  # a pass is sent at most this often while the workers that could not be reached answer probes
#: turns of the event loop a commit at a pass's tail waits before it looks for idle work (``_commit_then_poll``):
#: tornado reads a message over more than one turn (its frames' header, then its frames), and the messages
#: read meanwhile are handled first (one turn let a stall's backlog through in 1 of 5 trials, 3 in none of 4)
TAIL_LOOK_TURNS = 3
#: seconds after it joins the cluster that a worker which has not registered its key yet is not probed as hung:
#: its event loop is busy setting up its plugins (dscar's imports, ~1 s of CPU, several seconds on a loaded
#: machine), so it cannot answer a probe; a joiner or a restarted worker removed then was a healthy one lost
START_GRACE_S = 30.0
#: how long the coordinator waits for a worker to give back batch members it has not started
RELEASE_TIMEOUT_S = 1.0
#: how often, at most, the liveness watch looks for stalled jobs (a quarter of ``stall_timeout()`` when shorter)
STALL_CHECK_S = 1.0
SNAPSHOT_TIMEOUT_S = 10.0  # an owner that cannot snapshot its partitions in this long fails the version
#: an idle worker's long poll (``dscar_next``) is answered ``idle`` after this many of Dask's heartbeat
#: intervals: it is woken by new work or a job's end, so its timeout only bounds a lost wake; scaled with
#: the interval, idle polls cost the scheduler a fixed fraction of what Dask's own heartbeats cost
IDLE_POLL_HEARTBEATS = 20


def hang_timeout(n_workers: int = 0) -> float:
    """Seconds without a sign of life after which a worker is probed, then removed: ``dscar.hang-timeout``,
    or longer on a cluster of ``n_workers`` whose heartbeats come further apart (``dscar.core.liveness``)."""
    return silence_limit(float(dask.config.get("dscar.hang-timeout", 3.0)), heartbeat_interval(n_workers))


def idle_poll_timeout(n_workers: int = 0) -> float:
    """Seconds a worker's long poll for work waits when nothing is to do (``IDLE_POLL_HEARTBEATS``
    of Dask's heartbeat intervals on a cluster of ``n_workers``: 10 s up to 10 workers, 120 s at 1,000)."""
    return IDLE_POLL_HEARTBEATS * heartbeat_interval(n_workers)


def lease_timeout() -> float:
    """Seconds a job lives after its driver's last renewal (``dscar.lease-timeout``): a job whose
    driver died ends within about twice this (``Coordinator._watch_leases``)."""
    return float(dask.config.get("dscar.lease-timeout", DEFAULT_LEASE_S))


def stall_timeout() -> float:
    """Seconds a working job may go without moving on before it is reported stalled (``dscar.core.stall-timeout``)."""
    return float(dask.config.get("dscar.core.stall-timeout", 60.0))


def _relay(mine: asyncio.Future, source: asyncio.Future) -> None:
    """``source``'s result into ``mine`` (a done callback of ``source``, which is never cancelled)."""
    if not source.cancelled():
        resolve(mine, source.result())


class FirstApply(NamedTuple):
    """The first try of a pass's apply, sent (``Coordinator._send_first_apply``): what
    ``Coordinator._apply_pass`` awaits, and tries again from."""

    #: the live workers the pass is applied on
    targets: list[str]
    #: who fetches what from whom (``dscar.core.apply_plan``)
    plan: ApplyPlan
    #: the worker the clock end is folded into (its apply answers once that ran), or None
    folded: str | None
    #: the apply message's fields beyond the pass's own (SSP floor and batch, data phase)
    extra: dict
    #: the workers the first try's messages went to
    receivers: list[str]
    #: their answers, gathered
    answers: asyncio.Future


class Coordinator(SchedulerPlugin):
    """Shard service, ownership, clocks, checkpoints and recovery on the scheduler (glue over ``JobState``)."""

    name = PLUGIN_NAME
    idempotent = True

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        #: running jobs by id (one at a time)
        self.jobs: dict[str, JobState] = {}
        #: the last ended job's final snapshot (for the dashboard)
        self._ended: dict[str, Any] | None = None
        #: jobs whose recovery loop is running
        self._recovering: set[str] = set()
        #: job -> workers whose loss was simulated (``faults.lose``): they kept what they lost
        self._simulated: dict[str, set[str]] = {}
        #: set and replaced on every change (the dashboard's collector waits on it)
        self._changed = asyncio.Event()
        #: the coordinator's own waits for the next change (``_wait_change``): each resolved by ``_wake``
        self._change_waits: set[asyncio.Future] = set()
        #: the drivers' long polls for their reports (``_h_wait``): resolved by ``_wake``, but by a
        #: change of one worker's own progress (a grant, a commit that completes nothing) only when
        #: it added events (``_events_heard``: the jobs' events counted when they were last resolved)
        self._driver_waits: set[asyncio.Future] = set()
        self._events_heard = 0
        #: how many changes woke the waits
        self.wakes = 0
        #: answers to a driver's long poll held back for its ``linger`` (``_h_wait``)
        self.lingered = 0
        #: the workers whose long poll for work waits (``dscar.core.wake``): a change wakes those it may concern
        self._line = WaitLine()
        #: worker -> the future its waiting long poll waits on (resolved with its ``Woken``)
        self._polls: dict[str, asyncio.Future] = {}
        #: worker -> {job: the token of the owners map it holds}, as its latest poll or commit said: its next
        #: item, the answer to that request, carries the map only where it holds another (``PartitionMap.for_item``)
        self._owners_known: dict[str, dict[str, str]] = {}
        #: waiting long polls woken so far (each looks once more)
        self.poll_wakes = 0
        #: wakes the head of the line when a time-driven decision turns due (``_tick``)
        self._ticker: asyncio.Task | None = None
        #: job -> (membership generation, workers it lost) when its live workers were last told it: a
        #: poll tells it again only after a change (``_live`` sorts every worker: O(W) a poll)
        self._told_live: dict[str, tuple[int, int]] = {}
        self._watch: asyncio.Task | None = None
        #: worker -> when a dscar message of it last arrived (a sign of life besides heartbeats)
        self._heard: dict[str, float] = {}
        #: job -> its stall watch (``_check_stalls``)
        self._stalls: dict[str, StallWatch] = {}
        #: stall reports gathering their workers' stacks (kept referenced until done)
        self._stall_reports: set[asyncio.Future] = set()
        #: job -> its token (``dscar.core.membership``): every call about the job carries it
        self._tokens: dict[str, str] = {}
        #: worker address -> the key its process registered and confirmed (``dscar_hello``)
        self._keys: dict[str, str] = {}
        #: worker -> when it joined the cluster (monotonic seconds; ``START_GRACE_S``)
        self._arrived: dict[str, float] = {}
        #: job -> its driver's lease
        self._leases: dict[str, Lease] = {}
        #: job -> why the coordinator ended it (lease lapsed, cancelled), for its driver if it comes back
        self._ended_why: dict[str, str] = {}
        self._lease_watch: asyncio.Task | None = None
        #: job -> the name of its model (``dscar.jobs``)
        self._models: dict[str, str] = {}
        #: job -> (run, clock, shard, attempt) of a granted commit -> the partitions its updates touched
        #: (``partition_store.touched_parts``): each owner fetches from the workers that staged some for it
        self._touched: dict[str, dict[tuple[int, int, int, int], dict]] = {}
        #: job -> run of which a commit moved a shard's data or state (``protocol.Finished.moved``), or an
        #: attempt stopped or failed -> the workers that may hold a copy or a state to install: the
        #: stagers of those attempts and the shards' holders before them (``_apply_receivers``)
        self._moved: dict[str, dict[int, set[str]]] = {}
        #: job -> run -> the workers handed a BSP attempt that copies its shard, and the holders it copies
        #: from (``_item_for``): a pass with a move is applied on them too (their copies go)
        self._copying: dict[str, dict[int, set[str]]] = {}
        #: job -> (run, clock, shard, attempt) of a granted commit whose updates rode it
        #: (``protocol.Finished.inline``) -> ``{(table, part): payload}``: put in the owners' apply messages
        self._inline: dict[str, dict[tuple[int, int, int, int], dict[tuple[str, int], Any]]] = {}
        #: job -> the runs whose passes are being applied (``_apply``): their inline updates stay
        self._applying: dict[str, list[int]] = {}
        #: job -> (run, the workers its apply is sent to) of the clock's last pass the next clock began with
        #: (``JobState.applying``), while that apply is under way: a work item says to wait for it (``_item_for``)
        self._with_apply: dict[str, tuple[int, frozenset[str]]] = {}
        for op, handler in self.handlers().items():  # every handler behind the caller check (``_guarded``)
            scheduler.handlers[handler_name(op)] = self._guarded(op, handler)
        self._specs: dict[str, bytes] = {}
        #: job -> how many placements the driver reported done (``placed``): an ``until_lost`` poll
        #: guards one placement and ends with it, not after its timeout (every wake runs every poll)
        self._placements: dict[str, int] = {}
        #: messages to workers: a dead worker fails a message in seconds (``dscar.comm``)
        self._pool = fast_fail_pool(scheduler.connection_args, server=scheduler, metadata_only=True)
        await self._pool.start()
        #: messages waiting for a worker's answer (they fail at once when it is removed)
        self._inflight = Inflight()
        #: membership changes so far: the generation of the next loss or join (``dscar.inflight``)
        self._generation = 0
        #: addresses removed while a job ran: a worker joining at one of them is announced to the others
        self._removed: set[str] = set()
        #: coroutines run beside the clock loop (``_background``), kept referenced until done
        self._tasks: set[asyncio.Future] = set()
        #: hand-offs, joiners, even-outs, switches and standby workers (``dscar.scheduler.elastic``)
        self.elastic = Elastic(self)
        self.elastic.wrap_dask(scheduler)

    def handlers(self) -> dict[str, Callable]:
        """The coordinator's handlers by op (Dask's name: ``protocol.handler_name``); each one's
        caller rule is ``membership.SCHEDULER_RULES[op]``."""
        return {
            # the driver's
            "start_job": self._h_start_job, "placed": self._h_placed, "begin_clock": self._h_begin_clock,
            "wait": self._h_wait, "end_job": self._h_end_job, "owners": self._h_owners, "flush": self._h_flush,
            "rebase": self._h_rebase, "published": self._h_published, "stop": self._h_stop,
            "until_lost": self._h_until_lost, "renew": self._h_renew, "simulate_loss": self._h_simulate_loss,
            # a worker's shard runner (``protocol``: work items and commits)
            "next": self._h_next, "commit": self._h_commit, "fail": self._h_fail, "clock_done": self._h_clock_done,
            "clock_failed": self._h_clock_failed, "runner_failed": self._h_runner_failed,
            # a worker's other reports
            "ckpt_written": self._h_ckpt_written, "mirrored": self._h_mirrored, "event": self._h_event,
            "run": self._h_run, "job_spec": self._h_job_spec, "hello": self._h_hello,
            # an operator's
            "jobs": self._h_jobs, "cancel": self._h_cancel,
        }

    async def close(self) -> None:
        self.scheduler.handlers.update(self.elastic.dask_handlers)
        if self._watch is not None:
            self._watch.cancel()
        if self._lease_watch is not None:
            self._lease_watch.cancel()
        await self._pool.close()

    def valid_workers_downscaling(self, scheduler, workers: list) -> list:
        """Dask's hook: it may retire as idle no worker of a running job (``Elastic.may_retire``)."""
        return self.elastic.may_retire(workers)

    # ----------------------------------------------------------- callers
    def _guarded(self, op: str, handler):
        """``handler`` behind the one check of its caller (``membership.refusal`` under
        ``SCHEDULER_RULES[op]``): the call's ``token`` and ``key`` are checked and taken off; a
        refused call is answered with a ``RefusedCallError`` and recorded, never handed on. A
        granted driver call renews its job's lease."""
        rule = SCHEDULER_RULES[op]
        params = inspect.signature(handler).parameters
        wants_token, wants_key, wants_comm = "token" in params, "key" in params, "comm" in params

        def guarded(comm, token: str | None = None, key: str | None = None, **kw):
            job_id, worker = kw.get("job_id"), kw.get("worker")
            job_id = job_id if isinstance(job_id, str) else None  # (a forged call may send anything)
            why = refusal(rule, job_token=self._tokens.get(job_id), token=token,
                          worker_key=self._keys.get(worker) if isinstance(worker, str) else None, key=key)
            if why is not None:
                return self._refuse(op, getattr(comm, "peer_address", None), why, job_id, worker)
            if rule is Rule.DRIVER and job_id in self._leases:
                self._leases[job_id].renew(time.monotonic())
            if wants_token:
                kw["token"] = token
            if wants_key:
                kw["key"] = key
            if wants_comm:
                kw["comm"] = comm
            return handler(**kw)  # a coroutine for an async handler: distributed awaits it

        guarded.__name__ = guarded.__qualname__ = handler_name(op)
        return guarded

    def _refuse(self, op: str, caller: str | None, why: str, job_id: str | None, worker: str | None) -> dict:
        """The answer to a refused call, recorded as a ``forged-call`` event in the job it names
        (in every running job when it names none) and in the log."""
        info = {"handler": handler_name(op), "caller": caller, "reason": why}
        if isinstance(worker, str):
            info["claimed"] = worker
        for job in [self.jobs[job_id]] if job_id in self.jobs else list(self.jobs.values()):
            job.event(time.time(), "forged-call", **info)
        logger.warning("dscar: refused dscar_%s from %s%s: %s", op, caller,
                       f" claiming to be {worker}" if isinstance(worker, str) else "", why)
        return error_message(RefusedCallError(f"{handler_name(op)} refused: {why}"), status="uncaught-error")

    async def _h_hello(self, comm, worker: str, key: str) -> dict:
        """A worker registers its key. Believed once the worker listening at ``worker`` confirms,
        asked there, that it holds that key: only that process can (``membership``)."""
        if worker not in self.scheduler.workers:
            return {"status": "unknown-worker"}  # (not registered yet: it asks again)
        if same(self._keys.get(worker), key):
            return {"status": "OK"}
        try:
            r = await asyncio.wait_for(self._pool(worker).dscar_confirm_key(digest=key_digest(key)), 2 * PROBE_TIMEOUT_S)
        except Exception as e:
            return {"status": "unconfirmed", "error": repr(e)}
        if r.get("status") != "OK":
            return self._refuse("hello", getattr(comm, "peer_address", None),
                                "the worker at that address holds another key", None, worker)
        self._keys[worker] = key
        return {"status": "OK"}

    # ----------------------------------------------------------- plumbing
    def _wake(self, everyone: bool = False, polls: bool = True, driver: bool = True) -> None:
        """Something changed: the waits on ``_changed`` look again, and the waiting long polls for work
        it may concern (every one with ``everyone``: a clock or pass begins, shards are placed, a recovery
        ends; none with ``polls=False``). ``driver=False``: a change of one worker's own progress, which
        wakes the drivers' long polls only if it added events: nothing else they answer with (a report, a
        placement, checkpoints to publish, a failure) follows from it, and at W workers a clock has W
        grants and W commits, each of which woke every driver's poll to find nothing."""
        self.wakes += 1
        self._changed.set()
        self._changed = asyncio.Event()
        if self._change_waits:
            waits, self._change_waits = self._change_waits, set()
            for fut in waits:
                resolve(fut, True)
        if self._driver_waits:
            heard = sum(job.log.count for job in self.jobs.values())
            if driver or heard != self._events_heard:
                waits, self._driver_waits, self._events_heard = self._driver_waits, set(), heard
                for fut in waits:
                    resolve(fut, True)
        if polls and len(self._line):
            mine = () if everyone else owners(self.jobs.values())
            self._wake_polls(self._line.wake(everyone=everyone, owners=mine))

    def _wake_polls(self, woken: list[Woken]) -> None:
        for w in woken:
            fut = self._polls.pop(w.worker, None)
            if fut is not None and not fut.done():
                self.poll_wakes += 1
                fut.set_result(w)

    async def _wait_poll(self, worker: str, timeout: float) -> Woken | None:
        """``worker``'s long poll waits in the line until it is woken (its ``Woken``) or ``timeout`` (None).

        Every poll waits once or twice a clock, so this is a timer and a future of its own fed by the
        worker's (``dscar.inflight.timed_wait``; a poll that is cancelled cancels only its own, not another poll's
        of the same worker), not ``asyncio.wait_for`` of a shielded future (three futures more)."""
        loop = asyncio.get_running_loop()
        fut = self._polls.get(worker)
        if fut is None or fut.done():
            fut = self._polls[worker] = loop.create_future()
        if not self.elastic.standing_by(worker):  # (a standby worker waits out of the line: ``Elastic.refill`` wakes it)
            self._line.wait(worker)
        if self._ticker is None:
            self._ticker = asyncio.ensure_future(self._tick())
        mine = loop.create_future()
        relay = partial(_relay, mine)
        fut.add_done_callback(relay)
        try:
            woken = await timed_wait(mine, timeout, None)
        finally:
            fut.remove_done_callback(relay)
        if woken is None:  # it looks again out of the line: a wake meanwhile goes to another
            self._line.leave(worker)
            if self._polls.get(worker) is fut:
                del self._polls[worker]
            if fut.done():  # (woken just as its time ran out: the relay had not run yet)
                woken = fut.result()
        return woken

    async def _tick(self) -> None:
        """While polls wait: wake the head of the line when a time-driven decision may have turned due (a
        backup, a late holder's shard worth moving: ``_recheck_s``), not every poll on a timer."""
        due_at = float("inf")
        try:
            while len(self._line):
                now = time.monotonic()
                due_at = min(due_at, now + self._recheck_s())  # (a change may bring it forward)
                if now >= due_at:
                    due_at = float("inf")
                    self._wake_polls(self._line.wake(spare=1))
                    continue
                if await self._wait_change(min(due_at - now, MOVE_RECHECK_S)):
                    # a burst of changes (every commit is one) is looked at once, not once each
                    await asyncio.sleep(min(IDLE_RECHECK_S, max(0.0, due_at - time.monotonic())))
        finally:
            self._ticker = None

    async def _wait_change(self, timeout: float, driver: bool = False) -> bool:
        """Whether a change (``_wake``) came within ``timeout`` seconds (``driver``: a driver's long poll,
        which one worker's progress wakes only when it added events). The driver's long poll for
        its clock's report waits here once per change, so this is a future and a timer
        (``dscar.inflight.timed_wait``), not ``asyncio.wait_for`` of ``Event.wait()`` (a task a wait)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        waits = self._driver_waits if driver else self._change_waits
        waits.add(fut)
        try:
            return await timed_wait(fut, timeout, False)
        finally:
            (self._driver_waits if driver else self._change_waits).discard(fut)

    def _background(self, coro) -> asyncio.Future:
        """Run ``coro`` beside the clock loop (kept referenced until done); its task."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _bundles(self, job: JobState, calls: list[tuple[str, str, dict]]) -> list:
        """Messages ``(worker, op, kwargs)`` about ``job``: each worker's in one (``bundle``, in order), the
        workers side by side; their answers in order, each a dict or the error its worker's message raised
        (a worker gone holds nothing)."""
        by_worker: dict[str, list[int]] = {}
        for i, (w, _, _) in enumerate(calls):
            by_worker.setdefault(w, []).append(i)
        results = await asyncio.gather(*(
            self._rpc(w, "bundle", job_id=job.cfg.job_id, calls=[[calls[i][1], calls[i][2]] for i in ix])
            for w, ix in by_worker.items()), return_exceptions=True)
        out: list = [None] * len(calls)
        for ix, r in zip(by_worker.values(), results):
            got = r["answers"] if isinstance(r, dict) and r.get("status") == "OK" else [r] * len(ix)
            for i, a in zip(ix, got):
                out[i] = a
        return out

    def _live_changed(self, job_id: str) -> None:
        """The job's active workers changed without a loss or a join (a worker stands by or rejoins): the
        next poll tells the job again (``_item_for``)."""
        self._told_live.pop(job_id, None)

    def _live(self, job: JobState) -> list[str]:
        """The job's active workers: the scheduler's, less those the job lost and those standing by."""
        live = job.live(list(self.scheduler.workers))
        standby = self.elastic.standby(job.cfg.job_id)
        return [w for w in live if w not in standby] if standby else live

    def _do(self, job: JobState, effects: list, polls: bool = True) -> None:
        """Carry out what ``job`` decided; ``polls``: its change may concern the waiting polls and the
        drivers' (``_wake``)."""
        applies: list[ApplyPass] = []
        for e in effects:
            if isinstance(e, ApplyPass):
                applies.append(e)
            elif isinstance(e, StartRecovery):
                if job.cfg.job_id not in self._recovering:
                    self._recovering.add(job.cfg.job_id)
                    asyncio.ensure_future(self._recover(job))
            elif isinstance(e, Checkpoint):
                asyncio.ensure_future(self._checkpoint(job, e))
            elif isinstance(e, Mirror):
                asyncio.ensure_future(self._mirror(job, e))
            elif isinstance(e, DropCopies):
                self._background(self._drop_copies(job, e))
            elif isinstance(e, RestartWorker):
                pass  # carried out in begin_clock, where nothing is staged
            elif isinstance(e, BeginClock):
                self._background(self._auto_begin(job, e.clock, e.ahead))
        for e in applies:  # (after the others, as a task's start would be: a checkpoint begun here is boundary work)
            self._start_apply(job, e)
        self._wake(polls=polls, driver=polls)

    async def _rpc(self, worker: str, op: str, timeout: float = RPC_TIMEOUT_S, **kw) -> Any:
        """A message to ``worker`` (with the token of the job it names); fails at once if the
        worker is removed meanwhile."""
        if kw.get("job_id") in self._tokens:
            kw["token"] = self._tokens[kw["job_id"]]
        return await self._inflight.call(worker, getattr(self._pool(worker), handler_name(op))(**kw), timeout)

    async def _remove(self, worker: str, why: str) -> None:
        """Take ``worker`` out of the cluster (hung or unreachable); ``remove_worker`` below recovers."""
        if worker in self.scheduler.workers:
            logger.warning("dscar: removing %s: %s", worker, why)
            for job in self.jobs.values():
                job.event(time.time(), "worker-removed", worker=worker, reason=why)
            await self.scheduler.remove_worker(worker, stimulus_id=f"dscar-{why}-{time.time()}", close=True)

    async def _watch_heartbeats(self) -> None:
        """Remove workers silent for ``hang_timeout()`` that do not answer a probe either.

        Silence is measured from the newest heartbeat or dscar message of the worker. A round
        in which this loop itself woke up late (the scheduler's process was starved: the
        workers' messages may be waiting unread) removes nobody. The probe tells a starved
        worker (it answers, late) from a hung one (it cannot answer at all)."""
        tick = SWEEP_S
        last = stalls_at = time.monotonic()
        while self.jobs:
            await asyncio.sleep(tick)
            now_m = time.monotonic()
            lagged, last = now_m - last > 4 * tick, now_m
            if lagged:
                continue
            if now_m >= stalls_at:  # (a job's progress key counts its shards: not at every tick)
                self._check_stalls(now_m)
                stalls_at = now_m + min(STALL_CHECK_S, stall_timeout() / 4)
            limit, now = hang_timeout(len(self.scheduler.workers)), time.time()
            silence = {w: now - max(ws.last_seen, self._heard.get(w, 0.0)) for w, ws in self.scheduler.workers.items()
                       if w in self._keys or now_m - self._arrived.get(w, -math.inf) > START_GRACE_S}
            silent = to_probe(silence, limit)
            probes = await asyncio.gather(*(self._probe(w) for w in silent))
            for w, alive in zip(silent, probes):
                if not alive and w in self.scheduler.workers:  # silent since before the probe, and it did not answer
                    await self._remove(w, f"no sign of life for {silence[w] + time.time() - now:.1f} s (no heartbeat "
                                          f"or message, and no answer to a probe in {PROBE_TIMEOUT_S} s)")
        self._watch = None

    def _check_stalls(self, now_m: float) -> None:
        """Report, once per episode, a job that is working and has not moved on for ``stall_timeout()``
        seconds while its workers answer (``dscar.core.stall``): an event with its state, and a warning."""
        for job_id, job in self.jobs.items():
            watch = self._stalls.setdefault(job_id, StallWatch(stall_timeout()))
            key, working = job.progress()
            still = watch.observe(key, now_m, working)
            if still is not None:
                task = asyncio.ensure_future(self._report_stall(job_id, job, still, job.stall_report()))
                self._stall_reports.add(task)
                task.add_done_callback(self._stall_reports.discard)
        for job_id in [j for j in self._stalls if j not in self.jobs]:
            del self._stalls[job_id]

    async def _report_stall(self, job_id: str, job: JobState, still: float, report: dict[str, Any]) -> None:
        """The stall's event and warning, with where the runner thread of each worker holding the
        job stands (its innermost frames): a step blocked inside a library shows where."""
        asked = workers_to_ask(report, job.workers)
        stacks = dict(zip(asked, await asyncio.gather(*(self._runner_stack(w) for w in asked))))
        job.event(time.time(), "job-stalled", stalled_s=round(still, 1), **report, stacks=stacks)
        where = "".join(f"\n  runner thread of {w}:\n    " + "\n    ".join(frames) for w, frames in stacks.items())
        logger.warning("dscar job %s has not moved on for %.1f s: %s%s", job_id, still, report, where)

    async def _runner_stack(self, worker: str) -> list[str]:
        """The innermost frames of ``worker``'s runner thread, or why there are none."""
        try:
            return (await self._rpc(worker, "stack", timeout=PROBE_TIMEOUT_S))["stack"]
        except Exception as e:  # gone, hung (no answer in time), or an older dscar there
            return [f"no answer: {e!r}"]

    async def _ask_info(self, worker: str) -> None:
        """One ``dscar_info`` to ``worker`` within ``PROBE_TIMEOUT_S``; an answer is a sign of life."""
        await asyncio.wait_for(self._pool(worker).dscar_info(job_id=""), PROBE_TIMEOUT_S)
        self._heard[worker] = time.time()

    async def _probe(self, worker: str) -> bool:
        try:
            await self._ask_info(worker)
            return True
        except asyncio.TimeoutError:
            return False
        except Exception:
            return True  # it answered, if only with an error: not hung; a dead one is removed by its comm

    async def _answers(self, worker: str) -> bool:
        """``worker`` answers a message now (unlike ``_probe``, an error in reaching it is no answer)."""
        try:
            await self._ask_info(worker)
        except Exception:
            return False
        return True

    def _alive(self, worker: str) -> None:
        self._heard[worker] = time.time()

    # ------------------------------------------------------------ the job
    def _h_start_job(self, job_id: str, spec: bytes, n_shards: int, reloadable: bool, tables: list,
                     max_failures: int = 3, sharding: str = "dynamic", policies: bytes | None = None,
                     monitor: dict | None = None, checkpoint: dict | None = None, rebuild: list | None = None,
                     resume: dict | None = None, phases: list | None = None, consistency: str = "bsp",
                     staleness: int = 0, max_clocks: int = 0, shard_bounds: list | None = None,
                     token: str | None = None, model: str = "", elastic_workers: int | None = None,
                     active_workers: str = "all", active_floor: int = 1, data_bytes: int | None = None) -> dict:
        """A new job, with its token (every later call about it must carry it: ``membership``) and
        its driver's lease; refused while another job runs."""
        if not token:
            return {"status": "no-token"}
        busy = [j for j, s in self.jobs.items() if not s.failed and j != job_id]
        if busy:
            return {"status": "busy", "jobs": busy}
        workers = sorted(self.scheduler.workers)
        if not workers:
            return {"status": "no-workers"}
        everyone = workers
        phases = [(str(n), int(k)) for n, k in phases] if phases else [("", n_shards)]
        workers = self.elastic.start_job(job_id, workers, consistency, sharding, [k for _, k in phases], active_workers,
                                         active_floor, data_bytes)
        pmap = PartitionMap(TableLayout(t[0], int(t[1]), int(t[2])) for t in tables)
        plan = placement_plan([k for _, k in phases], workers)  # where the driver puts the data first
        homes = {}
        if shard_bounds and len(phases) == 1:  # tables of the data's rows start where their shards do
            bounds = [(int(a), int(b)) for a, b in shard_bounds]
            homes = data_homes(pmap.layouts.values(), bounds, plan)
            self.elastic.shard_homes[job_id] = shard_homes(pmap.layouts.values(), bounds)
        pmap.assign(workers, homes)
        queue = ShardQueue(n_shards, reloadable=reloadable, max_failures=max_failures, sharding=sharding,
                           phases=[k for _, k in phases])
        cfg = JobConfig(job_id, n_shards, {t[0]: t[3] for t in tables}, list(rebuild or ()),
                        [n for n, _ in phases], CheckpointConfig(**checkpoint) if checkpoint else None)
        kw = dict(monitor=ThroughputMonitor(**(monitor or {})), policies=loads(policies) if policies else [],
                  resume=resume)
        if consistency == "ssp":
            kw.update(consistency="ssp", staleness=int(staleness), max_clocks=int(max_clocks))
        job = JobState(cfg, queue, pmap, **kw)
        job.workers = workers
        if consistency != "ssp":  # (SSP keeps the clock-end item: see ``SspSchedule.unfold_clock_end``)
            job.schedule.fold_clock_end = bool(dask.config.get("dscar.fold-clock-end", True))
            job.schedule.auto_begin = bool(dask.config.get("dscar.auto-begin", True))
        self._models[job_id] = model or job_id.rsplit("-", 1)[0]
        self.elastic.job_started(job_id, workers_wanted(n_shards, elastic_workers))
        self.jobs[job_id] = job
        self._specs[job_id] = spec
        self._tokens[job_id] = token
        lease = self._leases[job_id] = Lease(lease_timeout(), time.monotonic())
        self._ended_why.pop(job_id, None)
        job.event(time.time(), "job-started", workers=workers, n_shards=n_shards, sharding=sharding,
                  policies=[p.name for p in job.policies], consistency=consistency,
                  **({"staleness": int(staleness)} if consistency == "ssp" else {}),
                  checkpoint=None if cfg.checkpoint is None else f"{cfg.checkpoint.policy}/{cfg.checkpoint.recovery}")
        if (active := self.elastic.active[job_id]).mode == "auto":
            job.event(time.time(), "active-workers", active=len(workers), standby=sorted(active.standby),
                      reason="data size", data_bytes=data_bytes)
        if self._watch is None:
            self._watch = asyncio.ensure_future(self._watch_heartbeats())
        if self._lease_watch is None:
            self._lease_watch = asyncio.ensure_future(self._watch_leases())
        return {"status": "OK", "owners": pmap.to_msg(), "workers": everyone, "plan": [list(p) for p in plan],
                "lease": lease.timeout}

    async def _h_stop(self, job_id: str, clock: int, timeout: float = 60.0) -> dict:
        """The driver read its last clock, ``clock``: under SSP no later clock goes on, and this
        answers once nothing is being applied (the tables hold still for the gather)."""
        job = self.jobs.get(job_id)
        if job is not None and job.consistency == "ssp":
            job.stop(int(clock))
            self._wake()
            deadline = time.monotonic() + timeout
            while not (job.quiet or job.failed) and time.monotonic() < deadline:
                await self._wait_change(min(1.0, max(deadline - time.monotonic(), 0.0)))
            if job.failed:
                return {"status": "failed", "error": job.error}
        return {"status": "OK"}

    def _h_job_spec(self, job_id: str, worker: str) -> bytes | dict:
        """The job's spec (with its token) for a registered worker that joins it; a job that has
        ended (a joiner's late warm-up, a runner's late first item) is answered with a
        ``JobFailedError`` that names it, not a ``KeyError`` logged as a scheduler fault."""
        if job_id not in self._specs:
            return error_message(JobFailedError(f"job {job_id} is not running: it has ended or never began"),
                                 status="uncaught-error")
        return self._specs[job_id]

    async def _h_until_lost(self, job_id: str, workers: list, timeout: float = 60.0) -> dict:
        """Long poll: returns once one of ``workers`` is lost to the job (``lost``), once the job has
        ended (``ended``), once the placement under way is reported done (``placed``), or after
        ``timeout``. The driver races it against a call to a worker (``Driver._call_unless_lost``):
        a hung worker accepts the connection and never answers."""
        deadline = time.monotonic() + timeout
        placement = self._placements.get(job_id, 0)
        while True:
            job = self.jobs.get(job_id)
            gone = [w for w in workers if w not in self.scheduler.workers or (job is not None and w in job.lost)]
            left = deadline - time.monotonic()
            if gone or job is None or left <= 0 or self._placements.get(job_id, 0) > placement:
                return {"lost": gone, "ended": job is None}
            await self._wait_change(left)

    async def _recovered(self, job_id: str) -> tuple[JobState | None, dict | None]:
        """The job once no recovery is under way, or the answer that says why there is none."""
        job = self.jobs.get(job_id)
        if job is None:
            return None, {"status": "failed", "error": self._unknown(job_id)}
        while job.recovering and not job.failed:
            await self._wait_change(1.0)
        if job.failed:
            return None, {"status": "failed", "error": job.error}
        return job, None

    async def _h_owners(self, job_id: str) -> dict:
        """The partitions' owners, once no recovery is under way (the driver gathers the model)."""
        job, failed = await self._recovered(job_id)
        return failed or {"status": "OK", "owners": job.pmap.to_msg()}

    def _h_placed(self, job_id: str, placements: list) -> dict:
        job = self.jobs[job_id]
        self._placements[job_id] = self._placements.get(job_id, 0) + 1
        job.placed(placements, self.scheduler.workers)
        self._wake(everyone=True)
        return {"status": "OK"}

    async def _h_begin_clock(self, job_id: str, clock: int, wait: float = 0.0, events_from: int = 0,
                             until: int = 0, ahead: bool = False) -> dict:
        """Begin ``clock``; with ``wait``, then long-poll for its report as ``dscar_wait`` does (one
        round trip where a clock is quick). ``until``: the driver's last clock; under BSP the
        coordinator begins the clocks up to it itself while the stopping rule, evaluated with a
        folded clock end, says go on (``BeginClock``): a report says so (``next_begun``). ``ahead``:
        the algorithm's clock end only reads (``Algorithm.clock_end_reads_only``): it may run while the
        next clock begins (``dscar.clock-end-ahead`` turns it off)."""
        job = self.jobs.get(job_id)
        if job is not None and job.consistency == "bsp":
            job.schedule.auto_until = int(until)
            job.schedule.ahead_ok = bool(ahead) and bool(dask.config.get("dscar.clock-end-ahead", True))
            job.schedule.with_apply_ok = bool(dask.config.get("dscar.begin-with-apply", True))
        r = await self._begin(job_id, clock)
        if r["status"] != "OK" or wait <= 0:
            return r
        return await self._h_wait(job_id, clock, wait, events_from)

    async def _begin(self, job_id: str, clock: int) -> dict:
        job, failed = await self._recovered(job_id)
        if failed:
            return failed
        # a boundary that moves partitions waits for one where no clock end runs ahead (``_auto_begin`` waits for it)
        moves = job.consistency == "bsp" and not job.clock_end_ahead
        leaving = [w for w in self._live(job) if w in self.elastic.leaving]
        if leaving and moves:  # a clock boundary: Dask is retiring these
            await self.elastic.hand_off(job, leaving)
            job, failed = await self._recovered(job_id)  # (a leaver that still owned something)
            if failed:
                return failed
        if moves and self.elastic.copies.get(job_id):  # a boundary: copies to joiners switch owner
            await self.elastic.switch_copies(job)
            while job.recovering and not job.failed:  # (a loss while they switched: the clock begins after it)
                await self._wait_change(1.0)
            if job.failed:
                return {"status": "failed", "error": job.error}
        if moves and job_id in self.elastic.active:  # a boundary: the active count may change
            await self.elastic.resize(job)
            job, failed = await self._recovered(job_id)
            if failed:
                return failed
        job.workers = self._live(job)
        heap.hold(job_id)  # (set up: from its first clock on, full collections skip the heap as it is now)
        effects = job.begin(clock, time.time())
        for e in effects:  # between clocks nothing is staged: safe to move partitions
            if isinstance(e, RestartWorker):
                await self._restart(job, e.worker)
        self._do(job, [e for e in effects if not isinstance(e, RestartWorker)])
        self._wake(everyone=True)  # (a pass begins: every worker may have shards of its own)
        return {"status": "OK"}

    async def _auto_begin(self, job: JobState, clock: int, ahead: bool = False) -> None:
        """``BeginClock``: once the previous clock's report is ready (its snapshots taken, a loss
        meanwhile recovered), keep that report for the driver and begin ``clock`` here, as the
        driver's ``begin_clock`` would. ``ahead``: the previous clock's end runs ahead of ``clock``
        (``BspSchedule.applied``): begin now, unless work waits for the boundary (a hand-off, a switch
        of copies, the active workers' count): then once that clock end reported (its report keeps itself)."""
        job_id = job.cfg.job_id
        while self.jobs.get(job_id) is job and not job.failed and (
                job.schedule.ending is not None and self.elastic.boundary_work(job) if ahead else not job.report_ready):
            await self._wait_change(1.0)
        if self.jobs.get(job_id) is not job or job.failed or job.schedule.clock != clock - 1:
            return
        if ahead and not job.schedule.next_begun:  # (its clock end said stop, or left the rule to the driver)
            return
        if not ahead:
            job.schedule.keep_report()
        try:
            await self._begin(job_id, clock)
        except Exception as e:  # noqa: BLE001 - no driver call to raise it in: the job fails with it
            logger.exception("dscar: beginning clock %d of job %s failed", clock, job_id)
            job.fail(time.time(), f"beginning clock {clock} failed: {e!r}")
            self._wake()

    def _h_event(self, job_id: str, clock: int, kind: str, worker: str, info: dict | None = None) -> dict:
        """A worker reports something that happened to it (an injected fault, ...)."""
        job = self.jobs.get(job_id)
        if job is not None:
            job.worker_event(time.time(), clock, kind, worker, info)
            self._wake()
        return {"status": "OK"}

    async def _h_run(self, job_id: str, worker: str, owners: bool = False) -> dict:
        """The job's current run id (None: no such job here): a worker asks before it takes a write
        tagged with a run newer than it knows of (``membership.run_refusal``). ``owners``: a worker
        whose work item names an owner that is gone asks, with the partitions' owners once no
        recovery of its run is under way (a loss that kept the pass: ``ShardRunner.refresh_owners``)."""
        job = self.jobs.get(job_id)
        if job is None or not owners:
            return {"run": None if job is None else job.run_id}
        run = job.run_id
        while job.recovering and job.run_id == run and not job.failed and self.jobs.get(job_id) is job:
            await self._wait_change(1.0)
        return {"run": job.run_id, "owners": job.pmap.to_msg(), "owners_token": job.pmap.token()}

    def _h_end_job(self, job_id: str) -> dict:
        job = self._drop(job_id)
        return {"status": "OK", "events": [] if job is None else job.events, "all_events": True,
                "first_event": 0 if job is None else job.log.first, "workers": sorted(self.scheduler.workers)}

    def _drop(self, job_id: str) -> JobState | None:
        """Forget the job here (the driver's end, or the coordinator's: ``_end_here``)."""
        job = self.jobs.pop(job_id, None)
        heap.release(job_id)
        self._specs.pop(job_id, None)
        self._simulated.pop(job_id, None)
        self._placements.pop(job_id, None)
        self._tokens.pop(job_id, None)
        self._leases.pop(job_id, None)
        self._models.pop(job_id, None)
        self._touched.pop(job_id, None)
        self._moved.pop(job_id, None)
        self._copying.pop(job_id, None)
        self._inline.pop(job_id, None)
        self._applying.pop(job_id, None)
        self._told_live.pop(job_id, None)
        self.elastic.forget(job_id)
        if job is not None:  # the dashboard's last look at it (its snapshots are rate-limited)
            self._ended = job.snapshot(set(self.scheduler.workers), time.time())
        self._wake()
        return job

    def _unknown(self, job_id: str) -> str:
        why = self._ended_why.get(job_id)
        return f"job {job_id} {why}" if why else f"job {job_id} is unknown to the coordinator"

    # ------------------------------------------------------- job lease
    def _h_renew(self, job_id: str) -> dict:
        """The driver is alive (the lease itself is renewed by ``_guarded``, as by every driver call)."""
        return {"status": "OK" if job_id in self.jobs else "unknown", "error": self._unknown(job_id)}

    async def _watch_leases(self) -> None:
        """End every job whose driver let its lease lapse (``membership.Lease``). A round in which
        this loop woke late (the scheduler's process was starved, the renewals may wait unread)
        grants the lag to every lease instead of holding it against the drivers."""
        last = time.monotonic()
        try:
            while self.jobs:
                tick = min(0.5, min((lease.timeout for lease in self._leases.values()), default=1.0) / 4)
                await asyncio.sleep(tick)
                now = time.monotonic()
                lag, last = now - last - tick, now
                for job_id, lease in list(self._leases.items()):
                    if lag > tick:
                        lease.grant(lag)
                    elif lease.expired(now) and job_id in self.jobs:
                        await self._end_here(job_id, "job-expired", f"was ended: its driver did not renew its lease "
                                             f"for {lease.age(now):.1f} s (dscar.lease-timeout {lease.timeout:g} s)",
                                             lease_age=round(lease.age(now), 1), lease_timeout=lease.timeout)
        finally:
            self._lease_watch = None

    async def _end_here(self, job_id: str, kind: str, why: str, **info) -> None:
        """End a job without its driver (lease lapsed, cancelled), as its driver would: the job is
        dropped here, then every worker drops its partitions, shards and runner work."""
        job, token = self.jobs.get(job_id), self._tokens.get(job_id)
        if job is None:
            return
        logger.warning("dscar: job %s %s", job_id, why)
        job.event(time.time(), kind, **info)
        job.fail(time.time(), f"job {job_id} {why}")  # a recovery or long poll of it stops
        self._ended_why[job_id] = why
        self._drop(job_id)
        await asyncio.gather(*(self._inflight.call(w, self._pool(w).dscar_end_job(job_id=job_id, token=token), 10)
                               for w in list(self.scheduler.workers)), return_exceptions=True)

    def _h_jobs(self) -> dict:
        """The running jobs (``dscar.jobs``): id, model, clock, live workers, lease age and timeout."""
        now = time.monotonic()
        return {"jobs": [{"job": job_id, "model": self._models.get(job_id, ""), "clock": job.clock,
                          "workers": self._live(job),
                          "lease_age": round(self._leases[job_id].age(now), 1) if job_id in self._leases else None,
                          "lease_timeout": self._leases[job_id].timeout if job_id in self._leases else None}
                         for job_id, job in self.jobs.items()]}

    async def _h_cancel(self, job_id: str) -> dict:
        """End a running job by hand (``dscar cancel``): as a lapsed lease ends it."""
        if job_id not in self.jobs:
            return {"status": "unknown", "jobs": sorted(self.jobs)}
        await self._end_here(job_id, "job-cancelled", "was cancelled by hand (dscar cancel)")
        return {"status": "OK"}

    def snapshot(self) -> dict[str, Any]:
        """The newest job's state as plain JSON-able data (``JobState.snapshot``); when no job runs,
        the last one's state as it ended (``{"job": None}`` before the first). For the dashboard page."""
        jobs = getattr(self, "jobs", None)
        if not jobs:
            return getattr(self, "_ended", None) or {"job": None, "time": time.time()}  # before start(): None
        return list(jobs.values())[-1].snapshot(set(self.scheduler.workers), time.time())

    # ------------------------------------------------------- worker side
    def _item_for(self, worker: str) -> dict | None:
        now = time.time()
        for job_id, job in self.jobs.items():
            if self.elastic.holds_back(job_id, job, worker):
                continue
            told = (self._generation, len(job.lost))  # (a job's lost workers only grow)
            if self._told_live.get(job_id) != told:
                job.workers = self._live(job)
                self._told_live[job_id] = told
            item = job.next_item(worker, now)
            if item is None and (effects := job.idle(worker, now)):
                self._do(job, effects)  # no effect, no wake: every idle poll would wake the others' polls
            if item is not None:
                if job.consistency != "ssp":
                    self._note_copies(job_id, worker, item)
                    if (pending := self._with_apply.get(job_id)) is not None:  # (items of the clock begun with it)
                        item["prev_run"] = pending[0]  # (its clock began with that apply: ``runner.Job.settle_before``)
                        if worker in pending[1]:
                            item["apply_here"] = True  # (taken up once applied here: ``ShardRunner._await_apply``)
                if job.cfg.checkpoint is not None and any("state_file" in m for m in item.get("shards", ())):
                    item["ckpt_url"] = job.cfg.checkpoint.url
                    item["storage_options"] = job.cfg.checkpoint.storage_options
                job.pmap.for_item(item, self._owners_known.get(worker, {}).get(job_id))
                self._wake(polls=False, driver=False)  # (the waiting polls: a poll that gets an item passes a wake on)
                return item
        return None

    def _note_copies(self, job_id: str, worker: str, item: dict) -> None:
        """``worker`` and the holders its item's members copy their shards from (``_copying``)."""
        sources = {m["fetch_from"] for m in item.get("shards", ()) if m.get("fetch_from") not in (None, worker)}
        if sources:
            self._copying.setdefault(job_id, {}).setdefault(int(item["run"]), set()).update(sources | {worker})

    async def _h_next(self, worker: str, timeout: float | None = None, owners_known: dict | None = None) -> dict:
        """Long poll: the next work item for ``worker``, or ``idle`` after ``timeout`` (None:
        ``idle_poll_timeout``). It waits in the line of waiting polls until a change that may concern
        it wakes it (``dscar.core.wake``), not on a clock: an idle worker costs the scheduler one call
        per timeout. A woken poll passes the wake on as the rule says, whether it found work or not.
        ``owners_known``: the owners maps the worker holds (``_owners_known``)."""
        self._owners_known[worker] = owners_known or {}
        return await self._poll(worker, timeout)

    async def _poll(self, worker: str, timeout: float | None, looked: bool = False) -> dict:
        """``_h_next``'s long poll; ``looked``: ``_item_for(worker)`` just found nothing (a commit's
        answer), so the first look asks only for batch members back (``_take_back_for``)."""
        if timeout is None:
            timeout = idle_poll_timeout(len(self.scheduler.workers))
        deadline = time.monotonic() + timeout
        self._alive(worker)
        woken: Woken | None = None
        try:
            while True:
                item = None
                if worker in self.scheduler.workers:
                    if looked:
                        looked = False
                        item = await self._take_back_for(worker)
                    else:
                        item = self._item_for(worker) or await self._take_back_for(worker)
                if woken is not None:  # there may be more (got one), or it was not for this worker (none)
                    self._wake_polls(self._line.pass_on(woken, item is not None))
                if item is not None:
                    return item
                left = deadline - time.monotonic()
                if left <= 0:
                    return dict(IDLE)
                woken = await self._wait_poll(worker, left)
        finally:
            self._line.leave(worker)

    async def _take_back_for(self, worker: str) -> dict | None:
        """Nothing to hand ``worker``: ask the worker with the most batch members not started yet
        to give some back (``JobState.releasable``), then hand ``worker`` one of them."""
        for job_id, job in list(self.jobs.items()):
            if self.elastic.holds_back(job_id, job, worker):
                continue
            ask = job.releasable(worker)
            if ask is None:
                continue
            victim, members = ask
            try:
                r = await self._rpc(victim, "release", timeout=RELEASE_TIMEOUT_S, job_id=job.cfg.job_id,
                                    item=job.item_of[victim], members=[list(m) for m in members])
                released = r.get("released", [])
            except Exception:  # gone, hung or late: its loss, a backup or its commit's ``released`` deal with them
                released = []
            job.released(victim, members, released, time.time())
            return self._item_for(worker)
        return None

    def _recheck_s(self) -> float:
        """How long the waiting long polls may go without one of them looking again when nothing
        wakes them (``dscar.core.wake.recheck_s``: a backup or a move turning due)."""
        return recheck_s(self.jobs.values(), time.time())

    def _h_commit(self, job_id: str, clock: int, run: int, worker: str, commits: list[dict],
                  rebuild: bool = False, released: list | None = None, stopped: list | None = None,
                  wait: bool = False, wait_timeout: float | None = None,
                  owners_known: dict | None = None) -> dict | Coroutine[Any, Any, dict]:
        """Grant or refuse the commits of a batch's attempts in one decision (``protocol.Commit``:
        ``commits``, each ``protocol.Finished``; ``rebuild``: the batch is of the rebuild pass); the
        answer (``protocol.CommitAnswer``) carries the worker's next work item, if one is ready.
        ``released``: the batch's members the worker gave back unstarted, so those whose release
        answer came too late are queued again, not left running nowhere. ``stopped``: its attempts
        that stopped as lost races (``protocol.Stopped``), so one stopped wrongly runs again rather
        than hold its clock for ever. ``wait``: when no item is ready, the answer waits for one as
        ``dscar_next`` does (``wait_timeout``: its ``timeout``; then ``next`` is ``idle``): a BSP
        worker's last commit of a pass and its poll for the next pass are one round trip, not two."""
        msg = Commit.from_msg(job_id, clock, run, worker, commits, rebuild, released, stopped, wait, wait_timeout,
                              owners_known)
        self._owners_known[worker] = msg.owners_known or {}
        self._alive(worker)
        job = self.jobs.get(job_id)
        if job is None:
            return CommitAnswer([False] * len(msg.commits)).to_msg()
        now = time.time()
        if msg.released:
            job.released(worker, msg.released, msg.released, now)
        for s in msg.stopped:
            job.attempt_failed(worker, s.clock, msg.run, s.shard, s.attempt,
                               "another attempt of the shard was applied where it read", now,
                               seconds=s.seconds, stopped=True)
        touched = self._touched.setdefault(job_id, {})
        inline = self._inline.setdefault(job_id, {})
        if msg.stopped or any(c.moved for c in msg.commits):  # (a stopped attempt may hold a copy of its shard)
            involved = self._moved.setdefault(job_id, {}).setdefault(msg.run, set())
            involved.add(worker)  # (before the commits: a granted one makes this worker the holder)
            involved.update(h for c in [*msg.commits, *msg.stopped] if (h := job.queue.holder(c.shard)) is not None)
        for c in msg.commits:  # before the commits: their effects may apply the pass at once
            if c.inline is not None:
                inline[(msg.run, c.clock, c.shard, c.attempt)] = {(t, int(p)): payload for t, p, payload in c.inline}
            elif c.parts is not None:
                touched[(msg.run, c.clock, c.shard, c.attempt)] = c.parts
        granted, effects = job.commit_many(worker, msg.run, [(c.clock, c.shard, c.attempt, c.timings)
                                                             for c in msg.commits], now, msg.rebuild)
        for c, ok in zip(msg.commits, granted):
            if not ok:
                touched.pop((msg.run, c.clock, c.shard, c.attempt), None)
                inline.pop((msg.run, c.clock, c.shard, c.attempt), None)
        here = worker in self.scheduler.workers
        # (a pass's tail: what it may get is idle work. Asked before the decision is carried out: where it began
        # the next clock with its apply, this worker looks after the others were woken, as any tail commit's)
        tail = msg.wait and here and not job.queue.n_todo
        self._do(job, effects, commit_wakes(job, effects))  # (one wake for the whole commit)
        if tail:
            return self._commit_then_poll(granted, worker, msg.wait_timeout, looked=False)
        item = self._item_for(worker) if here else None
        if item is None and msg.wait and here:
            return self._commit_then_poll(granted, worker, msg.wait_timeout)  # (distributed awaits it)
        return CommitAnswer(granted, item).to_msg()

    async def _commit_then_poll(self, granted: list[bool], worker: str, timeout: float | None,
                                looked: bool = True) -> dict:
        """A commit's answer once the worker's next item is ready (``_poll``; ``idle`` after ``timeout``).
        ``looked=False``: a commit at a pass's tail, whose worker is now idle, looks for idle work (a
        backup) only after the messages already read with it are handled. After a stall of the
        event loop (a long collection, a busy machine) the commits of steps that ended meanwhile
        arrive together, and each one handled first would otherwise see the others' attempts, still
        unread, as running late: a 0.2 s stall at W = 64 hollow workers started 57 backups of 64
        shards, which moved 29 shards and cost the next three clocks ~370 ms."""
        if not looked:
            for _ in range(TAIL_LOOK_TURNS):  # (behind the handlers of the messages read meanwhile)
                await asyncio.sleep(0)
        return CommitAnswer(granted, await self._poll(worker, timeout, looked=looked)).to_msg()

    def _sources(self, job_id: str, e: ApplyPass) -> dict[str, dict]:
        """``{worker: {table: parts or None}}`` for each worker whose committed attempts of the pass
        staged updates: the partitions they touched, merged (a worker with an attempt not reported
        is left out: it may have touched any; attempts whose updates rode their commits are not
        fetched, so not counted). Forgets the pass's entries and those of older runs."""
        touched = self._touched.get(job_id, {})
        inline = self._inline.get(job_id, {})
        merged: dict[str, dict] = {}
        unknown: set[str] = set()
        for key, worker in e.attempt_keys():
            if key in inline:
                continue
            parts = touched.pop(key, None)
            if parts is None:
                unknown.add(worker)
            else:
                merge_touched(merged.setdefault(worker, {}), parts)
        for key in [k for k in touched if k[0] < e.run_id]:
            del touched[key]
        return {w: m for w, m in merged.items() if w not in unknown}

    def _apply_plan(self, job: JobState, e: ApplyPass, targets: list[str], direct: bool = False) -> ApplyPlan:
        """Who fetches the pass's updates from whom (``dscar.core.apply_plan``): direct while that is a few
        messages per worker (``dscar.apply-direct-per-worker``), otherwise through a tree of fan-in
        ``dscar.apply-fanin``."""
        stagers: dict[str, list] = {}
        held = self._inline.get(job.cfg.job_id, {})
        inline: dict[tuple, list] = {}
        for key, worker in e.attempt_keys():
            stagers.setdefault(worker, []).append(key[1:])  # ((clock, shard, attempt): as the workers stage it)
            if key in held:
                inline[key[1:]] = list(held[key])
        live = set(targets)
        owners: dict[str, list] = {w: [] for w in targets}
        for part, w in job.pmap.owners.items():
            if w in live:
                owners[w].append(part)
        return plan_apply(stagers, self._sources(job.cfg.job_id, e), owners,
                          fanin=int(dask.config.get("dscar.apply-fanin", FANIN)),  # (a bad one: ValueError)
                          direct_per_worker=(float("inf") if direct else
                                             float(dask.config.get("dscar.apply-direct-per-worker", DIRECT_PER_WORKER))),
                          inline=inline)

    def _role_msg(self, job_id: str, e: ApplyPass, plan: ApplyPlan, worker: str) -> dict:
        """``worker``'s role in the apply of ``e`` as its message carries it, with the inline updates'
        payloads for its partitions (``Role.inline``: held here since their commits)."""
        msg = plan.role(worker).to_msg()
        if "inline" in msg:
            held = self._inline[job_id]
            msg["inline"] = [[k, t, p, held[(int(e.run_id), *k)][(t, p)]] for k, t, p in msg["inline"]]
        return msg

    def _h_fail(self, job_id: str, clock: int, run: int, shard: int, attempt: int, worker: str,
                error: str, lost_data: bool = False, seconds: float = 0.0) -> dict:
        job = self.jobs.get(job_id)
        if job is not None:
            # (it may have copied its shard: it and the holder apply the pass)
            self._moved.setdefault(job_id, {}).setdefault(int(run), set()).update(
                w for w in (worker, job.queue.holder(int(shard))) if w is not None)
            job.attempt_failed(worker, clock, run, shard, attempt, error, time.time(), lost_data, float(seconds))
            self._wake()
        return {"status": "OK"}

    def _setting_up(self, job: JobState, live: list[str] | None = None) -> set[str]:
        """The job's ``live`` workers (None: ``_live``) still setting up dscar, with nothing of the job
        (``elastic.setting_up``)."""
        return setting_up(self._live(job) if live is None else live, self._keys, job.pmap.owners.values(),
                          (job.queue.holder(s) for s in range(job.queue.n_shards)))

    def _apply_targets(self, job: JobState) -> list[str]:
        """The workers a pass is applied on: the live ones, less those setting up (``_setting_up``), which
        have nothing to apply and would hold the clock until they can answer."""
        live = self._live(job)  # (sorts every worker: once an apply)
        fresh = self._setting_up(job, live)
        return [w for w in live if w not in fresh] if fresh else live

    def _start_apply(self, job: JobState, e: ApplyPass) -> None:
        """The apply of ``e`` is sent now, in the decision that made it (``_send_first_apply``), and awaited
        beside the loop (``_apply``). Started as a task, it waited behind whatever was ready on the loop:
        at the end of a clock the tail looks of the commits read just before the last (``TAIL_LOOK_TURNS``),
        0.1-0.3 ms a clock at W = 64 hollow workers, before the first of the next clock's items."""
        applying = self._applying.setdefault(job.cfg.job_id, [])
        applying.append(int(e.run_id))
        try:
            first = self._send_first_apply(job, e)
        except BaseException:
            applying.remove(int(e.run_id))
            raise
        asyncio.ensure_future(self._apply(job, e, first))

    async def _apply(self, job: JobState, e: ApplyPass, first: FirstApply | None) -> None:
        """``_apply_pass`` (``first``: its first try, sent), then the pass's inline updates are forgotten
        (and those of older runs whose passes are not being applied: commits a loss voided)."""
        job_id = job.cfg.job_id
        applying = self._applying[job_id]
        try:
            if first is not None:
                await self._apply_pass(job, e, *first)
        finally:
            applying.remove(int(e.run_id))
            if self._with_apply.get(job_id, (None,))[0] == e.run_id:
                del self._with_apply[job_id]
                if self.jobs.get(job_id) is job and job.machine.ending_applying and job.schedule.ending.run == e.run_id:
                    # cut short (a loss, a stop): the clock the next began with is skipped; its outcome is asked as ever
                    job.apply_cut(e.run_id, time.time(), "its last apply did not reach every worker")
                    self._background(self._ahead_outcome(job, e))
                    self._wake()
            held = self._inline.get(job_id, {})
            for key, _ in e.attempt_keys():
                held.pop(key, None)
            oldest = min(applying, default=int(e.run_id))
            for key in [k for k in held if k[0] < min(oldest, int(e.run_id))]:
                del held[key]

    def _send_first_apply(self, job: JobState, e: ApplyPass) -> FirstApply | None:
        """The first try of the apply of ``e``, sent (``_send_apply``); None where it cannot be planned
        (the job failed)."""
        targets = self._apply_targets(job)
        extra = {"floor": e.floor} if e.batch is not None else {}
        if e.phase:
            extra["phase"] = e.phase
        if e.batch is not None:
            extra["batch"] = e.batch
        try:
            plan = self._apply_plan(job, e, targets)
        except (TypeError, ValueError) as err:  # a bad ``dscar.apply-*`` setting
            job.fail(time.time(), f"cannot plan the apply of clock {e.clock}: {err}")
            self._wake()
            return None
        folded = None if e.clock_end is None else e.clock_end["worker"]  # (its apply answers once its clock end ran)
        return FirstApply(targets, plan, folded, extra, *self._send_apply(job, e, targets, plan, folded, extra, 0))

    def _send_apply(self, job: JobState, e: ApplyPass, targets: list[str], plan: ApplyPlan, folded: str | None,
                    extra: dict, attempt: int) -> tuple[list[str], asyncio.Future]:
        """Try ``attempt`` of the apply of ``e``: its messages to the receivers among ``targets``, on their
        way; ``(receivers, their answers gathered)``. On the first try the next clock may begin with it."""
        targets = self._apply_receivers(job, e, targets, plan, folded)
        if folded in targets:  # (the others' applies gate the clock end's first read: they go first)
            targets = [w for w in targets if w != folded] + [folded]
        begun = []  # the next clock may begin with this apply (``JobState.applying``)
        if attempt == 0 and folded is not None and e.clock_end.get("ahead") and not self.elastic.boundary_work(job):
            begun = job.applying(e.run_id, time.time())
            if begun:
                self._with_apply[job.cfg.job_id] = (int(e.run_id), frozenset(targets))
        # through a tree, an owner's fetch waits on the combine steps below the root (each level's deadline)
        timeout = RPC_TIMEOUT_S + (plan.depth() + 2) * float(dask.config.get("dscar.rpc-timeout", 10.0)) * plan.tree
        # each worker is told its own commits, and the pass's (the batch's) shards per clock as ranges
        own, extra["clock_shards"] = batch_fields(e.committed, e.clocks if e.batch is not None
                                                  else [e.clock] * len(e.committed))
        committed = {w: own.get(w, ([], []))[0] for w in targets}
        clocks = {w: own.get(w, ([], []))[1] for w in targets} if e.batch is not None else {}
        # the other owners push the folded clock end's first read their answers once they applied the pass
        owning = job.pmap.workers() if folded is not None and self._push_reads() else ()
        pushers = [w for w in targets if w != folded and w in owning]
        # the clock end has no deadline, as its item has none: a hung worker is found by the liveness watch
        applies = asyncio.gather(*(
            self._rpc(w, "apply", timeout=None if w == folded else timeout, job_id=job.cfg.job_id, clock=e.clock,
                      run=e.run_id, committed=committed[w], reset=e.reset,
                      **({"clocks": clocks[w]} if e.batch is not None else {}),
                      **extra, **self._role_msg(job.cfg.job_id, e, plan, w),
                      **({"clock_end": {**e.clock_end, "pushers": pushers}} if w == folded else
                         {"clock_end_at": folded, **({"clock_end_ahead": True} if e.clock_end.get("ahead") else {})}
                         if w in pushers else {}))
            for w in targets
        ), return_exceptions=True)
        if begun:  # (begun once the apply messages are on their way: a worker's next item waits for its apply)
            self._do(job, begun)
        return targets, applies

    async def _apply_pass(self, job: JobState, e: ApplyPass, targets: list[str], plan: ApplyPlan,
                          folded: str | None, extra: dict, receivers: list[str], first: asyncio.Future) -> None:
        """Every live worker applies the pass: owners their tables' updates, holders the shard state.
        ``targets``, ``plan``, ``folded``, ``extra``: the first try's (``_send_first_apply``), whose
        messages went to ``receivers``; ``first``: their answers.

        A worker that could not be reached (the apply message, or a peer's fetch of its staged
        updates) is probed before it is taken for lost: on a loaded machine a connect can time out
        to a worker that is alive. If every such worker answers, a BSP pass is sent again, with
        direct fetches (workers that applied it answer at once: one pass is applied once), up to
        ``APPLY_TRIES`` times; a worker that does not answer is lost, as before."""
        for attempt in range(APPLY_TRIES):
            if attempt == 0:
                targets, applies = receivers, first
            else:
                targets, applies = self._send_apply(job, e, targets, plan, folded, extra, attempt)
            results = await applies
            unreached: dict[str, str] = {}  # worker -> why it looks lost
            for w, r in zip(targets, results):
                if isinstance(r, dict) and r.get("status") == "stopped":  # an injected kill
                    await self._remove(w, "stopped by an injected fault")
                    return
                if isinstance(r, dict) and r.get("status") == "source-lost":  # a worker that ran attempts is gone?
                    if r["worker"] in self.scheduler.workers and r["worker"] not in job.lost:
                        unreached.setdefault(r["worker"], f"its staged updates could not be collected: {r.get('error')}")
                elif isinstance(r, Exception) and w in self.scheduler.workers and w not in job.lost:
                    if not isinstance(r, (OSError, asyncio.TimeoutError)):
                        job.fail(time.time(), f"applying clock {e.clock}'s updates on {w} failed: {r!r}")
                        self._wake()
                        return
                    unreached.setdefault(w, f"apply did not reach it: {r!r}")
            if not unreached:
                if any(isinstance(r, dict) and r.get("status") == "source-lost" for r in results):
                    return  # (the named worker is gone already: its loss skips the clock)
                ahead = folded is not None and bool(e.clock_end.get("ahead"))  # (answered before its clock end ran)
                self._do(job, job.applied(e.run_id, time.time(), e.batch, ahead))
                if ahead:
                    self._background(self._ahead_outcome(job, e))
                elif folded is not None:
                    await self._folded_clock_end(job, e, dict(zip(targets, results)).get(folded))
                return
            answering = await asyncio.gather(*(self._answers(w) for w in unreached))
            silent = [w for w, ok in zip(unreached, answering) if not ok]
            removed = unreached_after_apply(
                list(unreached), silent, job_current=self.jobs.get(job.cfg.job_id) is job and not job.failed,
                batched=e.batch is not None, last_try=attempt + 1 == APPLY_TRIES)
            if removed is not None:
                for w in removed:
                    if w in self.scheduler.workers and w not in job.lost:
                        await self._remove(w, unreached[w])  # the loss skips the clock
                self._wake()
                return
            job.event(time.time(), "apply-retried", clock=e.clock, run=e.run_id, workers=sorted(unreached),
                      reason="; ".join(unreached.values())[:500])
            targets = self._apply_targets(job)
            plan = self._apply_plan(job, e, targets, direct=True)

    @staticmethod
    def _push_reads() -> bool:
        """Whether the other owners push their answers to a folded clock end's first read once they applied
        the pass (``dscar.push-first-read``, default True), or the clock end asks them (``ParamServer._start_first_read``)."""
        return bool(dask.config.get("dscar.push-first-read", True))

    def _apply_receivers(self, job: JobState, e: ApplyPass, targets: list[str], plan: ApplyPlan,
                         folded: str | None) -> list[str]:
        """The ``targets`` the apply of ``e`` is sent to (``apply_plan.apply_receivers``): under BSP,
        not a worker with nothing to apply; where a commit of the pass moved a shard's data or state,
        also the workers that move involved (``_moved``, ``_copying``). Forgets the runs older than the pass's."""
        moved = self._moved.get(job.cfg.job_id, {})
        copying = self._copying.get(job.cfg.job_id, {})
        shards_moved = e.batch is not None or e.run_id in moved
        involved = None if e.batch is not None else moved.get(e.run_id, set()) | copying.get(e.run_id, set())
        for runs in (moved, copying):
            for r in [r for r in runs if r < e.run_id]:
                del runs[r]
        keep = {folded} | {w for w, _ in self.elastic.copies.get(job.cfg.job_id, {}).values()}
        return apply_receivers(targets, job.pmap.owners.values(), plan, keep, shards_moved, involved)

    async def _ahead_outcome(self, job: JobState, e: ApplyPass) -> None:
        """The clock end folded into the apply of ``e`` ran ahead of the next clock (its worker answered
        the apply first): its outcome, asked for once it ran (``dscar_clock_end_outcome``), is carried
        out as a folded one's (a worker that cannot give it, lost or unreachable, gives none: skipped)."""
        try:
            answer = await self._rpc(e.clock_end["worker"], "clock_end_outcome", timeout=None, job_id=job.cfg.job_id,
                                     run=e.run_id)
        except Exception as err:  # noqa: BLE001 - gone: its loss, or the outcome's absence, skips the clock
            answer = {"not_run": f"its outcome could not be asked: {err!r}"}
        if self.jobs.get(job.cfg.job_id) is job:
            await self._folded_clock_end(job, e, {"clock_end": answer})

    async def _folded_clock_end(self, job: JobState, e: ApplyPass, answer: Any) -> None:
        """The clock end folded into the apply of ``e`` (``ApplyPass.clock_end``) answered with that
        worker's apply: carried out as its ``clock_done`` or ``clock_failed`` message would have been;
        where it did not run there, the clock-end item goes to the first worker that asks, as unfolded."""
        worker = e.clock_end["worker"]
        out = ClockEndOutcome.from_msg(answer.get("clock_end") if isinstance(answer, dict) else None)
        if out.metrics is not None:
            if out.stop is None and "rule" in e.clock_end:  # its copy of the history was not what it was sent
                job.schedule.rule.forget(worker)
            self._h_clock_done(job.cfg.job_id, e.clock, e.run_id, worker, out.metrics, out.seconds, out.stop)
        elif out.error is not None:
            await self._h_clock_failed(job.cfg.job_id, e.clock, e.run_id, worker, out.error, out.unreachable)
        else:
            if job.clock_end_worker == worker:
                job.event(time.time(), "clock-end-unfolded", worker=worker, reason=out.not_run)
            self._do(job, job.unfold_clock_end(worker, time.time()))

    def _h_clock_done(self, job_id: str, clock: int, run: int, worker: str, metrics: dict, seconds: float,
                      stop: bool | None = None) -> dict:
        job = self.jobs.get(job_id)
        if job is not None:
            job.workers = self._live(job)
            self._do(job, job.clock_end_done(worker, run, metrics, seconds, time.time(), clock, stop))
        return {"status": "OK"}

    async def _h_clock_failed(self, job_id: str, clock: int, run: int, worker: str, error: str,
                              unreachable: str | None = None) -> dict:
        """The clock end failed on ``worker``. Where it failed to reach another worker
        (``unreachable``) that does not answer a probe either, that worker died and its loss is not
        yet noticed: it is removed first, so the clock is skipped and recovered as any loss under a
        clock end is, instead of failing the job."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "OK"}
        if (isinstance(unreachable, str) and unreachable != worker and unreachable in self.scheduler.workers
                and unreachable in job.workers and not await self._answers(unreachable)):
            await self._remove(unreachable, f"the clock end on {worker} could not reach it")
        if self.jobs.get(job_id) is job:
            self._do(job, job.clock_end_failed(worker, run, error, time.time(), clock))
        return {"status": "OK"}

    def _h_runner_failed(self, job_id: str, worker: str, error: str) -> dict:
        """A worker's engine code failed outside an attempt (``ShardRunner._runner_failed``): a bug,
        which no retry would mend, so the job fails with it rather than wait on that worker."""
        job = self.jobs.get(job_id)
        if job is not None:
            job.fail(time.time(), f"worker {worker} failed: {error}")
            self._wake()
        return {"status": "OK"}

    async def _restart(self, job: JobState, worker: str) -> None:
        """Hand ``worker``'s partitions to the least loaded others, then restart it (kill-and-restart).

        A target that fails to adopt one (lost or hung meanwhile: its loss is recovered as any other)
        is passed over for the next; when no target is left, or ``worker`` itself is gone, the restart
        is given up (``restart-abandoned``): what did not move stays where the partition map says."""
        others = [w for w in self._live(job) if w != worker]
        if worker not in self.scheduler.workers or not others:
            return
        for table, part in job.pmap.owned_by(worker):
            while True:
                others = [w for w in others if w in self.scheduler.workers]
                new = job.adopter(others) if worker in self.scheduler.workers else None
                if new is None:
                    job.event(time.time(), "restart-abandoned", worker=worker, table=table, part=part)
                    return
                try:
                    await self._rpc(new, "adopt", job_id=job.cfg.job_id, table=table, part=part, source=worker)
                    break
                except Exception as e:
                    logger.info("dscar: %s could not adopt %s/%s from %s: %r", new, table, part, worker, e)
                    others.remove(new)
            job.partition_moved((table, part), worker, new, time.time())
        job.restart_begun(worker, time.time())
        await self.scheduler.restart_workers([worker], wait_for_workers=False, on_error="return",
                                             stimulus_id=f"dscar-restart-{time.time()}")

    # -------------------------------------------------------- checkpoints
    async def _checkpoint(self, job: JobState, c: Checkpoint) -> None:
        """Every writer snapshots now and writes in the background; it reports through ``ckpt_written``."""
        cfg = job.cfg.checkpoint
        writers = sorted(c.writers)
        t0 = time.monotonic()
        results = await asyncio.gather(*(
            self._rpc(w, "checkpoint", timeout=SNAPSHOT_TIMEOUT_S, job_id=job.cfg.job_id, version=c.version, url=cfg.url,
                      fraction=cfg.save_fraction, storage_options=cfg.storage_options, state_shards=c.writers[w],
                      whole=[list(k) for k in c.whole.get(w, ())], max_chain=cfg.max_chain)
            for w in writers
        ), return_exceptions=True)
        self._do(job, job.snapshotted("checkpoint", time.time()))  # every owner has its snapshot (or failed): tables may change
        job.checkpoint_snapshotted(c.version, time.monotonic() - t0, {
            w: r["unsaved_sq"] for w, r in zip(writers, results)
            if not isinstance(r, Exception) and r.get("status") == "OK" and "unsaved_sq" in r}, time.time())
        for w, r in zip(writers, results):
            if isinstance(r, Exception) or r.get("status") != "OK":
                job.checkpoint_written(c.version, w, [], f"{r!r}", time.time())
                if not isinstance(r, Exception) and r.get("status") == "stopped":
                    await self._remove(w, "stopped by an injected fault")
        self._wake()

    async def _mirror(self, job: JobState, m: Mirror) -> None:
        """The memory tier: every owner snapshots its param partitions now and sends them to its
        buddy in the background (the buddy's copy is recorded by ``dscar_mirrored``)."""
        owners = sorted(m.buddies)
        results = await asyncio.gather(*(
            self._rpc(w, "mirror", timeout=SNAPSHOT_TIMEOUT_S, job_id=job.cfg.job_id, clock=m.clock, buddy=m.buddies[w])
            for w in owners), return_exceptions=True)
        self._do(job, job.snapshotted("mirror", time.time()))
        for w, r in zip(owners, results):
            if isinstance(r, Exception) or r.get("status") != "OK":
                logger.info("dscar: memory copy of %s's partitions at clock %s failed: %r", w, m.clock, r)
        self._wake()

    async def _drop_copies(self, job: JobState, d: DropCopies) -> None:
        """The memory copies ``d.holder`` keeps that no record names any more go (one message; a holder
        gone holds nothing)."""
        try:
            await self._rpc(d.holder, "drop_copies", job_id=job.cfg.job_id, parts=[list(k) for k in d.parts],
                            shards=[list(k) for k in d.shards])
        except Exception as e:  # noqa: BLE001 - gone, or the job ended there: its copies went with it
            logger.info("dscar: dropping stale memory copies on %s failed: %r", d.holder, e)

    def _h_mirrored(self, job_id: str, worker: str, buddy: str, clock: int, parts: list, shards: list = ()) -> dict:
        job = self.jobs.get(job_id)
        if job is not None:
            drops = job.mirrored(buddy, clock, parts, time.time(), shards)
            if drops:
                self._do(job, drops, polls=False)
        return {"status": "OK"}

    def _h_ckpt_written(self, job_id: str, version: int, worker: str, files: list, error: str | None = None,
                        seconds: float = 0.0) -> dict:
        job = self.jobs.get(job_id)
        if job is not None:
            job.checkpoint_written(version, worker, files, error, time.time(), seconds)
            self._wake()
        return {"status": "OK"}

    def _h_rebase(self, job_id: str, manifest: dict) -> dict:
        self.jobs[job_id].rebase(manifest)
        return {"status": "OK"}

    async def _h_flush(self, job_id: str, timeout: float = 30.0) -> dict:
        """Wait until every started checkpoint is written (or abandoned); return what is left to publish."""
        deadline = time.monotonic() + timeout
        job = self.jobs.get(job_id)
        while job is not None and job.ledger is not None and job.ledger.pending and time.monotonic() < deadline:
            await self._wait_change(min(0.1, max(deadline - time.monotonic(), 0.0)))
        ledger = None if job is None else job.ledger
        return {"publish": [] if ledger is None else list(ledger.to_publish),
                "pending": 0 if ledger is None else len(ledger.pending)}

    def _h_published(self, job_id: str, version: int) -> dict:
        job = self.jobs.get(job_id)
        if job is not None:
            job.published(version, time.time())
        return {"status": "OK"}

    # ------------------------------------------------------------ recovery
    async def _recover(self, job: JobState) -> None:
        """Restore what the lost workers took, re-planning until no loss is left unrecovered
        (a loss during the restore, of a target included, just adds to the next round)."""
        t0, first_event = time.perf_counter(), job.log.pin()  # (its events are read when it ends)
        try:
            while job.clock_end_ahead and not job.failed and self.jobs.get(job.cfg.job_id) is job:
                await self._wait_change(1.0)  # (a clock end ahead reads the tables: bounded, a loss fails its reads)
            while not job.failed:
                live = self._live(job)
                if not live:
                    job.fail(time.time(), "no live worker left")
                    break
                plan, covered = job.start_recovery_round(live, time.time())
                await self._restore(job, plan.restores, plan.manifests, plan.from_memory)
                await self._confirm_states(job)
                effects = job.end_recovery_round(plan, covered, time.time(), time.perf_counter() - t0, first_event)
                if not job.recovering:
                    self._do(job, effects)
                    break
        except Exception as e:  # a bug: say so rather than hang
            logger.exception("dscar recovery failed")
            job.fail(time.time(), f"recovery failed: {e!r}")
        finally:
            job.log.unpin(first_event)
            self._recovering.discard(job.cfg.job_id)
            self._wake(everyone=True)

    async def _restore(self, job: JobState, restores: dict, manifests: list[dict],
                       from_memory: dict | None = None) -> None:
        """Restore each partition on its target from the first source that serves it
        (``dscar.core.ledger.restore_sources``: a live buddy's memory copy, then each checkpoint that
        verifies, newest first, then the initial values).

        A source that fails (its holder gone, a corrupt file) sends the restore on to the next
        source, on the same target. Only a target that itself cannot be reached (no answer, its
        comm closed, and no answer to a probe either) is removed from the cluster; its partitions
        stay owned by a lost worker, so the next round of ``_recover`` plans them again.
        """
        cfg = job.cfg.checkpoint
        from_memory = from_memory or {}

        async def one(key: tuple[str, int], target: str) -> None:
            table, part = key
            previous = job.pmap.owners.get(key)
            tried: set[tuple[int, str | None]] = set()
            while True:
                sources = job.restore_sources(key, manifests, from_memory.get(key), self._live(job), tried)
                if not sources:
                    break
                version, chain, buddy = sources[0]
                tried.add((version, buddy))
                try:
                    r = await self._rpc(target, "restore", job_id=job.cfg.job_id, table=table, part=part,
                                        run=job.run_id,
                                        chain=chain, url=cfg.url if cfg else "", mirror_from=buddy,
                                        storage_options=cfg.storage_options if cfg else None)
                except (OSError, asyncio.TimeoutError) as e:
                    if target in self.scheduler.workers and target not in job.lost and (
                            not isinstance(e, asyncio.TimeoutError) and await self._answers(target)):
                        # it answers: the failure was not its being unreachable (an error inside the
                        # handler that reads like one): the next source, on the same target
                        job.event(time.time(), "restore-failed", table=table, part=part, target=target,
                                  version=version, memory=buddy, error=repr(e))
                        continue
                    await self._remove(target, f"restore did not reach it: {e!r}")
                    return
                if r["status"] == "stopped":  # an injected kill
                    await self._remove(target, "stopped by an injected fault")
                    return
                if r["status"] == "OK":
                    if target in job.lost:
                        return  # lost meanwhile: the next round restores it elsewhere
                    job.restored(key, target, version, time.time(),
                                 memory_clock=None if buddy is None else int(r["clock"]))
                    await self._perturbation(job, key, previous, target)
                    return
                if r["status"] == "source-gone":  # the memory copy's holder died: the disk next
                    job.event(time.time(), "restore-source-gone", table=table, part=part, target=target,
                              source=buddy, error=r.get("error"))
                elif buddy is None:  # (a buddy without the copy: simply the disk next)
                    job.event(time.time(), "checkpoint-corrupt", table=table, part=part, version=version,
                              error=r.get("error"))
            job.fail(time.time(), f"partition {table}/{part}: no readable checkpoint, not even the initial values")

        await asyncio.gather(*(one(k, w) for k, w in sorted(restores.items())))

    async def _confirm_states(self, job: JobState) -> None:
        """Ask the buddies which clocks they keep of the shard states a kept pass needs whose record is older
        (``JobState.states_to_confirm``: a sender lost after its buddy kept a copy, before it reported it);
        one message a buddy asked, only then. A buddy that does not answer leaves the plan as it is: the
        pass is not kept."""
        behind = job.states_to_confirm()
        if not behind:
            return
        buddies = sorted(behind)
        answers = await asyncio.gather(*(self._rpc(b, "mirror_clocks", timeout=PROBE_TIMEOUT_S, job_id=job.cfg.job_id,
                                                   shards=behind[b]) for b in buddies), return_exceptions=True)
        for b, r in zip(buddies, answers):
            if isinstance(r, Exception) or r.get("status") != "OK":
                logger.info("dscar: %s did not say which shard states it keeps: %r", b, r)
                continue
            drops = job.states_kept(b, {int(s): int(c) for s, c in r["clocks"]}, time.time())
            if drops:
                self._do(job, drops, polls=False)

    async def _perturbation(self, job: JobState, key: tuple[str, int], previous: str | None, target: str) -> None:
        """A ``partition-perturbation`` event, ``||restored - lost||`` and ``||lost||`` of a restored
        param partition, when its previous owner's loss was simulated (that process kept the lost
        values: a benchmark's measurement of SCAR's perturbation). Best effort: nothing on failure."""
        if previous not in self._simulated.get(job.cfg.job_id, ()) or job.cfg.kinds[key[0]] != "param":
            return
        try:
            r = await self._rpc(previous, "perturbation", timeout=PROBE_TIMEOUT_S * 4, job_id=job.cfg.job_id,
                                table=key[0], part=key[1], owner=target)
        except Exception as e:  # a measurement, not part of the recovery
            logger.info("dscar: could not measure the perturbation of %s: %r", key, e)
            return
        if r.get("status") == "OK":
            job.event(time.time(), "partition-perturbation", table=key[0], part=key[1],
                      perturbation=r["perturbation"], lost_norm=r["lost_norm"])

    def remove_worker(self, scheduler, worker: str, **kwargs) -> None:
        self._arrived.pop(worker, None)
        self._owners_known.pop(worker, None)
        self._generation += 1
        self._inflight.cancel(worker, self._generation)
        for job_id, job in list(self.jobs.items()):
            standby = self.elastic.standby(job_id)
            was_standing_by = worker in standby
            standby.discard(worker)
            effects = job.lose(worker, time.time())
            if not was_standing_by:
                self.elastic.refill(job, "loss")  # (before the recovery plans: a standby worker can take what it restores)
            self._do(job, effects)
        if self.jobs:  # messages to it on the other workers fail over now, not at their deadline
            self._removed.add(worker)
            asyncio.ensure_future(self._tell_peers("peer_lost", worker, self._generation))

    async def _tell_peers(self, op: str, worker: str, generation: int) -> None:
        await asyncio.gather(*(self._rpc(w, op, timeout=5, address=worker, generation=generation)
                               for w in list(self.scheduler.workers) if w != worker), return_exceptions=True)

    async def _h_simulate_loss(self, job_id: str, worker: str) -> dict:
        """Recover from ``worker`` exactly as from a crash, but keep the process: it forgets the job."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "ignored"}
        self._simulated.setdefault(job_id, set()).add(worker)
        self._do(job, job.lose(worker, time.time()))
        try:
            await self._rpc(worker, "forget", timeout=10, job_id=job_id)
        except (OSError, asyncio.TimeoutError):
            pass
        return {"status": "OK"}

    def add_worker(self, scheduler, worker: str) -> None:
        self._arrived[worker] = time.monotonic()  # (``START_GRACE_S``: not probed before its key, for a while)
        self._generation += 1
        self._inflight.revive(worker, self._generation)
        if worker in self._removed:  # a worker restarted at a removed one's address: reachable again
            self._removed.discard(worker)
            asyncio.ensure_future(self._tell_peers("peer_joined", worker, self._generation))
        for job_id, job in self.jobs.items():
            job.event(time.time(), "worker-joined", worker=worker)
            self._background(self.elastic.prepare_joiner(job_id, worker))
        self._wake()

    # -------------------------------------------------------- driver side
    @staticmethod
    def _report(job: JobState, clock: int, drop_older: bool = True) -> dict | None:
        """``clock``'s report for the driver (``JobState.report_for``) with when the clock finished
        (``finished_at``, this process's wall time), or None."""
        report = job.report_for(clock, drop_older)
        return None if report is None else {**report, "finished_at": job.tally.finished_at.get(clock)}

    def _reports_after(self, job: JobState, clock: int) -> list[dict]:
        """The reports of the clocks after ``clock`` that finished, in order, up to the first that has not
        (``_h_wait``'s ``more``). They are kept until the driver asks for a newer clock: an answer it did not
        get is sent again."""
        more = []
        while not job.failed and (report := self._report(job, clock + 1 + len(more), drop_older=False)) is not None:
            more.append(report)
        return more

    async def _h_wait(self, job_id: str, clock: int, timeout: float = 1.0, events_from: int = 0,
                      linger: float = 0.0) -> dict:
        """Long poll for the driver: the clock's report, a placement request, or pending. ``linger``: where the
        coordinator begins the next clocks itself, the answer goes no sooner than ``linger`` seconds after the
        ask, with the reports of the clocks after ``clock`` that finished meanwhile (``more``): a driver of short
        clocks then wakes once for several, not once a clock (each wake a thread hop in its process, on the
        scheduler's loop where the cluster is embedded). Each report says when its clock finished
        (``finished_at``, this process's wall time), which is how the driver times clocks read together."""
        asked = time.monotonic()
        deadline = asked + timeout
        while True:
            job = self.jobs.get(job_id)
            if job is None:
                return {"status": "failed", "error": self._unknown(job_id)}
            job.log.trim(events_from)  # (the driver holds those below its cursor)
            events = job.log.since(events_from)
            publish = [] if job.ledger is None else list(job.ledger.to_publish)
            if job.failed:
                return {"status": "failed", "error": job.error, "events": events}
            report = self._report(job, clock)
            if report is not None:
                left = asked + linger - time.monotonic()
                if left > 0 and report.get("next_begun"):
                    self.lingered += 1
                    await asyncio.sleep(left)
                    continue  # (the answer then carries the events and checkpoints of the linger too)
                return {**report, "publish": publish, "events": events, "more": self._reports_after(job, clock)}
            if not job.queue.reloadable:
                missing = [s for s in job.queue.unplaced() if job.queue.status(s).value == "todo"]
                if missing:
                    return {"status": "place", "shards": missing, "workers": self._live(job), "events": events,
                            "publish": publish}
            if publish:
                return {"status": "pending", "events": events, "publish": publish}
            left = deadline - time.monotonic()
            if left <= 0 or not await self._wait_change(left, driver=True):
                return {"status": "pending", "events": events, "publish": publish}
