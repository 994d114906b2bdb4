"""One job's table partitions on one worker: values, checkpointed copies, staged updates.

Pure (no Dask): ``dscar.worker.plugin`` holds one ``PartitionStore`` per job and answers
the ``dscar_*`` handlers from it; the store decides nothing the coordinator decides.

Exactly once: a shard attempt stages its contributions on the worker that ran it
(``stage``, keyed ``(clock, shard, attempt)`` with its run id), then asks the
coordinator to commit. When the pass is complete the coordinator tells every
worker which ``(shard, attempt, worker)`` committed; each owner collects those
attempts' updates to its partitions from the workers that ran them and staged
some for it (each commit reports the partitions it touched, ``touched_parts``;
``select_staged``: one message per such worker and pass), or, where that would be
O(W²) messages, from the root of an aggregation tree whose members hold their
subtrees' updates (``hold_combined`` / ``select_combined``; ``dscar.core.apply_plan``),
and applies exactly those,
in shard order, so sums are deterministic (``apply_pass``); holders install
exactly those shard states (``dscar.worker.shard_store``); everything else is dropped.
A staged update of an older run is never applied: ``select_staged`` answers
``missing`` for it and ``apply_pass`` drops it. A worker lost with committed,
unapplied attempts takes them with it: the coordinator runs those shards again
(or skips the clock, if it was applying).
"""
from __future__ import annotations

import threading
from types import ModuleType
from typing import Any, Iterable

import numpy as np

from .. import checkpoint as ckpt
from ..algorithm import TableSpec
from ..core.partitions import TableLayout
from ..xp import to_host

#: ``(table, part)``: a partition of a table
Part = tuple[str, int]
#: ``(clock, shard, attempt)``: an attempt's key
Key = tuple[int, int, int]
#: ``(table, part, lo, values, rows)``: add ``values`` at rows ``lo..`` (``rows`` None) or at ``rows``
Update = tuple[str, int, int, np.ndarray, "np.ndarray | None"]


def add_update(xp, arr, lo: int, data, rows=None) -> None:
    """Add one update's ``data`` to ``arr``: rows ``lo..`` or, with ``rows``, those rows (repeats
    add up). The one way an update is added: by the owners applying it, and by a worker adding its
    own to its pulled copy (``PullCache.write_back``)."""
    if rows is None:
        arr[lo : lo + data.shape[0]] += xp.asarray(data)
    else:
        xp.add.at(arr, xp.asarray(rows), xp.asarray(data))


def touched_parts(updates: Iterable[Update], n_parts: dict[str, int]) -> dict[str, list[int] | None]:
    """The partitions ``updates`` add to, per table: a sorted list, or None where they add to every
    partition of the table (``n_parts``: each table's partition count). An attempt's commit reports
    it, so an owner fetches staged updates only from the workers that staged some for it."""
    out: dict[str, set[int]] = {}
    for table, part, *_ in updates:
        out.setdefault(table, set()).add(int(part))
    return {t: (None if len(ps) >= n_parts.get(t, len(ps) + 1) else sorted(ps)) for t, ps in out.items()}


