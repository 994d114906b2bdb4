"""The shard runner: the worker's own thread that pulls work and runs it.

A thread of its own pulls work from the coordinator (``dscar_next``, a long
poll), so no Dask task is ever pinned to a worker. For a work item it runs the
batch's attempts one after another (members not started yet may be given back:
``release``, the ``dscar_release`` handler), stages each attempt's updates and
new shard state in the job's stores (``dscar.worker.partition_store``,
``dscar.worker.shard_store``), and commits those that succeeded in one ``dscar_commit``,
whose answer carries the next work item. It also runs clock-end steps, and
injects the faults of ``dscar.faults`` at the points of this thread.

It reaches the scheduler and other workers only through ``RunnerHost``, which
``dscar.worker.plugin.ParamServer`` implements: every message to a peer goes through a
connection pool with a short connect timeout and a deadline
(``dscar.rpc-timeout``), so a dead or hung peer fails the attempt in seconds.
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
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from .. import checkpoint as ckpt
from .. import wire
from ..algorithm import Algorithm, DataMeta, TableSpec
from ..errors import InvalidInputError
from ..inflight import PeerUnreachable
from ..core.apply_plan import INLINE_BYTES, rides_commit
from ..core.ledger import INITIAL_STATE
from .mirror_store import MirrorStore, mirror_answer, shard_key
from .partition_store import PartitionStore, touched_parts
from ..core.protocol import ClockEndOutcome, Commit, CommitAnswer, Finished, Stopped, WorkItem
from .pull_cache import SMALL, PullCache
from ..core.partitions import TableLayout, by_owner
from .shard_store import ShardEntry, ShardStore
from ..xp import synchronize, to_host

from distributed.protocol import to_serialize

logger = logging.getLogger("dscar.worker.runner")  # under dscar.worker: one name quiets both

#: tables of at most this many bytes are read whole, all of them in one message per owner
SMALL_TABLE_BYTES = 1 << 20
#: a shard step reads the small tables whole while they have at most this many owners besides its worker;
#: past that it reads the rows it asks for, from their owners, as a large table's: every worker asking every
#: owner each clock is W^2 messages a clock (63 a worker at W = 64, 4,032 in all: ``bench.elastic --hollow``)
WHOLE_READ_OWNERS = 8

#: seconds a work item of a clock that began with the previous clock's last apply waits for that apply here
#: before its attempts fail (the coordinator sends it at once, and again to a worker it could not reach)
APPLY_WAIT_S = 60.0


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
    #: names ``owners`` (``PartitionMap.token``): this worker's requests say it, and a work item then leaves
    #: the map out while it is the same (None: not named, the next item carries it)
    owners_token: str | None = None
    #: the rows pulled here, shared by the attempts run here while they serve their reads
    pull_cache: PullCache = field(default_factory=PullCache)
    #: ``(owners, whether a step reads the small tables whole)`` for the owners map it was decided on
    #: (``ShardRunner.reads_small_whole``; the map is replaced, never changed in place)
    small_whole: tuple[dict, bool] | None = None
    #: stale-synchronous clocks: reduction tables are read per clock
    ssp: bool = False
    #: an attempt whose staged updates hold at most this many bytes sends them with its commit
    #: (``apply_plan.rides_commit``; the job's spec carries the fit's ``dscar.apply-inline-bytes``)
    inline_bytes: int = INLINE_BYTES
    clock_seen: int = 0  # the newest clock this worker was given work in (fault points outside attempts)
    run_seen: int = -1  # the newest run id this worker was given work in (an older pass's apply is stale)
    #: the newest run id the coordinator confirmed as issued (a write of it needs no question: ``membership``)
    run_confirmed: int = -1
    #: other workers' partitions and shard states kept here (the memory tier)
    mirrors: MirrorStore = field(default_factory=MirrorStore)
    #: set when the job ends here or the worker stops: a slowed attempt's sleep (``faults.slow``) ends
    #: with it rather than run into the next job
    ended: threading.Event = field(default_factory=threading.Event)
    #: a simulated loss's param partitions as they were lost (``forget``): what their restore is
    #: measured against (``dscar_perturbation``); a real crash leaves nothing to compare with
    forgotten: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    #: set once a simulated loss has set ``forgotten`` aside
    forgot: threading.Event = field(default_factory=threading.Event)
    #: the job's token (``dscar.core.membership``): every call about the job carries it
    token: str | None = None
    #: one BSP pass applied here at a time: a pass sent again (``Coordinator._apply``'s retry) waits for
    #: the first message's apply, then finds it applied (``PartitionStore.applied_run``)
    apply_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: the newest run whose BSP apply ended here, applied or not (``apply_ended``), and its condition: a work
    #: item of a clock that began with that apply is taken up once it ended (``wait_apply_ended``), and a read
    #: waiting for a pass learns it will not be applied (``ParamServer._until_applied``)
    applies_ended: int = -1
    apply_ended_cv: threading.Condition = field(default_factory=threading.Condition)

    def apply_pass(self, run: int, keys: list, workers: list, fetched: dict, reset: set, owned: dict,
                   me: str, drop_through: int, floor: int | None = None) -> dict:
        """Apply the pass of ``run`` to both stores at once (their shared lock): the committed
        attempts' updates (``keys``: ``(clock, shard, attempt)``, run on ``workers``;
        ``PartitionStore.apply_pass``), then their shard states (``ShardStore.install``, which
        drops the pending states of clocks up to ``drop_through``). A pass older than the newest
        work given here is stale: the machine moved on (a loss), and installing it could drop a
        shard a newer attempt holds here. SSP: ``floor`` is the newest finished clock."""
        with self.tables.lock:
            if run < self.run_seen:
                return {"status": "stale"}
            applied = self.tables.apply_pass(run, keys, fetched, reset, owned, floor)
            self.shards.install([(s, a, w, c) for (c, s, a), w in zip(keys, workers)], me, drop_through, run)
        return {"applied": applied}

    def apply_ended(self, run: int) -> None:
        """This worker's apply of the BSP pass of ``run`` ended (applied, refused or cut short)."""
        with self.apply_ended_cv:
            self.applies_ended = max(self.applies_ended, run)
            self.apply_ended_cv.notify_all()

    def wait_apply_ended(self, run: int, timeout: float, stop: threading.Event) -> bool:
        """Block until this worker's apply of the BSP pass of ``run`` ended, for at most ``timeout`` seconds
        (less where the job ends or ``stop`` is set: those are looked at every 0.1 s); whether it ended."""
        deadline = time.monotonic() + timeout
        with self.apply_ended_cv:
            while self.applies_ended < run:
                left = deadline - time.monotonic()
                if left <= 0 or self.ended.is_set() or stop.is_set():
                    return False
                self.apply_ended_cv.wait(min(left, 0.1))
        return True

    def settle_before(self, run: int, clock: int) -> None:
        """A BSP work item of ``run`` in ``clock`` was taken up: every older pass was applied or voided,
        so what attempts staged under an older run, and the pending states of older clocks, can go.
        A worker with nothing to apply gets no apply message (``apply_plan.apply_receivers``): this
        is where it drops them."""
        with self.tables.lock:
            for key in [k for k, (r, _) in self.tables.staged.items() if r < run]:
                del self.tables.staged[key]
            for key in [k for k in self.shards.pending if k[0] < clock]:
                del self.shards.pending[key]

    def lost_race(self, attempt: "list | tuple | None", part: tuple[str, int] | None = None) -> bool:
        """Whether the attempt ``[run, clock, shard]`` can no longer commit, as this worker's stores
        tell (``part``: a partition it reads; None: the stores as a whole): another attempt of its
        shard won and was applied here. What it would read here now is not what it started from:
        it stops quietly (``LostRace``) rather than run into an error. None: no such check."""
        if attempt is None:
            return False
        run, clock, shard = (int(x) for x in attempt)
        with self.tables.lock:
            return (self.shards.lost(shard, run, clock)
                    or self.tables.settled(part, run, clock, shard, self.ssp))


