"""Events people can read: a fit's event list as ordered, relative-time, grouped lines and a summary.

Pure functions over the plain event dicts of ``FitResult.events`` (``time`` in epoch seconds, ``kind``,
usually ``clock`` and ``worker``); no Dask, no pandas unless ``events_frame`` is asked for. Times are
given relative to the job's start (its ``job-started`` event, else the first event), because epoch
floats say nothing to a reader; workers get short names (``w0``, ``w1``, ... in the order the job
started with them, later joiners after) because a fault spec names workers by that index.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

#: event kinds that say a worker left the job
LOSS_KINDS = ("worker-lost",)
#: event kinds that say a lost worker's state was brought back
RECOVERY_KINDS = ("recovery-done",)
#: kinds that happen every clock in a healthy run; the CLI counts them instead of listing them
ROUTINE_KINDS = ("shard-moved", "checkpoint-started", "checkpoint-published")
#: fields never shown in a line's details (shown elsewhere, or too long to help)
HIDDEN_FIELDS = ("time", "kind", "clock", "t")


def origin(events: Sequence[dict[str, Any]]) -> float:
    """The epoch time the job started: its ``job-started`` event, else its earliest event (0.0 if none)."""
    for e in events:
        if e.get("kind") == "job-started":
            return float(e["time"])
    return min((float(e["time"]) for e in events), default=0.0)


def ordered(events: Iterable[dict[str, Any]], t0: float | None = None) -> list[dict[str, Any]]:
    """Copies of the events sorted by time, each with ``t``: seconds since ``t0`` (default: ``origin``)."""
    evs = sorted(events, key=lambda e: float(e["time"]))
    t0 = origin(evs) if t0 is None else t0
    return [dict(e, t=float(e["time"]) - t0) for e in evs]


def worker_names(events: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Address -> ``wN``: the job's starting workers in order, then any other worker as first seen."""
    names: dict[str, str] = {}

    def add(addr: Any) -> None:
        if isinstance(addr, str) and addr not in names:
            names[addr] = f"w{len(names)}"

    for e in events:
        if e.get("kind") == "job-started":
            for w in e.get("workers", ()):
                add(w)
    for e in sorted(events, key=lambda e: float(e["time"])):
        for k in ("worker", "source", "target"):
            add(e.get(k))
    return names


@dataclass
class Group:
    """A run of consecutive events of one kind in one clock (``shard-moved x 12``)."""

    kind: str
    clock: int | None
    events: list[dict[str, Any]] = field(default_factory=list)  #: in time order, each with ``t``

    @property
    def t(self) -> float:
        return self.events[0]["t"]

    @property
    def count(self) -> int:
        return len(self.events)


def group(events: Iterable[dict[str, Any]], t0: float | None = None) -> list[Group]:
    """Ordered events, consecutive ones of the same kind and clock merged into one ``Group``."""
    out: list[Group] = []
    for e in ordered(events, t0):
        clock = e.get("clock")
        if out and out[-1].kind == e["kind"] and out[-1].clock == clock:
            out[-1].events.append(e)
        else:
            out.append(Group(e["kind"], clock, [e]))
    return out


def _value(v: Any, names: dict[str, str]) -> str:
    if isinstance(v, str):
        return names.get(v, v)
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x, names) for x in v) + "]"
    return str(v)


def describe(e: dict[str, Any], names: dict[str, str] | None = None) -> str:
    """``key=value`` details of one event, addresses as short worker names."""
    names = names or {}
    return " ".join(f"{k}={_value(v, names)}" for k, v in e.items() if k not in HIDDEN_FIELDS and v is not None)


def _group_details(g: Group, names: dict[str, str]) -> str:
    if g.count == 1:
        return describe(g.events[0], names)
    # the fields that differ between the grouped events, as lists; the fields they share, once
    keys = [k for k in g.events[0] if k not in HIDDEN_FIELDS]
    parts = []
    for k in keys:
        vals = [e.get(k) for e in g.events]
        if all(v == vals[0] for v in vals):
            if vals[0] is not None:
                parts.append(f"{k}={_value(vals[0], names)}")
        else:
            parts.append(f"{k}={_value(vals, names)}")
    return " ".join(parts)


def event_lines(events: Sequence[dict[str, Any]], t0: float | None = None, *, width: int = 160,
                hide: Iterable[str] = ()) -> list[str]:
    """One line per group, in time order: ``+  0.305s  clock  5  fault-kill  worker=w1 point=start``.

    Repeats read as ``shard-moved x 3``; details longer than ``width`` are cut with ``...``.
    """
    names = worker_names(events)
    hidden = set(hide)
    lines = []
    for g in group(events, t0):
        if g.kind in hidden:
            continue
        clock = "  -" if g.clock is None else f"{g.clock:3d}"
        head = f"+{g.t:8.3f}s  clock {clock}  {g.kind}" + (f" x {g.count}" if g.count > 1 else "")
        line = f"{head}  {_group_details(g, names)}".rstrip()
        lines.append(line if len(line) <= width else line[: width - 3] + "...")
    return lines


