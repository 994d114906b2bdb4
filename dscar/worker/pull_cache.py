"""A worker's copy of the tables it pulled, shared by the attempts it runs (no Dask here).

A shard step's ``pull`` fetches rows from their owners once and keeps them here, so the
worker's other attempts of the same clock (BSP) or of the open clocks (SSP) read them without
a round trip. The copy is good for one run id (a new one means a new pass, a redo or a
recovery); under SSP it is also as new as ``version`` (``ClockWindow.version`` when it was
cleared), and the worker adds its own granted updates to it (**write-back**: ``written_back``),
so that its next attempts of the same shards read their own writes without a fresh pull
(``dscar.core.ssp.copy_serves`` decides whether the copy serves an item).

Invariant: every entry holds each update in ``written_back`` and ``settled`` exactly once. An
entry fetched before the update was granted gets it added (``write_back``); one fetched after
asked each owner which of the worker's updates its partition already holds (``mine``, the
owner's ``PartitionStore.held``, read under the same lock as the rows) and got the others added
(``patch``): a batch may be applied by some owners and not yet by others.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .partition_store import add_update
from ..core.ssp import copy_serves

#: the key of the entry holding every small table whole (one message per owner for all of them)
SMALL = ("small tables",)


class PullCache:
    """Pulled rows by ``(table, start, stop, sums)`` (``sums``: the clock of a reduction's sums
    under SSP, else None), and every small table whole under ``SMALL``: ``(sums, {table: rows})``."""

    def __init__(self) -> None:
        #: the pulled arrays (on the job's device)
        self.entries: dict[tuple, Any] = {}
        #: the run id the entries belong to (tables change only with a new run id)
        self.run: int = -1
        #: under SSP: the entries are at least this new (``ClockWindow.version``)
        self.version: int = -1
        #: (shard, clock) -> (attempt, updates) of this worker's granted SSP updates of open clocks:
        #: every entry holds each of them exactly once (fetched with it, or added here)
        self.written_back: dict[tuple[int, int], tuple[int, list]] = {}
        #: (shard, clock) of updates written back whose clock has finished since (every owner holds
        #: them): the entries hold them, and a fetch need not ask about them
        self.settled: set[tuple[int, int]] = set()

    def clear(self) -> None:
        """Drop the entries (the updates written back stay: a fetch adds those its owner lacks)."""
        self.entries.clear()
        self.settled.clear()

    def prepare(self, item: dict) -> None:
        """Keep the entries for work item ``item`` when they serve its reads, else drop them."""
        if self.run != item["run"]:  # a new pass, a redo, a recovery: every table may have changed
            self.clear()
            self.written_back.clear()
            self.run, self.version = item["run"], item.get("version", -1)
            return
        if "read_floor" not in item:  # BSP: tables change only with a new run id
            return
        floor = item["floor"]
        for key in [k for k in self.written_back if k[1] <= floor]:
            del self.written_back[key]  # its clock finished: in every partition now
            self.settled.add(key)
        members = [(m["shard"], m["clock"], m["seen"], m["mine"]) for m in item["shards"]]
        # a member whose previous update the window took as another's (or wrote off) while the entries
        # hold this worker's attempt of it: that attempt's update is not what the tables hold
        held = self.settled | set(self.written_back)
        foreign = {(shard, clock - 1) for shard, clock, _, mine in members if not mine} & held
        for key in foreign:
            self.written_back.pop(key, None)
        if foreign or not copy_serves(self.version, held, item["read_floor"], members):
            self.clear()
            self.version = item["version"]

    def mine(self) -> list | None:
        """``[run, [[clock, shard, attempt], ...]]`` of the updates written back, for a fetch to ask
        which its owner holds; None when there are none."""
        if not self.written_back:
            return None
        return [self.run, [[clock, shard, attempt] for (shard, clock), (attempt, _) in self.written_back.items()]]

    def patch(self, rows, table: str, part: int, lo: int, held: list, xp):
        """Add to ``rows`` (fetched rows ``lo..`` of partition ``part`` of ``table``) the updates
        written back that their owner had not applied (``held``: those it had); returns the rows."""
        held = {tuple(k) for k in held}
        for (shard, clock), (attempt, updates) in self.written_back.items():
            if (clock, shard, attempt) not in held:
                rows = _add_rows(rows, lo, [(a, d, r) for t, p, a, d, r in updates if t == table and p == part], xp)
        return rows

    def get(self, key: tuple):
        return self.entries.get(key)

    def put(self, key: tuple, value) -> None:
        """Keep fetched rows (patched by the fetch: they hold every update written back)."""
        self.entries[key] = value

    def write_back(self, shard: int, clock: int, attempt: int, updates: list,
                   bounds: dict[str, list[tuple[int, int]]], xp) -> None:
        """Add the granted update of ``shard``'s ``attempt`` in ``clock`` (``updates``: ``(table,
        part, lo, data, rows)``, partition-local rows; ``bounds``: each param table's partition
        bounds; reduction tables are left out) to every entry holding its rows."""
        updates = [u for u in updates if u[0] in bounds]
        for key, table, start, arr in self._holding({u[0] for u in updates}):
            first = bounds[table]  # rows of the table, then of the entry (its row 0 is the table's ``start``)
            ups = [(first[p][0] + lo - start, d, None if r is None else first[p][0] + np.asarray(r) - start)
                   for t, p, lo, d, r in updates if t == table]
            self._set(key, table, _add_rows(arr, 0, ups, xp))
        self.written_back[(shard, clock)] = (attempt, updates)

    def _holding(self, tables: set[str]) -> list[tuple[tuple, str, int, Any]]:
        """(key, table, first row, array) of every entry holding rows of ``tables``."""
        out = []
        small = self.entries.get(SMALL)
        if small is not None:
            out += [(SMALL, t, 0, small[1][t]) for t in sorted(tables) if t in small[1]]
        out += [(k, k[0], k[1], arr) for k, arr in self.entries.items()
                if k != SMALL and k[0] in tables and k[3] is None]
        return out

    def _set(self, key: tuple, table: str, arr) -> None:
        if key == SMALL:
            self.entries[SMALL][1][table] = arr
        else:
            self.entries[key] = arr


def _add_rows(arr, lo: int, updates: list, xp):
    """Add ``updates`` (``(first, data, rows)``: to rows ``first..``, or to ``rows``) to the rows
    of ``arr`` they reach, ``arr`` holding rows ``lo..``; returns ``arr`` (a writable copy when it
    was read-only)."""
    n = arr.shape[0]
    for first, data, rows in updates:
        if rows is None:
            a, b = max(first, lo), min(first + data.shape[0], lo + n)
            if a < b:
                arr = _writable(arr)
                add_update(xp, arr, a - lo, data[a - first : b - first])
        else:
            rows = np.asarray(rows)
            sel = (rows >= lo) & (rows < lo + n)
            if sel.any():
                arr = _writable(arr)
                add_update(xp, arr, 0, data[sel], rows[sel] - lo)
    return arr


def _writable(arr):
    return arr if getattr(getattr(arr, "flags", None), "writeable", True) else arr.copy()
