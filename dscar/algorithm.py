"""The contract an iterative-convergent model implements to run on dscar.

An algorithm is a small, picklable object holding only hyperparameters: every
piece of state that changes while training lives in *tables* (named arrays
partitioned by rows across the workers), so a copy of the object on every
worker behaves the same. A clock runs in three steps:

1. ``shard_step(ctx, data)`` once per data shard, on whichever worker pulled
   the shard. It reads tables as of the clock's start (``ctx.pull``,
   ``ctx.pull_rows``) and adds its contributions (``ctx.add`` for a row range,
   ``ctx.add_rows`` for scattered rows). Contributions are copied and staged
   on the attempt's worker; the partition owners collect and apply them only
   for the attempt that commits: exactly
   once. Per-shard latent state (``ctx.state``, ``ctx.set_state``) travels
   with the shard and is kept only when the attempt commits; a model that
   declares it (``shard_state``) has a checkpointed copy checked before use.
2. The engine applies the committed contributions. A ``param`` table adds them
   to its value; a ``reduction`` table is set to their sum (it holds this
   clock's reduction, e.g. a gradient or a Gram block).
3. ``clock_end(ctx)`` once, on one worker: reads tables, writes new values
   (``ctx.assign``) and returns this clock's metrics, ``objective`` among them.
   A large table it only reduces is better read as ``ctx.summaries(table)``:
   ``summarize`` runs on each partition's owner and only its result travels
   (named in ``clock_end_summaries``, in the same message as the small tables).

Multi-phase clocks: an algorithm that names ``phases`` (e.g. ALS's
``("user", "item")``) gets data with one set of shards per phase
(``dscar.PhasedData``) and a clock runs steps 1-2 once per phase, in order —
phase ``p + 1``'s shard steps see the tables with phase ``p``'s updates applied
— then step 3. ``ctx.phase`` names the phase a shard step runs in. A
``reduction`` table is zeroed when the clock's first phase is applied and sums
the contributions of every phase of the clock, so per-clock metrics can be
accumulated by the steps of whichever phase sees the values.

The driver stops when ``converged(history, tol)`` says so or at ``max_clocks``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np


@dataclass(frozen=True)
class TableSpec:
    """A named parameter array: ``n_rows`` rows of shape ``trailing`` each."""

    name: str
    n_rows: int
    trailing: tuple[int, ...] = ()
    dtype: str = "float64"
    kind: Literal["param", "reduction"] = "param"
    n_parts: int | None = None  # None: one per worker at job start (at most n_rows)

    def __post_init__(self):
        if self.n_rows < 1:
            raise ValueError(f"table {self.name!r} needs at least one row")
        if self.kind not in ("param", "reduction"):
            raise ValueError(f"table {self.name!r}: kind must be 'param' or 'reduction'")


class StateSpec(NamedTuple):
    """One array of a shard's state (``ShardContext.set_state``), as the model declares it
    (``Algorithm.shard_state``): a copy read back from a checkpoint is used only if it matches."""

    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class DataMeta:
    """What the driver knows of the training data without holding it all."""

    n_rows: int
    n_shards: int
    shapes: dict[str, tuple[int, ...]]  # trailing shape per named array
    dtypes: dict[str, str]
    sparse: dict[str, bool] = field(default_factory=dict)
    shard_bounds: tuple[tuple[int, int], ...] = ()
    #: (name, number of shards) of each data phase in clock order; () for one pass over all shards.
    #: Shard ids are global: phase i's shards follow those of phases 0..i-1.
    phases: tuple[tuple[str, int], ...] = ()

    def phase_shards(self, name: str) -> range:
        """The shard ids of data phase ``name``."""
        start = 0
        for n, k in self.phases:
            if n == name:
                return range(start, start + k)
            start += k
        raise KeyError(f"no data phase {name!r} (phases: {[n for n, _ in self.phases]})")


class ShardContext(Protocol):
    """What ``shard_step`` sees (implemented by the worker plugin)."""

    xp: ModuleType
    clock: int
    shard: int
    phase: str | None  # the data phase this step runs in (None: the algorithm has no phases)
    meta: DataMeta

    tol: float
    state: dict[str, Any]  # the shard's state as of its last commit
    batch_scale: float  # this worker's share of a fixed global batch (adaptive-batch policy)
    #: in a rebuild step: table -> the row ranges ``[start, stop)`` the recoveries since the last
    #: rebuild restored from a checkpoint (older than the rest of the model); {} in a shard step
    restored: dict[str, list[tuple[int, int]]]

    def pull(self, table: str, start: int = 0, stop: int | None = None) -> Any: ...

    def pull_rows(self, table: str, rows: Any) -> Any: ...

    def add(self, table: str, values: Any, start: int = 0) -> None: ...

    def add_rows(self, table: str, rows: Any, values: Any) -> None: ...

    def set_state(self, name: str, value: Any) -> None: ...


class ClockContext(Protocol):
    """What ``clock_end`` sees (implemented by the worker plugin)."""

    xp: ModuleType
    clock: int
    meta: DataMeta
    tol: float

    def pull(self, table: str, start: int = 0, stop: int | None = None) -> Any: ...

    def summaries(self, table: str) -> list[list[np.ndarray]]: ...

    def assign(self, table: str, values: Any, start: int = 0) -> None: ...


class Algorithm:
    """Base class; override ``tables``, ``shard_step`` and ``clock_end``."""

    #: short name used in events, the CLI and checkpoints
    name: str = "algorithm"
    #: names of the row-aligned arrays the data must provide
    data_names: tuple[str, ...] = ()
    #: names of the data phases of a clock, in order (each its own shards, applied before the
    #: next runs); () for one pass over all shards per clock
    phases: tuple[str, ...] = ()
    #: how many clocks stale its shard steps' reads may be (bounded staleness, SSP) and the model
    #: still converge: a read in clock t may miss the updates of clocks t-s .. t-1, its own shard's
    #: excepted. 0: every clock is a barrier. A measured property: ``python -m bench.staleness``
    max_staleness: int = 0
    #: its convergence per clock suffers as its data is cut into more shards (AD-LDA's shards of a
    #: clock sample from the same start): a fit not given ``n_shards`` runs one per worker (``dscar.core.shard_count``)
    shards_cost_quality: bool = False
    #: ``converged`` reads only its arguments (the history and ``tol``), as a stopping rule should, so it
    #: may run on a worker with the clock end and the next clock begin there, without a round trip to the
    #: driver (``dscar.auto-begin``). False for a ``converged`` that acts in the driver's process (a test's or
    #: a benchmark's hook): the driver then evaluates it and begins every clock
    converged_on_workers: bool = True
    #: its ``clock_end`` only reads the tables (no ``ctx.assign``), so it may run while the next clock's
    #: shards run (their updates are applied only once it reported): one step off every clock's path.
    #: Leave it False for a clock end that writes: the next clock's steps must read what it wrote
    clock_end_reads_only: bool = False

    def validate(self, meta: DataMeta) -> None:
        """Raise ``InvalidInputError`` for data or hyperparameters this model cannot fit."""

    def tables(self, meta: DataMeta) -> list[TableSpec]:
        raise NotImplementedError

    def init_rows(self, table: TableSpec, start: int, stop: int, xp: ModuleType) -> Any:
        """Initial value of rows ``[start, stop)``; deterministic (it counts as checkpoint 0)."""
        return xp.zeros((stop - start, *table.trailing), dtype=table.dtype)

    def prepare_shard(self, arrays: dict[str, Any], xp: ModuleType) -> dict[str, Any]:
        """Turn a shard's host arrays into what ``shard_step`` wants (layout, device)."""
        from .xp import to_device

        return {k: to_device(v, xp) for k, v in arrays.items()}

    def shard_state(self, data: dict[str, Any]) -> dict[str, StateSpec] | None:
        """The arrays of the state a shard step keeps (``ctx.set_state``) for the shard whose
        prepared data (``prepare_shard``) is ``data``: name -> ``StateSpec``. A state read back
        from a checkpoint of other names, dtypes or shapes is corrupt: it is reported and not used
        (the shard then has none, as if never saved). Default None: not declared, used as saved
        (its checksum is still verified)."""
        return None

    def warm_up(self, xp: ModuleType) -> None:
        """Load or compile the model's kernels, once per worker, before clock 1 (the engine calls
        it during setup, off the worker's event loop). A kernel first used in the middle of a fit
        stalls its worker for as long as the load takes, and the others wait or back it up.
        Default: nothing to load."""

    def shard_step(self, ctx: ShardContext, data: dict[str, Any]) -> None:
        raise NotImplementedError

    def clock_end(self, ctx: ClockContext) -> dict[str, float]:
        raise NotImplementedError

    def summarize(self, table: str, rows: Any, start: int) -> list[np.ndarray]:
        """Small host arrays that sum up rows ``[start, start + len(rows))`` of ``table``, for a
        clock end that reduces a large table (``ClockContext.summaries``).

        The engine runs it where the rows are, on each partition's owner (``rows``: the
        partition, on the device, read-only), so the clock end receives a few numbers per
        partition instead of pulling the table to one worker. Default: none.
        """
        raise NotImplementedError(f"{type(self).__name__} summarizes no table")

    def clock_end_summaries(self) -> list[str]:
        """The tables whose ``summaries`` the clock end reads before it assigns anything.

        Their owners summarize them in the message that carries the small tables' rows, so
        the clock end reads both in one round trip (started as soon as the clock's last
        apply does, when the clock end is folded into it). Default: none.
        """
        return []

    def result_rows(self, table: str, meta: DataMeta) -> np.ndarray | None:
        """The stored row of each row of ``table`` as a fit returns it (a permutation), for a model
        that stores a table's rows in another order than its result's (LDA's partitioned schedule
        keeps each vocabulary block in one partition); the gather reorders by it. Default None:
        stored in result order."""
        return None

    def rebuild_tables(self) -> list[str]:
        """``param`` tables that ``rebuild_step`` recomputes from the data after a restore.

        After a worker loss is recovered, the engine zeroes these tables and runs
        ``rebuild_step`` once over every shard (one data pass, exactly once), so
        tables derived from the data or from shard state (LDA's counts, Lasso's
        column sums) agree with it again.
        """
        return []

    def rebuild_step(self, ctx: ShardContext, data: dict[str, Any]) -> None:
        """Add this shard's contribution to every table of ``rebuild_tables``.

        With ``phases``, the rebuild pass runs over the shards of every phase at once
        (``ctx.phase`` says which phase a shard belongs to). ``ctx.restored`` names the rows a
        recovery put back from a checkpoint, for a step that recomputes only those; its reads
        see the tables as restored (they are zeroed when the pass is applied).
        """
        raise NotImplementedError(f"{type(self).__name__} names rebuild tables but has no rebuild_step")

    def converged(self, history: list[dict[str, float]], tol: float) -> bool:
        """Default: the objective's relative change fell below ``tol``."""
        if len(history) < 2:
            return False
        a, b = history[-2]["objective"], history[-1]["objective"]
        return abs(a - b) <= tol * max(abs(a), abs(b), np.finfo(float).tiny)

    def get_params(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}
