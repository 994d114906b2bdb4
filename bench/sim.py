"""A discrete-event simulation of the control plane's pure core at W workers (no Dask here).

It drives the real ``dscar.core.job.JobState`` (with its BSP or SSP schedule, ``dscar.core.schedule``), with the real
shard queue, partition map, checkpoint ledger, monitor and policies, through the calls
``dscar.scheduler.coordinator.Coordinator`` makes, in the order it makes them: ``begin`` (driver), ``next_item`` and
``idle`` (a worker's long poll), ``releasable`` / ``released`` (taking batch members back for an idle
worker), ``commit`` (a batch's commits, then the worker's next item), ``attempt_failed``, ``applied``
(after every live worker applied a pass), ``clock_end_done``, ``lose`` (a crash, or a hang found by the
liveness rule of ``dscar.core.liveness``), the recovery loop (``start_recovery_round``, ``restored``,
``end_recovery_round``), ``placed`` and the checkpoint effects (``snapshotted``, ``checkpoint_snapshotted``,
``checkpoint_written``, ``published``). Workers are simulated: step times drawn from a log-normal
around ``step_s``, some workers persistently slower (stragglers), losses, hangs and joins at given
simulated times. Time is simulated; only the decisions are real, and each is timed
(``time.perf_counter_ns`` around the call: the simulator is one thread, so this is the call's CPU
plus whatever preemption the machine adds; ``time.thread_time_ns`` costs 3 us a call here, more
than the decisions it would time) and counted.

What it counts, per clock and in all:

* control messages by kind (one per RPC, answer included): ``next`` / ``commit`` / ``release`` /
  ``clock_done`` from workers, ``apply`` / ``restore`` / ``checkpoint`` to workers, ``probe`` (liveness),
  ``begin`` / ``wait`` from the driver;
* data-plane messages the coordinator's decisions cause: ``fetch_staged`` / ``fetch_combined`` (at
  an apply the owners collect the committed attempts' updates from the workers that ran them,
  directly or through an aggregation tree, as ``dscar.core.apply_plan`` plans it), ``pull`` (a worker reads each table's owners once per run id);
* bytes of the control messages that grow with W (a work item carries the partition map where its worker
  holds another, after a change of the owners: ``PartitionMap.for_item``; a BSP apply
  carries its worker's own commits, the pass's shards as ranges and its role in the fan-out, an SSP
  one its worker's own commits and the batch's shards per clock as ranges): estimated from their msgpack-like size;
* shard-status entries the core touched (``dscar.core.shards.ShardQueue`` and ``dscar.core.ssp.ClockWindow``
  keep them in lists; a counting list counts every read): a machine-independent measure of the work
  per decision, what the tests bound (the counting costs the timed decisions: ``count_reads``);
* exactly-once: every update a worker applies is recorded as (clock, shard); a finished clock must
  hold each of its shards once, and no (clock, shard) twice.

Used by ``bench/scale.py`` (tables, JSON, a plot) and ``tests/test_scale.py`` (the assertions).
"""
from __future__ import annotations

import dataclasses
import hashlib
import heapq
import itertools
import math
import random
import statistics
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

from dscar.core.apply_plan import batch_fields, plan_apply, rides_commit
from dscar.checkpoint import CheckpointConfig
from dscar.core.clock import Stage
from dscar.core.job import ApplyPass, Checkpoint, JobConfig, JobState, Mirror, RestartWorker, StartRecovery
from dscar.core.liveness import PROBE_TIMEOUT_S, SWEEP_S, silence_limit
from dscar.core.monitor import ThroughputMonitor
from dscar.core.partitions import PartitionMap, TableLayout
from dscar.core.policies import make_policies
from dscar.core.shards import ShardQueue
from dscar.core.wake import WaitLine, Woken, owners, recheck_s

#: Dask's heartbeat interval at n workers (``distributed.scheduler.heartbeat_interval``; copied: no Dask here)
def heartbeat_interval(n: int) -> float:
    return 0.5 if n <= 10 else 1.0 if n < 50 else 2.0 if n < 200 else n / 200 + 1


#: decisions whose CPU makes up "per grant+commit": what a worker's round trip costs the core
GRANT_COMMIT = ("next_item", "idle", "releasable", "released", "commit")
NET_S = 0.001  #: one-way message latency, simulated seconds
PROBE_S = PROBE_TIMEOUT_S  #: the coordinator's probe timeout


