"""Fault injection: slow, kill or hang a worker from a given clock (specs; no Dask here).

Faults are reproducible on a small machine: a slowdown sleeps ``(factor - 1)``
times the shard step's real duration after each step, so the slowed worker runs
``factor`` times slower whatever the machine. A kill is a hard exit of the
worker process (``os._exit``; on an in-process cluster the worker is closed);
a hang stops the process (SIGSTOP) so only the scheduler's ``worker-ttl`` can
notice (in-process it blocks the worker's loop instead). Targets are indices
into the job's workers (sorted by address) or addresses, resolved when the job
starts; every fault that fires is an event with its clock and time.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Iterable, Literal

from .errors import InvalidInputError

Kind = Literal["slow", "kill", "hang", "lose"]
#: where a kill, hang or loss can fire
POINTS = ("start", "mid-push", "apply", "clock-end", "checkpoint", "recovery")
#: the points that belong to a data phase (a fault naming a phase fires only at these)
PHASE_POINTS = ("start", "mid-push", "apply")


@dataclass(frozen=True)
class Fault:
    kind: Kind
    worker: int | str  # index into the job's sorted workers, or an address
    clock: int = 1
    factor: float = 1.0  # slow: how many times slower
    until: int | None = None  # slow: last slowed clock (None: to the end)
    #: kill / hang / lose: where it fires — before a shard step ("start"), between two pushes of a
    #: step's updates ("mid-push"), when the pass is applied ("apply"), before the clock-end step
    #: ("clock-end"), when a checkpoint is snapshotted ("checkpoint"), when a partition is restored
    #: onto this worker during a recovery ("recovery")
    point: str = "start"
    phase: str | None = None  # kill / hang / lose: only in this data phase of the clock (None: any; PHASE_POINTS)

    def active(self, clock: int) -> bool:
        return self.clock <= clock and (self.until is None or clock <= self.until)


def slow(worker: int | str, factor: float, clock: int = 1, until: int | None = None) -> Fault:
    return Fault("slow", worker, clock, factor=factor, until=until)


def kill(worker: int | str, clock: int, point: str = "start", phase: str | None = None) -> Fault:
    return Fault("kill", worker, clock, point=point, phase=phase)


def hang(worker: int | str, clock: int, phase: str | None = None, point: str = "start") -> Fault:
    return Fault("hang", worker, clock, point=point, phase=phase)


def lose(worker: int | str, clock: int, phase: str | None = None, point: str = "start") -> Fault:
    """A simulated loss: the worker stays up, but the job recovers exactly as if it had crashed
    (its partitions, shards and staged updates are dropped and restored elsewhere). Fast and
    deterministic; for many-trial experiments and in-process clusters."""
    return Fault("lose", worker, clock, point=point, phase=phase)


def resolve(faults: Iterable[Fault], workers: list[str]) -> list[Fault]:
    """Check every fault and name its worker by address; raise ``InvalidInputError`` if wrong."""
    out = []
    for f in faults:
        if not isinstance(f, Fault):
            raise InvalidInputError(f"faults must be dscar.faults.Fault objects, not {type(f).__name__}")
        if f.kind not in ("slow", "kill", "hang", "lose"):
            raise InvalidInputError(f"unknown fault kind {f.kind!r}; use slow, kill, hang or lose")
        if f.clock < 1 or (f.until is not None and f.until < f.clock):
            raise InvalidInputError(f"{f.kind} fault: clock must be >= 1 and until >= clock, got {f.clock}..{f.until}")
        if f.kind == "slow" and not f.factor >= 1:
            raise InvalidInputError(f"slowdown factor must be >= 1, got {f.factor}")
        if f.point not in POINTS:
            raise InvalidInputError(f"fault point must be one of {POINTS}, got {f.point!r}")
        if f.phase is not None and f.point not in PHASE_POINTS:
            raise InvalidInputError(f"{f.kind} fault in phase {f.phase!r} at {f.point!r}: only {PHASE_POINTS} "
                                    "belong to a data phase")
        if isinstance(f.worker, int) and not isinstance(f.worker, bool):
            if not 0 <= f.worker < len(workers):
                raise InvalidInputError(
                    f"{f.kind} fault aimed at worker {f.worker}, but the cluster has {len(workers)} "
                    f"worker(s) (0..{len(workers) - 1})"
                )
            f = replace(f, worker=workers[f.worker])
        elif f.worker not in workers:
            raise InvalidInputError(f"{f.kind} fault aimed at {f.worker!r}, which is not a worker of this cluster")
        out.append(f)
    return out


def unfired(faults: Iterable[Fault], events: Iterable[dict[str, Any]]) -> list[Fault]:
    """The resolved ``faults`` of which no ``fault-<kind>`` event came back.

    A fault fires at most once: a kill, hang or loss at its point, a slowdown at a
    slowed step. A worker's faults of one kind and point fire in clock order, so
    its n-th event of that kind and point (in the order the events came) is the
    n-th such fault by clock. A fault that did not fire (the fit stopped first,
    its worker was lost first, its point was never reached) leaves the
    experiment it belongs to measuring nothing, so the driver reports it (an
    ``unfired-fault`` event) rather than stay silent.
    """
    fired = Counter((e.get("worker"), str(e.get("kind", ""))[len("fault-"):], e.get("point")) for e in events
                    if str(e.get("kind", "")).startswith("fault-"))
    out = []
    for f in sorted(faults, key=lambda f: f.clock):
        key = (f.worker, f.kind, fire_point(f))
        if fired[key] > 0:
            fired[key] -= 1
        else:
            out.append(f)
    return out


def fire_point(f: Fault) -> str | None:
    """Where ``f`` fires (its event's ``point``); None for a slowdown, which fires at any slowed step."""
    return None if f.kind == "slow" else f.point


def why_unfired(f: Fault, events: Iterable[dict[str, Any]], last_clock: int) -> str:
    """Why ``f`` did not fire, from the job's events and the last clock it reported."""
    lost = min((int(e.get("clock", 0)) for e in events if e.get("kind") == "worker-lost" and e.get("worker") == f.worker),
               default=None)
    if lost is not None and lost <= f.clock:
        return f"its worker was lost at clock {lost}, before it was due"
    if last_clock < f.clock:
        return f"the fit stopped at clock {last_clock}"
    end = lost if lost is not None else last_clock
    if f.kind == "slow":
        return f"no shard step of {f.worker} ran in clocks {f.clock}..{min(end, f.until or end)}"
    where = f" in phase {f.phase!r}" if f.phase else ""
    return f"no {f.point!r} point of {f.worker} was reached{where} in clocks {f.clock}..{end}" + (
        f" (it was lost at clock {lost})" if lost is not None else "")


def parse(kind: str, text: str) -> Fault:
    """CLI form: slow ``W:FACTOR[:FROM[:TO]]``, kill and hang ``W:CLOCK[:POINT]`` (W an index, POINT one
    of ``POINTS``, "start" when left out)."""
    parts = text.split(":")
    try:
        w = int(parts[0])
        if kind == "slow":
            if not 2 <= len(parts) <= 4:
                raise ValueError
            start = int(parts[2]) if len(parts) > 2 else 1
            until = int(parts[3]) if len(parts) > 3 else None
            return slow(w, float(parts[1]), start, until)
        if not 2 <= len(parts) <= 3 or (len(parts) == 3 and parts[2] not in POINTS):
            raise ValueError
        point = parts[2] if len(parts) == 3 else "start"
        return (kill if kind == "kill" else hang)(w, int(parts[1]), point=point)
    except ValueError:
        form = "W:FACTOR[:FROM[:TO]]" if kind == "slow" else f"W:CLOCK[:POINT] (POINT one of {', '.join(POINTS)})"
        raise InvalidInputError(f"--{kind} {text!r}: expected {form} with W a worker index") from None
