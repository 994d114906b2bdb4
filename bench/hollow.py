"""Hollow workers: dscar's real protocol at W = 64 and 256 workers on a 2-core machine.

kubemark's "hollow node" idea: the real agent with a fake payload. A real Dask scheduler (its own
process) runs dscar's ``Coordinator``; W real ``distributed.Worker`` objects (``nthreads=1``, each
with dscar's ``ParamServer`` and so its own shard runner thread) run many to a process: ``--procs``
processes each run W/P workers in one event loop. The algorithm is ``HollowStep``
(``bench.stragglers.SleepStep``: each shard step sleeps, the one table has a few rows per shard), so
what is measured is the engine's control plane, not compute.

What it measures, per W
-----------------------
Both modes run the same protocol; they differ in who begins each clock. By default ``HollowStep``
stops on the workers, as every bundled model does: the clock end is folded into the last apply and
the coordinator begins the next clock itself (``dscar.auto-begin``); the driver only reads reports,
off the clocks' path. ``--driver-begins`` (``DriverHollowStep``): its stopping rule runs in the
driver's process, so the driver begins every clock (a round trip a clock that users do not pay).
The mode that ran is printed.

* **clock time vs step time**: ``ClockRecord.seconds`` (under auto-begin the coordinator's time from one
  clock's finish to the next's, from ``begin_clock`` to the report when the driver begins), median over
  the clocks after ``--warmup``, divided by the ideal clock: shards per worker x ``--step`` (target
  <= 1.2x); their mean is in the JSON (``clock_mean_s``) too, as a check that reports read late and
  then bunched do not flatter the median.
* **scheduler CPU per clock**: the scheduler loop thread's CPU (``bench.overhead.loop_cpu_s`` through
  ``run_on_scheduler``) read before and after a fit, never between its clocks (nothing of the
  harness runs on the scheduler while the clocks run): ``(CPU(fit of --clocks) - CPU(fit of
  --warmup)) / (clocks - warmup)``, the steady clocks' mean without the fits' setup and end.
* **messages per clock / W**: every ``dscar_*`` handler of the scheduler and of every worker wraps a
  counter (``bench.overhead.install_counters``), counted the same way (long fit less short fit, per
  steady clock), by handler: ``scheduler:<op>`` (the workers' polls and commits, the driver's calls),
  ``worker:<op>`` (the scheduler's applies to workers, worker-to-worker fetches and pulls). Dask's
  own messages (heartbeats) are not counted.
* **idle scheduler CPU** (ms of loop CPU per second): with plain Dask only (before dscar's plugins
  are registered), with dscar registered and no job, and with a job registered between clocks (in
  one more fit of ``DriverHollowStep``, whatever the mode, the driver holds still inside
  ``converged`` after its last clock).
* **per-round overhead, dscar vs plain Dask**: dscar's median clock time minus the step time, beside
  plain Dask's: ``client.map`` of the same sleeps (one task per worker x shard) and a gather barrier,
  per round, on the same workers before dscar is registered; ratio dscar / Dask (target <= 0.5x).
* **this machine's floor** (``bench.barrier``, before the cluster starts; ``--no-floor`` skips it): the
  same barrier with no dscar in it, in the same layout (W clients in the same P processes, a thread
  each that sleeps the step, one Dask RPC each way a worker a clock, answered once all W arrived). A
  clock of dscar's cannot be shorter on this machine; printed beside the clock target.
* **hang detection**: one worker runs alone in a process of its own and is hung at clock 2
  (``dscar.faults.hang``: SIGSTOP of that process); time from its ``fault-hang`` event to its
  ``worker-lost`` event (both stamped by the coordinator), against Dask's heartbeat interval at that
  W (``distributed.scheduler.heartbeat_interval``): target <= 2 intervals + 2 s.
* **false positives**: workers lost in the healthy fits (every fit without a fault: the measured one,
  the short one, the held one and ``--healthy-runs`` more): target 0.
* **exactly once**: in every healthy fit that lost no worker (a loss restores the table from its
  initial values: no checkpoint store here), every clock's report says each shard committed once
  (the committed shards per worker sum to the shard count) and every row counts exactly the clocks.
* **event-loop lag** of each worker process (the loop its workers share) during the measured fit:
  how late a 100 ms sleep wakes, p50 / p99 / max; and each process's CPU seconds.

Usage: ``python -m bench.hollow [--quick] [--workers 64,256] [--procs P] [--driver-begins] [--profile DIR]
[--json PATH] [--plot PATH]``.
``--quick``: W = 16 on 2 processes, few clocks (the test). The load average is printed with the figures.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import dscar
from bench import barrier
from bench.common import load_average, log, machine_info, pyplot, spawn_serving, warn_busy, write_json
from bench.overhead import install_counters, loop_cpu_s
from bench.stragglers import SleepStep
from dscar import faults
from dscar.api.cluster import worker_info

STEP_S = 0.1
ROWS_PER_SHARD = 4
TARGET_CLOCK_RATIO = 1.2  # clock time <= 1.2x the ideal (shards per worker x step)
TARGET_OVERHEAD_RATIO = 0.5  # dscar's per-round overhead <= 0.5x plain Dask's
HANG_INTERVALS, HANG_SLACK_S = 2, 2.0  # a hung worker found within 2 heartbeat intervals + 2 s
#: the Dask settings of every process of the harness: dscar's embedded-cluster settings (no
#: profiler, a 200 ms tick) and its worker ttl, so the workers behave as dscar.Cluster's do
DASK_CONFIG = {**dscar.api.cluster.EMBEDDED_CONFIG, "distributed.scheduler.worker-ttl": dscar.api.cluster.DEFAULT_WORKER_TTL}


class HollowStep(SleepStep):
    """``SleepStep`` that also reports the table's largest count. It stops on the workers, as every
    bundled model does (``converged_on_workers``): with the clock end folded into the last apply, the
    coordinator begins the next clock itself (``dscar.auto-begin``) and the driver only reads reports."""

    name = "hollowstep"
    clock_end_reads_only = True  # (its clock end only reads: it may run while the next clock begins)

    def clock_end(self, ctx):
        count = dscar.to_host(ctx.pull("count"))
        return {"objective": float(count.sum()), "count_min": float(count.min()), "count_max": float(count.max())}


class DriverHollowStep(HollowStep):
    """``HollowStep`` whose stopping rule runs in the driver's process (``--driver-begins``): the driver
    begins every clock, one round trip between clocks that users of the bundled models do not pay.
    ``on_clock`` (driver only, never pickled to the workers) is called at every clock boundary."""

    name = "hollowstep"
    on_clock: Callable[[int], None] | None = None
    converged_on_workers = False

    def converged(self, history, tol):
        if self.on_clock is not None:
            self.on_clock(len(history))
        return False

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "on_clock"}


def hollow_sleep(seconds: float, i: int) -> int:
    """Plain Dask's task: the same sleep as a shard step."""
    time.sleep(seconds)
    return i


