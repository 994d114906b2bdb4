"""Engine overhead: the cost of a clock when the shard work is nearly nothing.

What it measures
----------------
``Trivial``: one tiny table (8 rows, one partition per worker), every shard
step adds ones to the whole table (so every shard stages an update at every
partition owner, as a data-parallel model does) and ``clock_end`` sums it. The
shard work is a few microseconds, so a clock's wall time is the engine's own
cost: RPCs, serialization, thread hops, the coordinator's logic.

For 1, 2 and 4 worker processes (an embedded ``dscar.Cluster``, one thread
each; 1 and 2 with ``--quick``) x 4 and 16 shards (in total), with the default
policies:

* **ms per clock**: ``ClockRecord.seconds`` (the driver's wall time from
  ``begin_clock`` to the report, or, where the coordinator began the clock itself
  (``dscar.auto-begin``), the coordinator's from the previous clock's finish to this one's: the
  driver reads several reports at once, ``dscar.report-linger``), the mean over the clocks after ``warmup``
  (their total time over their count: a cost paid every few clocks, such as the driver's wake for the
  reports it reads together, counts in full, where a median would hide it; the median is in the JSON), then
  median over repeats (the per-repeat means are in the JSON).
* **RPCs per clock**: every scheduler and worker handler whose name starts with
  ``dscar_`` is wrapped with a counter before the fits (``client.run_on_scheduler``
  / ``client.run``; nothing of the engine's internals is assumed beyond the
  handler prefix). Each repeat runs a short fit (``warmup`` clocks) and a long
  one (``clocks``); ``(calls(long) - calls(short)) / (clocks - warmup)`` is the
  count per clock without setup and teardown. Calls include the workers' long
  polls, RPCs from the driver, scheduler -> worker and worker -> worker.
* **scheduler CPU per clock**: the CPU time of the scheduler's event-loop thread
  (``time.thread_time`` read on that thread through ``client.run_on_scheduler``),
  differenced between the long and the short fit as the RPC counts are: every
  commit and long poll passes through that one thread, so what it spends bounds
  how fast clocks can go (long polls left waiting cost CPU there on every wake without
  adding a single call: the placement polls fixed in b870810).
* **RPC floor** (same run, same cluster, before and after the fits): the round
  trip of distributed's built-in ``echo`` handler called through
  ``distributed.utils.sync`` from a thread of the worker process (as a worker's
  shard loop calls the scheduler), to the scheduler and to another worker, and
  from the driver's thread to the scheduler (as the driver steers clocks).
  Median over ``n`` calls.

Targets: <= 4 ms per clock at 1 worker x 4 shards (issue 9) and, on a quiet machine, at
2 workers x 16 shards too (issue 43; issue 9 asked 8 ms); the table marks them MET / NOT MET.

Usage: ``python -m bench.overhead [--quick] [--repeats N] [--json PATH] [--plot PATH]``.
Run timing runs under ``flock /tmp/dscar-timing.lock``; the load average is printed with the figures.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import sys
import time
from collections import Counter
from typing import Any

import numpy as np

import dscar
from bench.common import load_average, log, machine_info, pyplot, warn_busy, write_json
from dscar import Algorithm, TableSpec

#: (workers, shards) -> the issues' target in ms per clock (issue 9: 1 x 4; issue 43: a second worker
#: costs nothing fixed, so 2 x 16 too is held to 4 ms on a quiet machine)
TARGETS_MS = {(1, 4): 4.0, (2, 16): 4.0}
SHARDS = (4, 16)
TABLE_ROWS = 8


class Trivial(Algorithm):
    """Near-zero shard work: each shard adds ones to one 8-row table; never converges."""

    name = "trivial"
    data_names = ("x",)
    clock_end_reads_only = True  # (its clock end only reads: it may run while the next clock begins)

    def tables(self, meta):
        return [TableSpec("t", TABLE_ROWS)]

    def shard_step(self, ctx, data):
        ctx.add("t", ctx.xp.ones(TABLE_ROWS))

    def clock_end(self, ctx):
        return {"objective": float(dscar.to_host(ctx.pull("t")).sum())}

    def converged(self, history, tol):
        return False


# ------------------------------------------------------------------ RPC counters (run remotely)
def _counted(handler, name: str, counts: Counter):
    """``handler`` that counts its calls; ``functools.wraps`` keeps its signature, so distributed
    passes it the same arguments (``comm`` first when the original wants it)."""

    @functools.wraps(handler)
    def wrapper(*args, **kwargs):
        counts[name] += 1
        return handler(*args, **kwargs)  # a coroutine for an async handler: distributed awaits it

    wrapper._bench_counted = True
    return wrapper


def install_counters(dask_scheduler=None, dask_worker=None) -> int:
    """Wrap every ``dscar_*`` handler of this server with a counter (idempotent); how many are wrapped."""
    server = dask_scheduler if dask_scheduler is not None else dask_worker
    counts = getattr(server, "_bench_rpc_counts", None)
    if counts is None:
        counts = server._bench_rpc_counts = Counter()
    n = 0
    for name, h in list(server.handlers.items()):
        if name.startswith("dscar_"):
            if not getattr(h, "_bench_counted", False):
                server.handlers[name] = _counted(h, name, counts)
            n += 1
    return n


def read_counters(dask_scheduler=None, dask_worker=None) -> dict[str, int]:
    server = dask_scheduler if dask_scheduler is not None else dask_worker
    return dict(getattr(server, "_bench_rpc_counts", {}))


def total_counts(client) -> Counter:
    """Calls of every ``dscar_*`` handler so far, summed over the scheduler and the workers."""
    c = Counter(client.run_on_scheduler(read_counters))
    for per in client.run(read_counters).values():
        c.update(per)
    return c


def loop_cpu_s() -> float:
    """CPU seconds of the thread this runs on: the scheduler's event loop (``run_on_scheduler``)."""
    return time.thread_time()


