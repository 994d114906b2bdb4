"""A model's first clocks on a tiny problem, in one process, with no engine: the warm-up of a CuPy worker.

Why: on CuPy, every elementwise kernel, reduction and ``bincount`` / ``add.at`` the namespace code
launches is compiled by NVRTC the first time it meets a new dtype signature. Compiled mid-fit it
stalls its worker, and issue 42's SSP fits on a GPU hung with two runner threads inside
``nvrtcCompileProgram`` (from ``cupy.bincount`` in ``LDAGibbs._push_deltas`` and ``cupy.add.at`` in
the sweep). Running the model's own ``shard_step`` and ``clock_end`` on a tiny input with the fit's
dtypes, in ``warm_up`` (before clock 1, one thread at a time), compiles them all before any runner
thread starts. The rehearsal runs on NumPy as well (that is how the suite tests it).

``Rehearsal`` holds every table in one array in memory, applies a clock's adds at its end (as a
commit does) and resets the reductions; it implements what ``ShardContext`` and ``ClockContext``
promise and nothing more.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from dscar.algorithm import Algorithm, DataMeta


class Rehearsal:
    """The contexts of one shard's steps and of the clock ends, over in-memory tables."""

    def __init__(self, algo: Algorithm, meta: DataMeta, xp: ModuleType):
        self.algo, self.meta, self.xp = algo, meta, xp
        self.specs = {t.name: t for t in algo.tables(meta)}
        self.tables = {name: self._initial(t) for name, t in self.specs.items()}
        self.pending: list[tuple[str, Any, Any]] = []  # (table, rows or start, values) until the clock's end
        self.clock, self.shard, self.phase = 1, 0, None
        self.tol, self.batch_scale = 1e-3, 1.0
        self.state: dict[str, Any] = {}
        self.restored: dict[str, list[tuple[int, int]]] = {}

    def _initial(self, t):
        if t.kind == "reduction":
            return self.xp.zeros((t.n_rows, *t.trailing), dtype=t.dtype)
        return self.xp.asarray(self.algo.init_rows(t, 0, t.n_rows, self.xp))

    # ShardContext / ClockContext
    def pull(self, table: str, start: int = 0, stop: int | None = None):
        return self.tables[table][start:stop].copy()

    def pull_rows(self, table: str, rows):
        return self.tables[table][self.xp.asarray(rows)]

    def add(self, table: str, values, start: int = 0) -> None:
        self.pending.append((table, int(start), self.xp.asarray(values)))

    def add_rows(self, table: str, rows, values) -> None:
        self.pending.append((table, self.xp.asarray(rows), self.xp.asarray(values)))

    def set_state(self, name: str, value) -> None:
        self.state[name] = value

    def summaries(self, table: str) -> list[list[np.ndarray]]:
        return [self.algo.summarize(table, self.tables[table], 0)]

    def assign(self, table: str, values, start: int = 0) -> None:
        v = self.xp.asarray(values)
        self.tables[table][start:start + v.shape[0]] = v

    # the clock
    def commit(self) -> None:
        """Apply the clock's adds, in the order made (rows of one ``add_rows`` are distinct)."""
        for table, where, values in self.pending:
            t = self.tables[table]
            if isinstance(where, int):
                t[where:where + values.shape[0]] += values.astype(t.dtype)
            else:
                t[where] += values.astype(t.dtype)
        self.pending.clear()

    def run(self, shards: list[tuple[str | None, dict[str, Any]]], clocks: int) -> list[dict]:
        """``clocks`` clocks of ``shards`` (``(phase, prepared data)``, shard ``i`` the ``i``-th, in clock
        order), each step committed before the next (a phase's result is the next one's input) and each
        clock closed by ``clock_end``; returns the clock ends' metrics."""
        history = []
        for clock in range(1, clocks + 1):
            self.clock = clock
            for t in self.specs.values():
                if t.kind == "reduction":
                    self.tables[t.name][...] = 0
            for shard, (phase, data) in enumerate(shards):
                self.shard, self.phase = shard, phase
                self.algo.shard_step(self, data)
                self.commit()
            history.append(self.algo.clock_end(self))
        return history


def _meta(arrays: dict[str, Any], **kw) -> DataMeta:
    n = int(next(iter(arrays.values())).shape[0])
    return DataMeta(n_rows=n, shapes={k: tuple(v.shape[1:]) for k, v in arrays.items()},
                    dtypes={k: str(v.dtype) for k, v in arrays.items()},
                    sparse={k: hasattr(v, "tocsr") for k, v in arrays.items()}, **kw)


def rehearse(algo: Algorithm, arrays: dict[str, Any], xp: ModuleType, clocks: int = 2) -> list[dict]:
    """``clocks`` clocks of ``algo`` on the one-shard data ``arrays`` (host arrays, row-aligned; no
    phases) in namespace ``xp``; returns the clock ends' metrics (the suite checks them)."""
    n = int(next(iter(arrays.values())).shape[0])
    meta = _meta(arrays, n_shards=1, shard_bounds=((0, n),))
    algo.validate(meta)
    return Rehearsal(algo, meta, xp).run([(None, algo.prepare_shard(dict(arrays), xp))], clocks)


def rehearse_phases(algo: Algorithm, phases: dict[str, dict[str, Any]], xp: ModuleType, clocks: int = 2) -> list[dict]:
    """The same for a model with data phases: one shard per phase (``phases``: name -> its host arrays, in
    the order of ``algo.phases``)."""
    first = phases[algo.phases[0]]
    meta = _meta(first, n_shards=len(phases), phases=tuple((name, 1) for name in algo.phases))
    algo.validate(meta)
    shards = [(name, algo.prepare_shard(dict(phases[name]), xp)) for name in algo.phases]
    return Rehearsal(algo, meta, xp).run(shards, clocks)