def sched_cpu_s(dask_scheduler=None) -> float:
    """The scheduler loop thread's CPU seconds (``bench.overhead.loop_cpu_s``, run on the scheduler)."""
    return loop_cpu_s()


def worker_statuses(dask_scheduler=None) -> dict[str, str]:
    """Each worker the scheduler knows -> its status's name (``bench.elastic``'s churn on hollow workers)."""
    return {a: ws.status.name for a, ws in list(dask_scheduler.workers.items())}


# --------------------------------------------------------------------------- the processes
async def _serve_scheduler(address_file: str) -> None:
    from distributed import Scheduler

    async with Scheduler(host="127.0.0.1", port=0, dashboard=False) as s:
        tmp = address_file + ".tmp"
        Path(tmp).write_text(s.address)
        os.replace(tmp, address_file)
        await s.finished()


#: this worker process's event-loop lag samples (s): how late a 100 ms sleep on the loop woke up
LOOP_LAG: list[float] = []
LAG_TICK_S = 0.1


async def _watch_loop_lag() -> None:
    """Sample the event loop's lag every ``LAG_TICK_S`` (the loop every worker of this process shares)."""
    loop = asyncio.get_running_loop()
    while True:
        t0 = loop.time()
        await asyncio.sleep(LAG_TICK_S)
        LOOP_LAG.append(max(0.0, loop.time() - t0 - LAG_TICK_S))


def loop_lag_ms(dask_worker=None) -> dict[str, float]:
    """The lag samples since the last call (run on a worker: its process's loop), in ms; forgets them."""
    lags = sorted(LOOP_LAG)
    LOOP_LAG.clear()
    if not lags:
        return {"n": 0}
    return {"n": len(lags), "p50": lags[len(lags) // 2] * 1e3, "p99": lags[int(len(lags) * 0.99)] * 1e3,
            "max": lags[-1] * 1e3}


#: the environment variable that keeps every hollow worker's system monitor (``--all-monitors``)
ALL_MONITORS_ENV = "DSCAR_HOLLOW_ALL_MONITORS"


async def _serve_workers(address: str, n: int, prefix: str) -> None:
    """``n`` workers in this process's one event loop, until they are all closed.

    Only the first keeps Dask's system monitor (``distributed.system_monitor``: psutil reads of the
    process's CPU, memory, fds, disk and network, every 500 ms): the others would each sample this
    same process again, on the loop they share, where a real worker samples its own process once
    (at W = 64, 32 monitors were about half of an idle hollow process's CPU). ``--all-monitors``
    keeps them all."""
    from distributed import Worker

    lag = asyncio.ensure_future(_watch_loop_lag())

    workers = [Worker(address, nthreads=1, name=f"{prefix}-{i}", host="127.0.0.1", memory_limit=0,
                      dashboard=False) for i in range(n)]
    await asyncio.gather(*workers)
    if not os.environ.get(ALL_MONITORS_ENV):
        for w in workers[1:]:
            pc = w.periodic_callbacks.pop("monitor", None)
            if pc is not None:
                pc.stop()
    await asyncio.gather(*(w.finished() for w in workers))
    lag.cancel()


#: the environment variable that carries a harness's own Dask settings (JSON) to its processes
CONFIG_ENV = "DSCAR_HOLLOW_CONFIG"
#: the environment variable that holds a worker process's workers back until a line comes on its stdin
GATE_ENV = "DSCAR_HOLLOW_GATE"
#: the environment variable that names the folder each harness process writes its profile to (``--profile``)
PROFILE_ENV = "DSCAR_HOLLOW_PROFILE"


def serve(role: str, *args: str) -> None:
    """A harness process: ``scheduler ADDRESS_FILE`` or ``workers ADDRESS N PREFIX``; with ``GATE_ENV`` set, its
    workers start once a line comes on its stdin (``HollowCluster.stand_by``: imported, not yet joined)."""
    import json

    import dask

    if os.environ.get(GATE_ENV):
        sys.stdin.readline()

    profile_dir = os.environ.get(PROFILE_ENV)
    profiler = None
    if profile_dir:  # (``--profile``: this process's event-loop thread, written when the harness ends it)
        import cProfile

        profiler = cProfile.Profile()
        signal.signal(signal.SIGTERM, _exit_on_term)
        profiler.enable()
    try:
        with dask.config.set({**DASK_CONFIG, **json.loads(os.environ.get(CONFIG_ENV) or "{}")}):
            if role == "scheduler":
                asyncio.run(_serve_scheduler(args[0]))
            else:
                asyncio.run(_serve_workers(args[0], int(args[1]), args[2]))
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(os.path.join(profile_dir, f"{role if role == 'scheduler' else args[2]}.prof"))


def _exit_on_term(signum, frame) -> None:
    raise SystemExit(0)  # (the default action would end the process before its profile is written)


def _spawn(*args: str, config: dict[str, Any] | None = None, gated: bool = False) -> subprocess.Popen:
    """A harness process (``serve``); ``config``: Dask settings of its own beside ``DASK_CONFIG``; ``gated``: its
    workers start once a line is written to its stdin."""
    import json

    return spawn_serving("bench.hollow", *args, env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                                                      "MKL_NUM_THREADS": "1", CONFIG_ENV: json.dumps(config or {}),
                                                      **({GATE_ENV: "1"} if gated else {})},
                         stdin=subprocess.PIPE if gated else None)


