"""The memory tier's copies kept on a buddy worker: other workers' param partitions and shard states.

Pure (no Dask). Each copy is keyed by what it copies (``part_key`` / ``shard_key``) and
labelled with the clock it holds; a late, older copy never replaces a newer one. A crash
loses them all (``clear``), which is why recovery falls back to disk when the buddy is gone.
"""
from __future__ import annotations

import threading
from typing import Any, Callable


def part_key(table: str, part: int) -> tuple:
    return ("part", str(table), int(part))


def shard_key(shard: int) -> tuple:
    return ("shard", int(shard))


class MirrorStore:
    """``key -> (clock, value)``: a partition's values, or a shard's state (a dict of arrays)."""

    def __init__(self):
        self.lock = threading.Lock()
        #: key -> (clock, value) of the newest copy received
        self.copies: dict[tuple, tuple[int, Any]] = {}

    def keep(self, key, clock: int, value: Any) -> None:
        with self.lock:
            key = tuple(key)
            old = self.copies.get(key)
            if old is None or old[0] <= clock:
                self.copies[key] = (int(clock), value)

    def discard(self, key, clock: int) -> bool:
        """Drop the copy of ``key`` if it is of ``clock`` or older (a newer one came since); whether it went."""
        with self.lock:
            key = tuple(key)
            old = self.copies.get(key)
            if old is None or old[0] > clock:
                return False
            del self.copies[key]
            return True

    def get(self, key) -> tuple[int, Any] | None:
        with self.lock:
            return self.copies.get(tuple(key))

    def clear(self) -> None:
        with self.lock:
            self.copies.clear()


def mirror_answer(got: tuple | None, wrap: Callable[[Any], Any] = lambda v: v) -> dict:
    """A ``get_mirror`` answer for a memory copy ``(clock, value)`` kept here (None: none): ``wrap`` the value
    for the wire where it is sent, not where this worker reads its own copy."""
    return {"status": "missing"} if got is None else {"status": "OK", "clock": got[0], "value": wrap(got[1])}