class PartitionStore:
    """The partitions of one job held by this worker, and the updates staged by attempts run here."""

    def __init__(self, specs: dict[str, TableSpec], layouts: dict[str, TableLayout], xp: ModuleType,
                 lock: threading.RLock | None = None):
        self.specs, self.layouts, self.xp = specs, layouts, xp
        #: guards every field; shared with the job's shard store, so a pass applies atomically
        self.lock = lock if lock is not None else threading.RLock()
        #: (table, part) -> the partition's current values (on the job's device)
        self.parts: dict[Part, Any] = {}
        #: (table, part) -> host copy of a param partition as of its last checkpoint
        self.saved: dict[Part, np.ndarray] = {}
        #: (table, part) -> fraction of a row a priority save owes it (``checkpoint.priority_count``)
        self.credit: dict[Part, float] = {}
        #: (table, part) -> (rows still owed for its last whole save, rows each save repays)
        self.debt: dict[Part, tuple[float, float]] = {}
        #: (clock, shard, attempt) -> (run id, updates) staged here by attempts, applied if they commit
        self.staged: dict[Key, tuple[int, list[Update]]] = {}
        #: SSP: (table, part, clock) -> a reduction partition's sums of that clock (several clocks are
        #: open at once); a finished clock's are kept until the next one finishes (what BSP's shard
        #: steps read in a clock's first phase)
        self.sums: dict[tuple[str, int, int], Any] = {}
        #: SSP: (table, part) -> {(clock, shard, attempt): run id} of the updates of open clocks
        #: applied to a param partition held here (a worker's pull asks which of its own it holds)
        self.holds: dict[Part, dict[Key, int]] = {}
        #: SSP: the newest finished clock the applies here were told of (its updates are in every partition)
        self.floor: int = 0
        #: BSP: the run id of the newest pass applied here (every attempt of it or an older run lost)
        self.applied_run: int = -1
        #: (run, clock or SSP batch) of a pass -> key -> (worker that staged it, updates): this worker's
        #: combined set when the pass goes through an aggregation tree (``dscar.core.apply_plan``), served
        #: to its parent and to the owners; kept until a newer pass is combined or applied here
        self.combined: dict[tuple[int, int], dict[Key, tuple[str, list[Update]]]] = {}
        #: raised by every change of the partitions held (own, disown, clear, assign, apply): a value
        #: computed from them at one version holds while the version does
        self.version = 0

    # ------------------------------------------------------------ owning
    def own(self, table: str, part: int, values, checkpointed: bool = False, holds: Iterable = ()) -> None:
        """Hold ``values`` as partition ``(table, part)``; ``checkpointed``: they are also its last
        checkpointed values (initial values are checkpoint 0, a restore reads a checkpoint);
        ``holds``: ``(clock, shard, attempt, run)`` of the SSP updates of open clocks in ``values``."""
        arr = self.xp.asarray(values, dtype=self.specs[table].dtype) if checkpointed else self.xp.asarray(values)
        with self.lock:
            self.version += 1
            self.parts[(table, int(part))] = arr
            self.holds[(table, int(part))] = {(int(c), int(s), int(a)): int(r) for c, s, a, r in holds}
            for k in [k for k in self.sums if k[:2] == (table, int(part))]:
                del self.sums[k]  # a restored reduction partition starts its clocks' sums anew
            if checkpointed and self.specs[table].kind == "param":
                self.saved[(table, int(part))] = to_host(arr).copy()

    def disown(self, table: str, part: int) -> Any:
        """Hold partition ``(table, part)`` no more: it moved to another owner (a join's switch). Its
        values as they were (None: not held here), which nothing here touches again."""
        key = (table, int(part))
        with self.lock:
            self.version += 1
            values = self.parts.pop(key, None)
            for held in (self.saved, self.credit, self.debt, self.holds):
                held.pop(key, None)
            for k in [k for k in self.sums if k[:2] == key]:
                del self.sums[k]
        return values

    def owned(self) -> dict[Part, Any]:
        """The partitions held now (a shallow copy: a pass updates those it started with)."""
        with self.lock:
            return dict(self.parts)

    def clear(self) -> None:
        """Drop everything, as a crash would (a simulated loss)."""
        with self.lock:
            self.version += 1
            self.parts.clear()
            self.saved.clear()
            self.debt.clear()
            self.staged.clear()
            self.combined.clear()
            self.sums.clear()
            self.holds.clear()
            self.applied_run = -1

    def _values(self, table: str, part: int, clock: int | None):
        """A partition's values; for a reduction table under SSP (``clock`` given), its sums of
        ``clock`` (zeros before any). None when not held here."""
        arr = self.parts.get((table, int(part)))
        if arr is None or clock is None or self.specs[table].kind != "reduction":
            return arr
        got = self.sums.get((table, int(part), int(clock)))
        return self.xp.zeros_like(arr) if got is None else got

    # ------------------------------------------------------------ reading
    def host_rows(self, table: str, part: int, lo: int = 0, hi: int = 0, rows=None,
                  clock: int | None = None) -> np.ndarray | None:
        """Rows ``[lo, hi)`` or ``rows`` (local indices) of a partition, as a contiguous host copy;
        None when it is not held here (it moved, or the job ended)."""
        with self.lock:
            arr = self._values(table, part, clock)
            if arr is None:
                return None
            out = to_host(arr[lo:hi]).copy() if rows is None else to_host(
                arr[self.xp.asarray(np.asarray(rows, dtype=np.int64))])
        return np.ascontiguousarray(out)

    def host_parts(self, parts: Iterable[Part], clock: int | None = None) -> list[np.ndarray] | None:
        """Whole partitions as host copies (a message is serialised after the lock is let go, and
        an apply may change the partitions meanwhile); None when one is not held here."""
        with self.lock:
            keys = [(t, int(p)) for t, p in parts]
            if any(k not in self.parts for k in keys):
                return None
            return [to_host(self._values(*k, clock)).copy() for k in keys]

    def summarize(self, table: str, parts: Iterable[int], summarize,
                  clock: int | None = None) -> list[list[np.ndarray]] | None:
        """``summarize(table, values, start)`` of each partition ``parts`` of ``table`` (``start``: its
        first global row), under the lock: no apply changes the rows it reads. None when one is
        not held here."""
        bounds = self.layouts[table].bounds
        with self.lock:
            if any((table, int(p)) not in self.parts for p in parts):
                return None
            return [[np.asarray(x) for x in summarize(table, self._values(table, p, clock), bounds[int(p)][0])]
                    for p in parts]

    def rows(self, table: str, part: int, lo: int, hi: int, clock: int | None = None):
        """Rows ``[lo, hi)`` of a partition held here (a copy, on the device)."""
        with self.lock:
            if (table, int(part)) not in self.parts:
                raise KeyError((table, part))
            return self._values(table, part, clock)[lo:hi].copy()

    def rows_into(self, out, table: str, part: int, lo: int, hi: int, clock: int | None = None) -> None:
        """Copy rows ``[lo, hi)`` of a partition held here into ``out`` (a read gathering a range
        from several owners writes each piece where it goes: one copy, not a copy and a concatenation)."""
        with self.lock:
            if (table, int(part)) not in self.parts:
                raise KeyError((table, part))
            out[...] = self._values(table, part, clock)[lo:hi]

    def row_set(self, table: str, part: int, local, clock: int | None = None):
        """Rows ``local`` (local indices, any order) of a partition held here."""
        with self.lock:
            if (table, int(part)) not in self.parts:
                raise KeyError((table, part))
            return self._values(table, part, clock)[self.xp.asarray(local)]

    def assign(self, table: str, part: int, lo: int, data) -> None:
        """Overwrite rows ``lo..`` of a partition held here (a clock-end step's ``assign``)."""
        with self.lock:
            self.version += 1
            arr = self.parts[(table, int(part))]
            arr[lo : lo + data.shape[0]] = self.xp.asarray(data)

    # ------------------------------------------------------------ staging
    def stage(self, key: Key, run: int, updates: Iterable[Update]) -> list[Update]:
        """Keep an attempt's updates until its pass is applied (copied: a step may reuse its
        buffers); returns the copies."""
        staged = [(t, int(p), int(lo), np.array(d, copy=True), None if r is None else np.array(r, dtype=np.int64))
                  for t, p, lo, d, r in updates]
        with self.lock:
            self.staged[tuple(key)] = (run, staged)
        return staged

    def select_staged(self, run: int, keys: Iterable, parts: Iterable | None) -> tuple[Key | None, list]:
        """The updates staged here by ``keys`` (committed attempts of ``run``) to ``parts`` (an
        owner's partitions; None: all, for a combine step): ``(None, [(key, updates), ...])``, or
        ``(key, [])`` for the first key not staged here under ``run`` (the pass cannot be applied)."""
        want = None if parts is None else {(t, int(p)) for t, p in parts}
        out = []
        with self.lock:
            for key in keys:
                key = tuple(int(k) for k in key)
                staged_run, ups = self.staged.get(key, (None, ()))
                if staged_run != run:
                    return key, []
                out.append((key, list(ups) if want is None else [u for u in ups if (u[0], u[1]) in want]))
        return None, out

    def hold_combined(self, tag: tuple[int, int], entries: dict[Key, tuple[str, list[Update]]]) -> None:
        """Keep a combine step's set for the pass ``tag`` (``(run, clock or batch)``); older sets go."""
        tag = (int(tag[0]), int(tag[1]))
        with self.lock:
            for old in [t for t in self.combined if t < tag]:
                del self.combined[old]
            self.combined[tag] = entries

    def select_combined(self, tag: tuple[int, int], parts: Iterable | None, exclude: str | None = None
                        ) -> list[tuple[Key, str, list[Update]]] | None:
        """The combined set of pass ``tag``: every key not staged by ``exclude`` (an owner applies its
        own from ``staged``) with its updates to ``parts`` (None: all); None when not held here."""
        want = None if parts is None else {(t, int(p)) for t, p in parts}
        with self.lock:
            entries = self.combined.get((int(tag[0]), int(tag[1])))
            if entries is None:
                return None
            return [(key, source, list(ups) if want is None else [u for u in ups if (u[0], u[1]) in want])
                    for key, (source, ups) in entries.items() if source != exclude]

    # ------------------------------------------------------------ applying
    def update_bytes(self, keys: Iterable[Key], fetched: dict[Key, list]) -> int:
        """Bytes of updates applying ``keys`` would add here (an upper bound: all of them)."""
        with self.lock:
            return sum(d.nbytes for key in keys
                       for _, _, _, d, _ in (fetched.get(key) or self.staged.get(key, (None, ()))[1]))

    def apply_pass(self, run: int, keys: Iterable[Key], fetched: dict[Key, list], reset: set[str],
                   owned: dict[Part, Any], floor: int | None = None) -> int:
        """Apply the committed attempts ``keys`` of ``run`` to the partitions ``owned`` (those held
        when the pass began, unless replaced by a restore since): tables in ``reset`` start from
        zero, then each key's updates, in key (shard) order. An update comes from ``fetched``
        (collected from the worker that ran it) or from this store when run here under ``run``.
        Drops the staged updates of older runs (this pass's stay: other owners may still collect
        them). Returns the number of updates applied.

        SSP (``floor``, the newest finished clock, given): the keys span several clocks, and an
        update to a reduction table adds to its clock's sums (``sums``); staged updates and sums of
        finished clocks go (the newest finished clock's sums stay)."""
        applied, keys = 0, [tuple(k) for k in keys]
        with self.lock:
            self.version += 1
            owned = {k: a for k, a in owned.items() if self.parts.get(k) is a}
            for (table, _), arr in owned.items():
                if table in reset:
                    arr[...] = 0
            for key in sorted(set(keys), key=lambda k: (k[1], k[0])):  # shard order: deterministic sums
                if key in fetched:
                    ups = fetched[key]
                else:
                    staged_run, ups = self.staged.get(key, (None, ()))
                    if staged_run != run:
                        continue  # not run here
                for table, part, lo, data, rows in ups:
                    arr = owned.get((table, part))
                    if arr is None:
                        continue  # another owner's partition
                    if floor is not None and self.specs[table].kind == "reduction":
                        arr = self.sums.get((table, part, key[0]))
                        if arr is None:
                            arr = self.sums[(table, part, key[0])] = self.xp.zeros_like(owned[(table, part)])
                    add_update(self.xp, arr, lo, data, rows)
                    applied += 1
            for key in [k for k, (r, _) in self.staged.items() if r < run or (floor is not None and k[0] <= floor)]:
                del self.staged[key]
            for tag in [t for t in self.combined if t[0] < run]:
                del self.combined[tag]
            if floor is None:
                self.applied_run = max(self.applied_run, run)
            else:
                for k in [k for k in self.sums if k[2] < floor]:
                    del self.sums[k]
                self.floor = max(self.floor, floor)
                for part in owned:
                    if self.specs[part[0]].kind == "param":
                        holds = self.holds.setdefault(part, {})
                        holds.update((k, run) for k in keys if k[2] >= 0)  # (not the shards won elsewhere)
                        for k in [k for k, r in holds.items() if r < run or k[0] <= self.floor]:
                            del holds[k]
        return applied

    def held(self, part: Part, run: int, keys: Iterable) -> list[Key]:
        """Which of the SSP updates ``keys`` ((clock, shard, attempt) of ``run``) partition ``part``
        holds: those applied to it, and any of a finished clock (applied everywhere). A worker adds
        the others to its pulled copy (``PullCache.patch``)."""
        with self.lock:
            holds = self.holds.get((part[0], int(part[1])), {})
            return [tuple(k) for k in keys if k[0] <= self.floor or holds.get(tuple(k)) == run]

    def settled(self, part: Part | None, run: int, clock: int, shard: int, ssp: bool) -> bool:
        """Whether an attempt of ``shard`` in ``clock`` under ``run`` can no longer commit, as far as
        partition ``part`` tells (None: the store as a whole): under BSP a pass of ``run`` or newer
        was applied here (every shard of it committed first); under SSP ``clock`` has finished, or
        ``part`` holds an update of ``(clock, shard)`` of ``run`` (another attempt's, which won).
        Rows read after that are not the ones the attempt started from."""
        with self.lock:
            if not ssp:
                return run <= self.applied_run
            if clock <= self.floor:
                return True
            holds = self.holds.get((part[0], int(part[1])), {}) if part is not None else {}
            return any(k[0] == clock and k[1] == shard and r == run for k, r in holds.items())

    def holds_of(self, part: Part) -> list[tuple[int, int, int, int]]:
        """``(clock, shard, attempt, run)`` of the SSP updates in ``part`` (its adopter takes them)."""
        with self.lock:
            return [(*k, r) for k, r in self.holds.get((part[0], int(part[1])), {}).items()]

    # ------------------------------------------------------------ memory tier
    def param_copies(self) -> list[tuple[str, int, np.ndarray]]:
        """Host copies of the param partitions held here, taken at once (a buddy keeps them)."""
        with self.lock:
            return [(t, p, to_host(arr).copy()) for (t, p), arr in sorted(self.parts.items())
                    if self.specs[t].kind == "param"]

    # ------------------------------------------------------------ checkpoints
    def snapshot(self, fraction: float, whole: set[Part] = frozenset(), max_chain: int = ckpt.MAX_CHAIN
                 ) -> tuple[list[tuple[str, int, np.ndarray | None, np.ndarray]], float]:
        """What a checkpoint of the param partitions writes: ``(table, part, rows, values)``, all
        rows (``fraction >= 1``, ``rows`` None) or the ``fraction`` that moved most since their
        last save (``fraction * rows`` on average; a save that owes a tiny partition no row skips
        it); the partitions of ``whole`` all their rows, paid for by their next ``max_chain - 1``
        saves (``checkpoint.whole_count``); the saved copies are updated as if the write succeeded.
        Also the squared norm of the change they held since their saved copies, before this
        save: the perturbation losing them just before it would have caused
        (``intervals.rework_estimate``)."""
        snaps, unsaved = [], 0.0
        with self.lock:
            for (table, part), arr in sorted(self.parts.items()):
                if self.specs[table].kind != "param":
                    continue
                current = to_host(arr)
                saved = self.saved.get((table, part))
                moved = None if saved is None else ckpt.moved(current, saved)
                if moved is not None:
                    unsaved += float(moved.sum())
                if fraction >= 1 or moved is None:
                    rows, values = None, current.copy()
                elif (table, part) in whole:
                    _, debt = ckpt.whole_count(current.shape[0], fraction, self.credit.get((table, part), 0.0))
                    self.credit[(table, part)] = max(-debt, 0.0)
                    self.debt[(table, part)] = (max(debt, 0.0), max(debt, 0.0) / max(max_chain - 1, 1))
                    rows, values = None, current.copy()
                else:
                    debt, rate = self.debt.pop((table, part), (0.0, 0.0))
                    repay = min(debt, rate)
                    if debt - repay > 1e-9:
                        self.debt[(table, part)] = (debt - repay, rate)
                    k, self.credit[(table, part)] = ckpt.priority_count(
                        current.shape[0], fraction, self.credit.get((table, part), 0.0), repay)
                    if not k:
                        continue  # this save owes the partition no row: its chain goes on unchanged
                    rows = ckpt.priority_rows(moved, k)
                    values = current[rows].copy()
                new_saved = current.copy() if saved is None else saved
                new_saved[rows if rows is not None else slice(None)] = values
                self.saved[(table, part)] = new_saved
                snaps.append((table, part, rows, values))
        return snaps, unsaved
