"""Parameter tables cut into row partitions, and who owns each (no Dask here).

A table of ``n_rows`` rows is cut into ``n_parts`` contiguous row blocks whose
bounds are a pure function of ``(n_rows, n_parts)``, so every process computes
the same layout. ``PartitionMap`` is the coordinator's truth of which worker
owns each partition: every partition has exactly one owner at a time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping


def row_bounds(n_rows: int, n_parts: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` blocks, sizes differing by at most one."""
    if n_parts < 1 or n_rows < n_parts:
        raise ValueError(f"cannot cut {n_rows} rows into {n_parts} partitions")
    base, extra = divmod(n_rows, n_parts)
    out, start = [], 0
    for i in range(n_parts):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def by_owner(owners: Mapping[tuple[str, int], str], keys: Iterable[tuple[str, int]]) -> dict[str, list[tuple[str, int]]]:
    """``keys`` (table, part) grouped by owner, in the order given: one message per owner then
    carries all of that owner's partitions (initial values, gathers, small-table reads)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for k in keys:
        out.setdefault(owners[k], []).append(k)
    return out


@dataclass(frozen=True)
class TableLayout:
    name: str
    n_rows: int
    n_parts: int

    @property
    def bounds(self) -> list[tuple[int, int]]:
        return row_bounds(self.n_rows, self.n_parts)

    def split(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """The pieces ``(part, lo, hi)`` of global rows ``[start, stop)``."""
        if not 0 <= start <= stop <= self.n_rows:
            raise IndexError(f"rows [{start}, {stop}) outside table {self.name!r} of {self.n_rows} rows")
        pieces = []
        for part, (a, b) in enumerate(self.bounds):
            lo, hi = max(a, start), min(b, stop)
            if lo < hi:
                pieces.append((part, lo, hi))
        return pieces


class PartitionMap:
    """Owner of every ``(table, part)``; assignment balances rows across workers."""

    def __init__(self, layouts: Iterable[TableLayout]):
        self.layouts = {t.name: t for t in layouts}
        self.owners: dict[tuple[str, int], str] = {}

    def assign(self, workers: list[str]) -> None:
        """Give every partition an owner, greedily to the worker holding fewest rows."""
        if not workers:
            raise ValueError("no workers to own partitions")
        load = {w: 0 for w in sorted(workers)}
        for t in self.layouts.values():
            for part, (a, b) in enumerate(t.bounds):
                w = min(load, key=lambda w: (load[w], w))
                self.owners[(t.name, part)] = w
                load[w] += b - a

    def rows_by_worker(self) -> dict[str, int]:
        load: dict[str, int] = {}
        for (t, p), w in self.owners.items():
            a, b = self.layouts[t].bounds[p]
            load[w] = load.get(w, 0) + b - a
        return load

    def least_loaded(self, candidates: list[str]) -> str:
        """The candidate owning the fewest rows (ties by name)."""
        if not candidates:
            raise ValueError("no candidate workers")
        load = self.rows_by_worker()
        return min(sorted(candidates), key=lambda w: load.get(w, 0))

    def owned_by(self, worker: str) -> list[tuple[str, int]]:
        return sorted(k for k, w in self.owners.items() if w == worker)

    def workers(self) -> set[str]:
        return set(self.owners.values())

    def to_msg(self) -> list[list]:
        """msgpack-able form: ``[[table, part, owner], ...]``."""
        return [[t, p, w] for (t, p), w in sorted(self.owners.items())]

    @staticmethod
    def owners_from_msg(msg: Iterable) -> dict[tuple[str, int], str]:
        return {(t, int(p)): w for t, p, w in msg}