class HollowCluster:
    """A scheduler process and ``n_workers`` workers: ``procs`` processes share them, but ``solo`` of
    them run each alone in a process of its own (a hang or a kill stops only that worker; ``solos``
    maps each such process to its worker's address, ``replace_solos`` starts new ones). ``client`` is
    a plain Dask client until ``register``. ``config``: Dask settings of the scheduler process beside
    ``DASK_CONFIG`` (e.g. ``dscar.hang-timeout``)."""

    def __init__(self, n_workers: int, procs: int, solo: int = 0, timeout: float = 120.0,
                 config: dict[str, Any] | None = None):
        from distributed import Client

        self.n_workers, self.procs = n_workers, procs
        self._tmp = tempfile.TemporaryDirectory(prefix="dscar-hollow-")
        self.processes: dict[str, subprocess.Popen] = {}
        #: each one-worker process (its name in ``processes``) -> its worker's address
        self.solos: dict[str, str] = {}
        #: one-worker processes held before their worker starts (``stand_by``), next first
        self.standby: list[str] = []
        self.client = None
        self.cluster: dscar.Cluster | None = None
        self._solo = 0
        try:
            addr_file = os.path.join(self._tmp.name, "scheduler")
            self.processes["scheduler"] = _spawn("scheduler", addr_file, config=config)
            deadline = time.monotonic() + timeout
            while not os.path.exists(addr_file):
                if self.processes["scheduler"].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the scheduler process did not start")
                time.sleep(0.1)
            self.address = Path(addr_file).read_text()
            shared = n_workers - int(solo)
            sizes = [shared // procs + (i < shared % procs) for i in range(procs)]
            for i, n in enumerate(sizes):
                if n:
                    self.processes[f"workers-{i}"] = _spawn("workers", self.address, str(n), f"hollow{i}")
            import dask

            with dask.config.set(DASK_CONFIG):
                self.client = Client(self.address, set_as_default=False, timeout=timeout)
            self.client.wait_for_workers(shared, timeout=timeout)
            self.add_solos(int(solo), timeout)
        except BaseException:
            self.close()
            raise

    @property
    def solo(self) -> str | None:
        """The first one-worker process's worker (None: there is none)."""
        return next(iter(self.solos.values()), None)

    def register(self) -> dscar.Cluster:
        """dscar's plugins on the scheduler and every worker (from now on, every worker polls for work)."""
        self.cluster = dscar.Cluster(self.client)
        return self.cluster

    def worker_names(self) -> dict[str, str]:
        return {a: str(w.get("name")) for a, w in worker_info(self.client).items()}

    def _new_solo_name(self) -> str:
        """The name of the next one-worker process (``solo1``, ``solo2``, ...)."""
        self._solo += 1
        return f"solo{self._solo}"

    def stand_by(self, k: int) -> None:
        """``k`` one-worker processes started and held before their worker starts (``GATE_ENV``): a later
        ``add_solos`` lets them join, as a machine already up and imported joins a real cluster, without
        an interpreter's start (some 2 s of CPU here) on the cores the running workers share."""
        for _ in range(k):
            name = self._new_solo_name()
            self.standby.append(name)
            self.processes[name] = _spawn("workers", self.address, "1", name, gated=True)

    def add_solos(self, k: int, timeout: float = 120.0) -> list[str]:
        """``k`` processes of one worker each (standing by ones first: ``stand_by``); their workers'
        addresses once they have all joined."""
        names = []
        for _ in range(k):
            if self.standby:
                names.append(self.standby.pop(0))
                proc = self.processes[names[-1]]
                proc.stdin.write(b"go\n")
                proc.stdin.close()
                continue
            names.append(self._new_solo_name())
            self.processes[names[-1]] = _spawn("workers", self.address, "1", names[-1])
        deadline = time.monotonic() + timeout
        while True:
            joined = {n.rsplit("-", 1)[0]: a for a, n in self.worker_names().items()}
            self.solos.update({n: joined[n] for n in names if n in joined})
            missing = [n for n in names if n not in self.solos]
            if not missing:
                return [self.solos[n] for n in names]
            if any(self.processes[n].poll() is not None for n in missing) or time.monotonic() > deadline:
                raise RuntimeError(f"worker process(es) {missing} did not join")
            time.sleep(0.2)

    def retire(self, worker: str, timeout: float = 60.0) -> bool:
        """``retire_workers`` of ``worker`` (one of a shared process closes alone; a one-worker process ends with
        it); whether it was gone from the scheduler within ``timeout``."""
        self.client.retire_workers(workers=[worker])
        deadline = time.monotonic() + timeout
        while worker in self.client.run_on_scheduler(worker_statuses) and time.monotonic() < deadline:
            time.sleep(0.02)
        for name in [n for n, a in self.solos.items() if a == worker]:
            self.solos.pop(name)
            self._end(self.processes.pop(name))
        return worker not in self.client.run_on_scheduler(worker_statuses)

    def replace_solos(self, addresses: list[str] | None = None, timeout: float = 120.0) -> list[str]:
        """End the one-worker processes whose workers are ``addresses`` (default: all; hung, dead or
        not), wait until the scheduler has forgotten those workers, and start as many new ones; their
        addresses."""
        names = [n for n, a in self.solos.items() if addresses is None or a in addresses]
        for name in names:
            self.solos.pop(name)
            self._end(self.processes.pop(name))
        deadline = time.monotonic() + timeout
        while (any(n.rsplit("-", 1)[0] in names for n in self.worker_names().values())
               and time.monotonic() < deadline):
            time.sleep(0.2)
        return self.add_solos(len(names), timeout)

    def replace_solo(self, timeout: float = 120.0) -> str:
        """``replace_solos`` for a cluster of one one-worker process: its new worker."""
        return self.replace_solos(timeout=timeout)[0]

    def loop_lag_ms(self) -> dict[str, dict[str, float]]:
        """Each worker process's event-loop lag since the last call (``loop_lag_ms`` on one of its workers)."""
        first: dict[str, str] = {}
        for addr, name in sorted(self.worker_names().items(), key=lambda kv: kv[1]):
            first.setdefault(name.rsplit("-", 1)[0], addr)
        got = self.client.run(loop_lag_ms, workers=list(first.values()))
        return {prefix: got[addr] for prefix, addr in first.items() if addr in got}

    def process_cpu_s(self) -> dict[str, float]:
        """User + system CPU seconds of each harness process so far."""
        import psutil

        out = {}
        for name, p in self.processes.items():
            try:
                t = psutil.Process(p.pid).cpu_times()
                out[name] = t.user + t.system
            except psutil.Error:
                pass
        return out

    @staticmethod
    def _end(p: subprocess.Popen) -> None:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGCONT)  # a hung (stopped) process cannot act on SIGTERM
                p.terminate()
                p.wait(10)
            except (subprocess.TimeoutExpired, OSError):
                p.kill()
                p.wait(10)

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.close()
        if self.client is not None:
            try:
                self.client.close(timeout=10)
            except Exception:
                pass
        for name in [n for n in self.processes if n != "scheduler"] + ["scheduler"]:
            if name in self.processes:
                self._end(self.processes.pop(name))
        self._tmp.cleanup()

    def __enter__(self) -> "HollowCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------------------ measurements
def idle_cpu(client, seconds: float) -> float:
    """Scheduler loop CPU in ms per second while the driver holds still for ``seconds``."""
    c0, t0 = client.run_on_scheduler(sched_cpu_s), time.perf_counter()
    time.sleep(seconds)
    c1, t1 = client.run_on_scheduler(sched_cpu_s), time.perf_counter()
    return (c1 - c0) / (t1 - t0) * 1e3


def plain_dask_rounds(client, n_tasks: int, step_s: float, rounds: int) -> dict[str, Any]:
    """Rounds of ``client.map`` of ``n_tasks`` sleeps and a gather barrier: wall and scheduler CPU per round."""
    walls, cpus = [], []
    for r in range(rounds):
        c0, t0 = client.run_on_scheduler(sched_cpu_s), time.perf_counter()
        futs = client.map(hollow_sleep, [step_s] * n_tasks, range(n_tasks),
                          key=[f"hollow-sleep-{r}-{i}" for i in range(n_tasks)])
        got = client.gather(futs)
        walls.append(time.perf_counter() - t0)
        cpus.append(client.run_on_scheduler(sched_cpu_s) - c0)
        if sorted(got) != list(range(n_tasks)):
            raise RuntimeError(f"plain Dask round {r} returned {len(got)} results, not {n_tasks}")
        del futs
    return {"round_s": walls, "sched_cpu_s": cpus}


