"""When a fit takes checkpoints and memory copies, who writes what, and what they cost (no Dask here).

``CheckpointPlanner`` is the part of a job's control state that owns the checkpoint ledger
(``dscar.core.ledger``), the interval in force (``dscar.core.intervals``), the memory tier's copies and
what is being snapshotted. The job asks it at each clock end whether a checkpoint or a memory
copy is due and gets the ``Checkpoint`` / ``Mirror`` effect to carry out; the coordinator's
reports (snapshotted, written, published, mirrored) come back here.

Invariants:

- ``snapshotting`` names every snapshot taken but not finished: while it is not empty the clock
  is not reported (nor the next begun), so a snapshot labelled clock t never holds clock t+1's
  updates;
- a checkpoint's cost is recorded once, when both its stall and its longest write are known, and
  never for a version that failed or was abandoned;
- ``mirrors`` / ``state_mirrors`` name only live buddies, and for each key the newest clock
  reported (a late, older copy's report changes nothing);
- a copy no record names any more is dropped where it is (``DropCopies``): each worker holds only the
  copies recovery may read, so the memory tier keeps one copy of the model however the ring and the
  owners change; a hand-off passes the copies a leaver keeps, and those its takers now own, on to the
  stayers' ring (``handed_copies``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection

from ..checkpoint import state_shards
from .events import EventLog
from .intervals import FixedSchedule, IntervalPlanner, rework_estimate
from .ledger import CheckpointLedger
from .partitions import PartitionMap
from .shards import ShardQueue


def ring_buddies(workers: Collection[str]) -> dict[str, str]:
    """Each worker's buddy in the memory tier's ring: the next worker in address order (none for one worker)."""
    ring = sorted(workers)
    return {w: ring[(i + 1) % len(ring)] for i, w in enumerate(ring)} if len(ring) > 1 else {}


@dataclass(frozen=True)
class Checkpoint:
    version: int
    writers: dict[str, list[int]]  # worker -> shards whose state it saves (every param owner writes)
    whole: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # worker -> partitions it saves whole


@dataclass(frozen=True)
class Mirror:
    """The memory tier: each owner (key) copies its param partitions to its buddy (value) now."""

    clock: int
    buddies: dict[str, str]


@dataclass(frozen=True)
class DropCopies:
    """The memory tier: ``holder`` drops its copies no record names any more (a copy as new or newer is
    recorded elsewhere): each partition's (``parts``: ``(table, part, clock)``) and shard state's
    (``shards``: ``(shard, clock)``) if the copy it holds is of that clock or older (a newer one has
    reached it since, and its report is on its way)."""

    holder: str
    parts: tuple[tuple[str, int, int], ...] = ()
    shards: tuple[tuple[int, int], ...] = ()


class CheckpointPlanner:
    """Checkpoint and memory-copy planning for one fit (a job without a store has no ledger and no
    interval: nothing is ever due, and the reports change nothing)."""

    def __init__(self, cfg: Any, pmap: PartitionMap, queue: ShardQueue, log: EventLog,
                 resume: dict | None = None):
        #: the job's fixed settings (``JobConfig``: its ``checkpoint`` is a ``CheckpointConfig`` or None)
        self.cfg = cfg
        #: partition -> owner (the job's; read here for writers and manifests)
        self.pmap = pmap
        #: shard holders (the job's; read here for the state writers and mirror senders)
        self.queue = queue
        #: where checkpoint events go
        self.log = log
        ck = cfg.checkpoint
        #: checkpoint versions (None without a store)
        self.ledger = None if ck is None else CheckpointLedger(ck.policy, ck.keep, resume, ck.max_chain)
        #: when checkpoints are due: every ``period`` clocks, or a period from measurements
        #: (``interval="auto"``); None without a store
        self.interval = None if ck is None else (
            IntervalPlanner(ck.period, ck.mtbf) if ck.interval == "auto" else FixedSchedule(ck))
        #: version -> {"stall": seconds its snapshot stalled the job (None: not yet), "write": its
        #: longest write so far, "written": every writer has written} until its cost is recorded
        self.ckpt_cost: dict[int, dict[str, Any]] = {}
        #: shards' worth of state saves carried to the next checkpoint (``checkpoint.state_shards``)
        self.state_credit = 0.0
        #: owner -> squared norm of its param partitions' change not saved before the newest
        #: checkpoint (the perturbation losing it then would have caused; ``rework_estimate``)
        self.unsaved_sq: dict[str, float] = {}
        #: the checkpoint period last chosen (``interval="auto"``; 0 before the first checkpoint)
        self.last_period = 0.0
        #: what is being snapshotted ("checkpoint", "mirror")
        self.snapshotting: set[str] = set()
        #: (table, part) -> (buddy, clock) of the newest memory copy the buddy has (memory tier)
        self.mirrors: dict[tuple[str, int], tuple[str, int]] = {}
        #: shard -> (buddy, clock) of the newest memory copy of its state (memory tier)
        self.state_mirrors: dict[int, tuple[str, int]] = {}
        #: sender -> the buddy its newest memory copy was asked to go to (its report may never come: the
        #: sender lost after the buddy kept it; ``JobState.states_to_confirm``). A lost sender's entry stays:
        #: it is what a recovery asks about, and a worker lost comes back under a new address
        #: (a few entries a loss, never read again once recovered)
        self.sent_to: dict[str, str] = {}

    # ------------------------------------------------------------- clock ends
    def start_interval(self, now: float) -> None:
        """The automatic checkpoint interval counts its time from the first clock."""
        if isinstance(self.interval, IntervalPlanner) and self.interval.started is None:
            self.interval.started = now

    def clock_finished(self, clock: int, seconds: float, workers: list[str], lost: set[str], now: float,
                       cut: Callable[[], list[int] | None] = lambda: None) -> list[Checkpoint | Mirror]:
        """Clock ``clock`` ended after ``seconds``: the checkpoint and memory copy due now (``cut``:
        per shard, the newest clock the tables hold; under BSP, None: every shard's is ``clock``)."""
        due: list[Checkpoint | Mirror] = []
        if self.interval is not None:
            self.interval.record_clock(seconds)
            if self.interval.due(clock):
                due.append(self._start_checkpoint(clock, lost, now, cut()))
        if self.cfg.checkpoint is not None and self.cfg.checkpoint.memory:
            due += self._start_mirror(clock, workers, lost)
        return due

    def _start_checkpoint(self, clock: int, lost: set[str], now: float, cut: list[int] | None) -> Checkpoint:
        """Every live param owner writes its partitions; the shards' states due now are saved by
        their holders; ``cut`` (SSP): per shard, the newest clock the tables hold."""
        cfg = self.cfg.checkpoint
        saving, self.state_credit = state_shards(self.queue.n_shards, cfg.save_fraction, self.ledger.state_saved,
                                                 self.state_credit)
        writers: dict[str, list[int]] = {w: [] for (t, _), w in self.pmap.owners.items()
                                         if self.cfg.kinds[t] == "param" and w not in lost}
        for s in saving:
            h = self.queue.holder(s)
            if h is not None and h not in lost:
                writers.setdefault(h, []).append(s)
        whole: dict[str, list[tuple[str, int]]] = {}
        for t, p in self.ledger.whole_due(self.param_parts()):
            w = self.pmap.owners.get((t, p))
            if w in writers:
                whole.setdefault(w, []).append((t, p))
        version = self.ledger.start(clock, writers, [k for ks in whole.values() for k in ks], cut)
        self.ckpt_cost[version] = {"stall": None, "write": 0.0, "written": False}
        self.interval.taken(clock)
        self.replan(now)
        self.snapshotting.add("checkpoint")
        info = {} if cut is None else {"cut": cut}
        self.log.add(now, "checkpoint-started", version=version, policy=cfg.policy, fraction=cfg.save_fraction,
                     **info)
        return Checkpoint(version, writers, whole)

    def replan(self, now: float) -> None:
        """The automatic interval chooses its period again; a change is an event."""
        choice = self.interval.replan(now)
        if choice is None:  # a fixed period
            return
        if choice["period"] != self.last_period:
            self.log.add(now, "checkpoint-interval", **{k: v for k, v in choice.items() if v is not None})
        self.last_period = choice["period"]

    def _start_mirror(self, clock: int, workers: list[str], lost: set[str]) -> list[Mirror]:
        """Every param owner and shard holder copies its partitions and shard states to the next
        live worker (a ring in address order)."""
        live = [w for w in workers if w not in lost]
        owners = {w for (t, _), w in self.pmap.owners.items() if self.cfg.kinds[t] == "param"}
        senders = [w for w in sorted(live) if w in owners or self.queue.held_by(w)]
        if len(live) < 2 or not senders:
            return []
        self.snapshotting.add("mirror")
        ring = ring_buddies(live)
        buddies = {w: ring[w] for w in senders}
        self.sent_to.update(buddies)
        return [Mirror(clock, buddies)]

    # ---------------------------------------------------------------- reports
    def mirrored(self, buddy: str, clock: int, parts: list, shards: list = ()) -> list[DropCopies]:
        """``buddy`` holds the memory copies of ``parts`` and of the states of ``shards`` as of ``clock``;
        the copies that no record names now go where they are: the older holder's when the newest clock
        wins, ``buddy``'s own when its report came late, after a copy as new elsewhere. Of two as new, the
        later report wins, unless its buddy is the key's own owner (holder) and the other is not: a copy
        there goes with what it copies (a hand-off passed the other on from there: ``handed_copies``)."""
        stale: dict[str, tuple[list, list]] = {}
        keys = [(self.mirrors, (t, int(p)), 0) for t, p in parts] + [(self.state_mirrors, int(s), 1) for s in shards]
        for where, key, kind in keys:
            old = where.get(key)
            if old is not None and old[1] == clock and old[0] != buddy and buddy == self._owner(kind, key):
                drop = (buddy, int(clock))
            elif old is None or old[1] <= clock:  # (the newest clock wins; of two as new, the later report)
                where[key] = (buddy, int(clock))
                drop = old if old is not None and old[0] != buddy else None
            else:  # a late, older copy's report: the record stays
                drop = (buddy, int(clock)) if old[0] != buddy else None
            if drop is not None:
                stale.setdefault(drop[0], ([], []))[kind].append(
                    (*key, drop[1]) if kind == 0 else (key, drop[1]))
        return [DropCopies(w, tuple(ps), tuple(ss)) for w, (ps, ss) in stale.items()]

    def checkpoint_snapshotted(self, version: int, stall_s: float, unsaved_sq: dict[str, float], now: float) -> None:
        """Every writer of ``version`` has its snapshot: it stalled the job ``stall_s`` seconds, and
        each owner had ``unsaved_sq`` of change not saved before it."""
        if unsaved_sq:
            self.unsaved_sq = {w: float(v) for w, v in unsaved_sq.items()}
        if version in self.ckpt_cost:
            self.ckpt_cost[version]["stall"] = float(stall_s)
            self._record_cost(version, now)

    def checkpoint_written(self, version: int, worker: str, files: list, error: str | None, now: float,
                           seconds: float = 0.0) -> None:
        if self.ledger is None:
            return
        pending = self.ledger.pending.get(version)
        if not self.ledger.written(version, worker, files, error):
            return
        cost = self.ckpt_cost.get(version)
        if cost is not None:
            cost["write"] = max(cost["write"], float(seconds))
            if pending.failed:
                del self.ckpt_cost[version]
            elif not pending.waiting:
                cost["written"] = True
                self._record_cost(version, now)
        self.build_manifests(now)

    def _record_cost(self, version: int, now: float) -> None:
        """A checkpoint's cost, once snapshotted and written: the stall plus the longest write,
        counted in full (an upper bound: the write runs beside training)."""
        cost = self.ckpt_cost[version]
        if cost["stall"] is not None and cost["written"]:
            del self.ckpt_cost[version]
            self.interval.record_cost(cost["stall"] + cost["write"])
            self.replan(now)

    def param_parts(self) -> dict[str, int]:
        """Param table -> its number of partitions (the tables checkpoints save)."""
        return {t: l.n_parts for t, l in self.pmap.layouts.items() if self.cfg.kinds[t] == "param"}

    def build_manifests(self, now: float) -> None:
        _, abandoned = self.ledger.build(
            self.param_parts(), now, job=self.cfg.job_id, fraction=self.cfg.checkpoint.save_fraction,
            tables=[[t, l.n_rows, l.n_parts, self.cfg.kinds[t]] for t, l in self.pmap.layouts.items()])
        for v, reason in abandoned:
            self.ckpt_cost.pop(v, None)
            self.interval.abandoned()
            self.log.add(now, "checkpoint-abandoned", version=v, reason=reason)

    def published(self, version: int, now: float) -> None:
        m = None if self.ledger is None else self.ledger.mark_published(version)
        if m is not None:
            self.log.add(now, "checkpoint-published", version=version, bytes=m["bytes"], clock=m["clock"])

    def _owner(self, kind: int, key) -> str | None:
        """Where what a memory copy copies lives: a param partition's owner (``kind`` 0), a shard's holder (1)."""
        return self.pmap.owners.get(key) if kind == 0 else self.queue.holder(key)

    def handed_copies(self, leaving: Collection[str], staying: list[str]) -> dict[str, dict[str, tuple[list, list]]]:
        """At a hand-off, once owners and holders switched and before the leavers go: the memory copies that
        would go with a leaver (those it keeps for others), or now sit on the owner of their partition (the
        holder of their shard: it took them from a leaver whose buddy it was), and where each goes instead:
        ``holder -> new holder -> (parts, shards)``. The new holder is the owner's (holder's) buddy in the ring
        of the workers ``staying`` (``_start_mirror``'s: its next copy goes there too). A key whose owner is not
        staying (its hand-off failed: the loss's way) stays where it is. Without this a loss in the clock after
        a hand-off restored those partitions from the disk."""
        buddy = ring_buddies(staying)
        gone = set(leaving)
        out: dict[str, dict[str, tuple[list, list]]] = {}
        records = [(holder, 0, key) for key, (holder, _) in sorted(self.mirrors.items())]
        records += [(holder, 1, s) for s, (holder, _) in sorted(self.state_mirrors.items())]
        for holder, kind, key in records:
            owner = self._owner(kind, key)
            to = buddy.get(owner)
            if to is not None and to != holder and (holder in gone or holder == owner):
                out.setdefault(holder, {}).setdefault(to, ([], []))[kind].append(key)
        return out

    # ----------------------------------------------------------------- losses
    def worker_lost(self, worker: str, planned: bool, now: float) -> None:
        """``worker`` is gone: its memory copies went with it, its writes will not come; an
        unplanned loss counts for the automatic interval (MTBF), a restart a policy chose does not."""
        if self.interval is not None and not planned:
            self.interval.record_loss()
            self.replan(now)
        self.mirrors = {k: v for k, v in self.mirrors.items() if v[0] != worker}
        self.state_mirrors = {s: v for s, v in self.state_mirrors.items() if v[0] != worker}

    def writer_lost(self, worker: str, now: float) -> None:
        """The versions ``worker`` was to write are built without it (or abandoned)."""
        if self.ledger is not None:
            self.ledger.writer_lost(worker)
            self.build_manifests(now)

    # ---------------------------------------------------------------- reports
    def status(self, clock: int) -> dict[str, Any] | None:
        """The newest complete checkpoint's age in clocks, the rework a loss now would cost
        (``intervals.rework_estimate``) and the period in force; None without a store."""
        cfg = self.cfg.checkpoint
        if cfg is None or self.ledger is None:
            return None
        built = self.ledger.built
        age = clock - (int(built["clock"]) if built is not None else 0)
        period = self.last_period or cfg.period
        return {"age": age, "rework_estimate": rework_estimate(age, cfg.recovery, self.unsaved_sq, cfg.memory),
                "period": float(period)}
