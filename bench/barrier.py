"""The floor of a barrier a clock on this machine: what any engine pays whose coordinator tells each
worker directly, measured without dscar.

``bench.hollow`` asks how close dscar's clock comes to its step at W hollow workers sharing a few
processes of this machine. This module asks what the machine itself allows, with the same layout: a
Dask ``Server`` in a process of its own and W clients in P processes (one event loop each, as the
hollow workers share theirs). Each client has a thread of its own that sleeps the step, as dscar's
shard runner runs a step on its own thread, then sends one message through Dask's comm
(``distributed.core.rpc``, as dscar's commits travel) and waits for one answer, which the server holds
until all W have arrived. One message each way a worker a clock is the least that a design with the
barrier at a coordinator sends; the payloads are of a commit's size. No dscar code runs, and none of
Dask's scheduler or workers (their heartbeats are not here): dscar's clock cannot be shorter on this
machine. ``threads=False``: the clients sleep on their event loop instead (no thread hand-offs).

Usage: ``python -m bench.barrier [--workers 64,256] [--procs P] [--clocks N] [--no-threads] [--json PATH]
[--plot PATH]``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import load_average, log, machine_info, pyplot, spawn_serving, warn_busy, write_json

STEP_S = 0.1
#: a commit's fields as a hollow worker sends them, roughly (an answer carries a work item of this size)
PAYLOAD = {"job_id": "j" * 32, "clock": 1, "run": 1, "commits": [{"shard": 0, "attempt": 1, "clock": 1,
                                                                  "timings": {"step": 0.1, "pull": 0.0}}]}


async def _serve(n_workers: int, barriers: int, address_file: str, out_file: str) -> None:
    """The coordinator: answers every waiting client once all ``n_workers`` have arrived, ``barriers``
    times; writes the barriers' times and its process's CPU seconds at each to ``out_file``."""
    from distributed.core import Server

    times: list[float] = []
    cpu: list[float] = []
    arrived = [0]
    released = [asyncio.Event()]
    finished = asyncio.Event()

    async def arrive(**kw: Any) -> dict:
        event = released[0]
        arrived[0] += 1
        if arrived[0] == n_workers:  # the last of the clock: every held answer goes
            times.append(time.perf_counter())
            cpu.append(time.process_time())  # (os.times counts whole 10 ms ticks)
            arrived[0], released[0] = 0, asyncio.Event()
            event.set()
            if len(times) >= barriers:
                finished.set()
        else:
            await event.wait()
        return {"status": "OK", "item": PAYLOAD}

    server = Server({"arrive": arrive})
    await server.listen("tcp://127.0.0.1:0")
    Path(address_file + ".tmp").write_text(server.address)
    os.replace(address_file + ".tmp", address_file)
    await finished.wait()
    Path(out_file + ".tmp").write_text(json.dumps({"times": times, "cpu": cpu}))
    os.replace(out_file + ".tmp", out_file)  # (whole, before any client sees the server go and ends)
    server.stop()


async def _clients(address: str, n: int, threads: bool, step_s: float) -> None:
    """``n`` clients on this process's loop, until the server goes."""
    from distributed.core import ConnectionPool

    pool = ConnectionPool()
    await pool.start()
    loop = asyncio.get_running_loop()

    def runner(steps: queue.SimpleQueue) -> None:  # (a shard runner's thread: a step, then the loop carries the commit)
        while True:
            done = steps.get()
            time.sleep(step_s)
            loop.call_soon_threadsafe(done.set_result, None)

    async def client() -> None:
        rpc = pool(address)
        steps: queue.SimpleQueue = queue.SimpleQueue()
        if threads:
            threading.Thread(target=runner, args=(steps,), daemon=True).start()
        while True:
            if threads:
                done = loop.create_future()
                steps.put(done)
                await done
            else:
                await asyncio.sleep(step_s)
            await rpc.arrive(**PAYLOAD)

    try:
        await asyncio.gather(*(client() for _ in range(n)))
    except OSError:  # (the server ended: the run is over)
        pass
    finally:
        await pool.close()


def _spawn(*args: str) -> subprocess.Popen:
    return spawn_serving("bench.barrier", *args)