def exactly_once(res: dscar.FitResult, n_shards: int, n_rows: int) -> list[str]:
    """What breaks exactly-once in a fit without losses (empty: nothing): each clock's commits (one
    per shard) and the table (every row counts the clocks so far)."""
    bad = []
    for rec in res.history:
        committed = sum(rec.shards_per_worker.values())
        if committed != n_shards:
            bad.append(f"clock {rec.clock}: {committed} shards committed, expected {n_shards}")
        m = rec.metrics
        if not (m.get("count_min") == m.get("count_max") == rec.clock and m.get("objective") == n_rows * rec.clock):
            bad.append(f"clock {rec.clock}: counts {m.get('count_min')}..{m.get('count_max')}, sum "
                       f"{m.get('objective')}; expected every row = {rec.clock}")
    np_count = res.params["count"]
    if not np.all(np_count == res.n_clocks):
        bad.append(f"final table: counts {np_count.min()}..{np_count.max()}, expected {res.n_clocks}")
    return bad


def losses(res_events: list[dict]) -> list[dict]:
    """The workers the job lost (``worker-lost``)."""
    return [e for e in res_events if e.get("kind") == "worker-lost"]


def loss_reasons(events: list[dict]) -> dict[str, int]:
    """Why the coordinator removed the lost workers (``worker-removed`` reasons, digits left out), by count."""
    out: dict[str, int] = {}
    for e in events:
        if e.get("kind") == "worker-removed":
            why = "".join("#" if c.isdigit() else c for c in str(e.get("reason")))
            out[why] = out.get(why, 0) + 1
    return out


def handler_counts(dask_scheduler=None, dask_worker=None) -> dict[str, int]:
    """Calls of each ``dscar_*`` handler of this server so far (``bench.overhead.install_counters``)."""
    server = dask_scheduler if dask_scheduler is not None else dask_worker
    return dict(getattr(server, "_bench_rpc_counts", {}))


def message_counts(client) -> dict[str, int]:
    """Calls of every ``dscar_*`` handler so far: ``scheduler:<op>`` on the scheduler, ``worker:<op>``
    summed over the workers (worker-to-worker fetches and pulls, scheduler-to-worker applies)."""
    out = {f"scheduler:{k}": v for k, v in client.run_on_scheduler(handler_counts).items()}
    for per in client.run(handler_counts).values():
        for k, v in per.items():
            out[f"worker:{k}"] = out.get(f"worker:{k}", 0) + v
    return out


def count_messages(client) -> int:
    """Wrap every ``dscar_*`` handler of the scheduler and the workers with a counter (idempotent;
    a worker that joins later is not counted); how many handlers are wrapped."""
    return client.run_on_scheduler(install_counters) + sum(client.run(install_counters).values())


def dscar_fit(hc: HollowCluster, spw: int, step_s: float, clocks: int, idle_s: float = 0.0,
              policies: list[str] | None = None, driver_begins: bool = False) -> dict[str, Any]:
    """One fit of ``clocks`` clocks on every worker: ``result``, the scheduler loop's CPU seconds over
    it (``cpu_s``: read before and after the fit, never between clocks), the ``dscar_*`` messages it
    sent (``messages``, by handler) and (``idle_s``) ``idle_job``, the loop CPU in ms/s while a job
    waits between clocks after the last (a ``DriverHollowStep`` holds it still there, whatever the mode).
    ``driver_begins``: the driver begins every clock (``DriverHollowStep``), else the coordinator does."""
    n_shards = hc.n_workers * spw
    algo = DriverHollowStep(step_s) if driver_begins or idle_s > 0 else HollowStep(step_s)
    idle: list[float] = []
    if idle_s > 0:
        algo.on_clock = lambda n: idle.append(idle_cpu(hc.client, idle_s)) if n == clocks else None
    m0, c0 = message_counts(hc.client), hc.client.run_on_scheduler(sched_cpu_s)
    res = dscar.fit(algo, {"row": np.arange(n_shards * ROWS_PER_SHARD, dtype=np.int64)}, hc.cluster,
                    n_shards=n_shards, max_clocks=clocks, progress=False, policies=policies)
    c1, m1 = hc.client.run_on_scheduler(sched_cpu_s), message_counts(hc.client)
    return {"result": res, "cpu_s": c1 - c0, "messages": {k: m1.get(k, 0) - m0.get(k, 0) for k in set(m0) | set(m1)},
            "idle_job": idle[0] if idle else None}


def hang_trial(hc: HollowCluster, victim: str, spw: int, step_s: float, clocks: int,
               policies: list[str] | None = None) -> dict[str, Any]:
    """``victim`` (a worker alone in its process) hung at clock 2: how long until the coordinator loses it."""
    n_total = len(hc.worker_names())  # (fewer than W when workers were lost before)
    t0 = time.perf_counter()
    algo = HollowStep(step_s)
    n_shards = n_total * spw
    try:
        res = dscar.fit(algo, {"row": np.arange(n_shards * ROWS_PER_SHARD, dtype=np.int64)}, hc.cluster,
                        n_shards=n_shards, max_clocks=clocks, progress=False, faults=[faults.hang(victim, 2)],
                        policies=policies)
        events, error = res.events, None
    except dscar.DscarError as e:
        events, error = [], f"{type(e).__name__}: {e}"
    hung = [e for e in events if e.get("kind") == "fault-hang" and e.get("worker") == victim]
    lost = [e for e in events if e.get("kind") == "worker-lost" and e.get("worker") == victim]
    others = [e for e in losses(events) if e.get("worker") != victim]
    from distributed.scheduler import heartbeat_interval

    out = {"workers": n_total, "victim": victim, "error": error, "fit_s": time.perf_counter() - t0,
           "heartbeat_interval_s": heartbeat_interval(n_total),
           "fired": bool(hung), "detected": bool(hung and lost),
           "detect_s": lost[0]["time"] - hung[0]["time"] if hung and lost else None,
           "other_losses": len(others), "other_loss_reasons": loss_reasons([e for e in events if e.get("worker") != victim]),
           "removed_reason": next((e.get("reason") for e in events
                                   if e.get("kind") == "worker-removed" and e.get("worker") == victim), None)}
    return out


