"""What the pure core asks the coordinator to carry out (no Dask here).

A decision of the job (``dscar.core.job``) returns a list of these; the coordinator (the Dask
scheduler plugin) turns each into messages and reports back what happened. None of them is
carried out by the core itself.
"""
from __future__ import annotations

from dataclasses import dataclass

from .checkpoint_plan import Checkpoint, DropCopies, Mirror


@dataclass(frozen=True)
class ApplyPass:
    """Every live worker applies the committed attempts of the pass (tables and shard state)."""

    run_id: int
    clock: int
    committed: list[tuple[int, int, str]]  # (shard, attempt, worker that ran it and holds its update)
    reset: list[str]  # tables that start from zero
    rebuild: bool = False  # the rebuild pass (its contributions rebuild tables, they are no clock's updates)
    #: SSP: the batch id, each update's clock (``committed``'s order) and the newest finished clock
    #: (staged updates, pending states and reduction sums of clocks up to it can go)
    batch: int | None = None
    clocks: list[int] | None = None
    floor: int | None = None
    #: the data phase whose pass this is (None: the algorithm has none; a fault may name it)
    phase: str | None = None
    #: BSP, the clock's last pass: the clock-end item (``worker`` names who runs it) folded into that
    #: worker's apply message; it answers the apply with the clock end's outcome (None: not folded)
    clock_end: dict | None = None

    def attempt_keys(self) -> list[tuple[tuple[int, int, int, int], str]]:
        """``((run, clock, shard, attempt), worker)`` of each committed attempt: the key its commit's
        touched partitions and inline updates are kept under, and the worker that staged it."""
        clocks = self.clocks or [self.clock] * len(self.committed)
        return [((int(self.run_id), int(c), int(s), int(a)), w) for (s, a, w), c in zip(self.committed, clocks)]


@dataclass(frozen=True)
class StartRecovery:
    """Restore what lost workers took with them; the coordinator loops until ``unrecovered`` is empty."""


@dataclass(frozen=True)
class RestartWorker:
    """A restart policy's choice, between clocks: ``worker``'s partitions move to others, then it restarts."""

    worker: str


@dataclass(frozen=True)
class BeginClock:
    """BSP: the clock before ``clock`` ended, its stopping rule said go on and the driver's last
    clock is not reached: the coordinator begins ``clock`` itself once that clock's report is ready
    (``BspSchedule.auto_until``), without waiting for the driver to ask. ``ahead``: the clock before
    is still ending (its clock end runs ahead: ``ClockMachine.end_ahead``): begin at once, unless its
    report says otherwise first (``BspSchedule.next_begun``)."""

    clock: int
    ahead: bool = False


Effect = ApplyPass | StartRecovery | Checkpoint | Mirror | DropCopies | RestartWorker | BeginClock
