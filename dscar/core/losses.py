"""Which workers a fit lost, what they took with them, and what is restored from where (no Dask here).

``Losses`` is the part of a job's control state that owns the lost workers and the recovery
bookkeeping: which losses are not recovered yet, which shards' states must come back, the file
(or memory copy) each of them is restored from, and the rows a rebuild pass must recompute. The
plan itself is ``dscar.core.ledger.plan_recovery``'s; the coordinator carries it out and reports each
restored partition here.

Invariants:

- ``lost`` only grows: a worker that comes back does so under a new address;
- ``unrecovered`` and the owners of ``pmap`` name a lost worker only until a plan covering it is
  carried out (``needs_recovery`` says whether one is);
- no planned restore reads a lost buddy's memory (``forget_memory``): a message to a hung buddy
  would wait out its deadline;
- a kept pass (``keep``) goes on only if every partition restored and every shard state still to
  restore since it began is a memory copy as of its ``base`` clock, of a partition not restored
  otherwise since that clock (``exact``): then what the pass reads is what it read before the loss.
  A shard state's copy is the one a buddy keeps (``states_kept``), reported or not.
"""
from __future__ import annotations

from typing import Any

from .events import EventLog
from .ledger import INITIAL_STATE, RecoveryPlan, plan_recovery
from .partitions import PartitionMap


