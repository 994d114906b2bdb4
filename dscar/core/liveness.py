"""When a silent worker is probed, relative to Dask's heartbeat interval (no Dask here).

Dask's scheduler asks its workers for heartbeats at an interval that grows with the cluster
(``distributed.scheduler.heartbeat_interval``: 0.5 s up to 10 workers, 1 s below 50, 2 s below 200,
then ``n / 200 + 1``: 6 s at 1,000 workers, 21 s at 4,000). A fixed silence threshold of 3 s sees
every healthy worker of a large cluster as silent and probes them all, every sweep. So a worker is
probed once it has missed ``MISSED_HEARTBEATS`` heartbeats (plus ``MARGIN_S`` for a late one), never
before the configured ``dscar.hang-timeout``; and one sweep probes at most ``MAX_PROBES`` workers, the
longest silent first (a starved scheduler that read nobody's heartbeat must not open thousands of
connections at once: the others are probed by the next sweeps).

A hung worker is found, at the latest, ``worst_detection_s`` after its last sign of life: its
silence limit, one sweep, then a probe it cannot answer. With two missed heartbeats that is two
intervals plus ``MARGIN_S + SWEEP_S + PROBE_TIMEOUT_S`` (1.75 s): within issue 39's bound of two
intervals plus 2 s, with a quarter second left for the scheduler's own lag.
"""
from __future__ import annotations

#: heartbeats a worker may miss before it is probed (one late heartbeat is normal on a busy machine)
MISSED_HEARTBEATS = 2
#: seconds added to the missed heartbeats' time: a heartbeat's own trip and handling (a probe follows,
#: not a removal: a worker that is only late answers it)
MARGIN_S = 0.1
#: seconds between two sweeps that look for silent workers
SWEEP_S = 0.15
#: a worker silent past its limit is hung if it cannot answer a probe within this many seconds
PROBE_TIMEOUT_S = 1.5
#: at most this many probes in flight per sweep
MAX_PROBES = 32


def silence_limit(configured: float, heartbeat_interval: float) -> float:
    """Seconds without a sign of life after which a worker is probed: the configured hang
    timeout, or ``MISSED_HEARTBEATS`` heartbeat intervals plus ``MARGIN_S`` where that is longer."""
    if configured <= 0 or heartbeat_interval <= 0:
        raise ValueError(f"hang timeout {configured} and heartbeat interval {heartbeat_interval} must be > 0")
    return max(float(configured), MISSED_HEARTBEATS * float(heartbeat_interval) + MARGIN_S)


def worst_detection_s(configured: float, heartbeat_interval: float) -> float:
    """The longest a hung worker goes unfound after its last sign of life (a heartbeat or a message):
    its silence limit, one sweep, and a probe's timeout."""
    return silence_limit(configured, heartbeat_interval) + SWEEP_S + PROBE_TIMEOUT_S


def to_probe(silent_s: dict[str, float], limit: float, max_probes: int = MAX_PROBES) -> list[str]:
    """The workers to probe this sweep: those silent for more than ``limit`` seconds (``silent_s``:
    worker -> seconds since its last sign of life), longest silent first, at most ``max_probes``."""
    over = [(s, w) for w, s in silent_s.items() if s > limit]
    return [w for _, w in sorted(over, key=lambda sw: (-sw[0], sw[1]))[:max_probes]]