def diff(a: Counter, b: Counter) -> dict[str, int]:
    return {k: b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b) if b.get(k, 0) != a.get(k, 0)}


# ------------------------------------------------------------------------ the RPC floor
async def _echo_from_thread(target: str | None, n: int, dask_worker=None) -> list[float]:
    """Round trips (s) of ``echo`` to ``target`` (None: the scheduler), each called through
    ``distributed.utils.sync`` from a thread of this worker process, not from its event loop."""
    from distributed.utils import sync

    def body() -> list[float]:
        rpc = dask_worker.scheduler if target is None else dask_worker.rpc(target)
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            sync(dask_worker.loop, rpc.echo, data=b"x")
            out.append(time.perf_counter() - t0)
        return out

    return await asyncio.to_thread(body)


def rpc_floor(cl: dscar.Cluster, n: int) -> dict[str, float]:
    """Median round trips in ms: worker thread -> scheduler, worker thread -> another worker (with
    two workers or more), driver thread -> scheduler."""
    client = cl.client
    ws = cl.workers
    out = {}
    r = client.run(_echo_from_thread, None, n, workers=[ws[0]])[ws[0]]
    out["worker_to_scheduler_ms"] = statistics.median(r) * 1e3
    if len(ws) > 1:
        r = client.run(_echo_from_thread, ws[1], n, workers=[ws[0]])[ws[0]]
        out["worker_to_worker_ms"] = statistics.median(r) * 1e3
    rt = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.sync(client.scheduler.echo, data=b"x")
        rt.append(time.perf_counter() - t0)
    out["driver_to_scheduler_ms"] = statistics.median(rt) * 1e3
    return out


# ------------------------------------------------------------------------------ runs
def one_fit(cl: dscar.Cluster, n_shards: int, clocks: int) -> tuple[dscar.FitResult, dict[str, int], float]:
    """A fit of ``clocks`` clocks: its result, the ``dscar_*`` calls it made and the scheduler loop's CPU seconds."""
    data = {"x": np.arange(2 * n_shards, dtype=np.float64)}
    before, cpu = total_counts(cl.client), cl.client.run_on_scheduler(loop_cpu_s)
    res = dscar.fit(Trivial(), data, cl, n_shards=n_shards, max_clocks=clocks, progress=False)
    return res, diff(before, total_counts(cl.client)), cl.client.run_on_scheduler(loop_cpu_s) - cpu


