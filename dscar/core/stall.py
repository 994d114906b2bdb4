"""Whether a job has stopped moving while it should be working (no Dask here).

A lost or hung worker is found by its silence (``Coordinator._watch_heartbeats``), and a slow
one by the monitor. What neither sees is a job whose workers all answer while nothing they do
moves it on: a bug in the engine's own bookkeeping, a clock-end step that never reports. Such
a fit would wait for ever, so the coordinator asks ``StallWatch`` every tick and, once the job's
progress key has not changed for ``limit_s`` seconds while the job is working, reports it once
(a ``job-stalled`` event with the job's state and where the runner threads of the workers
holding it stand, and a warning in the scheduler's log).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable


@dataclass
class StallWatch:
    """Tracks one job's progress key over time."""

    #: seconds without a change of the key that make a stall
    limit_s: float
    #: the last key seen, and since when it has not changed
    _key: Hashable = field(default=None, repr=False)
    _since: float | None = field(default=None, repr=False)
    #: a stall was reported and the key has not changed since: do not report it again
    _reported: bool = field(default=False, repr=False)

    def observe(self, key: Hashable, now: float, working: bool = True) -> float | None:
        """The seconds the job has stood still when that first passes ``limit_s`` while it is
        ``working`` (else None: it moved, it waits on its driver, or this stall was reported)."""
        if self._since is None or key != self._key or not working:
            self._key, self._since, self._reported = key, now, False
            return None
        still = now - self._since
        if self._reported or still <= self.limit_s:
            return None
        self._reported = True
        return still


def workers_to_ask(report: dict, job_workers: list[str]) -> list[str]:
    """Whose runner threads a stall report looks into: the workers of the attempts running and of
    the clock end in flight, or every worker of the job when the report names none (a stall
    between stages may be anywhere)."""
    named = {r[2] for r in report.get("running", ())}
    if report.get("clock_end_worker"):
        named.add(report["clock_end_worker"])
    return sorted(named) if named else sorted(job_workers)
