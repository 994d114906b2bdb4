"""Where a clock's time goes: the timeline of bench.overhead's trivial clock, handler by handler.

Every ``dscar_*`` handler of the scheduler and of each worker is stamped at its entry and its
exit (``time.time()``: one machine, one clock for every process), and so is the coordinator's
``begin`` of a clock (``Coordinator._begin``: asked by the driver's ``begin_clock``, or by the
coordinator itself where it begins the next clock, ``dscar.auto-begin``); for each clock after
``warmup`` the stamps are taken relative to that clock's ``begin`` entry at the scheduler, and the
table gives each handler's median entry and exit
over the clocks (the n-th call of a handler in a clock is its own row, ``#n``). Workers are named
by their rank among the worker addresses (``W0``, ``W1``, ...). The gaps between rows are the
hops: a message in flight, a thread or process waiting for a CPU, a handler's own work.

``--fold off`` runs the same with the clock end handed out as an item (``dscar.fold-clock-end``),
to compare the two paths side by side; ``--auto-begin off`` has the driver begin every clock;
``--ahead off`` runs each clock end before the next clock begins (``dscar.clock-end-ahead``; the
trivial model's clock end only reads, so by default it runs while the next clock begins);
``--with-apply off`` begins the next clock once the clock's last pass is applied, not as its apply is
sent (``dscar.begin-with-apply``).

Usage: ``python -m bench.clock_trace [--quick] [--workers 2] [--shards 16] [--clocks N] [--fold on|off]
[--auto-begin on|off] [--ahead on|off] [--with-apply on|off] [--json PATH]``.
"""
from __future__ import annotations

import argparse
import functools
import inspect
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

import dask
import numpy as np

import dscar
from bench.common import load_average, write_json
from bench.overhead import Trivial

WARMUP = 4


# ----------------------------------------------------------------- stamps (run remotely)
def _stamped(handler, name: str, who: str, log: list):
    """``handler`` that appends ``(who, name, entry, exit)`` to ``log``; keeps its signature."""
    if inspect.iscoroutinefunction(handler):
        @functools.wraps(handler)
        async def wrapper(*args, **kwargs):
            t0 = time.time()
            try:
                return await handler(*args, **kwargs)
            finally:
                log.append((who, name, t0, time.time()))
    else:
        @functools.wraps(handler)
        def wrapper(*args, **kwargs):
            t0 = time.time()
            out = handler(*args, **kwargs)
            if not inspect.isawaitable(out):
                log.append((who, name, t0, time.time()))
                return out

            async def finish():
                try:
                    return await out
                finally:
                    log.append((who, name, t0, time.time()))
            return finish()
    wrapper._clock_trace = True
    return wrapper


def install_stamps(dask_scheduler=None, dask_worker=None, who: str = "S") -> int:
    """Stamp every ``dscar_*`` handler of this server (idempotent), and on the scheduler the
    coordinator's ``_begin`` as ``begin``; how many handlers."""
    from dscar.scheduler.coordinator import PLUGIN_NAME

    server = dask_scheduler if dask_scheduler is not None else dask_worker
    log = server.__dict__.setdefault("_clock_trace_log", [])
    coordinator = getattr(server, "plugins", {}).get(PLUGIN_NAME)  # (a run passes a worker as dask_scheduler too)
    if coordinator is not None:
        if not getattr(coordinator._begin, "_clock_trace", False):
            coordinator._begin = _stamped(coordinator._begin, "begin", who, log)
    n = 0
    for name, h in list(server.handlers.items()):
        if name.startswith("dscar_"):
            if not getattr(h, "_clock_trace", False):
                server.handlers[name] = _stamped(h, name[len("dscar_"):], who, log)
            n += 1
    return n


def take_stamps(dask_scheduler=None, dask_worker=None) -> list:
    server = dask_scheduler if dask_scheduler is not None else dask_worker
    log = server.__dict__.setdefault("_clock_trace_log", [])
    out, log[:] = list(log), []
    return out