def measure(cl: dscar.Cluster, n_workers: int, n_shards: int, clocks: int, warmup: int) -> dict[str, Any]:
    """One repeat: a short fit (``warmup`` clocks) and a long one; ms per clock from the long one."""
    short, c_short, cpu_short = one_fit(cl, n_shards, warmup)
    long, c_long, cpu_long = one_fit(cl, n_shards, clocks)
    if long.n_clocks != clocks or short.n_clocks != warmup:
        raise RuntimeError(f"expected {warmup} and {clocks} clocks, got {short.n_clocks} and {long.n_clocks}")
    per_clock = {k: (c_long.get(k, 0) - c_short.get(k, 0)) / (clocks - warmup) for k in set(c_long) | set(c_short)}
    secs = [r.seconds for r in long.history[warmup:]]
    return {
        "workers": n_workers, "shards": n_shards,
        "ms_per_clock": statistics.fmean(secs) * 1e3,
        "ms_per_clock_median": statistics.median(secs) * 1e3,
        "clock_ms": [s * 1e3 for s in secs],
        "rpcs_per_clock": sum(per_clock.values()),
        "rpcs_by_handler": {k: v for k, v in sorted(per_clock.items()) if v},
        "sched_cpu_ms_per_clock": (cpu_long - cpu_short) / (clocks - warmup) * 1e3,
        "setup_s": long.setup_seconds,
    }