class Losses:
    """Lost workers and the recovery of what they held, for one fit."""

    def __init__(self, pmap: PartitionMap, log: EventLog, has_rebuild: bool):
        #: partition -> owner (the job's: a restore makes its target the owner)
        self.pmap = pmap
        #: where restore events go
        self.log = log
        #: the algorithm recomputes some tables after a restore (their rows are listed in ``restored_rows``)
        self.has_rebuild = has_rebuild
        #: workers lost to this job (a restarted worker comes back under a new address)
        self.lost: set[str] = set()
        #: workers a restart policy took down on purpose: their loss is not a failure (MTBF)
        self.restarting: set[str] = set()
        #: lost workers whose partitions and shard states are not restored yet
        self.unrecovered: set[str] = set()
        #: shards whose state went with a lost worker, not restored yet
        self.lost_shards: set[int] = set()
        #: shard -> checkpoint file its state is restored from before its next step
        self.restore_state: dict[int, Any] = {}
        #: table -> row ranges restored from a checkpoint since the last rebuild pass was applied (the
        #: rebuild steps' ``ShardContext.restored``; a memory-tier copy is as of the last clock: not listed)
        self.restored_rows: dict[str, list[tuple[int, int]]] = {}
        #: (table, part) -> the job's clock when it was last restored other than by a kept pass's exact
        #: copy: a memory copy labelled with that clock or an older one may not hold its value
        self.inexact_at: dict[tuple[str, int], int] = {}
        #: the clock whose memory copies a kept pass's restores must be (None: no pass is kept)
        self.base: int | None = None
        #: every restore since the pass was kept was a memory copy as of ``base``
        self.copies_exact = True

    def live(self, workers: list[str]) -> list[str]:
        """``workers`` (the scheduler's) less those this job lost."""
        return [w for w in sorted(workers) if w not in self.lost]

    def forget_memory(self, worker: str) -> list[int]:
        """``worker`` is gone: a state planned to come from its memory comes from the saved file, or
        from the initial state. Returns those shards (their states will not be as planned)."""
        switched = []
        for s, entry in self.restore_state.items():
            if entry.get("memory") == worker:
                self.restore_state[s] = entry.get("file") or INITIAL_STATE
                switched.append(s)
        return switched

    def keep(self, base: int) -> None:
        """A pass is kept through the recovery that starts (or goes on) now: its restores must be
        memory copies as of clock ``base`` (the pass's start)."""
        if self.base is None:
            self.base, self.copies_exact = base, True
        elif self.base != base:
            self.copies_exact = False

    def exact(self) -> bool:
        """Whether the kept pass may go on: every restore since it was kept, and every shard state
        still to restore, is a memory copy as of ``base``. Ends the keeping."""
        base, self.base = self.base, None
        return base is not None and self.copies_exact and all(
            "memory" in e and int(e.get("clock", -1)) == base for e in self.restore_state.values())

    def states_behind(self) -> list[int]:
        """The shards whose states a kept pass must restore as of ``base`` but whose memory copy is recorded as
        older. A copy as of ``base`` may be kept all the same: a sender reports its copy once its buddy has kept
        it (``dscar_mirrored``), and a sender lost in between leaves the record a clock old. The coordinator asks
        the buddies which clocks they keep (``JobState.states_to_confirm``, ``states_kept``) before ``exact``.
        None when the pass cannot be kept whatever they answer (a restore was not an exact copy, a state comes
        from a file or from none): the questions would cost messages, and a hung buddy its timeout."""
        entries = self.restore_state
        if self.base is None or not self.copies_exact or not all(
                isinstance(e, dict) and "memory" in e for e in entries.values()):
            return []
        return sorted(s for s, e in entries.items() if int(e.get("clock", -1)) < self.base)

    def states_kept(self, buddy: str, clocks: dict[int, int]) -> list[int]:
        """``buddy`` keeps memory copies of the shard states ``clocks`` names, as of those clocks: a state
        whose planned copy is older than the kept pass's ``base`` comes from ``buddy``'s when that one is no
        newer than ``base`` (the file stays its fallback). Nothing from a lost buddy (its memory is gone:
        ``forget_memory``). Returns the shards whose copy changed."""
        if self.base is None or buddy in self.lost:
            return []
        newer = []
        for s, c in clocks.items():
            e = self.restore_state.get(int(s))
            if isinstance(e, dict) and "memory" in e and int(e.get("clock", -1)) < int(c) <= self.base:
                self.restore_state[int(s)] = {**e, "memory": buddy, "clock": int(c)}
                newer.append(int(s))
        return sorted(newer)

    def needs_restore(self, worker: str, owned: bool, held: list[int]) -> bool:
        """``worker`` was lost owning partitions (``owned``) and holding the states of ``held``:
        whether a recovery must restore something (shard state lives with the data: with a rebuild
        pass, a lost holder's states must come back); records it if so."""
        state_lost = bool(held) and self.has_rebuild
        if owned or state_lost:
            self.unrecovered.add(worker)
            if state_lost:
                self.lost_shards |= set(held)
        return bool(owned or state_lost)

    def plan(self, kinds: dict[str, str], live: list[str], full: bool, manifests: list[dict], n_shards: int,
             mirrors: dict, state_mirrors: dict) -> RecoveryPlan:
        """What to restore now for every unrecovered loss, onto the ``live`` workers."""
        return plan_recovery(
            owners=self.pmap.owners, kinds=kinds, rows=self.pmap.rows, lost=self.lost, live=live, full=full,
            manifests=manifests, lost_shards=self.lost_shards, n_shards=n_shards, mirrors=mirrors,
            state_mirrors=state_mirrors)

    def planned(self, plan: RecoveryPlan) -> set[str]:
        """``plan`` is about to be carried out: the losses it covers (its shards' states are restored
        from its entries before their next steps)."""
        covered = set(self.unrecovered)
        for s, entry in plan.states.items():
            self.restore_state[s] = entry
        self.lost_shards.clear()
        return covered

    def restored(self, key: tuple[str, int], target: str, version: int, now: float,
                 memory_clock: int | None = None, clock: int = 0) -> None:
        """``target`` owns ``key`` now, restored from checkpoint ``version`` (0: the initial values)
        or from a buddy's memory copy as of ``memory_clock``, in the job's clock ``clock``."""
        self.pmap.owners[key] = target
        # a copy taken after the partition was last restored otherwise (a copy labelled with the
        # clock of that restore may be from before it: not counted), as of the kept pass's start
        exact = memory_clock is not None and self.base is not None and memory_clock == self.base \
            and self.inexact_at.get(key, -1) < memory_clock
        if not exact:
            self.inexact_at[key] = clock
            self.copies_exact = False
        if memory_clock is None and self.has_rebuild:  # (forgotten when a rebuild pass is applied)
            self.restored_rows.setdefault(key[0], []).append(self.pmap.layouts[key[0]].bounds[key[1]])
        where = {"version": version} if memory_clock is None else {"tier": "memory", "memory_clock": memory_clock}
        self.log.add(now, "partition-restored", table=key[0], part=key[1], target=target, **where)

    @property
    def needs_recovery(self) -> bool:
        """A loss is not recovered yet, or a partition is owned by a lost worker (a restore target
        lost before it took the partition over)."""
        return bool(self.unrecovered) or any(w in self.lost for w in self.pmap.owners.values())

    def plan_states(self, n_shards: int, manifest: dict | None) -> None:
        """Every shard whose state ``manifest`` saved is restored from it before its next step
        (a resume, or a rebase onto an older manifest: earlier plans are dropped)."""
        self.restore_state.clear()
        saved = manifest.get("states", {}) if manifest else {}
        for s in range(n_shards):
            if str(s) in saved:
                self.restore_state[s] = saved[str(s)]


def unreached_after_apply(unreached: list[str], silent: list[str], *, job_current: bool, batched: bool,
                          last_try: bool) -> list[str] | None:
    """An apply did not reach ``unreached`` (probed: ``silent`` did not answer the probe either): the
    workers to take out of the cluster, or None to send the pass again.

    A silent worker is lost. A worker that answers is taken out only while its loss still serves the
    job (an SSP batch, which is not sent twice, or the last try: the loss skips the clock). Once the
    job has ended or failed, a worker that answers is healthy: a call it refused (the job's token
    dropped meanwhile) says nothing about it, and taking it out would take it from the next fit."""
    if not job_current:
        return silent
    if silent or batched or last_try:
        return silent or unreached
    return None