def counts(events: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Events per kind, most frequent first."""
    c: dict[str, int] = {}
    for e in events:
        c[e["kind"]] = c.get(e["kind"], 0) + 1
    return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass
class Fate:
    """What happened to the job's workers: who started, who left (and when), who joined, who is left."""

    started: list[str]  #: addresses the job started with
    lost: list[tuple[str, int | None]]  #: (address, clock) per loss, in order
    joined: list[str]  #: addresses that joined later
    live: list[str]  #: addresses live at the end
    recoveries: int  #: completed recoveries


def fate(events: Sequence[dict[str, Any]], workers: Sequence[str] = ()) -> Fate:
    """Follow ``job-started`` / ``worker-lost`` / ``worker-joined`` / ``recovery-done`` through the events.

    ``workers``: the starting workers when the events hold no ``job-started`` (a trimmed list).
    """
    evs = ordered(events)
    started = list(workers)
    for e in evs:
        if e["kind"] == "job-started":
            started = list(e.get("workers", started))
            break
    live = list(started)
    lost, joined, recoveries = [], [], 0
    for e in evs:
        w = e.get("worker")
        if e["kind"] in LOSS_KINDS:
            lost.append((w, e.get("clock")))
            if w in live:
                live.remove(w)
        elif e["kind"] == "worker-joined":
            joined.append(w)
            if w not in live:
                live.append(w)
        elif e["kind"] in RECOVERY_KINDS:
            recoveries += 1
    return Fate(started, lost, joined, live, recoveries)


def workers_phrase(events: Sequence[dict[str, Any]], workers: Sequence[str] = ()) -> str:
    """``2 of 3 worker(s) live (lost w1 at clock 5; 1 recovery)``, or ``3 worker(s)`` when nothing changed."""
    f = fate(events, workers)
    names = worker_names(events)
    if not f.lost and not f.joined:
        return f"{len(f.live)} worker(s)"
    notes = []
    if f.lost:
        notes.append("lost " + ", ".join(
            names.get(w, str(w)) + ("" if c is None else f" at clock {c}") for w, c in f.lost))
    if f.joined:
        notes.append("joined " + ", ".join(names.get(w, str(w)) for w in f.joined))
    notes.append(f"{f.recoveries} recover{'y' if f.recoveries == 1 else 'ies'}")
    return f"{len(f.live)} of {len(set(f.started) | set(f.joined))} worker(s) live ({'; '.join(notes)})"


def counts_line(events: Iterable[dict[str, Any]]) -> str:
    """``events: shard-moved x 12, checkpoint-published x 7, ...``"""
    return "events: " + ", ".join(f"{k} x {n}" for k, n in counts(events).items())


def legend(events: Sequence[dict[str, Any]]) -> str:
    """``workers: w0=tcp://...:33123 w1=...``: the short names used in the lines."""
    return "workers: " + " ".join(f"{n}={a}" for a, n in worker_names(events).items())


#: columns of ``events_frame``, in order (the kind's own fields follow)
FRAME_COLUMNS = ["t", "clock", "kind", "worker"]


def events_frame(events: Sequence[dict[str, Any]], t0: float | None = None):
    """A ``pandas.DataFrame``: one row per event in time order; ``t`` seconds since the start, ``worker``
    as its short name (the address in ``worker_address``), each kind's own fields as further columns.

    pandas is optional: it is imported here, and a clear ImportError says how to get it.
    """
    try:
        import pandas as pd
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("FitResult.events_frame() needs pandas: pip install pandas") from e
    names = worker_names(events)
    rows = []
    for e in ordered(events, t0):
        row = {k: v for k, v in e.items() if k != "time"}
        if isinstance(e.get("worker"), str):
            row["worker_address"] = e["worker"]
            row["worker"] = names.get(e["worker"], e["worker"])
        row["time"] = e["time"]
        rows.append(row)
    df = pd.DataFrame(rows)
    for c in FRAME_COLUMNS:
        if c not in df.columns:
            df[c] = pd.Series([None] * len(df), dtype=object)
    rest = [c for c in df.columns if c not in FRAME_COLUMNS]
    df = df[FRAME_COLUMNS + rest]
    if len(df):
        df["clock"] = df["clock"].astype("Int64")
    return df
