"""Parameter tables cut into row partitions, and who owns each (no Dask here).

A table of ``n_rows`` rows is cut into ``n_parts`` contiguous row blocks whose
bounds are a pure function of ``(n_rows, n_parts)``, so every process computes
the same layout. ``PartitionMap`` is the coordinator's truth of which worker
owns each partition: every partition has exactly one owner at a time.
"""
from __future__ import annotations

import bisect
import heapq
import os
from dataclasses import dataclass
from functools import cached_property
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


def placement_plan(phase_sizes: Iterable[int], workers: list[str]) -> list[tuple[int, str]]:
    """(shard, worker) where the data goes first: contiguous blocks of each data phase's shards
    (``phase_sizes``: shards per phase, in order), so every phase starts balanced."""
    plan, start = [], 0
    for n in phase_sizes:
        plan += [(start + i, workers[i * len(workers) // n]) for i in range(n)]
        start += n
    return plan


def data_homes(layouts: Iterable[TableLayout], shard_bounds: list[tuple[int, int]],
               plan: list[tuple[int, str]]) -> dict[tuple[str, int], str]:
    """Owners for the partitions of tables whose rows are the data's rows (as many rows as the
    shards cover; LDA's ``doc_topic``): each goes to the worker ``plan`` first puts the shard
    holding its middle row on, so a shard's updates to its own rows stay on its worker."""
    if not shard_bounds or not plan:
        return {}
    n_rows, where = shard_bounds[-1][1], dict(plan)
    starts = [a for a, _ in shard_bounds]
    homes = {}
    for t in layouts:
        if t.n_rows != n_rows:
            continue
        for part, (a, b) in enumerate(t.bounds):
            shard = bisect.bisect_right(starts, (a + b - 1) // 2) - 1
            if shard in where:
                homes[(t.name, part)] = where[shard]
    return homes


def shard_homes(layouts: Iterable[TableLayout], shard_bounds: list[tuple[int, int]]) -> dict[int, tuple[str, int]]:
    """The partition each shard's steps update locally: of the first table whose rows are the data's rows
    (``data_homes``' tables), the one holding the shard's middle row. Empty when no table is. A shard held by
    that partition's owner pulls and pushes those rows without a message (``elastic.shard_plan``)."""
    if not shard_bounds:
        return {}
    n_rows = shard_bounds[-1][1]
    t = next((t for t in layouts if t.n_rows == n_rows), None)
    if t is None:
        return {}
    ends = [b for _, b in t.bounds]
    return {s: (t.name, bisect.bisect_right(ends, (a + b - 1) // 2)) for s, (a, b) in enumerate(shard_bounds)}


def row_units(layouts: Iterable[TableLayout]) -> dict[tuple[str, int], tuple[str, int]]:
    """The unit of every partition: partition ``p`` of every table laid out alike (as many rows, cut into as
    many partitions: the same row ranges) is one unit, ``("<n_rows>/<n_parts>", p)``. A step that reads or
    updates rows of one reads or updates the same rows of the others (a model's per-row weights and their
    running statistics, or its tables of the data's rows), so a unit with one owner answers them in one message
    and applies them in one place: ``elastic``'s unit plans move units whole."""
    return {(t.name, p): (f"{t.n_rows}/{t.n_parts}", p) for t in layouts for p in range(t.n_parts)}


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


class _Owners(dict):
    """A dict that counts its changes: ``PartitionMap.to_msg`` is built once per change, not once per
    work item (every item carries it)."""

    version = 0

    def _changed(method):
        def changed(self, *args, **kw):
            self.version += 1
            return method(self, *args, **kw)
        return changed

    __setitem__ = _changed(dict.__setitem__)
    __delitem__ = _changed(dict.__delitem__)
    pop = _changed(dict.pop)
    popitem = _changed(dict.popitem)
    setdefault = _changed(dict.setdefault)
    update = _changed(dict.update)
    clear = _changed(dict.clear)
    __ior__ = _changed(dict.__ior__)
    del _changed


class PartitionMap:
    """Owner of every ``(table, part)``; assignment balances rows across workers."""

    def __init__(self, layouts: Iterable[TableLayout]):
        self.layouts = {t.name: t for t in layouts}
        self.owners: dict[tuple[str, int], str] = _Owners()
        self._msg: tuple[int, list[list]] | None = None
        #: this map's own prefix of ``token``: a worker that held another map of the same job (a job set up
        #: again) never takes its token for this one's
        self._epoch = os.urandom(4).hex()

    def assign(self, workers: list[str], homes: Mapping[tuple[str, int], str] | None = None) -> None:
        """Give every partition an owner: ``homes`` (``data_homes``) first, then each row unit's other
        partitions (``units``: the same rows of tables laid out alike) together, to the worker holding fewest
        rows, the units in the order of their first table. A step that reads or updates rows of a unit asks
        one owner, as after a hand-off or an even-out (``elastic``'s unit plans); table by table, a cut whose
        partitions differ by a row (rows not a multiple of the parts) put each table's partition ``p`` on
        another worker."""
        if not workers:
            raise ValueError("no workers to own partitions")
        load = {w: 0 for w in sorted(workers)}
        homes = {k: w for k, w in (homes or {}).items() if w in load}
        for k, w in homes.items():
            if k in self.rows:
                self.owners[k] = w
                load[w] += self.rows[k]
        units: dict[tuple[str, int], list[tuple[str, int]]] = {}
        for k, u in self.units.items():  # (in table order, then part order: a unit at its first table's place)
            if k not in homes:
                units.setdefault(u, []).append(k)
        # the least-loaded worker (ties: the first name) from a heap: a scan of the workers per
        # unit was O(W^2) at the start of a fit (4,096 workers: 16.8 million key calls)
        heap = [(n, w) for w, n in load.items()]
        heapq.heapify(heap)
        for members in units.values():
            n, w = heapq.heappop(heap)
            for k in members:
                self.owners[k] = w
            heapq.heappush(heap, (n + sum(self.rows[k] for k in members), w))

    @cached_property
    def rows(self) -> dict[tuple[str, int], int]:
        """The rows of every partition (the layouts are fixed for the map's life)."""
        return {(t, p): b - a for t, layout in self.layouts.items() for p, (a, b) in enumerate(layout.bounds)}

    @cached_property
    def units(self) -> dict[tuple[str, int], tuple[str, int]]:
        """The row unit of every partition (``row_units``)."""
        return row_units(self.layouts.values())

    def rows_by_worker(self) -> dict[str, int]:
        load: dict[str, int] = {}
        for k, w in self.owners.items():
            load[w] = load.get(w, 0) + self.rows[k]
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
        """msgpack-able form: ``[[table, part, owner], ...]`` (built once per change of the owners;
        the same list each time: read it, do not change it)."""
        version = getattr(self.owners, "version", None)
        if version is None or self._msg is None or self._msg[0] != version:
            msg = [[t, p, w] for (t, p), w in sorted(self.owners.items())]
            if version is None:
                return msg  # owners replaced by a plain dict: no cache
            self._msg = (version, msg)
        return self._msg[1]

    def token(self) -> str | None:
        """Names the owners as they are now (changes with each change of them; None: owners replaced by a
        plain dict, which counts no changes)."""
        version = getattr(self.owners, "version", None)
        return None if version is None else f"{self._epoch}.{version}"

    def for_item(self, item: dict, known: str | None) -> dict:
        """A work item's owners as its worker needs them: the whole map (``owners``) only where the worker
        does not hold it already (``known``: the token it said it holds), else just the token
        (``owners_token``). Every item carried the whole map before: O(partitions) bytes a grant, so
        O(W^2) a clock at W workers each owning a partition (5.5 kB an item at W = 1,024)."""
        token = self.token()
        if token is None:
            return item
        item["owners_token"] = token
        if known == token:
            item.pop("owners", None)
        return item

    @staticmethod
    def owners_from_msg(msg: Iterable) -> dict[tuple[str, int], str]:
        return {(t, int(p)): w for t, p, w in msg}