def measure(w: int, procs: int, spw: int, step_s: float, clocks: int, warmup: int, idle_s: float,
            hang_trials: int, healthy_runs: int, t0: float, policies: list[str] | None = None,
            driver_begins: bool = False, floor: bool = True) -> dict[str, Any]:
    """Everything for one W (see the module docstring); ``policies`` as ``dscar.fit`` takes them;
    ``driver_begins``: the driver begins every clock (``DriverHollowStep``), else the coordinator does;
    ``floor``: measure this machine's floor first (``bench.barrier``; its step is a worker's clock)."""
    row: dict[str, Any] = {"workers": w, "procs": procs, "shards_per_worker": spw, "n_shards": w * spw,
                           "step_s": step_s, "clocks": clocks, "warmup": warmup,
                           "mode": "driver-begins" if driver_begins else "auto-begin"}
    from distributed.scheduler import heartbeat_interval

    row["heartbeat_interval_s"] = heartbeat_interval(w)
    row["floor"] = barrier.measure(w, procs, spw * step_s, clocks, warmup) if floor else None
    if floor:
        log(t0, f"W={w}: this machine's floor (bench.barrier): clock {row['floor']['clock_ratio']:.2f}x the step")
    ts = time.perf_counter()
    with HollowCluster(w, procs, solo=hang_trials > 0) as hc:
        row["start_s"] = time.perf_counter() - ts
        log(t0, f"W={w}: workers in {procs} processes{' and one alone' if hc.solo else ''} up in {row['start_s']:.1f} s")
        client = hc.client
        # plain Dask first, before dscar's runners poll the scheduler
        row["idle_ms_per_s_dask"] = idle_cpu(client, idle_s)
        plain_dask_rounds(client, hc.n_workers * spw, step_s, 1)  # warm the workers up
        dask_runs = plain_dask_rounds(client, hc.n_workers * spw, step_s, clocks)
        row["dask"] = dask_runs
        log(t0, f"W={w}: plain Dask rounds {[round(x, 3) for x in dask_runs['round_s']]}")
        hc.register()
        row["idle_ms_per_s_no_job"] = idle_cpu(client, idle_s)
        row["handlers_counted"] = count_messages(client)
        hc.loop_lag_ms()  # (forget what came before the fit)
        cpu0 = hc.process_cpu_s()
        tf = time.perf_counter()
        long = dscar_fit(hc, spw, step_s, clocks, policies=policies, driver_begins=driver_begins)
        fit_wall = time.perf_counter() - tf
        cpu1 = hc.process_cpu_s()
        row["loop_lag_ms"] = hc.loop_lag_ms()
        # the first ``warmup`` clocks and the fit's setup and end, measured alone: the long fit less
        # this one is ``clocks - warmup`` steady clocks
        cpu2 = hc.process_cpu_s()
        short = dscar_fit(hc, spw, step_s, warmup, policies=policies, driver_begins=driver_begins)
        cpu3 = hc.process_cpu_s()
        row["short_process_cpu_s"] = {k: cpu3[k] - cpu2.get(k, 0.0) for k in cpu3}
        res = long["result"]
        row["fit_wall_s"] = fit_wall
        row["setup_s"] = res.setup_seconds
        row["process_cpu_s"] = {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1}
        row["clock_s"] = [r.seconds for r in res.history]
        row["skipped_clocks"] = sum(r.skipped for r in res.history)  # cut short by a loss: no clock-end step
        row["stage_s"] = [dict(r.stage_s) for r in res.history]
        row["fit_cpu_ms"] = {"long": long["cpu_s"] * 1e3, "short": short["cpu_s"] * 1e3}
        row["fit_messages"] = {"long": long["messages"], "short": short["messages"]}
        # backups in a healthy fit: each is a second run of a shard that was not late, only slow to report
        row["backups"] = sum(e.get("kind") == "backup-attempt" for e in res.events)
        log(t0, f"W={w}: dscar fit: setup {res.setup_seconds:.1f} s, clocks {[round(x, 3) for x in row['clock_s']]}, "
                f"worker loops' lag p99 {[round(v.get('p99', 0)) for v in row['loop_lag_ms'].values()]} ms, "
                f"{row['backups']} backup(s)")
        healthy = [res, short["result"]]
        if idle_s > 0:  # a job between clocks: the driver holds still after the last (either mode)
            held = dscar_fit(hc, spw, step_s, max(3, warmup + 1), idle_s, policies)
            healthy.append(held["result"])
            row["idle_ms_per_s_job"] = held["idle_job"]
        else:
            row["idle_ms_per_s_job"] = None
        for i in range(healthy_runs):
            healthy.append(dscar_fit(hc, spw, step_s, max(3, warmup + 1), policies=policies,
                                     driver_begins=driver_begins)["result"])
        # a loss restores the table from its initial values (no checkpoint store here): exactly once
        # is checked on the fits that lost no worker
        checked = [r for r in healthy if not losses(r.events)]
        row["exactly_once_checked"] = len(checked)
        row["exactly_once_violations"] = [v for r in checked for v in exactly_once(r, w * spw, w * spw * ROWS_PER_SHARD)]
        row["healthy_runs"] = len(healthy)
        row["false_positives"] = sum(len(losses(r.events)) for r in healthy)
        row["false_positive_events"] = [e for r in healthy for e in losses(r.events)]
        row["event_counts"] = {}
        for r in healthy:
            for e in r.events:
                row["event_counts"][e["kind"]] = row["event_counts"].get(e["kind"], 0) + 1
        row["false_positive_reasons"] = loss_reasons([e for r in healthy for e in r.events])
        log(t0, f"W={w}: {len(healthy)} healthy fit(s), {row['false_positives']} workers lost "
                f"{row['false_positive_reasons'] or ''}")
        row["hang"] = []
        for i in range(hang_trials):
            h = hang_trial(hc, hc.solo if i == 0 else hc.replace_solo(), spw, step_s, max(4, warmup + 2), policies)
            row["hang"].append(h)
            log(t0, f"W={w}: hang trial {i + 1}: detected {h['detected']} after {h['detect_s']} s "
                    f"(heartbeat interval {h['heartbeat_interval_s']:g} s), other losses {h['other_losses']} "
                    f"{h['other_loss_reasons'] or ''}")
    return summarize(row)


#: heartbeat intervals the driver holds still at each clock boundary of a watch (``watch``): the
#: silence after which a worker is probed (``dscar.core.liveness.MISSED_HEARTBEATS``)
WATCH_INTERVALS = 2