@dataclass
class SimConfig:
    """One simulated fit."""

    workers: int
    shards_per_worker: int = 4
    clocks: int = 4
    consistency: str = "bsp"  #: "bsp" or "ssp"
    staleness: int = 1
    step_s: float = 0.1  #: median step time of a healthy worker (simulated seconds)
    jitter: float = 0.1  #: sigma of the step times' log-normal
    stragglers: int = 0  #: how many workers are persistently slower ...
    straggler_factor: float = 4.0  #: ... by this factor
    losses: list[tuple[float, int]] = field(default_factory=list)  #: (time, worker index) crashes
    hangs: list[tuple[float, int]] = field(default_factory=list)  #: (time, worker index): stops answering
    joins: list[float] = field(default_factory=list)  #: times a new worker joins
    parts_per_worker: int = 1  #: partitions of the param table per worker
    checkpoint_every: int = 2  #: clocks between checkpoints (a loss of an owner needs a store)
    policies: tuple[str, ...] = ("backup",)
    seed: int = 0
    max_sim_s: float = 3600.0  #: a fit not done by then is stalled
    #: wrap the shard-status lists in counting lists (``touched``); each counted read costs the timed
    #: decision ~0.3 us more than a list's (SSP's window reads its shards often: ~14 us per grant+commit
    #: at W = 256, BSP ~3.5), so ``bench.scale`` times a run without them and counts in another
    count_reads: bool = True
    #: bytes of an attempt's staged updates, spread over every partition (None: not modelled: every update is
    #: fetched). At most ``apply_plan.INLINE_BYTES`` (``rides_commit``), they ride the attempt's commit, and
    #: each owner's apply message carries its partitions' share of them, nothing fetched (the coordinator's
    #: ``_inline``); larger, they are fetched as without this
    update_bytes: int | None = None

    @property
    def n_shards(self) -> int:
        return self.workers * self.shards_per_worker


class CountingList(list):
    """A list that counts its element reads (shard-status entries touched by the pure core)."""

    touched = 0

    def __getitem__(self, i):
        CountingList.touched += 1
        return super().__getitem__(i)

    def __iter__(self):
        for x in super().__iter__():
            CountingList.touched += 1
            yield x


def _size(obj: Any) -> int:
    """About how many bytes ``obj`` takes in msgpack (what the coordinator's messages are)."""
    if isinstance(obj, dict):
        return 1 + sum(_size(k) + _size(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set)):
        return 1 + sum(_size(x) for x in obj)
    if isinstance(obj, str):
        return 1 + len(obj)
    return 5 if obj is not None else 1


@dataclass
class _Worker:
    name: str
    factor: float = 1.0
    alive: bool = True
    hung: bool = False
    idle: bool = False  #: waiting in a long poll
    item: dict | None = None
    started: int = 0  #: members of ``item`` started so far
    finished: list = field(default_factory=list)  #: members of ``item`` that ran their step (its commit names them)
    pulled: set = field(default_factory=set)  #: run ids whose tables it has pulled