def summarize(runs: list[dict], floors: dict[int, list[dict]]) -> list[dict[str, Any]]:
    rows = []
    for (w, s) in sorted({(r["workers"], r["shards"]) for r in runs}):
        rs = [r for r in runs if r["workers"] == w and r["shards"] == s]
        ms = statistics.median(r["ms_per_clock"] for r in rs)
        byh: dict[str, float] = {}
        for k in sorted({k for r in rs for k in r["rpcs_by_handler"]}):
            byh[k] = statistics.median(r["rpcs_by_handler"].get(k, 0.0) for r in rs)
        floor = {k: statistics.median(f[k] for f in floors[w]) for k in floors[w][0]}
        row = {
            "workers": w, "shards": s, "ms_per_clock": ms,
            "ms_per_clock_repeats": [r["ms_per_clock"] for r in rs],
            "ms_per_shard": ms / s,
            "rpcs_per_clock": statistics.median(r["rpcs_per_clock"] for r in rs),
            "rpcs_by_handler": byh,
            "sched_cpu_ms_per_clock": statistics.median(r["sched_cpu_ms_per_clock"] for r in rs),
            "rpc_floor_ms": floor,
        }
        row["floor_ratio"] = ms / floor["worker_to_scheduler_ms"]
        if (w, s) in TARGETS_MS:
            row["target_ms"] = TARGETS_MS[(w, s)]
            row["met"] = bool(ms <= TARGETS_MS[(w, s)])
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [
        f"{'workers':>7} {'shards':>6} {'ms/clock':>9} {'(repeats)':<22} {'ms/shard':>8} {'RPCs/clock':>10} "
        f"{'sched CPU':>9} {'floor w->s':>10} {'floor w->w':>10} {'floor drv':>9} {'x floor':>7}  target",
    ]
    for r in rows:
        f = r["rpc_floor_ms"]
        reps = ",".join(f"{x:.1f}" for x in r["ms_per_clock_repeats"])
        target = (f"<= {r['target_ms']:g} ms: {'MET' if r['met'] else 'NOT MET'}" if "target_ms" in r else "")
        ww = f"{f['worker_to_worker_ms']:.2f}" if "worker_to_worker_ms" in f else "-"
        lines.append(
            f"{r['workers']:>7} {r['shards']:>6} {r['ms_per_clock']:>9.2f} {reps:<22} {r['ms_per_shard']:>8.2f} "
            f"{r['rpcs_per_clock']:>10.1f} {r['sched_cpu_ms_per_clock']:>9.2f} {f['worker_to_scheduler_ms']:>10.2f} {ww:>10} "
            f"{f['driver_to_scheduler_ms']:>9.2f} {r['floor_ratio']:>7.1f}  {target}"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"{r['workers']}w x {r['shards']}s" for r in rows]
    x = np.arange(len(rows))
    a1.bar(x, [r["ms_per_clock"] for r in rows], color="tab:blue", label="ms per clock (mean of steady clocks)")
    a1.plot(x, [r["rpc_floor_ms"]["worker_to_scheduler_ms"] for r in rows], "k_", markersize=20,
            label="RPC floor (worker thread -> scheduler)")
    labelled = False
    for i, r in enumerate(rows):
        if "target_ms" in r:
            a1.plot([i - 0.4, i + 0.4], [r["target_ms"]] * 2, "r--", label=None if labelled else "target (issues 9, 43)")
            labelled = True
    a1.set_xticks(x, labels, rotation=30)
    a1.set_ylabel("ms")
    a1.set_title("trivial algorithm: wall time per clock")
    a1.legend(fontsize=8)
    a2.bar(x, [r["rpcs_per_clock"] for r in rows], color="tab:orange")
    a2.set_xticks(x, labels, rotation=30)
    a2.set_ylabel("dscar_* handler calls per clock")
    a2.set_title("RPCs per clock")
    for a in (a1, a2):
        a.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 and 2 workers, 1 repeat, 16 clocks (~1 min)")
    ap.add_argument("--repeats", type=int, default=None, help="repeats (default 3, 1 with --quick)")
    ap.add_argument("--workers", default=None, help="comma-separated worker counts (default 1,2,4; 1,2 with --quick)")
    ap.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    ap.add_argument("--plot", metavar="PATH", default="overhead.png", help="PNG plot (default overhead.png)")
    args = ap.parse_args(argv)
    warn_busy()
    repeats = args.repeats or (1 if args.quick else 3)
    workers = [int(w) for w in args.workers.split(",")] if args.workers else ([1, 2] if args.quick else [1, 2, 4])
    clocks, warmup = (16, 4) if args.quick else (60, 10)
    n_echo = 50 if args.quick else 300
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(k, "1")  # inherited by the worker processes

    t0 = time.perf_counter()
    machine = machine_info()
    runs: list[dict] = []
    floors: dict[int, list[dict]] = {}
    for w in workers:
        with dscar.Cluster(n_workers=w) as cl:
            cl.wait_for_workers(w)
            one_fit(cl, 4, 3)  # warm the processes (imports, connections)
            n = cl.client.run_on_scheduler(install_counters)
            n += sum(cl.client.run(install_counters).values())
            if n == 0:
                raise RuntimeError("no dscar_* handler found to count")
            floors[w] = [rpc_floor(cl, n_echo)]
            log(t0, f"{w} worker(s): RPC floor {floors[w][0]}")
            for rep in range(repeats):
                for s in (SHARDS if rep % 2 == 0 else SHARDS[::-1]):
                    r = measure(cl, w, s, clocks, warmup)
                    r["repeat"] = rep
                    runs.append(r)
                    log(t0, f"{w} worker(s) x {s} shards, repeat {rep}: {r['ms_per_clock']:.2f} ms/clock, "
                            f"{r['rpcs_per_clock']:.1f} RPCs/clock, scheduler CPU {r['sched_cpu_ms_per_clock']:.2f} ms/clock")
            floors[w].append(rpc_floor(cl, n_echo))
    rows = summarize(runs, floors)
    load = load_average()
    print(f"\nEngine overhead: trivial algorithm ({TABLE_ROWS}-row table, near-zero shard work), default policies; "
          f"{clocks} clocks, first {warmup} dropped; {repeats} repeat(s); RPC floor = median echo round trip "
          f"over {n_echo} calls, before and after the fits")
    print(f"load average: {', '.join(f'{x:.2f}' for x in load) if load else 'n/a'}")
    print(format_table(rows))
    for r in rows:
        if "target_ms" in r:
            print(f"target: {r['workers']} worker(s) x {r['shards']} shards <= {r['target_ms']:g} ms per clock: "
                  f"{r['ms_per_clock']:.2f} ms -> {'MET' if r['met'] else 'NOT MET'}")
    print("RPCs per clock by handler:")
    for r in rows:
        top = sorted(r["rpcs_by_handler"].items(), key=lambda kv: -kv[1])
        print(f"  {r['workers']}w x {r['shards']}s: " + ", ".join(f"{k}={v:.1f}" for k, v in top))
    print(f"total {time.perf_counter() - t0:.0f}s")
    if args.plot:
        plot(rows, args.plot)
        print(f"plot: {args.plot}")
    if args.json:
        write_json(args.json, {
            "quick": args.quick, "repeats": repeats, "clocks": clocks, "warmup": warmup, "echo_calls": n_echo,
            "workers": workers, "shards": list(SHARDS),
            "targets": [{"workers": w, "shards": s, "limit_ms": v,
                         "ms": next((r["ms_per_clock"] for r in rows if (r["workers"], r["shards"]) == (w, s)), None),
                         "met": next((r["met"] for r in rows if (r["workers"], r["shards"]) == (w, s)), None)}
                        for (w, s), v in TARGETS_MS.items()],
            "rows": rows, "runs": runs, "floors": {str(k): v for k, v in floors.items()},
            "machine": {**machine, "loadavg_after": load}, "seconds": time.perf_counter() - t0,
        })
    return 0


if __name__ == "__main__":
    # re-import under the package name so Trivial pickles as bench.overhead.Trivial, not __main__
    from bench.overhead import main as _main

    sys.exit(_main())