def watch(w: int, procs: int, windows: int, hang_trials: int, step_s: float, t0: float,
          policies: list[str] | None = None) -> dict[str, Any]:
    """False positives and hang detection at ``w`` workers for the price of one fit (a W = 256 fit's
    setup takes minutes here): one cluster, one fit whose first ``windows`` clocks are healthy, the
    driver holding still for ``WATCH_INTERVALS`` heartbeat intervals after each (a job registered,
    every worker polling: a window in which a healthy worker must not be judged silent), then
    ``hang_trials`` one-worker processes hung two clocks apart. False positives: workers lost that
    were not hung, per window; detection: from each ``fault-hang`` to that worker's ``worker-lost``."""
    from distributed.scheduler import heartbeat_interval

    hb = heartbeat_interval(w)
    hold = WATCH_INTERVALS * hb
    row: dict[str, Any] = {"workers": w, "procs": procs, "windows": windows, "hold_s": hold,
                           "heartbeat_interval_s": hb, "hang_limit_s": HANG_INTERVALS * hb + HANG_SLACK_S,
                           "load_before": load_average()}
    ts = time.perf_counter()
    with HollowCluster(w, procs, solo=hang_trials) as hc:
        row["start_s"] = time.perf_counter() - ts
        hc.register()
        log(t0, f"W={w} watch: {w - hang_trials} workers in {procs} processes and {hang_trials} alone, up in "
                f"{row['start_s']:.1f} s; {windows} windows of {hold:.2f} s, then {hang_trials} hang(s)")
        victims = list(hc.solos.values())
        hang_at = [windows + 1 + 2 * i for i in range(hang_trials)]
        clocks = windows + 2 * hang_trials + 1
        n_shards = w
        algo = DriverHollowStep(step_s)
        algo.on_clock = lambda n: time.sleep(hold)
        tf = time.perf_counter()
        res = dscar.fit(algo, {"row": np.arange(n_shards * ROWS_PER_SHARD, dtype=np.int64)}, hc.cluster,
                        n_shards=n_shards, max_clocks=clocks, progress=False, policies=policies,
                        faults=[faults.hang(v, c) for v, c in zip(victims, hang_at)])
        row["fit_s"] = time.perf_counter() - tf
        row["setup_s"] = res.setup_seconds
    row["clock_s"] = [r.seconds for r in res.history]
    lost = losses(res.events)
    false = [e for e in lost if e.get("worker") not in victims]
    row["false_positives"] = len(false)
    row["false_positive_windows"] = len({e["clock"] for e in false if e["clock"] <= windows})
    row["false_positive_events"] = false
    row["false_positive_reasons"] = loss_reasons([e for e in res.events if e.get("worker") not in victims])
    row["hang"] = []
    for v, c in zip(victims, hang_at):
        hung = [e for e in res.events if e.get("kind") == "fault-hang" and e.get("worker") == v]
        gone = [e for e in lost if e.get("worker") == v]
        row["hang"].append({"victim": v, "clock": c, "fired": bool(hung), "detected": bool(hung and gone),
                            "detect_s": gone[0]["time"] - hung[0]["time"] if hung and gone else None})
    row["load_after"] = load_average()
    return row


def format_watch(row: dict[str, Any]) -> str:
    found = [h["detect_s"] for h in row["hang"]]
    worst = max((x for x in found if x is not None), default=None)
    met = bool(found) and None not in found and worst <= row["hang_limit_s"]
    return "\n".join([
        f"W={row['workers']} ({row['procs']} shared processes; heartbeat interval {row['heartbeat_interval_s']:g} s), "
        f"one fit: setup {row['setup_s']:.1f} s, {row['windows']} healthy windows of a clock + {row['hold_s']:.2f} s "
        f"held still, then {len(row['hang'])} hung worker(s); load {row['load_before']} -> {row['load_after']}",
        f"W={row['workers']}: false positives in {row['windows']} healthy windows: {row['false_positive_windows']} "
        f"window(s), {row['false_positives']} worker(s) lost that were not hung in the whole fit "
        f"{row['false_positive_reasons'] or ''} {'MET' if row['false_positives'] == 0 else 'NOT MET'}",
        f"W={row['workers']}: hung worker found <= {HANG_INTERVALS} x {row['heartbeat_interval_s']:g} s + "
        f"{HANG_SLACK_S:g} s = {row['hang_limit_s']:.2f} s: "
        + ", ".join("not found" if x is None else f"{x:.2f} s" for x in found) + f" {'MET' if met else 'NOT MET'}",
    ])


def summarize(row: dict[str, Any]) -> dict[str, Any]:
    """The row's figures from its raw measurements: medians, ratios, targets."""
    wu, spw, step = row["warmup"], row["shards_per_worker"], row["step_s"]
    ideal = spw * step
    steady = row["clock_s"][wu:] or row["clock_s"]
    row["clock_median_s"] = statistics.median(steady)
    row["clock_ratio"] = row["clock_median_s"] / ideal
    row["dscar_overhead_s"] = row["clock_median_s"] - ideal
    dsteady = row["dask"]["round_s"][wu:] or row["dask"]["round_s"]
    row["dask_round_median_s"] = statistics.median(dsteady)
    row["dask_overhead_s"] = row["dask_round_median_s"] - ideal
    row["overhead_ratio"] = (row["dscar_overhead_s"] / row["dask_overhead_s"]) if row["dask_overhead_s"] > 0 else None
    steady_clocks = row["clocks"] - wu
    row["clock_mean_s"] = sum(steady) / len(steady)
    row["sched_cpu_ms_per_clock"] = (row["fit_cpu_ms"]["long"] - row["fit_cpu_ms"]["short"]) / steady_clocks
    fm = row["fit_messages"]
    per_clock = {k: (fm["long"].get(k, 0) - fm["short"].get(k, 0)) / steady_clocks
                 for k in set(fm["long"]) | set(fm["short"])}
    row["messages_per_clock"] = {k: v for k, v in sorted(per_clock.items(), key=lambda kv: -kv[1]) if v}
    row["messages_per_clock_per_worker"] = sum(per_clock.values()) / row["workers"]
    # what bounds a clock: each process's CPU a steady clock (long fit less short fit, as above)
    pl, ps = row["process_cpu_s"], row["short_process_cpu_s"]
    row["process_cpu_ms_per_clock"] = {k: (pl[k] - ps.get(k, 0.0)) / steady_clocks * 1e3 for k in pl}
    workers_ms = sum(v for k, v in row["process_cpu_ms_per_clock"].items() if k != "scheduler")
    row["worker_cpu_ms_per_clock"] = workers_ms
    # the messages the scheduler's loop handles or sends (its handlers' calls, and the applies it sends)
    sched_msgs = sum(v for k, v in per_clock.items() if k.startswith("scheduler:")) + per_clock.get("worker:dscar_apply", 0)
    row["sched_cpu_ms_per_message"] = row["sched_cpu_ms_per_clock"] / sched_msgs if sched_msgs > 0 else None
    dc = row["dask"]["sched_cpu_s"][wu:] or row["dask"]["sched_cpu_s"]
    row["dask_sched_cpu_ms_per_round"] = statistics.median(dc) * 1e3
    hangs = [h for h in row["hang"] if h["detected"]]
    row["hang_detect_s"] = [h["detect_s"] for h in row["hang"]]
    row["hang_limit_s"] = (HANG_INTERVALS * row["hang"][0]["heartbeat_interval_s"] + HANG_SLACK_S) if row["hang"] else None
    row["targets"] = {
        "clock_ratio": {"limit": TARGET_CLOCK_RATIO, "value": row["clock_ratio"],
                        "met": row["clock_ratio"] <= TARGET_CLOCK_RATIO},
        "overhead_ratio": {"limit": TARGET_OVERHEAD_RATIO, "value": row["overhead_ratio"],
                           "met": row["overhead_ratio"] is not None and row["overhead_ratio"] <= TARGET_OVERHEAD_RATIO},
        "false_positives": {"limit": 0, "value": row["false_positives"], "runs": row["healthy_runs"],
                            "met": row["false_positives"] == 0},
    }
    if row["hang"]:
        worst = max((h["detect_s"] for h in hangs), default=None)
        row["targets"]["hang_detect"] = {"limit": row["hang_limit_s"], "value": worst, "trials": len(row["hang"]),
                                         "met": len(hangs) == len(row["hang"]) and worst <= row["hang_limit_s"]}
    return row