class RunnerHost(Protocol):
    """What the runner needs of its worker (``ParamServer``): messages, and the worker's life."""

    #: this worker's address
    address: str
    #: set when the worker stops: the runner's thread ends
    stop: threading.Event
    #: an in-process cluster (``inproc://``): faults close or stall this worker, not the process
    in_process: bool

    def job(self, job_id: str) -> Job: ...
    def register(self) -> bool: ...
    def call(self, op: str, **kw) -> Any: ...
    def peer(self, address: str, op: str, **kw) -> dict: ...
    def peer_all(self, calls: list[tuple[str, str, dict]]) -> list[dict]: ...
    def closing(self) -> bool: ...
    def close_worker(self) -> None: ...
    def peer_gone(self, address: str) -> bool: ...
    def owners_known(self) -> dict[str, str]: ...


class ShardRunner:
    """Runs the work items the coordinator hands this worker, on a thread of its own."""

    def __init__(self, host: RunnerHost, poll_timeout: float | None = None):
        self.host = host
        #: seconds a ``dscar_next`` long poll waits for work (None: the coordinator's
        #: ``idle_poll_timeout``, scaled to Dask's heartbeat interval)
        self.poll_timeout = poll_timeout
        #: guards the release bookkeeping below and a job's per-item fields (owners, pull cache)
        self._lock = threading.RLock()
        #: (job, shard, attempt) of the running batch's members not started yet (``dscar_release``)
        self._unstarted: set[tuple[str, int, int]] = set()
        #: [shard, attempt] of the running batch's members given back: its commit names them
        self._given_back: list[list[int]] = []
        #: job -> id of the newest work item of it this runner has taken up
        self._item_seen: dict[str, int] = {}
        #: (job, item, shard, attempt) given back before their item reached this runner: when it
        #: does, they are skipped (the coordinator handed them to another worker meanwhile)
        self._released_early: set[tuple[str, int, int, int]] = set()

    def loop(self) -> None:
        """The worker's own thread: ask for work (a long poll), run it, commit; until stopped."""
        addr = self.host.address
        item: dict | None = None
        registered = False  # this worker's key is known to the coordinator (``dscar_hello``)
        while not self.host.stop.is_set():
            if item is None:
                try:
                    if not registered:
                        registered = self.host.register()
                        if not registered:  # not known to the scheduler yet
                            self.host.stop.wait(0.2)
                            continue
                    item = self.host.call("next", worker=addr, timeout=self.poll_timeout,
                                          owners_known=self.host.owners_known())
                except Exception as e:  # scheduler not ready, closing, no coordinator yet, or a new one
                    if self.host.stop.is_set() or self.host.closing():
                        return
                    logger.debug("dscar_next failed: %r", e)
                    registered = False
                    self.host.stop.wait(0.2)
                    continue
            op = item.get("op")
            try:
                if op in ("shard", "rebuild"):
                    item = self._run_shards(item)  # the commit's answer carries the next item
                elif op == "clock_end":
                    self._run_clock_end(item)
                    item = None
                else:
                    item = None
            except Exception as e:  # outside an attempt and a clock end, whose errors are reported as theirs
                self._runner_failed(item, e)
                item = None

    def _runner_failed(self, item: dict, e: Exception) -> None:
        """An error of the engine's own code on this worker, after an item's commit (its write-back):
        the job fails with it. The thread lives on for other jobs; had it ended, the worker would
        stop asking for work while staying alive, and a job whose every worker hit the error would
        wait for ever."""
        logger.error("dscar runner: %s item of job %s failed", item.get("op"), item.get("job"), exc_info=e)
        try:
            self.host.call("runner_failed", job_id=item.get("job"), worker=self.host.address, error=_last_frames(e))
        except Exception:
            pass  # the coordinator is gone: the job ends with it

    def _await_apply(self, job: Job, item: dict) -> None:
        """An item of a clock that began with the previous clock's last apply (``prev_run``), where that apply is
        sent to this worker too (``apply_here``), is taken up once it ended here: its steps read the tables and
        shard states it leaves. Before the item's members are noted as unstarted: that apply skips those of the
        batch it belongs to (``pass_applied``)."""
        prev = item.get("prev_run")
        if item.get("apply_here") and not job.wait_apply_ended(int(prev), APPLY_WAIT_S, self.host.stop):
            if self.host.stop.is_set() or job.ended.is_set():
                raise _Stopped
            raise RuntimeError(f"the apply of pass {prev} did not end on {self.host.address} within {APPLY_WAIT_S} s")

    def _prepare(self, job: Job, item: dict) -> None:
        """Take ``item`` up: its owners map, pull cache and run. Under BSP, what attempts staged under older runs
        goes, but that of the previous clock's last pass where this clock began with its apply (``prev_run``):
        its owners may still be collecting it."""
        prev = item.get("prev_run")
        with self._lock:
            if item.get("ahead") and job.run_seen > int(item["run"]):
                pass  # a clock end ahead of the next clock, whose items already set the owners and the pull cache
            elif "owners" in item:
                job.owners = {(t, int(p)): w for t, p, w in item["owners"]}
                job.owners_token = item.get("owners_token")
            elif item.get("owners_token") != job.owners_token:  # (left out only where this worker said it held them)
                raise RuntimeError(f"work item {item.get('item')} of job {job.id} names owners "
                                   f"{item.get('owners_token')} without them; this worker holds {job.owners_token}")
            if not (item.get("ahead") and job.run_seen > int(item["run"])):
                job.pull_cache.prepare(item)
            job.clock_seen = max(job.clock_seen, int(item["clock"]))
            job.run_seen = max(job.run_seen, int(item["run"]))
        if not job.ssp:
            job.settle_before(int(item["run"] if prev is None else prev), int(item["clock"]))

    def _run_shards(self, item: dict) -> dict | None:
        """Run a work item's attempts, then commit those that succeeded in one message; return
        the next work item the commit's answer carried (None: ask)."""
        attempts = WorkItem.from_msg(item).attempts()
        try:
            job = self.host.job(item["job"])
            self._await_apply(job, item)
        except _Stopped:
            return None
        except Exception as e:  # the job is unknown here, or the apply did not come: every attempt failed
            for a in attempts:
                self._fail(a, e)
            return None
        commits: list[Finished] = []
        stopped: list[Stopped] = []  # attempts stopped as lost races (``LostRace``): the coordinator hears of them
        staged: dict[tuple[int, int], list] = {}  # (shard, clock) -> the updates its attempt staged here
        with self._lock:  # the members after the first may be released to another worker until they start
            early = self._take_up(item)
            self._unstarted = {(item["job"], a["shard"], a["attempt"]) for a in attempts[1:]
                               if (a["shard"], a["attempt"]) not in early}
            self._given_back = [list(m) for m in sorted(early)]
        try:
            self._prepare(job, item)
            n_parts = {t: lay.n_parts for t, lay in job.layouts.items()}
            voided = None
            for i, a in enumerate(attempts):
                with self._lock:
                    key = (item["job"], a["shard"], a["attempt"])
                    if i and key not in self._unstarted:
                        continue  # released: the coordinator gave it to another worker
                    self._unstarted.discard(key)
                voided = voided or self._voided(job, item)
                if voided:  # (its step would run for nothing, and hold back the run that replaced it)
                    self._fail(a, RuntimeError(voided))
                    continue
                began = time.perf_counter()
                try:
                    done = self._attempt(job, a)
                except LostRace as e:
                    logger.debug("dscar shard %s clock %s: attempt %s stopped: %s", a["shard"], a["clock"],
                                 a["attempt"], e)
                    stopped.append(Stopped(a["shard"], a["attempt"], a["clock"], time.perf_counter() - began))
                    continue
                if done is not None:
                    timings, staged[a["shard"], a["clock"]], moved = done
                    ups = staged[a["shard"], a["clock"]]
                    touched = touched_parts(ups, n_parts)
                    # (updates to partitions owned here only are applied here: nothing to send, nothing to fetch)
                    inline = None if owned_here(touched, job.owners, self.host.address, n_parts) \
                        else inline_updates(ups, job.inline_bytes)
                    # (inline updates go to their owners whole: they need no partitions in the commit)
                    commits.append(Finished(a["shard"], a["attempt"], a["clock"], timings,
                                            None if inline is not None else touched, moved, inline))
        except _Stopped:
            return None
        except Exception as e:  # the job is unknown here: every attempt failed
            for a in attempts:
                self._fail(a, e)
            return None
        with self._lock:
            given_back, self._given_back = self._given_back, []
        if not commits and not given_back and not stopped:
            return None
        # under BSP the grants matter only with the next item: the commit waits for it (one round trip)
        commit = Commit(item["job"], item["clock"], item["run"], self.host.address, commits, item["op"] == "rebuild",
                        given_back, stopped, wait=not job.ssp, wait_timeout=self.poll_timeout,
                        owners_known=self.host.owners_known())
        try:
            answer = CommitAnswer.from_msg(self.host.call("commit", **commit.to_msg()))
        except Exception as e:
            sent = {(c.shard, c.attempt) for c in commits}
            for a in attempts:
                if (a["shard"], a["attempt"]) in sent:
                    self._fail(a, e)
            return None
        if job.ssp and item["op"] == "shard":
            self._write_back(job, item["run"], [(c.shard, c.clock, c.attempt)
                                                for c, ok in zip(commits, answer.granted) if ok], staged)
        return answer.next

    def _voided(self, job: Job, item: dict) -> str | None:
        """Why the item's attempts cannot commit, or None: a loss voided its run (the coordinator's run
        is newer). A worker learns of a loss at once (``dscar_peer_lost``) but of the new run only with
        its next item, so the members of a batch handed out before a loss would each run their step
        and then fail, reading from the lost owner, while the requeued shards wait for this worker.
        The coordinator is asked only when an owner in the item's map is gone."""
        gone = sorted({w for w in job.owners.values() if self.host.peer_gone(w)})
        if not gone:
            return None
        current = self.refresh_owners(job, int(item["run"]))
        if current is None or current <= int(item["run"]):
            return None
        return (f"not started: run {item['run']} was voided by the loss of {', '.join(gone)} "
                f"(the job's run is {current})")

    def refresh_owners(self, job: Job, run: int) -> int | None:
        """The job's run once no recovery is under way (None: the coordinator did not answer). Under BSP,
        while it is still ``run`` (a loss that kept the pass: ``dscar.core.clock``), the owners its
        recovery restored the lost partitions on replace the item's (``job.owners``): what the pass
        reads is where it is now."""
        try:
            r = self.host.call("run", job_id=job.id, worker=self.host.address, owners=True)
        except Exception:  # noqa: BLE001 - the coordinator did not answer: as before, the item's map
            return None
        current = r.get("run")
        if current is not None and int(current) == run and not job.ssp and r.get("owners"):
            with self._lock:
                if job.run_seen <= run:
                    job.owners = {(t, int(p)): w for t, p, w in r["owners"]}
                    job.owners_token = r.get("owners_token")
        return None if current is None else int(current)

    def _write_back(self, job: Job, run: int, granted: list[tuple[int, int, int]], staged: dict) -> None:
        """Add this worker's granted SSP updates to its pulled copy (``PullCache.write_back``): its
        next attempts of those shards read their own writes without pulling the tables again."""
        bounds = {t: job.layouts[t].bounds for t, spec in job.specs.items() if spec.kind == "param"}
        with self._lock:
            if job.pull_cache.run != run:
                return
            for shard, clock, attempt in granted:
                job.pull_cache.write_back(shard, clock, attempt, staged[shard, clock], bounds, job.xp)

    def _attempt(self, job: Job, item: dict) -> tuple[dict, list, bool] | None:
        """Run one attempt and stage its results; its timings, staged updates and whether it moved its
        shard's data or state (``protocol.Finished.moved``), or None when it failed (reported).
        ``LostRace`` when it stopped because another attempt of its shard won."""
        clock, shard, attempt, run = item["clock"], item["shard"], item["attempt"], item["run"]
        lost_data, began = False, time.perf_counter()
        # the attempt's reads stop it once another attempt of its shard is applied where it reads (under
        # SSP the window's rebuild pass reuses clocks: its attempts are not raced)
        race = [run, clock, shard] if not job.ssp or item["op"] == "shard" else None
        try:
            self._inject(job, clock, "start", item.get("phase"))
            t0 = time.perf_counter()
            _check_race(job, race)
            held = job.shards.get(shard)
            entry = self._shard_entry(job, shard, item.get("fetch_from"), item.get("backup", False), race,
                                      item.get("prev_run"))
            if entry is None:
                lost_data = not item.get("backup", False)  # a backup's miss: the primary still holds the data
                raise LookupError(f"the data of shard {shard} is on no live worker")
            if item.get("state_file"):  # a recovery restores this shard's state from a checkpoint
                self._restore_state(job, shard, entry, item)
            ctx = ShardStep(self, job, clock, shard, entry.state, item.get("batch_scale", 1.0), item.get("phase"),
                            item.get("restored"), race, item.get("prev_run"))
            c1, t1 = time.thread_time(), time.perf_counter()
            if item["op"] == "rebuild":
                job.algorithm.rebuild_step(ctx, entry.data)
            else:
                job.algorithm.shard_step(ctx, entry.data)
            synchronize(job.xp)  # on a GPU, compute_s is the step's kernels, not their launches
            c2, t2 = time.thread_time(), time.perf_counter()
            slow = self._slowdown(job, clock)
            if slow > 1:
                job.ended.wait((slow - 1) * (t2 - t1))
                t2 = time.perf_counter()
            key = (clock, shard, attempt)
            job.shards.stage_state(key, entry, ctx.new_state)  # installed when the pass is applied, if it commits
            staged = self._stage(job, key, run, ctx.updates, ctx.phase)
            t3 = time.perf_counter()
            moved = entry is not held or bool(ctx.new_state) or bool(item.get("state_file"))
            return {"data_s": t1 - t0, "pull_s": ctx.pull_s, "compute_s": t2 - t1 - ctx.pull_s,
                    "compute_cpu_s": c2 - c1 - ctx.pull_cpu_s, "push_s": t3 - t2}, staged, moved
        except (_Stopped, LostRace):  # (a lost race is reported with the item's commit: ``_run_shards``)
            raise
        except Exception as e:
            self._fail(item, e, lost_data, time.perf_counter() - began)
            return None

    def _fail(self, item: dict, error: BaseException, lost_data: bool = False, seconds: float = 0.0) -> None:
        """Tell the coordinator an attempt failed after ``seconds`` of work (it counts toward the
        shard's failure limit)."""
        logger.info("dscar shard %s clock %s failed: %r", item["shard"], item["clock"], error)
        try:
            self.host.call("fail", job_id=item["job"], clock=item["clock"], run=item["run"],
                       shard=item["shard"], attempt=item["attempt"], worker=self.host.address, lost_data=lost_data,
                       seconds=seconds,
                       error="".join(traceback.format_exception_only(type(error), error)).strip())
        except Exception:
            pass

    def _restore_state(self, job: Job, shard: int, entry: ShardEntry, item: dict) -> None:
        """Replace the shard's state by its copy in a buddy's memory (the memory tier) or its
        checkpointed one, or by none (a full rollback to a version that never saved it); a corrupt or
        missing copy leaves no state (the algorithm's rebuild step then re-creates it) and says so in
        an event."""
        source = item["state_file"]
        state = None
        if source == INITIAL_STATE:
            source = None
        elif "memory" in source:
            try:
                r = (mirror_answer(job.mirrors.get(shard_key(shard))) if source["memory"] == self.host.address
                     else self.host.peer(source["memory"], "get_mirror", job_id=job.id, key=shard_key(shard)))
                if r.get("status") == "OK":
                    state = {k: np.array(v) for k, v in r["value"].items()}
                    ckpt.check_state(state, job.algorithm.shard_state(entry.data), shard,
                                     f"the memory copy on {source['memory']}")
            except ckpt.CorruptCheckpointError as e:  # a wrong copy: the file, if any
                self._report(job, item["clock"], "checkpoint-corrupt", shard=shard, error=str(e))
                state = None
            except Exception as e:  # the buddy is gone: the file, if any
                logger.info("could not copy shard %s's state from %s: %r", shard, source["memory"], e)
            source = source.get("file")
        if state is None and source:
            try:
                fs, root = ckpt.fs_and_root(item["ckpt_url"], item.get("storage_options"))
                state = ckpt.read_state(fs, root, source, shard, job.algorithm.shard_state(entry.data))
            except ckpt.CorruptCheckpointError as e:
                self._report(job, item["clock"], "checkpoint-corrupt", shard=shard, error=str(e))
        entry.state = {k: job.xp.asarray(v) for k, v in (state or {}).items()}

    def _shard_entry(self, job: Job, shard: int, fetch_from: str | None, backup: bool,
                     race: list | None = None, settled: int | None = None) -> ShardEntry | None:
        """The shard's data and state: held here, copied from its holder, or read from the source.

        Every attempt, a backup too, keeps what it fetched: its worker becomes the holder when it
        commits, and a loss may void the pass before it is applied, so the shard must be here
        then. The holder keeps its own copy until the pass is applied (``ShardStore.install``
        drops the copies of every worker but the winner's)."""
        entry = job.shards.claim(shard, fetch_from, backup)
        if entry is not None:
            return entry
        arrays, state = None, {}
        if fetch_from and fetch_from != self.host.address:
            try:
                r = self.host.peer(fetch_from, "copy_shard", job_id=job.id, shard=shard,
                                   **({} if race is None else {"race": race}), **_settled(settled))
                if r["status"] == "lost-race":  # the holder applied another attempt's commit of it
                    raise LostRace(f"{fetch_from} applied another attempt of shard {shard}")
                if r["status"] == "not-applied":  # (its state may not be the one the last apply installs)
                    raise NotApplied(f"{fetch_from}: {r.get('error')}")
                if r["status"] == "OK":
                    arrays, state = r["arrays"], r["state"]
            except LostRace:
                raise
            except Exception as e:  # the holder is gone: fall back to the source
                logger.info("could not copy shard %s from %s: %r", shard, fetch_from, e)
        if arrays is None and job.loader is not None:
            arrays = job.loader.load_shard(shard)
        if arrays is None:
            return None
        entry = ShardEntry(job.algorithm.prepare_shard(arrays, job.xp), {k: job.xp.asarray(v) for k, v in state.items()})
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

    @staticmethod
    def due(job: Job, clock: int, point: str, phase: str | None = None) -> list:
        """The kill/hang/lose faults due at ``point`` (fired once each). A clock end's are its clock's: it may
        run while this worker already runs the next clock (``dscar.core.clock``: a clock end ahead)."""
        clock = clock if point == "clock-end" else max(clock, job.clock_seen)
        due = [f for f in job.faults if f.kind in ("kill", "hang", "lose") and f.clock <= clock and f.point == point
               and f not in job.fired and f.phase in (None, phase)]
        job.fired.update(due)
        return due

    def _inject(self, job: Job, clock: int, point: str, phase: str | None = None) -> None:
        """Injected faults due at ``point`` of the shard runner's thread (an attempt, a clock-end step)."""
        for f in self.due(job, clock, point, phase):
            info = {"point": point, **({"pid": os.getpid()} if f.kind == "hang" else {})}
            self._report(job, clock, f"fault-{f.kind}", **info)
            if f.kind == "kill":
                self._die()
            elif f.kind == "lose":  # simulated loss: the coordinator recovers as from a crash
                self.host.call("simulate_loss", job_id=job.id, worker=self.host.address)
                raise _Stopped
            else:
                self._hang()

    def _report(self, job: Job, clock: int, kind: str, **info) -> None:
        try:
            self.host.call("event", job_id=job.id, clock=clock, kind=kind,
                       worker=self.host.address, info=info)
        except Exception:
            pass

    def _in_process(self) -> bool:
        return self.host.address.startswith("inproc://")

    def _die(self) -> None:
        if not self.host.in_process:
            os._exit(1)
        self.host.close_worker()  # in-process cluster: close this worker, keep the process
        raise _Stopped

    def _hang(self) -> None:
        if not self.host.in_process:
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        while not self.host.stop.is_set():  # in-process: only this worker's loop stops
            self.host.stop.wait(0.05)
        raise _Stopped

    def _stage(self, job: Job, key: tuple, run: int, updates: list, phase: str | None = None) -> list:
        """Keep the attempt's updates here until its pass is applied: the owners collect the
        committed ones then (one message per worker and pass, not one per shard and owner)."""
        staged = job.tables.stage(key, run, updates)
        self._inject(job, key[0], "mid-push", phase)  # staged, not yet committed
        return staged

    def _clock_end(self, job: Job, ctx: ClockEnd) -> dict[str, float]:
        """The algorithm's clock-end step, its writes sent: its metrics."""
        metrics = job.algorithm.clock_end(ctx)
        ctx.flush()
        metrics = {str(k): float(v) for k, v in dict(metrics).items()}
        if "objective" not in metrics:
            raise ValueError(f"{type(job.algorithm).__name__}.clock_end returned no 'objective'")
        return metrics

    def clock_end_here(self, item: dict, first_read: Future | None = None) -> dict:
        """The clock end folded into this worker's apply of the clock's last pass (``item``, a
        clock-end item), run once that apply is done: its outcome (``protocol.ClockEndOutcome``) goes
        back with the apply's answer instead of a ``clock_done`` or ``clock_failed`` message.
        Where it did not run (stopped by a fault, an owner that had not applied in time, nothing
        written yet) the coordinator hands the clock end out as an item instead. ``first_read``:
        the other owners' answers to its first read (``clock_end_reads``), sent as the apply began."""
        clock, ctx = item["clock"], None
        try:
            job = self.host.job(item["job"])
            self._prepare(job, item)
            self._inject(job, clock, "clock-end")
            t0 = time.perf_counter()
            ctx = ClockEnd(self, job, clock, item["run"], folded=True, first_read=first_read, ahead=bool(item.get("ahead")))
            metrics = self._clock_end(job, ctx)
            return ClockEndOutcome(metrics=metrics, seconds=time.perf_counter() - t0).to_msg()
        except _Stopped:
            return ClockEndOutcome(not_run="stopped").to_msg()
        except NotApplied as e:
            if ctx is None or not ctx.wrote:
                return ClockEndOutcome(not_run=str(e)).to_msg()
            error: BaseException = e
        except Exception as e:
            error = e
        logger.warning("dscar clock_end of clock %s (folded) failed: %r", clock, error)
        return ClockEndOutcome(error=_last_frames(error), unreachable=_unreachable_peer(error)).to_msg()

    def _run_clock_end(self, item: dict) -> None:
        job_id, clock = item["job"], item["clock"]
        try:
            job = self.host.job(job_id)
            self._prepare(job, item)
            self._inject(job, clock, "clock-end")
            t0 = time.perf_counter()
            metrics = self._clock_end(job, ClockEnd(self, job, clock, item["run"]))
            self.host.call("clock_done", job_id=job_id, clock=clock, run=item["run"], worker=self.host.address,
                           metrics=metrics, seconds=time.perf_counter() - t0)
        except _Stopped:
            return
        except Exception as e:
            logger.warning("dscar clock_end of clock %s failed: %r", clock, e)
            peer = _unreachable_peer(e)  # a read from a worker that died: a loss not yet noticed, not a bug
            try:
                self.host.call("clock_failed", job_id=job_id, clock=clock, run=item["run"], worker=self.host.address,
                               error=_last_frames(e), **({} if peer is None else {"unreachable": peer}))
            except Exception:
                pass

    # --------------------------------------------------- table row access
    def read_rows(self, job: Job, table: str, start: int, stop: int | None, clock: int | None = None,
                  own: PullCache | None = None, race: list | None = None, after: int | None = None,
                  settled: int | None = None):
        """Global rows ``[start, stop)`` of ``table``, gathered from their owners (under SSP a
        reduction table's sums of ``clock``; ``own``: the pull cache whose written-back updates
        the rows must hold, ``PullCache.patch``; ``race``: ``[run, clock, shard]`` of the attempt
        reading, which stops (``LostRace``) where another attempt of its shard was applied;
        ``after``: a folded clock end's run, each owner answers once it applied that pass; ``settled``: the
        previous clock's last pass, when this clock began with its apply: each owner answers once that ended)."""
        layout = job.layouts[table]
        stop = layout.n_rows if stop is None else stop
        mine = None if own is None else own.mine()
        spans = [(part, lo - layout.bounds[part][0], hi - layout.bounds[part][0], job.owners[(table, part)])
                 for part, lo, hi in layout.split(start, stop)]
        # every remote owner at once: a read spanning W owners costs one round trip, not W in a row
        remote = [(part, owner) for part, _, _, owner in spans if owner != self.host.address]
        replies = dict(zip(remote, self.host.peer_all([
            (owner, "pull", {"job_id": job.id, "table": table, "part": part, "lo": lo, "hi": hi, "clock": clock,
                             "mine": mine, "race": race, **_after(after), **_settled(settled)})
            for part, lo, hi, owner in spans if owner != self.host.address]))) if remote else {}
        if len(spans) > 1 and not mine:  # each piece copied once, where it goes
            spec = job.specs[table]
            out = job.xp.empty((stop - start, *spec.trailing), dtype=spec.dtype)
            at = 0
            for part, lo, hi, owner in spans:
                if owner == self.host.address:
                    with job.tables.lock:
                        _check_race(job, race, (table, part))
                        job.tables.rows_into(out[at:at + hi - lo], table, part, lo, hi, clock)
                else:
                    out[at:at + hi - lo] = job.xp.asarray(_answered(replies[part, owner], owner, table, part)["data"])
                at += hi - lo
            return out
        pieces = []
        for part, lo, hi, owner in spans:
            if owner == self.host.address:
                with job.tables.lock:
                    _check_race(job, race, (table, part))
                    piece = job.tables.rows(table, part, lo, hi, clock)
                    held = job.tables.held((table, part), *mine) if mine else []
            else:
                r = _answered(replies[part, owner], owner, table, part)
                piece, held = job.xp.asarray(r["data"]), r.get("held", [])
            pieces.append(own.patch(piece, table, part, lo, held, job.xp) if mine else piece)
        if len(pieces) == 1:
            return pieces[0]
        return job.xp.concatenate(pieces) if pieces else job.xp.zeros((0, *job.specs[table].trailing))

    def is_small(self, job: Job, table: str) -> bool:
        spec = job.specs[table]
        return spec.n_rows * int(np.prod(spec.trailing)) * np.dtype(spec.dtype).itemsize <= SMALL_TABLE_BYTES

    def small_parts(self, job: Job) -> list[tuple[str, int]]:
        """Every partition of every small table (``is_small``), table by table."""
        return [(t, p) for t in job.specs if self.is_small(job, t) for p in range(job.layouts[t].n_parts)]

    def reads_small_whole(self, job: Job) -> bool:
        """Whether a shard step's pull of a small table reads every small table whole (one message per
        owner, once a pass): while their owners other than this worker are at most ``WHOLE_READ_OWNERS``."""
        owners = job.owners
        if job.small_whole is None or job.small_whole[0] is not owners:
            others = set(by_owner(owners, self.small_parts(job))) - {self.host.address}
            job.small_whole = (owners, len(others) <= WHOLE_READ_OWNERS)
        return job.small_whole[1]

    def read_small_tables(self, job: Job, clock: int | None = None, own: PullCache | None = None,
                          race: list | None = None, after: int | None = None,
                          replies: dict[str, dict] | None = None, settled: int | None = None) -> dict[str, Any]:
        """Every small table (``SMALL_TABLE_BYTES``), whole: the partitions held here copied, the
        others fetched with one message per owner, all owners at once. A small model's shard step
        or clock end reads several tables, and one message per table and owner is a round trip each.
        ``own``, ``race`` and ``after`` as for ``read_rows``; ``replies``: each other owner's answer
        to a clock end's first read (``clock_end_reads``), already fetched."""
        small = [t for t in job.specs if self.is_small(job, t)]
        remote = by_owner(job.owners, self.small_parts(job))
        mine = None if own is None else own.mine()
        pieces: dict[tuple[str, int], Any] = {}
        held: dict[tuple[str, int], list] = {}
        with job.tables.lock:
            for k in remote.pop(self.host.address, []):
                _check_race(job, race, k)
                pieces[k] = job.tables.rows(*k, 0, None, clock)
                held[k] = job.tables.held(k, *mine) if mine else []
        if remote:
            if replies is None:
                replies = self.host.peer_all([(o, "pull_many", {"job_id": job.id, "parts": [list(k) for k in keys],
                                                                "clock": clock, "mine": mine, "race": race,
                                                                **_after(after), **_settled(settled)})
                                              for o, keys in remote.items()])
            else:
                replies = [replies[o] for o in remote]
            for (owner, keys), r in zip(remote.items(), replies):
                r = _answered(r, owner, *keys[0])
                pieces.update((k, job.xp.asarray(d)) for k, d in zip(keys, wire.decode(r["data"])))
                held.update(zip(keys, r.get("held", [[]] * len(keys))))
        if mine:
            pieces = {k: own.patch(v, *k, 0, held[k], job.xp) for k, v in pieces.items()}
        return {t: job.xp.concatenate([pieces[(t, p)] for p in range(job.layouts[t].n_parts)]) for t in small}

    def summarize(self, job: Job, table: str, clock: int | None = None, after: int | None = None,
                  replies: dict[str, dict] | None = None) -> list[list[np.ndarray]]:
        """The algorithm's ``summarize`` of every partition of ``table``, in row order, each run by
        the partition's owner (one message per other owner, all at once; ``after`` as for ``read_rows``;
        ``replies`` as for ``read_small_tables``, when they carry ``table``'s summaries)."""
        layout = job.layouts[table]
        remote = by_owner(job.owners, [(table, p) for p in range(layout.n_parts)])
        mine = [p for _, p in remote.pop(self.host.address, [])]
        out: dict[int, list] = {}
        if remote and replies is not None:
            for owner, keys in remote.items():
                r = _answered(replies[owner], owner, *keys[0])
                arrays = iter(wire.decode(r["summaries"]["data"]))
                for t, parts, counts in zip(r["summaries"]["tables"], r["summaries"]["parts"],
                                            r["summaries"]["counts"]):
                    got = [[next(arrays) for _ in range(n)] for n in counts]
                    if t == table:
                        out.update(zip(parts, got))
                if any(p not in out for _, p in keys):
                    raise LookupError(f"{owner} did not summarize every partition of {table} it owns")
        elif remote:
            replies = self.host.peer_all([(o, "summarize", {"job_id": job.id, "table": table,
                                                             "parts": [p for _, p in keys], "clock": clock,
                                                             **_after(after)})
                                          for o, keys in remote.items()])
            for (owner, keys), r in zip(remote.items(), replies):
                arrays = iter(wire.decode(_answered(r, owner, *keys[0])["data"]))
                out.update((p, [next(arrays) for _ in range(n)]) for (_, p), n in zip(keys, r["counts"]))
        if mine:
            got = job.tables.summarize(table, mine, job.algorithm.summarize, clock)
            if got is None:
                raise LookupError(f"{self.host.address} no longer holds a partition of {table}")
            out.update(zip(mine, got))
        return [out[p] for p in range(layout.n_parts)]

    def clock_end_reads(self, job: Job, owners: dict[tuple[str, int], str], clock: int | None = None,
                        after: int | None = None, reader: str | None = None) -> list[tuple[str, str, dict]]:
        """The messages of a clock end's first read, one per other owner (``owners``: the clock-end
        item's map): its partitions of every small table, and its summaries of the algorithm's
        ``clock_end_summaries``; what ``read_small_tables`` and ``summarize`` would ask in a
        message each, so the clock end's reads cost one round trip, not two. ``reader``: the worker
        reading (None: this one), as another owner works out what it will be asked."""
        summed = [t for t in job.algorithm.clock_end_summaries() if t in job.specs]
        parts = by_owner(owners, self.small_parts(job))
        sums = by_owner(owners, [(t, p) for t in summed for p in range(job.layouts[t].n_parts)])
        calls = []
        me = self.host.address if reader is None else reader
        for owner in [*parts, *(o for o in sums if o not in parts)]:
            if owner == me:
                continue
            asks = by_owner({k: k[0] for k in sums.get(owner, [])}, sums.get(owner, []))
            calls.append((owner, "pull_many", {"job_id": job.id, "parts": [list(k) for k in parts.get(owner, [])],
                                               "summarize": [[t, [p for _, p in ks]] for t, ks in asks.items()],
                                               "clock": clock, **_after(after)}))
        return calls

    def read_row_set(self, job: Job, table: str, rows, clock: int | None = None, race: list | None = None,
                     after: int | None = None, settled: int | None = None):
        """Arbitrary rows of ``table`` (in the order given), gathered from their owners (``race`` and
        ``after`` as for ``read_rows``)."""
        layout, spec = job.layouts[table], job.specs[table]
        rows = np.asarray(to_host(rows), dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= layout.n_rows):
            raise IndexError(f"rows outside table {table!r} of {layout.n_rows} rows")
        out = job.xp.empty((rows.shape[0], *spec.trailing), dtype=spec.dtype)
        part_of = np.searchsorted([b for _, b in layout.bounds], rows, side="right")
        wants = []  # (part, owner, positions in ``rows``, rows within the partition)
        for part in np.unique(part_of):
            sel = np.flatnonzero(part_of == part)
            wants.append((int(part), job.owners[(table, int(part))], sel, rows[sel] - layout.bounds[part][0]))
        remote = [(part, owner, local) for part, owner, _, local in wants if owner != self.host.address]
        replies = dict(zip([(p, o) for p, o, _ in remote], self.host.peer_all([  # every remote owner at once
            (owner, "pull", {"job_id": job.id, "table": table, "part": part, "rows": to_serialize(local),
                             "clock": clock, "race": race, **_after(after), **_settled(settled)})
            for part, owner, local in remote]))) if remote else {}
        for part, owner, sel, local in wants:
            if owner == self.host.address:
                with job.tables.lock:
                    _check_race(job, race, (table, part))
                    vals = job.tables.row_set(table, part, local, clock)
            else:
                vals = job.xp.asarray(_answered(replies[part, owner], owner, table, part)["data"])
            out[job.xp.asarray(sel)] = vals
        return out

    def write_rows(self, job: Job, table: str, values, start: int, run: int) -> dict[str, list]:
        """Write global rows from ``start`` for a clock end of pass ``run``: the partitions held
        here at once; the others' chunks are returned by owner (``(table, part, lo, data)``), for
        ``send_writes`` to send. A run older than this worker has seen (a recovery restored or
        rolled back since) writes nothing: ``LookupError``, and its clock is skipped."""
        if run < job.run_seen:
            raise LookupError(f"clock end of run {run} is stale (run {job.run_seen} seen here)")
        layout = job.layouts[table]
        values = to_host(values)
        remote: dict[str, list] = defaultdict(list)
        for part, lo, hi in layout.split(start, start + values.shape[0]):
            a = layout.bounds[part][0]
            chunk = np.ascontiguousarray(values[lo - start : hi - start])
            owner = job.owners[(table, part)]
            if owner == self.host.address:
                job.tables.assign(table, part, lo - a, chunk)
            else:
                remote[owner].append((table, part, lo - a, chunk))
        return remote

    def send_writes(self, job: Job, writes: dict[str, list], run: int, after: int | None = None) -> None:
        """One message per owner, all owners at once: a clock end that assigns several tables
        costs one round trip, not one per table and owner (``after`` as for ``read_rows``: a row
        written before its owner applied the pass would be added to by that apply)."""
        if not writes:
            return
        replies = self.host.peer_all([(o, "assign", {"job_id": job.id, "run": run,
                                                     "chunks": [[t, p, lo] for t, p, lo, _ in c],
                                                     "arrays": wire.encode([d for *_, d in c]), **_after(after)})
                                      for o, c in writes.items()])
        for owner, r in zip(writes, replies):
            if r.get("status") == "not-applied":
                raise NotApplied(f"{owner}: {r.get('error')}")
            if r.get("status") != "OK":
                raise LookupError(f"{owner} no longer holds a partition this clock end assigns")

    def pass_applied(self, job_id: str) -> None:
        """The pass of the running batch was applied (backups won its other members): the members
        not started yet can no longer commit, so they are skipped, not run for nothing."""
        with self._lock:
            self._unstarted = {k for k in self._unstarted if k[0] != job_id}

    def _take_up(self, item: dict) -> set[tuple[int, int]]:
        """Note ``item`` as this runner's newest of its job; the (shard, attempt) of its members
        given back before it came. Call with ``_lock`` held."""
        job_id, n = item["job"], item["item"]
        self._item_seen[job_id] = n
        early = {(s, a) for j, i, s, a in self._released_early if j == job_id and i == n}
        self._released_early = {k for k in self._released_early if k[0] != job_id or k[1] > n}
        return early

    def release(self, job_id: str, members: list, item: int) -> dict:
        """Give back the members (``[shard, attempt]``) of work item ``item`` not started yet: an idle
        worker runs them. An item not here yet (the coordinator asked before its answer came) gives
        back every member asked; one this runner is done with, none."""
        with self._lock:
            seen = self._item_seen.get(job_id, 0)
            if item > seen:
                out = [[int(s), int(a)] for s, a in members]
                self._released_early.update((job_id, item, s, a) for s, a in out)
            elif item < seen:
                out = []
            else:
                out = [[int(s), int(a)] for s, a in members if (job_id, int(s), int(a)) in self._unstarted]
                self._unstarted.difference_update((job_id, s, a) for s, a in out)
                self._given_back.extend(out)
        return {"released": out}