class Sim:
    """One simulated fit; ``run()`` returns its figures (``Result``)."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.now = 0.0
        self._events: list = []
        self._seq = itertools.count()
        names = [f"w{i:05d}" for i in range(cfg.workers)]
        slow = set(self.rng.sample(range(cfg.workers), cfg.stragglers))
        self.workers = {w: _Worker(w, cfg.straggler_factor if i in slow else 1.0) for i, w in enumerate(names)}
        self.stragglers = {names[i] for i in slow}
        n_parts = cfg.workers * cfg.parts_per_worker
        tables = [("w", cfg.n_shards * 10, n_parts, "param"), ("seen", cfg.n_shards * 10, 1, "reduction")]
        pmap = PartitionMap(TableLayout(t, n, p) for t, n, p, _ in tables)
        pmap.assign(sorted(names))
        queue = ShardQueue(cfg.n_shards, reloadable=False, max_failures=3, sharding="dynamic")
        for s in range(cfg.n_shards):  # the driver places shard s on worker s mod W
            queue.set_holder(s, names[s % cfg.workers])
        ck = CheckpointConfig("memory://dscar-sim", policy="full", every=cfg.checkpoint_every, keep=3)
        jcfg = JobConfig("sim", cfg.n_shards, {t: k for t, _, _, k in tables}, [], [""], ck)
        kw = dict(monitor=ThroughputMonitor(), policies=make_policies(list(cfg.policies)), resume=None)
        if cfg.consistency == "ssp":
            kw.update(consistency="ssp", staleness=cfg.staleness, max_clocks=cfg.clocks)
        self.job = JobState(jcfg, queue, pmap, **kw)
        if cfg.count_reads:
            queue._shards = CountingList(queue._shards)
            if self.job.consistency == "ssp":
                self.job.window._shards = CountingList(self.job.window._shards)
        self.job.workers = sorted(names)
        #: decision -> [calls, CPU ns, shard entries touched]
        self.cpu: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        #: decision -> every call's nanoseconds (the grant+commit ones: their medians)
        self.samples: dict[str, list[int]] = defaultdict(list)
        self.messages: Counter = Counter()
        self.bytes: Counter = Counter()
        self.per_clock: dict[int, Counter] = defaultdict(Counter)
        self.applied: Counter = Counter()  #: (clock, shard) -> times applied
        #: attempts that asked to commit (granted or not), and each commit's number of them
        self.attempts_committed = 0
        self.members: list[int] = []
        self.poll_rechecks = 0  #: waiting long polls woken to look once more (``Coordinator._wake``, ``_tick``)
        self.reports: dict[int, dict] = {}
        self.next_clock = 1
        self.recovering = False
        #: when the recovery under way began, and the first of its events (``end_recovery_round``)
        self._recovery_t0, self._recovery_event = 0.0, 0
        self.done = False
        #: a loss may have left shards without a holder: the driver places them again
        self._unplaced_possible = False
        self._owners_size: tuple[Any, int] = (None, 0)
        #: worker -> the token of the owners map it holds (``PartitionMap.for_item``)
        self._owners_known: dict[str, str | None] = {}
        self._owner_set: tuple[Any, set[str]] = (None, set())  #: (partition map's version, its owners)
        self._members_changed = True
        #: workers waiting in a long poll, in the order they began waiting (``dscar.core.wake``)
        self._line = WaitLine()
        #: when the head of the line looks again though nothing woke it (``Coordinator._tick``)
        self._tick_at = math.inf
        #: woken polls still to look (``_run_woken``), and whether they are being run
        self._woken: deque[Woken] = deque()
        self._running_woken = False

    # ------------------------------------------------------------ machinery
    def _at(self, t: float, fn: Callable, *args: Any) -> None:
        heapq.heappush(self._events, (t, next(self._seq), fn, args))

    def _decide(self, name: str, fn: Callable, *args: Any) -> Any:
        """Call one pure decision, timing its CPU and counting the shard entries it touched."""
        touched, t0 = CountingList.touched, time.perf_counter_ns()
        out = fn(*args)
        dt = time.perf_counter_ns() - t0
        entry = self.cpu[name]
        entry[0] += 1
        entry[1] += dt
        if name in GRANT_COMMIT:  # (a poll that finds nothing apart: ~4 us against a hand-out's 10-30)
            self.samples[f"{name}:none" if name == "next_item" and out is None else name].append(dt)
        entry[2] += CountingList.touched - touched
        return out

    def _send(self, kind: str, n: int = 1, size: int = 0) -> None:
        self.messages[kind] += n
        self.bytes[kind] += size
        self.per_clock[self.job.clock][kind] += n

    def _live(self) -> list[str]:
        return [w for w, s in self.workers.items() if s.alive]

    def _refresh_workers(self) -> None:
        """``job.workers = self._live(job)``: the coordinator does it before every decision, an O(W log W)
        sort each time; the simulator does it when the membership changed (``live`` in the figures is
        then one call per change; ``bench.scale`` reports what one call costs)."""
        if self._members_changed:
            self._members_changed = False
            self.job.workers = self._decide("live", self.job.live, self._live())

    # ------------------------------------------------------------ effects
    def _do(self, effects: list) -> None:
        """``Coordinator._do``: carry the decisions out, then wake the waiting polls."""
        for e in effects:
            if isinstance(e, ApplyPass):
                self._apply(e)
            elif isinstance(e, StartRecovery):
                if not self.recovering:
                    self.recovering = True
                    self._recovery_t0, self._recovery_event = self.now, len(self.job.events)
                    self._at(self.now + NET_S, self._recover)
            elif isinstance(e, Checkpoint):
                self._checkpoint(e)
            elif isinstance(e, (Mirror, RestartWorker)):
                pass  # not configured here
        self._wake()

    def _wake(self, everyone: bool = False) -> None:
        """The waiting long polls a change may concern look once more (``Coordinator._wake``, the rule of
        ``dscar.core.wake``: the waiting owners of startable shards and the head of the line, whose wake
        is passed on), each counted; then the next time-driven look is due (``_arm_tick``)."""
        if len(self._line):
            self._run_woken(self._decide("wake", lambda: self._line.wake(
                everyone=everyone, owners=() if everyone else owners([self.job]))))
        self._arm_tick()

    def _run_woken(self, woken: list[Woken]) -> None:
        """The woken polls look, in turn (a loop, not a recursion: a chain of wakes may be W long)."""
        self._woken.extend(woken)
        if self._running_woken:
            return
        self._running_woken = True
        try:
            while self._woken:
                w = self._woken.popleft()
                self.poll_rechecks += 1
                s = self.workers[w.worker]
                if s.alive and not s.hung:
                    self._poll(w.worker, w)
                else:  # (its poll finds nothing: the scheduler no longer lists it, or it would not hear)
                    self._woken.extend(self._line.pass_on(w, False))
        finally:
            self._running_woken = False

    def _arm_tick(self) -> None:
        """``Coordinator._tick``: the head of the line looks again when a backup or a move may turn
        due (``dscar.core.wake.recheck_s``), not every poll on a timer."""
        if not len(self._line):
            return
        due = self.now + recheck_s([self.job], self.now)
        if due < self._tick_at:
            self._tick_at = due
            self._at(due, self._tick, due)

    def _tick(self, due: float) -> None:
        if due != self._tick_at:
            return  # (brought forward meanwhile)
        self._tick_at = math.inf
        if len(self._line):
            self._run_woken(self._line.wake(spare=1))
        self._arm_tick()

    def _apply(self, e: ApplyPass) -> None:
        """The apply fan-out as ``Coordinator._apply`` plans it (``dscar.core.apply_plan``; every attempt
        here touches every partition, as a data-parallel model's do): direct fetches count as
        ``fetch_staged``, a tree's as ``fetch_combined``; each apply message carries the pass and
        its worker's role."""
        live = self._live()
        stagers: dict[str, list] = {}
        for (shard, attempt, w), clock in zip(e.committed, e.clocks or [e.clock] * len(e.committed)):
            stagers.setdefault(w, []).append((clock, shard, attempt))
        owners: dict[str, list] = {w: [] for w in live}
        for part, w in self.job.pmap.owners.items():
            if w in owners:
                owners[w].append(part)
        # updates small enough ride their commits (``Coordinator._inline``): every partition's owner gets its share
        rides = self.cfg.update_bytes is not None and rides_commit(self.cfg.update_bytes)
        parts = list(self.job.pmap.owners) if rides else []
        inline = {key: parts for keys in stagers.values() for key in keys} if rides else None
        plan = plan_apply(stagers, {}, owners, inline=inline)
        share = self.cfg.update_bytes / max(1, len(parts)) if rides else 0  # (one key's payload for one partition)
        # a worker's own commits (and under SSP their clocks), the pass's (the batch's) shards per clock as ranges
        own, clock_shards = batch_fields(e.committed, e.clocks or [e.clock] * len(e.committed))
        shards = _size(clock_shards)
        sizes = [shards + _size(list(own.get(w, ([], []))) if e.batch is not None else own.get(w, ([], []))[0])
                 for w in live]
        roles = [plan.role(w) for w in live]
        self._send("apply", len(live), sum(n + _size(e.reset) + _size(r.to_msg()) + round(share * len(r.inline))
                                           for n, r in zip(sizes, roles)))
        self._send("fetch_combined" if plan.tree else "fetch_staged", plan.messages())
        self._at(self.now + (4 + 2 * plan.depth()) * NET_S, self._applied, e)

    def _applied(self, e: ApplyPass) -> None:
        job = self.job
        if job.consistency == "ssp":
            ok = job.window.in_flight is not None and job.window.in_flight.batch == e.batch
        else:
            ok = job.machine.stage is Stage.APPLY and job.machine.accepts(e.run_id)
        if any(self.workers[w].alive is False for _, _, w in e.committed if w in self.workers):
            # a source went: the coordinator removes it (``source-lost``) and never tells the job the pass
            # applied, the loss decides (told so, the job took a batch the loss then could not void as applied)
            return
        if ok and not e.rebuild:
            for i, (shard, _, _) in enumerate(e.committed):
                self.applied[(e.clocks[i] if e.clocks else e.clock, shard)] += 1
        self._do(self._decide("applied", job.applied, e.run_id, self.now, e.batch))

    def _checkpoint(self, c: Checkpoint) -> None:
        self._send("checkpoint", len(c.writers))
        self._at(self.now + 2 * NET_S, self._snapshotted, c)

    def _snapshotted(self, c: Checkpoint) -> None:
        job = self.job
        self._do(self._decide("snapshotted", job.snapshotted, "checkpoint", self.now))
        self._decide("checkpoint_snapshotted", job.checkpoint_snapshotted, c.version, 2 * NET_S, {}, self.now)
        for w in sorted(c.writers):
            self._at(self.now + 0.05, self._written, c.version, w)

    def _written(self, version: int, worker: str) -> None:
        job = self.job
        self._send("ckpt_written")
        self._decide("checkpoint_written", job.checkpoint_written, version, worker, [], None, self.now, 0.05)
        for m in list(job.ledger.to_publish):  # the driver publishes what its wait's answer lists
            self._decide("published", job.published, m["version"], self.now)

    def _recover(self) -> None:
        """``Coordinator._recover``: plan, restore every partition, repeat until nothing is left."""
        job = self.job
        live = self._live()
        if not live:
            job.fail(self.now, "no live worker left")
            return
        plan, covered = self._decide("start_recovery_round", job.start_recovery_round, live, self.now)
        self._send("restore", len(plan.restores))
        for key, target in sorted(plan.restores.items()):
            if self.workers[target].alive:
                self._decide("restored", job.restored, key, target, 0, self.now)
        now = self.now + 0.01
        effects = self._decide("end_recovery_round", job.end_recovery_round, plan, covered, now,
                               now - self._recovery_t0, self._recovery_event)
        if job.recovering and not job.failed:
            self._at(self.now + 0.01, self._recover)
            return
        self.recovering = False
        self._do(effects)
        self._wake(everyone=True)

    # ------------------------------------------------------------ workers
    def _poll(self, w: str, woken: Woken | None = None) -> bool:
        """A worker's long poll looks once (``_h_next``): an item, or it keeps waiting in the line; one
        that was woken passes the wake on first (``WaitLine.pass_on``)."""
        item = self._item_for(w)
        if item is None:
            item = self._take_back_for(w)
        s = self.workers[w]
        if woken is not None:
            self._run_woken(self._line.pass_on(woken, item is not None))
        if item is None:
            s.idle = True
            self._line.wait(w)
            self._arm_tick()
            return False
        s.idle = False
        self._line.leave(w)
        self._start(w, item)
        return True

    def _item_for(self, w: str) -> dict | None:
        job = self.job
        self._refresh_workers()
        item = self._decide("next_item", job.next_item, w, self.now)
        if item is None:
            effects = self._decide("idle", job.idle, w, self.now)
            if effects:
                self._do(effects)
        if item is not None:
            owners = item.get("owners", ())
            if self._owners_size[0] is not owners:  # (the core hands out one list per change of the owners)
                self._owners_size = (owners, _size(owners))
            # (``Coordinator._item_for``: the map only where the worker holds another; it holds this one then)
            sent = job.pmap.for_item(dict(item), self._owners_known.get(w))
            self._owners_known[w] = sent.get("owners_token")
            self._send("item_bytes", 0, _size({k: v for k, v in sent.items() if k != "owners"})
                       + (self._owners_size[1] if "owners" in sent else 0))
        return item

    def _take_back_for(self, w: str) -> dict | None:
        job = self.job
        ask = self._decide("releasable", job.releasable, w)
        if ask is None:
            return None
        victim, members = ask
        self._send("release")
        v = self.workers[victim]
        unstarted = set()
        if v.alive and not v.hung and v.item is not None and v.item.get("item") == job.item_of.get(victim):
            unstarted = {(m["shard"], m["attempt"]) for m in v.item["shards"][v.started:]}
        released = [m for m in members if tuple(m) in unstarted]
        if released and v.item is not None:  # the victim drops them from its item
            keep = [m for m in v.item["shards"] if (m["shard"], m["attempt"]) not in set(map(tuple, released))]
            v.item = dict(v.item, shards=keep)
        self._decide("released", job.released, victim, members, released, self.now)
        item = self._item_for(w)
        return item

    def _ask(self, w: str) -> None:
        s = self.workers[w]
        if not s.alive or s.hung:
            return
        self._send("next")
        self._poll(w)

    def _step_s(self, w: str) -> float:
        return self.cfg.step_s * self.workers[w].factor * math.exp(self.rng.gauss(0.0, self.cfg.jitter))

    def _start(self, w: str, item: dict) -> None:
        s = self.workers[w]
        s.item, s.started, s.finished = item, 0, []
        if item["op"] == "clock_end":
            self._at(self.now + NET_S + self.cfg.step_s / 10, self._clock_end_done, w, item)
            return
        if item["run"] not in s.pulled:  # the tables' owners, once per run id
            s.pulled.add(item["run"])
            self._send("pull", self._other_owners(w))
        self._at(self.now + NET_S, self._run_member, w, item)

    def _other_owners(self, w: str) -> int:
        """How many workers other than ``w`` own partitions (the owners ``w`` pulls from): the set of
        owners is built once per change of the partition map, not once per worker (O(W^2) a run id)."""
        owners = self.job.pmap.owners
        version = getattr(owners, "version", None)
        if version is None or self._owner_set[0] != (id(owners), version):
            self._owner_set = ((id(owners), version), set(owners.values()))
        distinct = self._owner_set[1]
        return len(distinct) - (w in distinct)

    def _run_member(self, w: str, item: dict) -> None:
        s = self.workers[w]
        if not s.alive or s.hung or s.item is not item and s.item.get("item") != item.get("item"):
            return
        item = s.item  # (members may have been released meanwhile)
        if s.started >= len(item["shards"]):
            self._at(self.now + NET_S, self._commit, w, item)
            return
        m = item["shards"][s.started]
        s.started += 1
        if self._voided(item):  # ``ShardRunner._voided``: not run, reported failed
            self._decide("attempt_failed", self.job.attempt_failed, w, m.get("clock", item["clock"]), item["run"],
                         m["shard"], m["attempt"], "not started: the item's run was voided by a loss", self.now)
            self._run_member(w, item)
            return
        s.finished.append(m)
        self._at(self.now + self._step_s(w), self._run_member, w, item)

    def _voided(self, item: dict) -> bool:
        """``ShardRunner._voided``: an owner in the item's map is gone (the worker was told) and the
        coordinator's run is newer than the item's: a loss voided it, and its steps would run for nothing."""
        if item["run"] >= self.job.run_id:
            return False
        return any(not self.workers[o].alive for _, _, o in item["owners"] if o in self.workers)

    def _commit(self, w: str, item: dict) -> None:
        s = self.workers[w]
        if not s.alive or s.hung:
            return
        self._send("commit")
        job = self.job
        step = self.cfg.step_s * s.factor
        finished = [(m.get("clock", item["clock"]), m["shard"], m["attempt"], {"compute_s": step})
                    for m in s.finished]
        if not finished:  # (every member was voided: ``ShardRunner`` sends no commit, it asks for work)
            s.item = None
            self._send("next")
            self._poll(w)
            return
        if self.cfg.update_bytes is not None and rides_commit(self.cfg.update_bytes):  # their updates ride it
            self.bytes["commit"] += self.cfg.update_bytes * len(finished)
        # one decision for the item's commits and one wake after it, as ``Coordinator._h_commit``
        self.attempts_committed += len(finished)
        self.members.append(len(finished))
        _, effects = self._decide("commit", job.commit_many, w, item["run"], finished, self.now,
                                  item["op"] == "rebuild")
        self._do(effects)
        s.item = None
        self._poll(w)

    def _clock_end_done(self, w: str, item: dict) -> None:
        s = self.workers[w]
        if not s.alive or s.hung:
            return
        self._send("clock_done")
        s.item = None
        self._refresh_workers()
        self._do(self._decide("clock_end_done", self.job.clock_end_done, w, item["run"],
                              {"objective": float(item["clock"])}, 0.001, self.now, item["clock"]))
        self._poll(w)

    # ------------------------------------------------------------ faults and joins
    def _crash(self, w: str) -> None:
        s = self.workers[w]
        if not s.alive:
            return
        s.alive = False
        self._at(self.now + 0.02, self._remove, w)  # its comm closes: the scheduler removes it at once

    def _hang(self, w: str) -> None:
        s = self.workers[w]
        if not s.alive:
            return
        s.hung = True
        limit = silence_limit(3.0, heartbeat_interval(len(self._live())))
        self._send("probe")
        self._at(self.now + limit + SWEEP_S + PROBE_S, self._remove, w)  # the next sweep, then the probe's timeout

    def _remove(self, w: str) -> None:
        """``Coordinator.remove_worker``: the job loses it."""
        s = self.workers[w]
        s.alive, s.idle = False, False
        self._line.leave(w)
        self._members_changed = True
        self._unplaced_possible = True
        self._do(self._decide("lose", self.job.lose, w, self.now))

    def _join(self) -> None:
        name = f"w{len(self.workers):05d}"
        self.workers[name] = _Worker(name)
        self._members_changed = True
        self._at(self.now + NET_S, self._ask, name)

    # ------------------------------------------------------------ the driver
    def _drive(self) -> None:
        """The driver (called after every event): under BSP, read the current clock's report once it is
        there, then begin the next; under SSP, begin once, then read the reports in order. It stops
        after ``clocks``."""
        job = self.job
        if self.recovering or job.failed or self.done:
            return
        if self._unplaced_possible:
            self._place()
        if job.consistency == "ssp":
            if self.next_clock == 1:
                self._begin(1)
            while len(self.reports) < self.cfg.clocks:
                report = job.report_for(len(self.reports) + 1)
                if report is None:
                    break
                self._send("wait")
                self.reports[len(self.reports) + 1] = report
            self.done = len(self.reports) >= self.cfg.clocks
            return
        current = self.next_clock - 1
        if current >= 1 and current not in self.reports:
            report = job.report_for(current)
            if report is None:
                return
            self._send("wait")
            self.reports[current] = report
        if self.next_clock > self.cfg.clocks:
            self.done = True
            return
        self._begin(self.next_clock)

    def _place(self) -> None:
        """The driver's wait answers ``place`` while shards of a lost worker have no holder
        (``Coordinator._h_wait``): the driver sends them round robin to the live workers (``_h_placed``)."""
        queue = self.job.queue
        unplaced = queue.unplaced()
        # (a lost worker's shard that is not TODO now is once its clock is over: asked for again then, as
        # the coordinator's every wait answer asks; this flag cleared by the first look stalled the fit)
        self._unplaced_possible = bool(unplaced)
        missing = [s for s in unplaced if queue.status(s).value == "todo"]
        live = self.job.live(self._live())
        if not missing or not live:
            return
        self._send("place", len(missing))
        self.job.placed([(shard, live[i % len(live)]) for i, shard in enumerate(missing)], live)
        self._wake(everyone=True)

    def _begin(self, clock: int) -> None:
        self._send("begin")
        self._refresh_workers()
        self.next_clock = clock + 1
        self._do(self._decide("begin", self.job.begin, clock, self.now))
        self._wake(everyone=True)

    # ------------------------------------------------------------ run
    def run(self) -> "Result":
        names = list(self.workers)
        self._drive()
        for w in names:
            self._at(NET_S * (1 + self.rng.random()), self._ask, w)
        for t, i in self.cfg.losses:
            self._at(t, self._crash, names[i])
        for t, i in self.cfg.hangs:
            self._at(t, self._hang, names[i])
        for t in self.cfg.joins:
            self._at(t, self._join)
        t0 = time.perf_counter()
        while self._events and not self.done and not self.job.failed and self.now < self.cfg.max_sim_s:
            self.now, _, fn, args = heapq.heappop(self._events)
            fn(*args)
            self._drive()
        return Result(self, time.perf_counter() - t0)


class Result:
    """A simulated fit's figures and checks."""

    def __init__(self, sim: Sim, wall_s: float):
        cfg = sim.cfg
        self.config = cfg
        self.wall_s = wall_s
        self.sim_s = sim.now
        self.error = sim.job.error
        self.clocks_done = len(sim.reports)
        self.finished = sim.done and sim.job.error is None
        self.skipped = sorted(c for c, r in sim.reports.items() if r.get("skipped"))
        self.messages = dict(sim.messages)
        self.bytes = dict(sim.bytes)
        self.poll_rechecks = sim.poll_rechecks
        self.cpu = {k: {"calls": v[0], "cpu_us": v[1] / 1e3, "touched": v[2]} for k, v in sim.cpu.items()}
        gc = [sim.cpu[k] for k in GRANT_COMMIT if k in sim.cpu]
        #: commit messages (each one decision: ``JobState.commit_many``), and the attempts they named
        self.commits = sim.cpu["commit"][0] if "commit" in sim.cpu else 0
        self.attempts = sim.attempts_committed
        #: attempts per commit message (1.0: every work item held one attempt)
        self.attempts_per_commit = round(self.attempts / max(1, self.commits), 2)
        #: grant+commit rounds: one per attempt that asked to commit (its grant and its commit)
        self.grant_commits = max(1, self.attempts)
        self.cpu_us_per_grant_commit = sum(v[1] for v in gc) / 1e3 / self.grant_commits
        self.touched_per_grant_commit = sum(v[2] for v in gc) / self.grant_commits
        #: as ``cpu_us_per_grant_commit`` with each kind of call's median in place of its mean: the typical
        #: cost, without the preemptions of a loaded machine. A ``next_item`` that found nothing is its own
        #: kind: the median of both kinds mixed fell where they meet (45 % of the calls at W = 4,096 SSP),
        #: 9 us in one run and 17 in the next of the same code
        self.median_us_per_grant_commit = sum(
            statistics.median(samples) * len(samples) for samples in sim.samples.values() if samples
        ) / 1e3 / self.grant_commits
        decisions = sum(v[0] for v in sim.cpu.values())
        cpu_s = sum(v[1] for v in sim.cpu.values()) / 1e9
        self.decisions = decisions
        self.decisions_per_s = decisions / cpu_s if cpu_s else math.inf
        control = ("next", "commit", "release", "clock_done", "apply", "restore", "checkpoint", "ckpt_written",
                   "probe", "begin", "wait")
        n = max(1, self.clocks_done)
        self.control_per_clock = sum(self.messages.get(k, 0) for k in control) / n
        fetches = ("fetch_staged", "fetch_combined")
        self.data_per_clock = sum(self.messages.get(k, 0) for k in (*fetches, "pull")) / n
        self.fetch_per_clock = sum(self.messages.get(k, 0) for k in fetches) / n
        self.item_bytes_per_grant = self.bytes.get("item_bytes", 0) / max(1, sim.cpu["next_item"][0])
        self.apply_bytes_per_clock = self.bytes.get("apply", 0) / n
        #: CPU microseconds of the wake rule (``dscar.core.wake``: which waiting polls a change wakes) per
        #: change that found polls waiting: the coordinator pays it at every such change
        wake = sim.cpu.get("wake", [0, 0, 0])
        self.wake_us_per_change = round(wake[1] / 1e3 / max(1, wake[0]), 2)
        self.exactly_once, self.lost_shards = self._exactly_once(sim)
        self.starvation_ok = self.finished and self._no_starvation(sim)

    def _exactly_once(self, sim: Sim) -> tuple[bool, list]:
        twice = [k for k, n in sim.applied.items() if n > 1]
        lost = [(c, s) for c in range(1, self.clocks_done + 1) if c not in self.skipped
                for s in range(sim.cfg.n_shards) if sim.applied[(c, s)] != 1]
        return not twice and not lost, lost[:10]

    def _no_starvation(self, sim: Sim) -> bool:
        """Every clock finished, and in every clock not skipped each worker that lived through it and is
        no straggler committed a shard (dynamic sharding left nobody waiting)."""
        lost = {w for w, s in sim.workers.items() if not s.alive or s.hung}
        healthy = [w for w in list(sim.workers)[:sim.cfg.workers] if w not in lost and w not in sim.stragglers]
        for c, r in sim.reports.items():
            if r.get("skipped"):
                continue
            done = r.get("shards_per_worker", {})
            if any(done.get(w, 0) == 0 for w in healthy):
                return False
        return True

    def row(self) -> dict[str, Any]:
        """One table row (and the JSON's)."""
        w = self.config.workers
        return {
            "W": w, "consistency": self.config.consistency, "clocks": self.clocks_done, "wall_s": round(self.wall_s, 2),
            "decisions": self.decisions, "decisions_per_s": round(self.decisions_per_s),
            "cpu_us_per_grant_commit": round(self.cpu_us_per_grant_commit, 2),
            "median_us_per_grant_commit": round(self.median_us_per_grant_commit, 2),
            "touched_per_grant_commit": round(self.touched_per_grant_commit, 1),
            "attempts_per_commit": self.attempts_per_commit,
            "control_msgs_per_clock": round(self.control_per_clock, 1),
            "control_msgs_per_clock_per_W": round(self.control_per_clock / w, 2),
            "fetch_staged_per_clock_per_W": round(self.fetch_per_clock / w, 1),
            "item_bytes_per_grant": round(self.item_bytes_per_grant),
            "apply_bytes_per_clock_per_W": round(self.apply_bytes_per_clock / w),
            "poll_rechecks_per_clock_per_W": round(self.poll_rechecks / max(1, self.clocks_done) / w, 1),
            "wake_us_per_change": self.wake_us_per_change,
            "exactly_once": self.exactly_once, "starvation_ok": self.starvation_ok, "finished": self.finished,
            "skipped": len(self.skipped), "error": self.error,
        }


def simulate(cfg: SimConfig) -> Result:
    return Sim(cfg).run()


class TracedSim(Sim):
    """``Sim`` that hashes every decision it asks of the core (the decision's name, its arguments and its
    answer), and at the end the job's events and the messages counted: two runs of a scenario made the
    same decisions if and only if their digests are equal (``decision_digest``). It shows that a change
    of how the core keeps its indexes or caches changes no decision. No decision follows the hash order of
    a set of worker names: digests agree under any ``PYTHONHASHSEED`` (``tests/test_scale.py``)."""

    def __init__(self, cfg: SimConfig):
        super().__init__(cfg)
        self.digest = hashlib.sha256()

    def _decide(self, name: str, fn: Callable, *args: Any) -> Any:
        out = super()._decide(name, fn, *args)
        self.digest.update(f"{name} {args!r} -> {out!r}\n".encode())
        return out


def decision_digest(cfg: SimConfig) -> str:
    """A digest of every decision of the simulated fit ``cfg`` (``TracedSim``), its events and messages."""
    sim = TracedSim(dataclasses.replace(cfg, count_reads=False))
    r = sim.run()
    sim.digest.update(repr(sim.job.events).encode())
    sim.digest.update(repr(sorted(r.messages.items())).encode())
    return sim.digest.hexdigest()[:16]
