"""One record per worker: what a hand-out and a commit read and write of it (no Dask here).

A worker's hand-out and its commit each read and write the same few facts of that worker: when it was
last seen, the item it runs, its batch members that may not have started (``dscar.core.dispatch``), its
window of step times and their median (``dscar.core.monitor``), under BSP whether it was handed a
shard attempt this clock (``dscar.core.schedule``). Kept in a dict or set of their own each, a
commit looked the worker up in six dicts of W entries, each a cold read at thousands of workers; kept
in one ``WorkerRecord``, it looks it up once. The monitor holds the job's table (``ThroughputMonitor.records``)
and the dispatch reads the same one (``Dispatch``): a record is made on a worker's first poll or step,
and kept (a lost worker's fields are cleared, as its entries were dropped).

The readers of the former dicts read a ``RecordView``: a mapping of the workers whose field is set.
"""
from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping
from typing import Any


class WorkerRecord:
    """What the core keeps of one worker (None: not known, or none). The fields a hand-out and a commit
    read come first (a record spans two cache lines)."""

    __slots__ = ("seen", "running", "members", "batch_changed", "mean", "steps", "low", "high", "item", "handed_in",
                 "warmup", "key")

    def __init__(self) -> None:
        #: when it last asked for work or committed (``Dispatch.worth_moving``: a holder that stopped asking)
        self.seen: float | None = None
        #: (hand-out time, shards) of the shard-pass work item it runs, until it commits or fails
        #: (``Dispatch.running_items``)
        self.running: tuple[float, int] | None = None
        #: (shard, attempt) of the members of its last work item that may not have started, never empty
        #: (``Dispatch.batched``; changed only through the dispatch, which keeps its ``BatchIndex`` in step)
        self.members: list[tuple[int, int]] | None = None
        #: its members changed since the ``BatchIndex`` was last read (it is listed in its ``_changed``)
        self.batch_changed = False
        #: its typical step time: the median of ``steps`` (``ThroughputMonitor.mean_step``)
        self.mean: float | None = None
        #: its last ``ThroughputMonitor.window`` step times after the warm-up, oldest first
        self.steps: array | None = None
        #: the middle pair of ``steps`` sorted (the lower and upper middle: the same one when odd), as of the
        #: last sort: ``mean`` is theirs (``ThroughputMonitor.record`` sorts only when a step may move them)
        self.low: float | None = None
        self.high: float | None = None
        #: the id of the last work item handed to it (``Dispatch.item_of``: a release names it)
        self.item: int | None = None
        #: BSP: the clock (``BspSchedule.begins``) in which it was last handed a shard attempt
        self.handed_in: int | None = None
        #: its first attempt's step time (``ThroughputMonitor``: compared only with the others' warm-ups)
        self.warmup: float | None = None
        #: its name as a ``BatchIndex`` key (``dispatch._descending``), kept while it is not forgotten
        self.key: str | None = None


class WorkerRecords(dict):
    """worker -> its ``WorkerRecord``: ``records[w]`` makes one on first use, ``get`` never does."""

    def __missing__(self, worker: str) -> WorkerRecord:
        record = self[worker] = WorkerRecord()
        return record


class RecordView(Mapping):
    """worker -> one field of its record, for the workers whose field is set: what a dict of its own
    showed before the records held it (read live; iterating or sizing it visits every record)."""

    __slots__ = ("_records", "_field")

    def __init__(self, records: WorkerRecords, field: str):
        self._records, self._field = records, field

    def get(self, worker: str, default: Any = None) -> Any:
        record = self._records.get(worker)
        value = None if record is None else getattr(record, self._field)
        return default if value is None else value

    def __getitem__(self, worker: str) -> Any:
        value = self.get(worker)
        if value is None:
            raise KeyError(worker)
        return value

    def __contains__(self, worker: object) -> bool:
        return self.get(worker) is not None  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[str]:
        field = self._field
        return (w for w, r in self._records.items() if getattr(r, field) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return repr(dict(self))