def _last_frames(e: BaseException) -> str:
    """The end of ``e``'s traceback (its last frame and the message): what a failed job reports."""
    return "".join(traceback.format_exception(type(e), e, e.__traceback__)[-3:]).strip()


def _unreachable_peer(error: BaseException) -> str | None:
    """The worker ``error`` (or an exception it was raised from, as a model may wrap it) failed to
    reach, if that is why it was raised."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, PeerUnreachable):
            return error.address
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _answered(reply: dict, owner: str, table: str, part: int) -> dict:
    """A pull's answer, or a ``LookupError`` when the owner no longer holds the partition (its job ended,
    the partition moved): the attempt fails and is retried or dropped like any other; ``LostRace``
    when the owner already applied another attempt of the reader's shard."""
    if reply.get("status") == "lost-race":
        raise LostRace(f"{owner} applied another attempt of the shard to {table}/{part}")
    if reply.get("status") == "not-applied":
        raise NotApplied(f"{owner}: {reply.get('error')}")
    if reply.get("status", "OK") != "OK":
        raise NotHeld(owner, f"{owner} no longer holds {table}/{part}")
    return reply


class NotHeld(LookupError):
    """An owner a read went to does not hold the partition (it moved, or its owner was lost and
    kept its process: a simulated loss)."""

    def __init__(self, owner: str, message: str):
        super().__init__(message)
        self.owner = owner