# ------------------------------------------------------------------------ the timeline
def timeline(stamps: list[tuple[str, str, float, float]], warmup: int = WARMUP) -> tuple[list[dict], int]:
    """Median entry and exit (ms from the clock's ``begin`` entry, or ``begin_clock``'s in stamps
    without one) of each (server, handler, #n) over the clocks after ``warmup`` (the last begin has no
    next one and is left out); rows seen in fewer than half the clocks are dropped. The rows in order
    of entry, and the clocks counted."""
    anchor = "begin" if any(s[0] == "S" and s[1] == "begin" for s in stamps) else "begin_clock"
    begins = sorted(s[2] for s in stamps if s[0] == "S" and s[1] == anchor)
    per: dict[tuple[str, str, int], list[tuple[float, float]]] = defaultdict(list)
    ordered = sorted(stamps, key=lambda s: s[2])
    clocks = list(zip(begins[warmup:-1], begins[warmup + 1:]))
    for t0, t1 in clocks:
        seen: dict[tuple[str, str], int] = defaultdict(int)
        for who, name, s, e in ordered:
            if t0 <= s < t1:
                per[(who, name, seen[(who, name)])].append(((s - t0) * 1e3, (e - t0) * 1e3))
                seen[(who, name)] += 1
        per[("driver", "clock", 0)].append((0.0, (t1 - t0) * 1e3))
    rows = [{"server": k[0], "handler": k[1], "n": k[2], "entry_ms": statistics.median(x for x, _ in v),
             "exit_ms": statistics.median(y for _, y in v), "clocks": len(v)}
            for k, v in per.items() if len(v) * 2 >= len(clocks)]
    return sorted(rows, key=lambda r: (r["entry_ms"], r["exit_ms"])), len(clocks)


def format_timeline(rows: list[dict]) -> str:
    lines = [f"{'server':>7} {'handler':<14} {'#':>2} {'entry ms':>9} {'exit ms':>9} {'clocks':>7}"]
    lines += [f"{r['server']:>7} {r['handler']:<14} {r['n']:>2} {r['entry_ms']:9.2f} {r['exit_ms']:9.2f} {r['clocks']:7d}"
              for r in rows]
    return "\n".join(lines)


def trace(n_workers: int, n_shards: int, clocks: int, fold: bool, auto_begin: bool = True,
          ahead: bool = True, with_apply: bool = True) -> dict[str, Any]:
    data = {"x": np.arange(2 * n_shards, dtype=np.float64)}
    # (the embedded cluster's scheduler runs in this process: its coordinator reads the settings at each fit)
    settings = {"dscar.fold-clock-end": fold, "dscar.auto-begin": auto_begin, "dscar.clock-end-ahead": ahead,
                "dscar.begin-with-apply": with_apply}
    with dask.config.set(settings), dscar.Cluster(n_workers=n_workers) as cl:
        dscar.fit(Trivial(), data, cl, n_shards=n_shards, max_clocks=3, progress=False)  # warm the processes
        names = {w: f"W{i}" for i, w in enumerate(sorted(cl.workers))}
        cl.client.run_on_scheduler(install_stamps)
        for w, name in names.items():
            cl.client.run(install_stamps, who=name, workers=[w])
        cl.client.run_on_scheduler(take_stamps)
        cl.client.run(take_stamps)
        load = load_average()
        res = dscar.fit(Trivial(), data, cl, n_shards=n_shards, max_clocks=clocks, progress=False)
        stamps = [tuple(s) for s in cl.client.run_on_scheduler(take_stamps)]
        stamps += [tuple(s) for per in cl.client.run(take_stamps).values() for s in per]
    rows, n = timeline(stamps)
    return {"workers": n_workers, "shards": n_shards, "fold": fold, "auto_begin": auto_begin, "ahead": ahead,
            "with_apply": with_apply, "clocks": n,
            "load_average": load,
            "ms_per_clock": statistics.median(r.seconds for r in res.history[WARMUP:]) * 1e3, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="20 clocks")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--clocks", type=int, default=None, help="clocks of the traced fit (default 60; 20 with --quick)")
    p.add_argument("--fold", choices=("on", "off"), default="on", help="dscar.fold-clock-end")
    p.add_argument("--auto-begin", choices=("on", "off"), default="on", help="dscar.auto-begin")
    p.add_argument("--ahead", choices=("on", "off"), default="on", help="dscar.clock-end-ahead")
    p.add_argument("--with-apply", choices=("on", "off"), default="on", help="dscar.begin-with-apply")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    clocks = a.clocks or (20 if a.quick else 60)
    if clocks < WARMUP + 3:
        p.error(f"--clocks must be at least {WARMUP + 3}")
    out = trace(a.workers, a.shards, clocks, a.fold == "on", a.auto_begin == "on", a.ahead == "on",
                a.with_apply == "on")
    print(f"{a.workers} worker(s) x {a.shards} shards, clock end folded: {a.fold}, auto-begin: {a.auto_begin}, "
          f"ahead: {a.ahead}, with the apply: {a.with_apply}; "
          f"{out['clocks']} clocks traced, median {out['ms_per_clock']:.2f} ms a clock; load average {out['load_average']}")
    print("median ms from the clock's begin entry at the scheduler (S), per handler entry and exit:")
    print(format_timeline(out["rows"]))
    if a.json:
        write_json(a.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