def measure(n_workers: int, procs: int, step_s: float = STEP_S, clocks: int = 12, warmup: int = 2,
            threads: bool = True, timeout: float = 120.0) -> dict[str, Any]:
    """One run: ``clock_s`` (the time between barriers), the steady clocks' median and its ratio to the
    step, and the server process's CPU a steady clock."""
    with tempfile.TemporaryDirectory(prefix="dscar-barrier-") as tmp:
        address_file, out_file = os.path.join(tmp, "address"), os.path.join(tmp, "out.json")
        server = _spawn("server", str(n_workers), str(clocks + 1), address_file, out_file)
        clients: list[subprocess.Popen] = []
        try:
            deadline = time.monotonic() + timeout
            while not os.path.exists(address_file):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the barrier server did not start")
                time.sleep(0.05)
            address = Path(address_file).read_text()
            shares = [n_workers // procs + (i < n_workers % procs) for i in range(procs)]
            clients = [_spawn("clients", address, str(k), "1" if threads else "0", repr(step_s)) for k in shares if k]
            while not os.path.exists(out_file):  # (a client that ended early leaves the barrier short for ever)
                if server.poll() is not None or any(c.poll() is not None for c in clients) or \
                        time.monotonic() > deadline + clocks * step_s * 10:
                    raise RuntimeError(f"the barrier of {n_workers} clients did not complete {clocks + 1} times")
                time.sleep(0.05)
            out = json.loads(Path(out_file).read_text())
        finally:
            for p in [server, *clients]:
                if p.poll() is None:
                    p.kill()
                p.wait()
    clock_s = [b - a for a, b in zip(out["times"], out["times"][1:])]
    steady = clock_s[warmup:] or clock_s
    cpu = out["cpu"]
    median = statistics.median(steady)
    return {"workers": n_workers, "procs": procs, "threads": threads, "step_s": step_s, "clock_s": clock_s,
            "warmup": warmup, "clock_median_s": median, "clock_ratio": median / step_s,
            "server_cpu_ms_per_clock": (cpu[-1] - cpu[warmup]) / (len(cpu) - 1 - warmup) * 1e3
            if len(cpu) - 1 > warmup else None}


def serve(role: str, *args: str) -> None:
    if role == "server":
        n, barriers, address_file, out_file = args
        asyncio.run(_serve(int(n), int(barriers), address_file, out_file))
    else:
        address, n, threads, step = args
        asyncio.run(_clients(address, int(n), threads == "1", float(step)))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        serve(*argv[1:])
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.barrier", description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default="64,256", help="comma-separated W (default 64,256)")
    ap.add_argument("--procs", type=int, default=None, help="client processes (default as bench.hollow: W/32, 2..8)")
    ap.add_argument("--step", type=float, default=STEP_S)
    ap.add_argument("--clocks", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-threads", action="store_true", help="the clients sleep on their event loop, not a thread each")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--plot", metavar="PATH", default="barrier.png")
    args = ap.parse_args(argv)
    warn_busy()
    t0 = time.perf_counter()
    machine = machine_info()
    rows = []
    for w in [int(x) for x in args.workers.split(",")]:
        procs = args.procs or min(8, max(2, w // 32))
        rows.append(measure(w, procs, args.step, args.clocks, args.warmup, threads=not args.no_threads))
        log(t0, f"W={w}: clocks {[round(x, 3) for x in rows[-1]['clock_s']]}")
    print(format_rows(rows))
    load = load_average()
    print(f"loadavg after: {load}")
    if args.json:
        write_json(args.json, {"rows": rows, "machine": {**machine, "loadavg_after": load},
                               "wall_s": time.perf_counter() - t0})
    plot(rows, args.plot)
    print(f"plot: {args.plot}")
    return 0


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Each W's clocks against the step: the floor's clock / step ratio."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ws = [r["workers"] for r in rows]
    ax.plot(ws, [r["clock_ratio"] for r in rows], "o-", label="clock / step (median)")
    for r in rows:
        ax.plot([r["workers"]] * len(r["clock_s"]), [c / r["step_s"] for c in r["clock_s"]], "k.", alpha=0.3)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers (W)")
    ax.set_ylabel("clock / step")
    ax.set_title("a barrier a clock, no dscar" + ("" if rows and rows[0]["threads"] else " (no threads)"))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'W':>5} {'procs':>5} {'threads':>7} {'clock ms':>8} {'x step':>6} {'server CPU/clock':>16}"]
    for r in rows:
        cpu = r["server_cpu_ms_per_clock"]
        lines.append(f"{r['workers']:>5} {r['procs']:>5} {'yes' if r['threads'] else 'no':>7} "
                     f"{r['clock_median_s'] * 1e3:>8.1f} {r['clock_ratio']:>6.2f} "
                     f"{'-' if cpu is None else f'{cpu:.1f} ms':>16}")
    return "\n".join(lines)


if __name__ == "__main__":
    from bench import barrier  # (as bench.hollow: the module's own name, not __main__)

    sys.exit(barrier.main())