def _after(run: int | None) -> dict:
    """A read's or write's ``after`` field, sent only by a folded clock end (other messages stay as they were)."""
    return {} if run is None else {"after": run}


def _settled(run: int | None) -> dict:
    """A step's read's ``settled`` field, sent only where its clock began with the previous clock's last apply."""
    return {} if run is None else {"settled": run}


class NotApplied(LookupError):
    """A folded clock end's read or write reached an owner that did not apply the clock's last
    pass in time, or will not (``ParamServer._until_applied``): the clock end did not run there."""


class _Stopped(Exception):
    """This attempt stops quietly: the worker was stopped by an injected fault, or its job ended."""


class LostRace(Exception):
    """This attempt stops: another attempt of its shard won and was applied (``Job.lost_race``), so
    what it would read now is not what it started from. No error is reported (it could not commit);
    the item's commit names it (``stopped``), so were the verdict wrong, the coordinator runs the
    shard again: a wrong verdict costs one attempt, never the fit."""


def _check_race(job: Job, race: list | None, part: tuple[str, int] | None = None) -> None:
    if job.lost_race(race, part):
        raise LostRace(f"another attempt of shard {race[2]} of clock {race[1]} was applied here")


class ShardStep:
    """The ``ShardContext`` of one attempt: cached pulls, staged adds, staged state."""

    def __init__(self, server: ShardRunner, job: Job, clock: int, shard: int, state: dict, batch_scale: float,
                 phase: str | None = None, restored: dict | None = None, race: list | None = None,
                 settled: int | None = None):
        self._server, self._job = server, job
        #: the previous clock's last pass, when this clock began with its apply: owners answer once it ended there
        self._settled = settled
        #: ``[run, clock, shard]``: a read that finds another attempt of the shard applied stops this one
        self._race = race
        self.xp, self.clock, self.shard, self.meta, self.tol = job.xp, clock, shard, job.meta, job.tol
        self.phase = phase  # the data phase of the clock this step runs in (None: the algorithm has none)
        #: in a rebuild step, table -> row ranges a recovery restored from a checkpoint
        self.restored = {t: [(int(a), int(b)) for a, b in rs] for t, rs in (restored or {}).items()}
        self.state = dict(state)  # the shard's state as of its last commit (read-only)
        self.batch_scale = float(batch_scale)  # this worker's share of a fixed global batch
        self.new_state: dict = {}
        self.updates: list = []
        #: seconds this step spent fetching rows (wall), and of that this thread's CPU seconds
        self.pull_s, self.pull_cpu_s = 0.0, 0.0
        #: under SSP reduction tables are read per clock: a step sees the previous clock's sums
        self._sums = clock - 1 if job.ssp else None

    def set_state(self, name: str, value) -> None:
        """Replace the shard's state ``name``; kept only if this attempt commits."""
        self.new_state[name] = value

    def pull(self, table: str, start: int = 0, stop: int | None = None):
        """Rows of ``table`` as of this clock's (data phase's) start (cached for it; do not mutate)."""
        return self._read_on(self._pull, table, start, stop)

    def _read_on(self, read, *args):
        """``read(*args)``, and once more when it found an owner gone (or no longer holding what it read)
        in a pass that owner's loss kept (``ShardRunner.refresh_owners``): then its partitions are
        where the recovery restored them. Where this clock began with the previous clock's last apply
        (``_settled``), a read that found an owner still applying it (an owner answers within half
        ``rpc_timeout()``) is sent again, for up to ``APPLY_WAIT_S``: a long apply costs the step time,
        not an attempt."""
        deadline = time.monotonic() + APPLY_WAIT_S
        while True:
            try:
                return self._read_once(read, *args)
            except NotApplied:
                if self._settled is None or time.monotonic() > deadline:
                    raise

    def _read_once(self, read, *args):
        """``_read_on``'s read, and its one retry after a kept pass's loss."""
        try:
            return read(*args)
        except Exception as e:
            peer, run = _unreachable_peer(e) or getattr(e, "owner", None), (self._race or [None])[0]
            if peer is None or run is None or self._job.ssp or peer not in self._job.owners.values() \
                    or self._server.refresh_owners(self._job, int(run)) != int(run) \
                    or peer in self._job.owners.values():
                raise
        return read(*args)

    def _pull(self, table: str, start: int, stop: int | None):
        # under SSP a reduction table's read is its sums of one clock, and steps of several clocks share the cache
        sums = self._sums if self._job.specs[table].kind == "reduction" else None
        cache = self._job.pull_cache
        own = cache if self._job.ssp else None  # its written-back updates: the fetched rows must hold them
        t0, c0 = time.perf_counter(), time.thread_time()
        if self._server.is_small(self._job, table) and self._server.reads_small_whole(self._job):
            small = cache.get(SMALL)  # every small table at once, then slices of it
            if small is None or (sums is not None and small[0] != sums):
                small = (self._sums, self._server.read_small_tables(self._job, self._sums, own, self._race,
                                                                    settled=self._settled))
                cache.put(SMALL, small)
                self._pulled(t0, c0)
            return small[1][table][start:stop]
        key = (table, start, stop, sums)
        rows = cache.get(key)
        if rows is None:
            rows = self._server.read_rows(self._job, table, start, stop, self._sums, own, self._race,
                                          settled=self._settled)
            cache.put(key, rows)
            self._pulled(t0, c0)
        return rows

    def _pulled(self, t0: float, c0: float) -> None:
        """Count a fetch begun at ``t0`` (wall clock) and ``c0`` (this thread's CPU clock) as pull time."""
        self.pull_s += time.perf_counter() - t0
        self.pull_cpu_s += time.thread_time() - c0

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
        t0, c0 = time.perf_counter(), time.thread_time()
        out = self._read_on(self._server.read_row_set, self._job, table, rows, self._sums, self._race, None,
                            self._settled)
        self._pulled(t0, c0)
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

    def __init__(self, server: ShardRunner, job: Job, clock: int, run: int, folded: bool = False,
                 first_read: Future | None = None, ahead: bool = False):
        self._server, self._job, self._run = server, job, run
        #: it runs while the next clock's shards run (``Algorithm.clock_end_reads_only``): it may not assign
        self._ahead = ahead
        #: folded into this worker's apply (``ShardRunner.clock_end_here``): every other owner's
        #: answer waits until it applied the pass of ``run``
        self._after = run if folded else None
        #: some row was assigned (a folded clock end that stops after it cannot be run again elsewhere)
        self.wrote = False
        self.xp, self.clock, self.meta, self.tol = job.xp, clock, job.meta, job.tol
        self._small: dict[str, Any] | None = None  # the small tables, read once until an assign
        self._sums = clock if job.ssp else None  # under SSP reduction tables are read per clock
        self._writes: dict[str, list] = defaultdict(list)  # assigned rows of other owners, not sent yet
        #: the other owners' answers to the first read (``ShardRunner.clock_end_reads``): sent when
        #: the clock's last apply began (``first_read``, a future of them) or at the first read;
        #: None once something was assigned (they no longer hold what a read must see)
        self._first: Future | dict[str, dict] | None = first_read
        self._first_dropped = False  # (an assign dropped it: every later read asks afresh)

    def _first_replies(self) -> dict[str, dict] | None:
        """The other owners' answers to the first read, fetched now if not sent before; None after an assign."""
        if self._first_dropped:
            return None
        if self._first is None:
            calls = self._server.clock_end_reads(self._job, self._job.owners, self._sums, self._after)
            self._first = dict(zip([o for o, _, _ in calls], self._server.host.peer_all(calls))) if calls else {}
        elif isinstance(self._first, Future):
            replies = self._first.result()  # (each of its messages has a deadline)
            for r in replies.values():
                if isinstance(r, BaseException):
                    raise r
            self._first = replies
        return self._first

    def discard_first_read(self) -> None:
        """The clock end will not read (it did not run, or it assigned first): its early read stops."""
        if isinstance(self._first, Future):
            self._first.cancel()
        self._first, self._first_dropped = None, True

    def flush(self) -> None:
        """Send the assigned rows other workers own (before a pull reads them, and at the step's end)."""
        writes, self._writes = self._writes, defaultdict(list)
        self._server.send_writes(self._job, writes, self._run, self._after)

    def pull(self, table: str, start: int = 0, stop: int | None = None):
        if self._writes:
            self.flush()
        if self._server.is_small(self._job, table):
            if self._small is None:
                self._small = self._server.read_small_tables(self._job, self._sums, after=self._after,
                                                             replies=self._first_replies())
            return self._small[table][start:stop].copy()  # the caller may change its copy
        return self._server.read_rows(self._job, table, start, stop, self._sums, after=self._after)

    def pull_rows(self, table: str, rows):
        if self._writes:
            self.flush()
        return self._server.read_row_set(self._job, table, rows, self._sums, after=self._after)

    def summaries(self, table: str) -> list[list[np.ndarray]]:
        if self._writes:
            self.flush()
        replies = self._first_replies() if table in self._job.algorithm.clock_end_summaries() else None
        return self._server.summarize(self._job, table, self._sums, self._after, replies)

    def assign(self, table: str, values, start: int = 0) -> None:
        if self._ahead:
            raise InvalidInputError(f"{type(self._job.algorithm).__name__}.clock_end assigns table {table!r}, but the "
                                    "algorithm says clock_end_reads_only = True: the next clock's steps, running "
                                    "meanwhile, would not read what it writes. Set clock_end_reads_only = False")
        self.wrote = True
        self.discard_first_read()
        for owner, chunks in self._server.write_rows(self._job, table, values, start, self._run).items():
            self._writes[owner] += chunks
        self._small = None