def _met(t: dict) -> str:
    return "MET" if t["met"] else "NOT MET"


def _num(x: float | None, fmt: str, scale: float = 1.0) -> str:
    return "-" if x is None else format(x * scale, fmt)


def _once(row: dict) -> str:
    """Exactly once in the table: ok, NO (violations), or - (no fit without a loss to check)."""
    return "-" if not row["exactly_once_checked"] else "NO" if row["exactly_once_violations"] else "ok"


def format_table(rows: list[dict]) -> str:
    head = (f"{'W':>4} {'procs':>5} {'clock ms':>8} {'x step':>6} {'dscar ovh':>9} {'Dask ovh':>8} {'ratio':>6} "
            f"{'sched CPU/clock':>15} {'Dask CPU/round':>14} {'idle Dask':>9} {'idle dscar':>10} {'idle job':>8} "
            f"{'msgs/clock/W':>12} {'HB int':>6} {'hang found s':>14} {'FP/runs':>7} {'1x/fits':>7}")
    lines = [head]
    for r in rows:
        hang = ",".join(_num(x, ".1f") for x in r["hang_detect_s"]) or "-"
        lines.append(
            f"{r['workers']:>4} {r['procs']:>5} {_num(r['clock_median_s'], '.1f', 1e3):>8} "
            f"{_num(r['clock_ratio'], '.2f'):>6} {_num(r['dscar_overhead_s'], '.1f', 1e3):>9} "
            f"{_num(r['dask_overhead_s'], '.1f', 1e3):>8} {_num(r['overhead_ratio'], '.2f'):>6} "
            f"{_num(r['sched_cpu_ms_per_clock'], '.1f'):>12} ms {_num(r['dask_sched_cpu_ms_per_round'], '.1f'):>11} ms "
            f"{_num(r['idle_ms_per_s_dask'], '.1f'):>9} {_num(r['idle_ms_per_s_no_job'], '.1f'):>10} "
            f"{_num(r['idle_ms_per_s_job'], '.1f'):>8} {r['messages_per_clock_per_worker']:>12.2f} "
            f"{r['heartbeat_interval_s']:>5.2f}s {hang:>14} "
            f"{r['false_positives']:>3}/{r['healthy_runs']:<3} {_once(r):>3}/{r['exactly_once_checked']}")
    return "\n".join(lines)


def format_messages(rows: list[dict]) -> str:
    """Each W's ``dscar_*`` messages a steady clock, by handler (where it ran) and per worker."""
    lines = []
    for r in rows:
        lines.append(f"W={r['workers']} ({r['mode']}): messages a steady clock / W, by handler "
                     f"(total {r['messages_per_clock_per_worker']:.2f}):")
        lines.extend(f"  {k:<32} {v / r['workers']:>7.3f}  ({v:.1f} a clock)" for k, v in r["messages_per_clock"].items())
    return "\n".join(lines)


def format_bounds(rows: list[dict]) -> str:
    """What a steady clock costs in CPU on this machine, beside the messages that cost it."""
    lines = []
    for r in rows:
        spm = r["sched_cpu_ms_per_message"]
        lines.append(
            f"W={r['workers']}: CPU a steady clock: scheduler loop {r['sched_cpu_ms_per_clock']:.1f} ms "
            f"({'-' if spm is None else f'{spm:.2f}'} ms a message it handles or sends), scheduler process "
            f"{r['process_cpu_ms_per_clock'].get('scheduler', float('nan')):.1f} ms, worker processes "
            f"{r['worker_cpu_ms_per_clock']:.1f} ms ({r['worker_cpu_ms_per_clock'] / r['workers']:.2f} ms a worker, "
            f"{r['worker_cpu_ms_per_clock'] / max(r['messages_per_clock_per_worker'], 1e-9) / r['workers']:.2f} ms a "
            f"message); {2 * r['step_s'] * 1e3:.0f} ms of CPU a clock of 2 cores")
    return "\n".join(lines)


