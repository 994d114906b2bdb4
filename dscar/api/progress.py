"""The progress line of a fit: what matters while it runs, from each clock's record and the new events.

``ProgressLine.update(record, events)`` after every clock returns the text of a tqdm postfix:

    obj=0.5937643 s/clock=0.073 workers=2/3 stragglers=1 ckpt=v6 1 clock ago rework~0.3 lost=1 recoveries=1

``rework~`` (with a checkpoint store) is the clocks a loss now would cost (``dscar.core.intervals``).

``events`` is the run's append-only event list; only the entries added since the last call are read.
Pure (no Dask, no tqdm), so the driver's hook is one line and the rules are tested directly.
"""
from __future__ import annotations

from typing import Any, Sequence


class ProgressLine:
    """Running counts for the progress line (see the module docstring)."""

    def __init__(self) -> None:
        self.seen = 0  #: how many events of the run's list have been read
        self.started: int | None = None  #: workers the job started with (its job-started event)
        self.lost = 0  #: worker-lost events so far
        self.joined = 0  #: worker-joined events so far
        self.recoveries = 0  #: recovery-done events so far
        self.checkpoint: tuple[int, int] | None = None  #: (version, clock) of the newest published checkpoint
        self.last_clock = 0  #: the newest clock seen

    def update(self, record: Any, events: Sequence[dict[str, Any]]) -> str:
        """Take one ``ClockRecord`` and the event list so far; return the line."""
        for e in events[self.seen:]:
            kind = e.get("kind")
            if kind == "job-started":
                self.started = len(e.get("workers", ()))
            elif kind == "worker-lost":
                self.lost += 1
            elif kind == "worker-joined":
                self.joined += 1
            elif kind == "recovery-done":
                self.recoveries += 1
            elif kind == "checkpoint-published":
                v, c = int(e["version"]), int(e.get("clock", 0))
                if self.checkpoint is None or v > self.checkpoint[0]:
                    self.checkpoint = (v, c)
        self.seen = len(events)
        self.last_clock = record.clock
        return self.text(record)

    def text(self, record: Any) -> str:
        """The line for ``record`` from the counts so far."""
        workers = record.workers or {}
        stragglers = sum(1 for w in workers.values() if w.get("straggler"))
        parts = [f"obj={record.objective:.7g}", f"s/clock={record.seconds:.3g}"]
        if self.started:  # live now of all the job has had
            parts.append(f"workers={self.started - self.lost + self.joined}/{self.started + self.joined}")
        elif workers:
            parts.append(f"workers={len(workers)}")
        parts.append(f"stragglers={stragglers}")
        if self.checkpoint is None:
            parts.append("ckpt=none")
        else:
            v, c = self.checkpoint
            age = max(record.clock - c, 0)
            parts.append(f"ckpt=v{v} {age} clock{'' if age == 1 else 's'} ago")
        est = getattr(record, "checkpoint", None)
        if est:  # what a loss now would cost (dscar.core.intervals.rework_estimate)
            parts.append(f"rework~{est['rework_estimate']:.2g}")
        if self.lost:
            parts.append(f"lost={self.lost}")
        parts.append(f"recoveries={self.recoveries}")
        return " ".join(parts)