def owned_here(touched: dict[str, list[int] | None], owners: dict[tuple[str, int], str], me: str,
               n_parts: dict[str, int]) -> bool:
    """Whether every partition an attempt's updates touched (``touched_parts``: None, every partition of
    the table) is owned by ``me``: then its updates stay staged, as larger ones do (its own apply adds
    them; no owner fetches them), and packing them for its commit would be work for nothing."""
    return all(owners.get((t, p)) == me for t, ps in touched.items() for p in (range(n_parts[t]) if ps is None else ps))


def inline_updates(staged: list, limit: int = INLINE_BYTES) -> list | None:
    """An attempt's staged updates as its commit carries them (``protocol.Finished.inline``):
    ``[[table, part, payload], ...]``, each partition's updates packed (``wire.pack``) with their
    first rows; None when they are too large to ride the commit (``apply_plan.rides_commit``)."""
    if not rides_commit(sum(d.nbytes + (0 if r is None else r.nbytes) for *_, d, r in staged), limit):
        return None
    by_part: dict[tuple[str, int], list] = {}
    for t, p, lo, d, r in staged:
        by_part.setdefault((t, int(p)), []).append((int(lo), d, r))
    return [[t, p, {"ups": [[lo, r is not None] for lo, _, r in ups],
                    **wire.pack([a for _, d, r in ups for a in ((d,) if r is None else (d, r))])}]
            for (t, p), ups in by_part.items()]


def read_inline(table: str, part: int, payload: dict) -> list:
    """``inline_updates``'s updates of one partition back: ``[(table, part, first row, values, rows), ...]``."""
    arrays = iter(wire.unpack(payload))
    return [(table, int(part), int(lo), next(arrays), next(arrays).astype(np.int64, copy=False) if has_rows else None)
            for lo, has_rows in payload["ups"]]