def target_lines(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        t = r["targets"]
        fl = r.get("floor")
        floor = "" if not fl else (f" (this machine's floor, bench.barrier: {fl['clock_ratio']:.2f}x: one Dask RPC "
                                   "each way a worker a clock from a thread a worker, no dscar)")
        out.append(f"W={r['workers']}: clock <= {TARGET_CLOCK_RATIO}x step: {t['clock_ratio']['value']:.2f}x "
                   f"{_met(t['clock_ratio'])}{floor}")
        v = t["overhead_ratio"]["value"]
        out.append(f"W={r['workers']}: dscar overhead <= {TARGET_OVERHEAD_RATIO}x plain Dask's: "
                   f"{'-' if v is None else f'{v:.2f}x'} {_met(t['overhead_ratio'])}")
        if "hang_detect" in t:
            h = t["hang_detect"]
            v = "not found" if h["value"] is None else f"{h['value']:.1f} s (worst of {h['trials']})"
            out.append(f"W={r['workers']}: hung worker found <= {HANG_INTERVALS} x {r['heartbeat_interval_s']:g} s "
                       f"+ {HANG_SLACK_S:g} s = {h['limit']:.1f} s: {v} {_met(h)}")
        fp = t["false_positives"]
        out.append(f"W={r['workers']}: false positives in {fp['runs']} healthy fit(s): {fp['value']} {_met(fp)}")
        if r["skipped_clocks"]:
            out.append(f"W={r['workers']}: {r['skipped_clocks']} of the measured fit's {len(r['clock_s'])} clocks were "
                       "skipped (a loss cut them short)")
    return out


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(14, 4))
    ws = [r["workers"] for r in rows]
    a1.plot(ws, [r["dscar_overhead_s"] * 1e3 for r in rows], "o-", label="dscar (clock - step)")
    a1.plot(ws, [r["dask_overhead_s"] * 1e3 for r in rows], "s-", label="plain Dask (map + gather - step)")
    if all(r.get("floor") for r in rows):
        a1.plot(ws, [(r["floor"]["clock_median_s"] - r["floor"]["step_s"]) * 1e3 for r in rows], "k:",
                label="floor here (bench.barrier: no dscar)")
    a1.set_ylabel("per-round overhead, ms")
    a1.set_title("overhead per round")
    nan = float("nan")
    a2.plot(ws, [nan if r["sched_cpu_ms_per_clock"] is None else r["sched_cpu_ms_per_clock"] for r in rows], "o-",
            label="dscar, per clock")
    a2.plot(ws, [r["dask_sched_cpu_ms_per_round"] for r in rows], "s-", label="plain Dask, per round")
    a2.plot(ws, [r["idle_ms_per_s_no_job"] for r in rows], "^--", label="idle, dscar no job (per s)")
    a2.plot(ws, [nan if r["idle_ms_per_s_job"] is None else r["idle_ms_per_s_job"] for r in rows], "v--",
            label="idle, job between clocks (per s)")
    a2.plot(ws, [r["idle_ms_per_s_dask"] for r in rows], "x--", label="idle, plain Dask (per s)")
    a2.set_ylabel("scheduler loop CPU, ms")
    a2.set_title("scheduler CPU")
    hw = [r for r in rows if r["hang"]]
    for r in hw:
        xs = [r["workers"]] * len(r["hang_detect_s"])
        a3.plot(xs, [x if x is not None else float("nan") for x in r["hang_detect_s"]], "ko")
    a3.plot([r["workers"] for r in hw], [r["hang_limit_s"] for r in hw], "r_", markersize=25,
            label=f"target: {HANG_INTERVALS} heartbeat intervals + {HANG_SLACK_S:g} s")
    a3.set_ylabel("seconds from hang to loss")
    a3.set_title("hung worker detection")
    for a in (a1, a2, a3):
        a.set_xlabel("workers (W)")
        a.set_xscale("log", base=2)
        a.grid(True, alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        serve(*argv[1:])
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.hollow", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="W = 16 on 2 processes, 5 clocks, 1 hang trial (~1-2 min)")
    ap.add_argument("--workers", default=None, help="comma-separated W (default 64,256; 16 with --quick)")
    ap.add_argument("--procs", type=int, default=None, help="worker processes (default W/32, at least 2, at most 8)")
    ap.add_argument("--shards-per-worker", type=int, default=1)
    ap.add_argument("--step", type=float, default=STEP_S, help="seconds each shard step sleeps (default 0.1)")
    ap.add_argument("--clocks", type=int, default=None, help="clocks of the measured fit and plain Dask rounds "
                    "(default 12, 5 with --quick)")
    ap.add_argument("--warmup", type=int, default=2, help="clocks / rounds left out of the medians")
    ap.add_argument("--idle", type=float, default=None, help="seconds of each idle measurement (default 5, 2 with --quick)")
    ap.add_argument("--hang-trials", type=int, default=None, help="hang trials per W (default 3, 1 with --quick)")
    ap.add_argument("--healthy-runs", type=int, default=0, help="healthy fits per W for false positives beside "
                    "the measured, the short and the held one (default 0)")
    ap.add_argument("--driver-begins", action="store_true", help="the driver begins every clock (its stopping "
                    "rule runs in its process), instead of the coordinator (dscar.auto-begin, as the bundled models run)")
    ap.add_argument("--policies", default="default", help="dscar's straggler policies: default (dscar.fit's), "
                    "none, or comma-separated names (backup, adaptive, restart)")
    ap.add_argument("--watch", type=int, metavar="N", default=None,
                    help="instead: false positives and hang detection in one fit per W (N healthy windows of a clock "
                         f"and {WATCH_INTERVALS} heartbeat intervals held still, then --hang-trials hangs)")
    ap.add_argument("--no-floor", action="store_true", help="skip this machine's floor (bench.barrier) before each W")
    ap.add_argument("--all-monitors", action="store_true", help="every hollow worker keeps Dask's system monitor "
                    "(by default one a process: the others would sample the same process again)")
    ap.add_argument("--profile", metavar="DIR", help="each harness process profiles its event-loop thread (cProfile: "
                    "the scheduler's handlers, Dask's comm, a worker process's loop) over the whole run and writes "
                    "DIR/<process>.prof when it is ended (read them with pstats; CPU figures are then inflated)")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--plot", metavar="PATH", default="hollow.png")
    args = ap.parse_args(argv)
    warn_busy()
    if args.all_monitors:
        os.environ[ALL_MONITORS_ENV] = "1"
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        os.environ[PROFILE_ENV] = os.path.abspath(args.profile)
    ws = [int(x) for x in args.workers.split(",")] if args.workers else ([16] if args.quick else [64, 256])
    clocks = args.clocks or (5 if args.quick else 12)
    idle_s = args.idle or (2.0 if args.quick else 5.0)
    policies = (None if args.policies == "default" else [] if args.policies == "none"
                else args.policies.split(","))
    hang_trials = args.hang_trials if args.hang_trials is not None else (1 if args.quick else 3)
    healthy = args.healthy_runs
    if min(ws) < 2 or clocks <= args.warmup + 1:
        ap.error("need W >= 2 and more clocks than warmup + 1")
    t0 = time.perf_counter()
    machine = machine_info()
    if args.watch:
        watched = [watch(w, args.procs or min(8, max(2, w // 32)), args.watch, hang_trials, args.step, t0, policies)
                   for w in ws]
        for row in watched:
            print(format_watch(row))
        if args.json:
            write_json(args.json, {"watch": args.watch, "workers": ws, "step_s": args.step, "rows": watched,
                                   "machine": {**machine, "loadavg_after": load_average()},
                                   "wall_s": time.perf_counter() - t0})
        return 0
    rows = []
    for w in ws:
        procs = args.procs or min(8, max(2, w // 32))
        rows.append(measure(w, procs, args.shards_per_worker, args.step, clocks, args.warmup, idle_s,
                            hang_trials, healthy, t0, policies, args.driver_begins, floor=not args.no_floor))
    load = load_average()
    mode = "driver-begins (the driver begins every clock)" if args.driver_begins else \
        "auto-begin (the coordinator begins each next clock; the stopping rule runs on the workers)"
    print(f"\nHollow workers: HollowStep (SleepStep, {args.step * 1e3:g} ms steps, {ROWS_PER_SHARD} rows a shard), "
          f"{args.shards_per_worker} shard(s) per worker, {clocks} clocks / plain Dask rounds, first {args.warmup} "
          f"dropped; policies {args.policies}; idle CPU over {idle_s:g} s (ms of scheduler loop CPU per s); "
          f"scheduler CPU and messages per clock: (fit of {clocks} clocks - fit of {args.warmup}) / {clocks - args.warmup}")
    print(f"mode: {mode}; Dask system monitors: {'every worker' if args.all_monitors else 'one a process'}")
    out = {"quick": args.quick, "driver_begins": args.driver_begins, "all_monitors": args.all_monitors, "profiled": bool(args.profile), "workers": ws, "step_s": args.step, "clocks": clocks, "warmup": args.warmup,
           "shards_per_worker": args.shards_per_worker, "idle_s": idle_s, "policies": args.policies, "rows": rows,
           "machine": {**machine, "loadavg_after": load}, "wall_s": time.perf_counter() - t0}
    if args.json:
        write_json(args.json, out)
    print(format_table(rows))
    print(format_messages(rows))
    print(format_bounds(rows))
    for line in target_lines(rows):
        print(line)
    print(f"loadavg after: {load}; this machine's speed probes (bench.common, as the run began): loop "
          f"{machine['speed_probe_ms']:.2f} ms, walk {machine['walk_probe_ms']:.2f} ms")
    plot(rows, args.plot)
    print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    # run as bench.hollow, not __main__: functions sent to the workers (client.run, the algorithm) are
    # then pickled by reference and find this module's state there (LOOP_LAG), not a copy of it
    from bench import hollow

    sys.exit(hollow.main())
