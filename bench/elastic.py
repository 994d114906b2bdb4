"""Membership churn: a BSP fit on worker processes while workers join, retire and are killed (issue 41).

A fit of ``bench.worker_models.ExactlyOnce`` (every shard commit counted per clock, checked at every clock end
and in the final parameters) runs on a ``LocalCluster`` of worker processes, each with a Nanny, with
checkpoints (partial recovery). A churn driver, a thread of this process, waits a random 2-4 clocks,
then does one event of the kinds asked for:

* ``join``: ``cluster.scale(n + 1)`` adds a worker process, not waited for (it warms up, then takes
  shards; partitions that even the load are copied to it while clocks run and switch at a boundary);
* ``retire``: ``client.retire_workers([w])`` on a worker of the job (held until the next clock boundary,
  where its partitions and shards are handed off: the ``handoff`` event's seconds);
* ``kill``: SIGKILL of a worker process (a loss: recovered; the Nanny starts it again and it rejoins).

and, for a retirement or a kill, waits for it to settle (the worker gone, or restarted) before it
counts the next clocks. The workers live or on their way stay between ``--workers - 1`` and
``--workers + 1``. After the last event the fit runs 2
more clocks and stops.

Figures:

* goodput: useful clocks (clocks that ran their clock end; a loss cuts a clock short and it is
  run again) per second of the churn fit, against the clock rate a failure-free fit would have
  had with the same live workers over time (DLRover's measure): failure-free reference fits at
  ``--workers - 1``, ``--workers`` and ``--workers + 1`` run in this same bench run, once before the
  churn fit and once after it (interleaved: a change of the machine's load shows as their spread,
  printed), of the churn fit's model (its width too: ``reference_fit``), and the expected rate is
  their mean rates weighted by the time the churn fit spent at each count (a count with no
  reference, briefly reached while a killed worker restarts, takes the nearest count's rate: a
  higher one, so goodput is if anything understated); a worker counts from its arrival at the
  scheduler until Dask begins to retire it (``ChurnDriver.working``: after its hand-off) or it is gone,
  sampled every 0.05 s and each change dated by the fit's event that made it (``dated_live``);
* where the time goes: each clock's seconds beyond a failure-free clock at its count, summed by the
  kind of the event before it (``lost_by_event``; "none": the clocks before the first event, the
  reference's own noise);
* a join's landing clock against whole shards (``join_granularity``): the time it lost, the part of it
  that no scheduler of whole shards could win back (a BSP clock ends with its last whole step: a
  joiner that arrives mid-clock shortens it only if it takes enough steps to end a round early), and
  the clock's time beyond that ideal (the engine's and the machine's);
* hand-off seconds per retirement (``handoff`` events);
* rework per event: clocks cut short by a loss (``skipped``) plus clocks rolled back, per event;
* the exactly-once audit: updates lost (``missing``), applied twice (``duplicated``), and every
  other breach ``bench.worker_models.check_seen`` / ``check_final`` count, over every clock;
* the final objective (``seen``'s sum: one per shard per clock applied) against the reference's.

A PNG shows the live workers and the clock rate over time, with the events marked.

The model's shard step is a fixed sleep (``WORK_S``) plus the real engine work of a shard (pulls,
staged updates, commits, applies, clock ends, checkpoints every 2 clocks): on this 2-core machine a
CPU-bound step cannot run faster with more workers, so goodput against references would measure CPU
share, not the engine; the sleep floor makes a clock's time fall with the worker count as on a real
cluster. Its objective is exact (``seen``'s sum counts every shard update applied), so "within the
model's tolerance of a failure-free run" is equality, less what a recovery rolled back.

Worker processes start as dscar's embedded cluster starts its own, forked from a forkserver that
preloaded Dask, NumPy, dscar's worker and this bench's models (``--start-method forkserver``, the
default): a joiner, or a nanny's restart of a killed worker, is a fork, not a fresh interpreter whose
imports (about 1 s of CPU on this machine before it registers, more as it sets up) the running workers'
clocks would pay on these 2 shared cores, which on a real cluster they do not: a joiner starts on a
machine of its own. ``--start-method spawn`` starts them as Dask does by default.

``--hollow W`` runs the churn on W hollow workers instead (``hollow_churn``; ``bench.hollow``: the real plugins,
steps that sleep ``HOLLOW_STEP_S``, ``HOLLOW_SHARDS_PER_WORKER`` shards a worker, many workers a process, the
scheduler in a process of its own), for the control plane under churn at a larger W (``HollowChurnDriver``):
the same figures, but for the layout and the memory copies (read from the coordinator, which runs in
another process), and references at W - 1, W and W + 1 on the same cluster (one-worker processes
retired and started between them), once each.

``--pull-bound`` measures a join instead (``pull_bound``): a model whose steps are pulls (``PullBound``)
on 2 worker processes whose pull serving is sleep-floored (``SlowServing``), a third added mid-fit;
time per clock and rows served per clock by each owner before the join, while the joiner owns
nothing, and once it owns partitions.

``--shards S`` cuts the same step work per clock (``STEP_WORK_S``) into S shards (default 12): a joiner
arriving mid-clock can take a larger part of what is left of it (the whole-shard bound shrinks), each
shard costs the engine its own hand-out, commit and apply. The references run at S shards too, so
goodput is against the same cut; the cost of the cut shows in the references' clock rates, compared
across runs. ``--parts P`` cuts the model's tables of the shards' rows into P partitions (default:
dscar's, one a worker at the start, so 3 partitions cannot be even, nor each held with its shards, on
2 or 4 workers); the references use the same cut. ``--event-at random`` fires each event at a uniform point of a clock (as long as the
last one) instead of right after a clock's end ("boundary", the default and the first timing): a
real cluster's joins, retirements and crashes do not wait for dscar's clocks, and a bench whose
joiners all land at one point of their clock measures that point only.

Usage: ``python -m bench.elastic [--events N] [--kinds join,retire,kill] [--workers W] [--seed S]
[--shards S] [--parts P] [--event-at boundary|random] [--quick] [--start-method forkserver|spawn] [--hollow W] [--json PATH] [--plot PATH]``; ``python -m bench.elastic --pull-bound [--json PATH]``.
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # before NumPy: one BLAS thread
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from typing import Any  # noqa: E402

import dask  # noqa: E402
from distributed.core import Status  # noqa: E402
import numpy as np  # noqa: E402

import dscar  # noqa: E402

# what the workers unpickle: in a module of their own, so a joiner does not import this harness
from bench.worker_models import (CHECK_KEYS, PB_COLS, PB_PARTS, PB_ROWS, PB_SHARDS, Churned,  # noqa: E402,F401
                                 PullBound, SlowServing, check_final, copies_held)
from bench.common import load_average, log, machine_info, pyplot, warn_busy, write_json  # noqa: E402

KINDS = ("join", "retire", "kill")
N_SHARDS = 12
#: seconds each shard step sleeps (a clock lasts about N_SHARDS * WORK_S / workers, plus the engine's
#: own work, some 0.1-0.3 s a clock on this loaded 2-core machine: the floor must dominate it)
WORK_S = 0.15
#: a clock's step work, whatever the shard count (``--shards``: finer shards, each ``work_s`` shorter)
STEP_WORK_S = N_SHARDS * WORK_S
EVENT_AT = ("boundary", "random")
SETTLE_S = 60.0  #: longest wait for an event to settle (a worker gone or arrived)
#: the churn on hollow workers (``--hollow W``): each shard step sleeps as ``bench.hollow``'s, shards a worker at W
HOLLOW_STEP_S, HOLLOW_SHARDS_PER_WORKER = 0.1, 4
#: the statuses of a worker that Dask is retiring or closing (not counted live: ``ChurnDriver.working``)
STOPPING = frozenset({Status.closing_gracefully, Status.closing, Status.closed})
STOPPING_NAMES = frozenset(st.name for st in STOPPING)  #: as ``bench.hollow.worker_statuses`` names them


def work_s(n_shards: int) -> float:
    """Seconds each of ``n_shards`` shard steps sleeps: a clock's step work (``STEP_WORK_S``) split evenly,
    so a run at another shard count differs from the default only in how finely the work is cut."""
    return STEP_WORK_S / n_shards


def event_delay(event_at: str, rng: random.Random, last_clock_s: float) -> float:
    """Seconds the churn driver waits after a clock's end before its event: none at "boundary" (right
    after the end, the bench's first timing), a uniform point of a clock as long as the last one at
    "random" (as a real cluster's joins, retirements and crashes come, unaware of dscar's clocks)."""
    if event_at == "boundary":
        return 0.0
    if event_at != "random":
        raise ValueError(f"event_at is one of {EVENT_AT}, not {event_at!r}")
    return rng.uniform(0.0, max(0.0, last_clock_s))


def coordinator_of(lc):
    """The dscar coordinator of an in-process ``LocalCluster``'s scheduler (imported here: the workers
    unpickle this module's model, and need not import the scheduler's code)."""
    from dscar.scheduler.coordinator import PLUGIN_NAME

    return lc.scheduler.plugins[PLUGIN_NAME]


def layout_of(coordinator) -> dict[str, Any] | None:
    """Where the running job's work lies now: live workers, and the largest rows, partitions and shards
    one worker owns or holds (read from another thread: a snapshot good enough to count); ``away``: the
    shards held by a worker other than the owner of their rows (``Churned``'s shard ``s`` steps on row ``s``
    of each table; None for another model), which pull and push those rows over the network; ``split``:
    the row ranges whose partitions in tables laid out alike have more than one owner (0 in a fit that
    placed them itself: the churn moves each partition on its own)."""
    job = next(iter(list(coordinator.jobs.values())), None)
    if job is None:
        return None
    owners = dict(job.pmap.owners)
    rows: Counter = Counter()
    for (t, p), w in owners.items():
        a, b = job.pmap.layouts[t].bounds[p]
        rows[w] += b - a
    held = Counter(job.queue.holder(s) for s in range(job.queue.n_shards))
    seen = job.pmap.layouts.get("seen")
    away = None
    if seen is not None and seen.n_rows == job.queue.n_shards:  # (Churned: shard s steps on row s of each table)
        away = sum(job.queue.holder(s) != owners.get(("seen", seen.split(s, s + 1)[0][0]))
                   for s in range(job.queue.n_shards))
    # the row ranges whose partitions of the tables laid out alike are owned by more than one worker: a step
    # on those rows pulls from, and stages updates for, each of them
    alike: dict[tuple[int, int], list[str]] = {}
    for name, lay in job.pmap.layouts.items():
        alike.setdefault((lay.n_rows, lay.n_parts), []).append(name)
    split = sum(len({owners.get((t, p)) for t in names}) > 1
                for (_, n_parts), names in alike.items() if len(names) > 1 for p in range(n_parts))
    return {"live": len(coordinator.scheduler.workers), "max_rows": max(rows.values()),
            "max_parts": max(Counter(owners.values()).values()), "max_shards": max(held.values()),
            "owners": len(rows), "away": away, "split": split}


class ChurnDriver:
    """Random joins, retirements and kills every few clocks, from a thread (see the module docstring)."""

    def __init__(self, lc, client, kinds: list[str], events: int, workers: int, seed: int,
                 event_at: str = "boundary"):
        self.lc, self.client, self.kinds, self.n_events = lc, client, kinds, events
        self.low, self.high = max(1, workers - 1), workers + 1
        self.rng = random.Random(seed)
        #: where in a clock events come (``event_delay``); its draws have a generator of their own, so
        #: the kinds drawn for a seed are the same at either timing
        self.event_at, self.delay_rng = event_at, random.Random(f"{seed}-delay")
        self.clock = 0  #: clocks ended so far
        self.clock_ends: list[float] = []  #: monotonic time of each clock's end (the last clock's length)
        self.changed = threading.Condition()
        self.done_at: int | None = None  #: the clock after which the last event settled
        self.events: list[dict[str, Any]] = []  #: what the driver did: kind, worker, clock, at, settle_s
        self.live: list[tuple[float, int]] = []  #: (time, live workers) samples
        self.stop = threading.Event()
        self.error: str | None = None
        self._round: list[str] = []  #: kinds left in this round of ``choose``

    def tick(self, clock: int) -> None:
        with self.changed:
            self.clock = clock
            self.clock_ends = [*self.clock_ends[-1:], time.monotonic()]
            self.changed.notify_all()

    def _wait_clock(self, clock: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.clock >= clock or self.stop.is_set(), timeout=600)

    def workers(self) -> list[str]:
        return sorted(self.lc.scheduler.workers)

    def _wait_until(self, cond) -> bool:
        t0 = time.monotonic()
        while not cond():
            if self.stop.wait(0.02) or time.monotonic() - t0 > SETTLE_S:
                return False
        return True

    def n_members(self) -> int:
        """Workers live or on their way (a join asked for and not arrived yet; a killed one restarting)."""
        return len(self.lc.worker_spec)

    def choose(self, n_live: int, n_members: int | None = None) -> str | None:
        """The next kind, round robin over the kinds in a shuffled order per round (so a few events cover
        every kind: a kind not allowed now stays in its round, and an allowed one fills in). Not allowed:
        a join at ``high`` workers live or on their way (``n_members``, default ``n_live``), a retirement
        or kill at ``low`` live or on their way; None when no kind is allowed (joins on their way, too
        few live yet)."""
        members = n_live if n_members is None else n_members
        ok = [k for k in self.kinds if not (k == "join" and members >= self.high)
              and not (k in ("retire", "kill") and min(n_live, members) <= self.low)]
        if not ok:  # (joins on their way and too few live: wait for them)
            return None
        if not self._round:
            self._round = self.rng.sample(self.kinds, len(self.kinds))
        kind = next((k for k in self._round if k in ok), None)
        if kind is None:  # the round's kinds are not allowed now: another in between, the round keeps them
            return self.rng.choice(ok)
        self._round.remove(kind)
        return kind

    def working(self) -> int:
        """Workers of the cluster that work: not those Dask is retiring (``closing_gracefully`` and after).
        dscar holds a retirement until the worker has handed off at a clock boundary, and lets Dask's
        retirement go on only then: from that moment it works no more, though the scheduler keeps it
        until its process has closed (some 0.02-0.05 s here), time the references would credit it."""
        return sum(ws.status not in STOPPING for ws in list(self.lc.scheduler.workers.values()))

    #: seconds between live-count samples
    SAMPLE_S = 0.05

    def sample(self) -> None:
        while not self.stop.wait(self.SAMPLE_S):
            self.live.append((time.time(), self.working()))

    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # noqa: BLE001 - reported, the fit goes on
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.done_at = self.clock

    def _run(self) -> None:
        self._wait_clock(2)
        while len(self.events) < self.n_events:
            if self.stop.is_set():
                return
            self._wait_clock(self.clock + self.rng.randint(2, 4))
            before = self.workers()
            kind = self.choose(len(before), self.n_members())
            while kind is None and not self.stop.is_set():  # a join on its way: its arrival, then a clock
                self._wait_clock(self.clock + 1)
                before = self.workers()
                kind = self.choose(len(before), self.n_members())
            if kind is None:
                return
            if self.event_at != "boundary":
                ends = self.clock_ends
                if self.stop.wait(event_delay(self.event_at, self.delay_rng, ends[-1] - ends[0] if len(ends) > 1 else 0.0)):
                    return
                before = self.workers()  # (a join on its way may have arrived: live counts only grow meanwhile)
            rec: dict[str, Any] = {"kind": kind, "clock": self.clock, "at": time.time(), "workers_before": len(before)}
            t0 = time.monotonic()
            {"join": self.join, "retire": self.retire, "kill": self.kill}[kind](rec, before)
            rec["settle_s"] = round(time.monotonic() - t0, 3)
            self.events.append(rec)

    def join(self, rec: dict[str, Any], before: list[str]) -> None:
        """A worker process more: not waited for (clocks run while it starts; it joins when up)."""
        # a spec of a name never used (scale() may reuse a retired worker's name, not yet forgotten)
        self.lc.worker_spec[f"joined-{len(self.events)}"] = copy.deepcopy(self.lc.new_spec)
        self.lc.scale(len(self.lc.worker_spec))
        rec["settled"] = True

    def retire(self, rec: dict[str, Any], before: list[str]) -> None:
        """``retire_workers`` of a random worker (held until the clock boundary, then handed off); settled once gone."""
        w = self.rng.choice(before)
        rec["worker"] = w
        name = self.lc.scheduler.workers[w].name
        self.client.retire_workers(workers=[w])
        rec["settled"] = self._wait_until(lambda: w not in self.lc.scheduler.workers)
        self.lc.worker_spec.pop(name, None)  # or the next scale() would start it again

    def kill(self, rec: dict[str, Any], before: list[str]) -> None:
        """SIGKILL of a random worker process; settled once the Nanny's new process has joined."""
        pids = self.client.run(os.getpid)
        w = self.rng.choice(sorted(pids))
        rec["worker"] = w
        os.kill(pids[w], signal.SIGKILL)
        rec["settled"] = self._wait_until(lambda: w not in self.lc.scheduler.workers
                                          and len(self.lc.scheduler.workers) >= len(before))


class HollowChurnDriver(ChurnDriver):
    """``ChurnDriver`` on hollow workers (``bench.hollow.HollowCluster``: the scheduler in a process of its own,
    many workers to a process): a join lets a process of one worker join, one standing by, imported, since the
    cluster started (``HollowCluster.stand_by``; a fresh interpreter once they are used up), and waits for it;
    a retirement retires any worker, one of a shared process too (its ``Worker``
    closes, the others stay); a kill SIGKILLs a one-worker process (nothing restarts it: joins keep the count),
    and where none is left the event is a retirement. The scheduler is asked for the workers (``worker_statuses``)."""

    SAMPLE_S = 0.1  # (each sample is a message to the scheduler)

    def __init__(self, hc, kinds: list[str], events: int, workers: int, seed: int, event_at: str = "boundary"):
        super().__init__(None, hc.client, kinds, events, workers, seed, event_at)
        self.hc = hc

    def _statuses(self) -> dict[str, str]:
        from bench.hollow import worker_statuses

        return self.client.run_on_scheduler(worker_statuses)

    def workers(self) -> list[str]:
        return sorted(self._statuses())

    def n_members(self) -> int:
        return len(self._statuses())  # (a join is waited for: none is on its way)

    def working(self) -> int:
        return sum(st not in STOPPING_NAMES for st in self._statuses().values())

    def choose(self, n_live: int, n_members: int | None = None) -> str | None:
        kind = super().choose(n_live, n_members)
        return "retire" if kind == "kill" and not self.hc.solos else kind

    def join(self, rec: dict[str, Any], before: list[str]) -> None:
        rec["worker"] = self.hc.add_solos(1)[0]
        rec["settled"] = True

    def retire(self, rec: dict[str, Any], before: list[str]) -> None:
        rec["worker"] = w = self.rng.choice(before)
        rec["settled"] = self.hc.retire(w, SETTLE_S)

    def kill(self, rec: dict[str, Any], before: list[str]) -> None:
        name = self.rng.choice(sorted(self.hc.solos))
        w = self.hc.solos.pop(name)
        rec["worker"] = w
        proc = self.hc.processes.pop(name)
        proc.kill()
        proc.wait(10)
        rec["settled"] = self._wait_until(lambda: w not in self._statuses())


def audit(res, clocks: int) -> dict[str, int]:
    """The exactly-once figures over every clock that ran its clock end, plus the final parameters."""
    out = {k: 0 for k in CHECK_KEYS}
    checked = 0
    for rec in res.history:
        if rec.skipped:
            continue
        checked += 1
        for k in CHECK_KEYS:
            out[k] += int(rec.metrics[k])
    last = res.history[-1]
    restored = any(e["kind"] == "model-restored" for e in res.events)
    out["final"] = check_final(res.params["seen"], last.clock, not last.skipped and not restored)
    out["checked_clocks"] = checked
    out["lost"], out["applied_twice"] = out["missing"], out["duplicated"]
    out["violations"] = sum(out[k] for k in CHECK_KEYS) + out["final"]
    return out


def checkpoint_config(tmp: str) -> dscar.CheckpointConfig:
    return dscar.CheckpointConfig(os.path.join(tmp, "ckpt"), policy="full", every=2, recovery="partial", memory=True)


def churn_clocks(events: int) -> int:
    """The churn fit's ``max_clocks``: room for ``events`` events (2-4 clocks apart, plus settling: a process
    start) and the tail. It is also the model's width (``ExactlyOnce``: a column of ``seen`` and ``bad`` per
    clock), which the references share."""
    return events * 15 + 20


def churn_fit(args, tmp: str, t0: float) -> dict[str, Any]:
    from distributed import LocalCluster

    kinds = args.kinds.split(",")
    clocks = churn_clocks(args.events)
    algo = Churned(clocks, work_s(args.shards), args.parts)
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        cl = dscar.connect(lc)
        cl.client.wait_for_workers(args.workers)
        algo.coordinator = coordinator_of(lc)
        driver = ChurnDriver(lc, cl.client, kinds, args.events, args.workers, args.seed, args.event_at)
        log(t0, f"churn fit: {args.events} events of {kinds} on {args.workers} workers, {args.shards} shards, "
                f"events at the clock's {args.event_at}")
        return driven_fit(algo, driver, lambda: dscar.fit(
            algo, {"x": np.arange(float(args.shards))}, cl, n_shards=args.shards, max_clocks=clocks,
            checkpoint=checkpoint_config(tmp), progress=False), t0)


def driven_fit(algo: Churned, driver: ChurnDriver, fit, t0: float) -> dict[str, Any]:
    """``fit()`` with ``driver``'s threads beside it (its events, its live-count samples), stopped after it;
    the churn's record (what ``summarize`` takes)."""
    algo.driver = driver
    threads = [threading.Thread(target=driver.run, daemon=True), threading.Thread(target=driver.sample, daemon=True)]
    for t in threads:
        t.start()
    t1 = time.time()
    try:
        res = fit()
    except Exception:
        log(t0, "the churn fit failed after these events: " + "; ".join(
            f"{e['kind']} {e.get('worker', '')} at clock {e['clock']} ({e['workers_before']} before)"
            for e in driver.events) + f"; live now {driver.workers()}")
        raise
    finally:
        driver.stop.set()
        with driver.changed:
            driver.changed.notify_all()
    t2 = time.time()
    for t in threads:
        t.join(SETTLE_S)
    return {"res": res, "driver": driver, "start": t1, "end": t2, "ticks": algo.ticks, "layouts": algo.layouts,
            "copies": algo.copies}


def hollow_fit(hc, algo: Churned, n_shards: int, clocks: int, tmp: str) -> Any:
    """A fit of ``algo`` on the hollow workers, with the churn fit's checkpoints."""
    return dscar.fit(algo, {"x": np.arange(float(n_shards))}, hc.cluster, n_shards=n_shards, max_clocks=clocks,
                     checkpoint=checkpoint_config(tmp), progress=False)


def hollow_reference(hc, n_shards: int, step_s: float, clocks: int, columns: int, n_parts: int | None,
                     tmp: str) -> dict[str, Any]:
    """``reference_fit`` on the hollow workers there are now."""
    algo = Churned(columns, step_s, n_parts)
    return reference_record(algo, hollow_fit(hc, algo, n_shards, clocks, tmp), len(hc.worker_names()))


def hollow_churn(args, tmp: str, t0: float) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """The churn on ``args.hollow`` hollow workers (``bench.hollow``: steps that sleep ``HOLLOW_STEP_S``, the
    real plugins, many workers a process): failure-free references at W, W - 1 and W + 1 on the same
    cluster (a one-worker process retired, then two started), then the churn fit from W. The churn and the
    references."""
    from bench.hollow import HollowCluster

    w, n_shards = args.hollow, args.shards
    clocks, columns = (6 if args.quick else 12), churn_clocks(args.events)
    solo = 2 + max(1, args.events // 4)  # (kills take one each; joins bring more)
    kinds = args.kinds.split(",")
    with HollowCluster(w, max(2, min(8, w // 32)), solo=solo) as hc:
        hc.stand_by(2 + args.events // 2)  # (the joiners, up and imported: ``HollowCluster.stand_by``)
        hc.register()
        runs = []
        for step, n in (("as started", w), ("one retired", w - 1), ("two started", w + 1)):
            if step == "one retired":
                hc.retire(sorted(hc.solos.values())[0])
            elif step == "two started":
                hc.add_solos(2)
            log(t0, f"failure-free reference on {n} hollow workers")
            runs.append(hollow_reference(hc, n_shards, HOLLOW_STEP_S, clocks, columns, args.parts,
                                         os.path.join(tmp, f"ref{n}")))
        hc.retire(sorted(hc.solos.values())[0])
        algo = Churned(columns, HOLLOW_STEP_S, args.parts)
        driver = HollowChurnDriver(hc, kinds, args.events, w, args.seed, args.event_at)
        log(t0, f"churn fit: {args.events} events of {kinds} on {w} hollow workers, {n_shards} shards")
        churn = driven_fit(algo, driver, lambda: hollow_fit(hc, algo, n_shards, columns, os.path.join(tmp, "churn")), t0)
    return churn, merge_references(runs)


def clock_records(res) -> list[dict[str, Any]]:
    """Each clock of a fit as the JSON keeps it, to look again at where a clock's time went: its seconds,
    the coordinator's stages, the attempts' timings summed over the workers, and the shards each ran."""
    out = []
    for rec in res.history:
        timings: Counter = Counter()
        for t in rec.timings.values():
            timings.update(t)
        out.append({"clock": rec.clock, "seconds": rec.seconds, "skipped": rec.skipped, "stage_s": dict(rec.stage_s),
                    "timings": dict(timings), "shards_per_worker": dict(rec.shards_per_worker)})
    return out


def reference_fit(n_workers: int, clocks: int, tmp: str, n_shards: int = N_SHARDS,
                  columns: int | None = None, n_parts: int | None = None) -> dict[str, Any]:
    """A failure-free fit of ``clocks`` clocks on ``n_workers`` worker processes, ``n_shards`` shards: its
    clock rate (clocks 2.. over their seconds). ``columns``: the model's width, the churn fit's
    (``churn_clocks``; default ``clocks``): a shard's update and the clock end's check grow with it, and
    below ``apply_plan.INLINE_BYTES`` an update rides its commit, so a narrower reference is a faster
    model, not the same fit without churn. ``n_parts``: as the churn fit's (``--parts``)."""
    from distributed import LocalCluster

    algo = Churned(columns or clocks, work_s(n_shards), n_parts)
    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        cl = dscar.connect(lc)
        cl.client.wait_for_workers(n_workers)
        algo.coordinator = coordinator_of(lc)
        res = dscar.fit(algo, {"x": np.arange(float(n_shards))}, cl, n_shards=n_shards, max_clocks=clocks,
                        checkpoint=checkpoint_config(tmp), progress=False)
    return reference_record(algo, res, n_workers)


def reference_record(algo: Churned, res, n_workers: int) -> dict[str, Any]:
    """A failure-free fit's figures: its clock rate (clocks 2.. over their seconds), objective, last layout."""
    ticks = algo.ticks
    rate = (len(ticks) - 1) / (ticks[-1][0] - ticks[0][0])  # from the first clock's end: no set-up
    last = next((lay for lay in reversed(algo.layouts) if lay is not None), None)
    return {"workers": n_workers, "clocks": res.n_clocks, "columns": algo.clocks, "rate": rate,
            "objective": float(np.sum(res.params["seen"])),
            "per_clock_objective": float(np.sum(res.params["seen"])) / max(1, res.n_clocks), "layout": last,
            "clock_records": clock_records(res)}


def time_at_counts(live: list[tuple[float, int]], start: float, end: float) -> dict[int, float]:
    """Seconds spent at each live-worker count between ``start`` and ``end``, from ``(time, count)`` samples."""
    out: Counter = Counter()
    pts = [(t, n) for t, n in live if start <= t <= end]
    for (ta, na), (tb, _) in zip(pts, pts[1:]):
        out[na] += tb - ta
    return dict(out)


def dated_live(live: list[tuple[float, int]], fit_events: list[dict[str, Any]]) -> tuple[list[tuple[float, int]], int]:
    """The sampled live counts (``ChurnDriver.sample``, every 0.05 s) with each change dated by the fit's
    event that made it, when one lies between the two samples: a worker's arrival at the scheduler
    (``worker-joined``), a retirement's release after its hand-off (``handoff``: Dask begins to retire
    the worker then), a loss (``worker-lost``). A change dated by its sample lags it by half the interval
    on average, time the references would credit to the wrong count (a retirement's next clock then reads
    some 10 ms slower, a join's landing clock as much faster). Also how many changes were dated."""
    ups = sorted(e["time"] for e in fit_events if e["kind"] == "worker-joined")
    downs = sorted(e["time"] for e in fit_events if e["kind"] in ("handoff", "worker-lost"))
    out, dated = list(live[:1]), 0
    for (ta, na), (tb, nb) in zip(live, live[1:]):
        t = tb
        if nb != na:
            t = next((t for t in (ups if nb > na else downs) if ta < t <= tb), tb)
            dated += t != tb
        out.append((t, nb))
    return out, dated


def rate_at(n: int, rates: dict[int, float]) -> float:
    """The reference rate at ``n`` workers; the nearest count's (the larger on a tie) when none ran at ``n``."""
    return rates[n] if n in rates else rates[min(rates, key=lambda m: (abs(m - n), -m))]


def expected_rate(seconds_at: dict[int, float], rates: dict[int, float]) -> float:
    """The clock rate a failure-free fit would have had: each count's reference rate, weighted by time."""
    total = sum(seconds_at.values())
    return sum(rate_at(n, rates) * s for n, s in seconds_at.items()) / total


def merge_references(runs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The references at each worker count, measured before and after the churn fit (interleaved with
    it, so a change of the machine's load meanwhile shows): their mean rate, and their spread (the
    reference's own noise, as a fraction of the mean)."""
    out: dict[int, dict[str, Any]] = {}
    for n in sorted({r["workers"] for r in runs}):
        mine = [r for r in runs if r["workers"] == n]
        rates = [r["rate"] for r in mine]
        mean = statistics.mean(rates)
        out[n] = {**mine[0], "rate": mean, "rates": rates, "spread": (max(rates) - min(rates)) / mean,
                  "per_clock_objective": statistics.mean(r["per_clock_objective"] for r in mine),
                  "clock_records": [c for r in mine for c in r.get("clock_records", ())]}
    return out


def count_at(live: list[tuple[float, int]], t: float) -> int:
    """The live-worker count sampled last before ``t`` (the first sample's before any)."""
    n = live[0][1]
    for ts, c in live:
        if ts > t:
            break
        n = c
    return n


def rate_over(live: list[tuple[float, int]], start: float, end: float, rates: dict[int, float]) -> float:
    """The failure-free clock rate over ``[start, end)``: each live-worker count's reference rate weighted
    by the time spent at it (the count at ``start`` until the first sample inside, then the samples). A
    clock that begins as a retired worker leaves, or a joiner arrives, runs mostly at the new count:
    the count at its start alone would take the whole clock for the old one."""
    pts = [(start, count_at(live, start))] + [(t, n) for t, n in live if start < t < end] + [(end, 0)]
    seconds: Counter = Counter()
    for (ta, n), (tb, _) in zip(pts, pts[1:]):
        seconds[n] += tb - ta
    total = sum(seconds.values())
    if total <= 0:
        return rate_at(pts[0][1], rates)
    return sum(rate_at(n, rates) * s for n, s in seconds.items()) / total


def lost_by_event(ticks: list[tuple[float, int]], live: list[tuple[float, int]], events: list[dict[str, Any]],
                  rates: dict[int, float]) -> dict[str, dict[str, float]]:
    """Where the time goes: each clock's seconds beyond a failure-free clock at its worker counts
    (``1 / rate_over`` the clock), summed by the kind of the driver's latest event before
    the clock ended ("none": clocks before the first event, the reference's own noise), split into the
    clock the event lands in and the clocks after it until the next event."""
    out: dict[str, dict[str, float]] = {}
    at = sorted((e["at"], e["kind"]) for e in events)
    seen: set[float] = set()
    for (ta, _), (tb, _) in zip(ticks, ticks[1:]):
        excess = (tb - ta) - 1.0 / rate_over(live, ta, tb, rates)
        last = [(t, k) for t, k in at if t < tb]
        kind = last[-1][1] if last else "none"
        row = out.setdefault(kind, {"events": 0, "clocks": 0, "lost_s": 0.0, "lost_s_landing": 0.0})
        row["clocks"] += 1
        row["lost_s"] += excess
        if last and last[-1][0] not in seen:  # the clock this event lands in
            seen.add(last[-1][0])
            row["lost_s_landing"] += excess
    for kind, row in out.items():
        row["events"] = sum(e["kind"] == kind for e in events)
        row["lost_s_per_event"] = row["lost_s"] / row["events"] if row["events"] else None
        for k in ("lost_s", "lost_s_landing", "lost_s_per_event"):
            if row[k] is not None:
                row[k] = round(row[k], 3)
    return out


def join_phases(ticks: list[tuple[float, int]], live: list[tuple[float, int]], events: list[dict[str, Any]],
                fit_events: list[dict[str, Any]], rates: dict[int, float]) -> dict[str, dict[str, float]]:
    """The time lost after joins (as ``lost_by_event``) split by where the joiner was when the clock ended:
    "starting" (its process was starting: the scheduler did not have it yet, and the bench counts it
    only from then), "landing" (the clock it arrived in), "after" (later clocks, until the next event).
    A joiner arrives at the first ``worker-joined`` event of the fit after the driver asked for it."""
    at = sorted((e["at"], e["kind"]) for e in events)
    joined = sorted(e["time"] for e in fit_events if e["kind"] == "worker-joined")
    out = {k: {"clocks": 0, "lost_s": 0.0} for k in ("starting", "landing", "after")}
    for (ta, _), (tb, _) in zip(ticks, ticks[1:]):
        last = [t for t, _ in at if t < tb]
        if not last or dict(at)[last[-1]] != "join":
            continue
        arrival = next((t for t in joined if t > last[-1]), None)
        phase = "starting" if arrival is None or arrival >= tb else ("landing" if arrival > ta else "after")
        out[phase]["clocks"] += 1
        out[phase]["lost_s"] += (tb - ta) - 1.0 / rate_over(live, ta, tb, rates)
    for row in out.values():
        row["lost_s"] = round(row["lost_s"], 3)
    return out


#: ``lost_by_distance``'s clocks after an event: the one it lands in, the next (a retirement's hand-off or
#: a join's switch of partitions runs at the boundary that begins it), the later ones until the next event
DISTANCES = ("starting", "landing", "next", "later")


def lost_by_distance(ticks: list[tuple[float, int]], live: list[tuple[float, int]], events: list[dict[str, Any]],
                     fit_events: list[dict[str, Any]], rates: dict[int, float]) -> dict[str, dict[str, dict[str, Any]]]:
    """The time lost after each kind of event (as ``lost_by_event``) by how far the clock lies from it:
    "landing" the clock it lands in (a join's: the clock its worker arrives in, ``join_phases``'
    arrival; before that "starting"), "next" the clock after it, which begins with the boundary where
    a retirement hands off and a join's copied partitions switch owner, "later" the clocks after that
    until the next event. Each with its clocks, seconds lost and median seconds lost a clock: the
    clocks between events that ``layout_vs_reference`` finds "even" are "next" and "later" ones."""
    at = sorted((e["at"], e["kind"]) for e in events)
    joined = sorted(e["time"] for e in fit_events if e["kind"] == "worker-joined")
    ends = [t for t, _ in ticks]
    lost: dict[str, dict[str, list[float]]] = {}
    for (ta, _), (tb, _) in zip(ticks, ticks[1:]):
        last = [(t, k) for t, k in at if t < tb]
        if not last:
            continue
        t_event, kind = last[-1]
        start = next((t for t in joined if t > t_event), None) if kind == "join" else t_event
        if start is None or start >= tb:
            where = "starting"
        else:
            ends_between = sum(start < t <= ta for t in ends)
            where = DISTANCES[1 + min(ends_between, 2)]
        excess = (tb - ta) - 1.0 / rate_over(live, ta, tb, rates)
        lost.setdefault(kind, {}).setdefault(where, []).append(excess)
    return {kind: {where: {"clocks": len(v), "lost_s": round(sum(v), 3), "lost_s_median": round(statistics.median(v), 4)}
                   for where, v in sorted(rows.items(), key=lambda kv: DISTANCES.index(kv[0]))}
            for kind, rows in sorted(lost.items())}


def makespan(n_old: int, n_shards: int, step_s: float, joiner_at: float) -> float:
    """When the last of a clock's ``n_shards`` steps of ``step_s`` ends, handed out one at a time to the
    first free worker (``n_old`` workers free from 0, a joiner free from ``joiner_at``): the shortest a
    BSP clock of whole shards can be when a worker joins into it (no step is split, none starts twice)."""
    free = [0.0] * n_old + [max(0.0, joiner_at)]
    end = 0.0
    for _ in range(n_shards):
        i = min(range(len(free)), key=lambda k: (free[k], k))
        free[i] += step_s
        end = max(end, free[i])
    return end


def join_granularity(ticks: list[tuple[float, int]], live: list[tuple[float, int]], events: list[dict[str, Any]],
                     fit_events: list[dict[str, Any]], rates: dict[int, float], n_shards: int,
                     step_s: float) -> dict[str, Any]:
    """What whole shards let a join's landing clock (the clock its worker arrives in, as ``join_phases``)
    gain: the failure-free clock at the old count ``n`` is ``ceil(n_shards / n)`` rounds of ``step_s``
    plus the rest (``1 / rates[n]`` less the rounds: the engine's own part of a clock); with the joiner
    taking shards from its arrival (``worker-joined``: its warm-up, dscar's, counts against the engine)
    the rounds end at ``makespan``. The time
    charged against ``rate_over`` (the counts weighted by time, as if work were fluid) beyond that
    ideal is what no scheduler of whole shards could win back ("bound_s"); the clock's time beyond the
    ideal is the engine's (and the machine's) ("over_ideal_s")."""
    at = sorted((e["at"], e["kind"]) for e in events)
    joined = sorted(e["time"] for e in fit_events if e["kind"] == "worker-joined")
    rows = []
    for t_ask, kind in at:
        if kind != "join":
            continue
        arrival = next((t for t in joined if t > t_ask), None)
        clock = next(((ta, tb) for (ta, _), (tb, _) in zip(ticks, ticks[1:]) if ta < arrival <= tb), None) \
            if arrival is not None else None
        if clock is None:
            continue
        ta, tb = clock
        n = count_at(live, ta)
        rounds = -(-n_shards // n)
        rest = 1.0 / rate_at(n, rates) - rounds * step_s
        ideal = makespan(n, n_shards, step_s, arrival - ta) + rest
        fluid = 1.0 / rate_over(live, ta, tb, rates)
        rows.append({"took_s": tb - ta, "fluid_s": fluid, "ideal_s": ideal, "old_s": 1.0 / rate_at(n, rates)})
    out: dict[str, Any] = {"joins": len(rows)}
    for k, f in (("lost_s", lambda r: r["took_s"] - r["fluid_s"]), ("bound_s", lambda r: max(0.0, r["ideal_s"] - r["fluid_s"])),
                 ("over_ideal_s", lambda r: r["took_s"] - r["ideal_s"]), ("gain_vs_old_s", lambda r: r["old_s"] - r["took_s"])):
        total = sum(f(r) for r in rows)
        out[k] = round(total, 3)
        out[k + "_per_join"] = round(total / len(rows), 4) if rows else None
    return out


def losses_by_cause(fit_events: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    """Each ``worker-lost`` of the fit by what the driver did to that worker: "kill" (it SIGKILLed it),
    "retire" (a retirement that went the loss's way), "other" (the driver did nothing to it: dscar
    removed it, ``worker-removed``'s reason, or its process died); workers lost twice; kills with no loss."""
    killed = {e["worker"] for e in events if e["kind"] == "kill"}
    retired = {e["worker"] for e in events if e["kind"] == "retire"}
    kills_at = sorted(e["at"] for e in events if e["kind"] == "kill" and "at" in e)
    removed = {e["worker"]: e.get("reason") for e in fit_events if e["kind"] == "worker-removed"}
    joined = {e["worker"]: e for e in fit_events if e["kind"] == "worker-joined"}
    lost = [e for e in fit_events if e["kind"] == "worker-lost"]
    times = Counter(e["worker"] for e in lost)
    by_cause: Counter = Counter()
    untraced = []
    for e in lost:
        cause = "kill" if e["worker"] in killed else "retire" if e["worker"] in retired else "other"
        by_cause[cause] += 1
        if cause != "kill":
            came = joined.get(e["worker"])
            before = [t for t in kills_at if "time" in e and t < e["time"]]
            untraced.append({"worker": e["worker"], "clock": e.get("clock"), "cause": cause,
                             "removed": removed.get(e["worker"]),
                             # a worker that joined mid-fit (a join, or a killed worker's restart), and when
                             "joined_clock": came.get("clock") if came else None,
                             "joined_s_before_loss": round(e["time"] - came["time"], 3) if came and "time" in e else None,
                             "s_since_last_kill": round(e["time"] - before[-1], 3) if before else None})
    return {"by_cause": dict(by_cause), "lost_twice": sorted(w for w, n in times.items() if n > 1),
            "kills_without_loss": len(killed - set(times)), "removed_by_dscar": len(removed), "untraced": untraced}


def layout_vs_reference(ticks: list[tuple[float, int]], live: list[tuple[float, int]],
                        layouts: list[dict[str, Any] | None], ref_layouts: dict[int, dict[str, Any] | None],
                        rates: dict[int, float], events: list[dict[str, Any]]) -> dict[str, Any]:
    """The layout at each clock's end against the reference's at the same live count (largest rows one
    worker owns, largest shards one holds), and the mean excess seconds of clocks whose top owner
    holds more rows than the reference's ("above") or not ("even"), leaving out the clocks an event
    lands in (``layouts``: ``layout_of`` at each tick, as ``ticks``)."""
    at = sorted(e["at"] for e in events)
    per_count: dict[int, dict[str, Any]] = {}
    excess: dict[str, list[float]] = {"above": [], "even": []}
    for i, ((ta, _), (tb, _)) in enumerate(zip(ticks, ticks[1:])):
        lay = layouts[i + 1] if i + 1 < len(layouts) else None
        ref = ref_layouts.get(lay["live"]) if lay else None
        if lay is None or ref is None or lay["owners"] != lay["live"]:  # (a joiner not owning yet: not a layout)
            continue
        row = per_count.setdefault(lay["live"], {"clocks": 0, "max_rows": 0.0, "max_shards": 0.0, "above": 0,
                                                 "reference_max_rows": ref["max_rows"],
                                                 "reference_max_shards": ref["max_shards"]})
        row["clocks"] += 1
        row["max_rows"] += lay["max_rows"]
        row["max_shards"] += lay["max_shards"]
        above = lay["max_rows"] > ref["max_rows"]
        row["above"] += above
        if not any(ta < t < tb for t in at):
            excess["above" if above else "even"].append((tb - ta) - 1.0 / rate_over(live, ta, tb, rates))
    for row in per_count.values():
        row["max_rows"] = round(row["max_rows"] / row["clocks"], 2)
        row["max_shards"] = round(row["max_shards"] / row["clocks"], 2)
    return {"per_count": dict(sorted(per_count.items())),
            "excess_s_per_clock": {k: (round(statistics.mean(v), 4) if v else None) for k, v in excess.items()},
            "clocks": {k: len(v) for k, v in excess.items()}}


def join_clocks(fit_events: list[dict[str, Any]]) -> list[int]:
    """For each worker that took partitions after joining, the clocks from its joining to its first owning
    some (the clocks its warm-up and background copy ran beside); later switches (the partitions evened
    out after a hand-off or another join) are not a join's."""
    joined = {}
    out = []
    for e in fit_events:
        if e["kind"] == "worker-joined":
            joined[e["worker"]] = e.get("clock") or 0
        elif e["kind"] == "partitions-taken-on":
            out += [(e.get("clock") or 0) - joined.pop(w) for w in e["workers"] if w in joined]
    return out


def rework(res) -> dict[str, int]:
    """Clocks cut short by a loss (run again) and clocks rolled back by a full recovery."""
    skipped = sum(rec.skipped for rec in res.history)
    rolled = 0
    for e in res.events:
        if e["kind"] == "rollback" and e.get("clock") is not None:
            rolled += max(0, int(e["clock"]) - int(e["to_clock"]))
    return {"skipped_clocks": skipped, "rolled_back_clocks": rolled}


def memory_copies(coordinator, client) -> dict[str, Any] | None:
    """The memory tier's copies the workers keep for the running job against the keys the coordinator
    records a copy of (one copy each once the reports of the last clock's copies are in; a worker that
    kept every copy it ever got would hold one per ring it sat in and per switch it gave up); None
    without a job or a memory tier."""
    job = next(iter(list(coordinator.jobs.values())), None)
    if job is None or job.cfg.checkpoint is None or not job.cfg.checkpoint.memory:
        return None
    held = client.run(copies_held)
    per_worker = {w: h.get(job.cfg.job_id, 0) for w, h in held.items()}
    return {"held": sum(per_worker.values()), "recorded": len(job.mirrors) + len(job.state_mirrors),
            "max_per_worker": max(per_worker.values(), default=0), "workers": len(per_worker)}


def summarize(churn: dict[str, Any], refs: dict[int, dict[str, Any]], n_shards: int = N_SHARDS,
              step_s: float | None = None) -> dict[str, Any]:
    """The figures of the module docstring. ``step_s``: a shard step's seconds (default ``work_s(n_shards)``)."""
    step_s = work_s(n_shards) if step_s is None else step_s
    res, driver = churn["res"], churn["driver"]
    ticks = churn["ticks"]
    live, dated = dated_live(driver.live, res.events)
    changes = sum(a[1] != b[1] for a, b in zip(driver.live, driver.live[1:]))
    useful = sum(not rec.skipped for rec in res.history[1:])  # from the first clock's end, as the references
    span = ticks[-1][0] - ticks[0][0]
    seconds_at = time_at_counts(live, ticks[0][0], ticks[-1][0])
    rate = useful / span
    expected = expected_rate(seconds_at, {n: r["rate"] for n, r in refs.items()})
    ev = Counter(e["kind"] for e in res.events)
    handoffs = [e for e in res.events if e["kind"] == "handoff"]
    rw = rework(res)
    n_events = len(driver.events)
    mean_workers = sum(n * s for n, s in seconds_at.items()) / max(1e-9, sum(seconds_at.values()))
    final = float(np.sum(res.params["seen"]))
    ref_per_clock = statistics.mean(r["per_clock_objective"] for r in refs.values())
    return {
        "events": n_events, "event_kinds": dict(Counter(e["kind"] for e in driver.events)),
        "shards": n_shards, "step_s": round(step_s, 5),
        "unsettled_events": sum(not e["settled"] for e in driver.events), "driver_error": driver.error,
        "clocks": res.n_clocks, "useful_clocks": useful + 1, "fit_s": round(churn["end"] - churn["start"], 2),
        "mean_workers": round(mean_workers, 3), "seconds_at_workers": {n: round(s, 2) for n, s in sorted(seconds_at.items())},
        "live_changes": changes, "live_changes_dated": dated,
        "clock_rate": round(rate, 3), "expected_rate": round(expected, 3), "goodput": round(rate / expected, 4),
        "handoffs": len(handoffs), "handoff_s": [e["seconds"] for e in handoffs],
        "handoff_s_mean": round(statistics.mean(e["seconds"] for e in handoffs), 4) if handoffs else None,
        "handoff_s_max": max((e["seconds"] for e in handoffs), default=None),
        "handoff_failed_copies": sum(e.get("failed", 0) for e in handoffs),
        # shards moved to their rows' owner: handed off by leavers, and stayers' that followed their rows
        "shards_handed_off": sum(e.get("shards", 0) for e in handoffs),
        "shards_followed": sum(e.get("followed", 0) for e in handoffs)
        + sum(e.get("shards_followed", 0) for e in res.events if e["kind"] == "partitions-taken-on"),
        **rw, "rework_per_event": round((rw["skipped_clocks"] + rw["rolled_back_clocks"]) / max(1, n_events), 3),
        "losses": ev["worker-lost"], "left": ev["worker-left"], "joined": ev["worker-joined"],
        "recoveries": ev["recovery-started"], "partitions_taken_on": ev["partitions-taken-on"],
        "audit": audit(res, res.n_clocks),
        "memory_copies": churn.get("copies"),
        # seen's sum: one per shard per clock applied; the reference's per clock times this fit's clocks
        "final_objective": final, "reference_objective": ref_per_clock * res.n_clocks,
        "fit_events": dict(ev),
        # who came and went, in order: the untraced losses' stories
        "membership_events": [{k: e[k] for k in ("time", "clock", "kind", "worker", "reason") if k in e}
                              for e in res.events if e["kind"] in ("worker-joined", "worker-ready", "worker-lost",
                                                                   "worker-left", "worker-removed")],
        "lost_by_event": lost_by_event(ticks, live, driver.events, {n: r["rate"] for n, r in refs.items()}),
        "join_phases": join_phases(ticks, live, driver.events, res.events, {n: r["rate"] for n, r in refs.items()}),
        "lost_by_distance": lost_by_distance(ticks, live, driver.events, res.events,
                                             {n: r["rate"] for n, r in refs.items()}),
        "join_granularity": join_granularity(ticks, live, driver.events, res.events,
                                             {n: r["rate"] for n, r in refs.items()}, n_shards, step_s),
        "losses_by_cause": losses_by_cause(res.events, driver.events),
        "layout": layout_vs_reference(ticks, live, churn.get("layouts", []),
                                      {n: r.get("layout") for n, r in refs.items()},
                                      {n: r["rate"] for n, r in refs.items()}, driver.events),
        "reference_spread": {n: round(r["spread"], 4) for n, r in refs.items()},
        "partitions_moved_to_joiners": sum(e.get("partitions", 0) for e in res.events if e["kind"] == "partitions-taken-on"),
        "join_to_owning_clocks": join_clocks(res.events),
        "joiner_warm_up_s_mean": round(statistics.mean(e["seconds"] for e in res.events if e["kind"] == "worker-ready"), 3)
        if any(e["kind"] == "worker-ready" for e in res.events) else None,
    }


def format_table(s: dict[str, Any], refs: dict[int, dict[str, Any]]) -> str:
    a = s["audit"]
    rows = [
        ("events (driver)", f"{s['events']} {s['event_kinds']}, unsettled {s['unsettled_events']}"),
        ("shards", f"{s['shards']} of {s['step_s']} s a step"),
        ("clocks / useful", f"{s['clocks']} / {s['useful_clocks']}"),
        ("mean live workers", f"{s['mean_workers']} (seconds at each: {s['seconds_at_workers']}; "
                              f"{s['live_changes_dated']} of {s['live_changes']} changes dated by their events)"),
        ("clock rate", f"{s['clock_rate']} /s; failure-free at the same workers {s['expected_rate']} /s"),
        ("goodput", f"{100 * s['goodput']:.1f} %"),
        ("hand-offs", f"{s['handoffs']}, mean {s['handoff_s_mean']} s, max {s['handoff_s_max']} s, "
                      f"failed copies {s['handoff_failed_copies']}; shards handed off {s['shards_handed_off']}, "
                      f"shards that followed their rows {s['shards_followed']}"),
        ("rework", f"{s['skipped_clocks']} clocks cut short + {s['rolled_back_clocks']} rolled back = "
                   f"{s['rework_per_event']} per event"),
        ("losses / left / joined", f"{s['losses']} / {s['left']} / {s['joined']} (recoveries {s['recoveries']}, "
                                   f"partitions-taken-on {s['partitions_taken_on']})"),
        ("exactly-once audit", f"lost {a['lost']}, applied twice {a['applied_twice']}, all breaches {a['violations']} "
                               f"over {a['checked_clocks']} checked clocks"),
        ("final objective", f"{s['final_objective']:g} (failure-free {s['reference_objective']:g})"),
        ("memory copies at end", "not read (hollow workers: the scheduler runs in a process of its own)"
         if not (m := s.get("memory_copies")) else
         f"{m['held']} held by {m['workers']} workers (at most {m['max_per_worker']} on one) for {m['recorded']} "
         f"partitions and shard states recorded"),
        ("references", ", ".join(f"{n} workers {r['rate']:.3f} clocks/s (before/after {r['rates'][0]:.3f}/"
                                 f"{r['rates'][-1]:.3f})" for n, r in sorted(refs.items()))),
        ("joins", f"warm-up mean {s['joiner_warm_up_s_mean']} s, partitions switched (joins, evening out) "
                  f"{s['partitions_moved_to_joiners']}, clocks from joining to owning them "
                  f"{sorted(s['join_to_owning_clocks'])}"),
    ]
    for kind, row in sorted(s["lost_by_event"].items()):
        rows.append((f"time lost after {kind}", f"{row['lost_s']} s over {row['clocks']} clocks "
                                               f"({row['lost_s_landing']} s in the clocks they land in; "
                                               f"{row['lost_s_per_event']} s per event)"))
    rows.append(("  after joins, by phase", "; ".join(f"{k} {v['lost_s']} s over {v['clocks']} clocks"
                                                      for k, v in s["join_phases"].items())))
    for kind, rows_ in s["lost_by_distance"].items():
        rows.append((f"  after {kind}, by clock", "; ".join(
            f"{where} {v['lost_s']} s over {v['clocks']} ({v['lost_s_median']} s median)" for where, v in rows_.items())))
    g = s["join_granularity"]
    rows.append(("  joins' landing clocks", f"{g['joins']}: lost {g['lost_s_per_join']} s a join against the "
                                            f"time-weighted rate; whole shards bound it at {g['bound_s_per_join']} s "
                                            f"(no scheduler wins it back), over that ideal {g['over_ideal_s_per_join']} s; "
                                            f"faster than a clock at the old count by {g['gain_vs_old_s_per_join']} s"))
    c = s["losses_by_cause"]
    rows.append(("losses by cause", f"{c['by_cause']}, lost twice {c['lost_twice']}, kills with no loss "
                                    f"{c['kills_without_loss']}, removed by dscar {c['removed_by_dscar']}; "
                                    f"untraced {c['untraced']}"))
    lay = s["layout"]
    rows.append(("layout vs reference", "not read (hollow workers)" if not lay["per_count"] else "; ".join(
        f"{n} workers: top owner {r['max_rows']} rows (reference {r['reference_max_rows']}), above it in {r['above']} "
        f"of {r['clocks']} clocks, top holder {r['max_shards']} shards (reference {r['reference_max_shards']})"
        for n, r in lay["per_count"].items())))
    rows.append(("  excess s per clock", f"top owner above the reference {lay['excess_s_per_clock']['above']} "
                                         f"({lay['clocks']['above']} clocks), even {lay['excess_s_per_clock']['even']} "
                                         f"({lay['clocks']['even']} clocks; no event in them)"))
    return "\n".join(f"{k:<24}{v}" for k, v in rows)


def plot(path: str, churn: dict[str, Any]) -> None:
    plt = pyplot()
    driver, ticks = churn["driver"], churn["ticks"]
    t0 = churn["start"]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    lt = [t - t0 for t, _ in driver.live]
    ax1.step(lt, [n for _, n in driver.live], where="post", color="k")
    colors = {"join": "tab:green", "retire": "tab:blue", "kill": "tab:red"}
    for e in driver.events:
        ax1.axvline(e["at"] - t0, color=colors[e["kind"]], alpha=0.4, lw=1)
    ax1.set_ylabel("live workers")
    ax1.set_title("membership churn (lines: join green, retire blue, kill red)")
    tt = np.array([t - t0 for t, _ in ticks])
    if len(tt) > 1:
        ax2.plot(tt[1:], 1.0 / np.maximum(np.diff(tt), 1e-6), ".-", ms=3)
    ax2.set_ylabel("clock rate (1/s)")
    ax2.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    print(f"plot: {path}")


# ------------------------------------------------------------------ the pull-bound join (--pull-bound)
#: the pull-bound model's table: large (pulled by row ranges, not whole: over ``SMALL_TABLE_BYTES``),
#: seconds an owner takes per row it serves, one pull at a time (an asyncio sleep under a lock in the
#: owner's pull handler, ``SlowServing``): on 2 shared cores serving CPU does not grow with owners, a
#: sleep floor does, as a real owner's network and memory bandwidth would
SERVE_S_PER_ROW = 150e-6
#: clocks on 2 workers before the join, and after the joiner owns partitions
PB_BEFORE, PB_AFTER = 6, 8


def pull_phases(ticks: list[tuple[float, int, int, int]],
                served: dict[str, list[tuple[float, int]]]) -> dict[str, dict[str, Any]]:
    """Per phase of the fit, the clocks' seconds and the pull load. ``ticks``: ``(time, clocks, workers,
    owners)`` at each clock's end (a clock is in the phase of the state at its end: partitions switch
    owner as a clock begins, so the owners read at its end are those it ran with); phases: "before"
    (2 workers), "joined" (a joiner is in, owning nothing yet), "owning" (it owns partitions). A
    phase's first clock is left out (a worker arriving lands in it). ``served``: worker -> ``(time,
    rows)`` of each pull it served; the load is rows served per clock by each worker."""
    clocks: dict[str, list[tuple[float, float]]] = {}
    for (ta, _, _, _), (tb, _, workers, owners) in zip(ticks, ticks[1:]):
        phase = "before" if workers <= 2 else ("joined" if owners <= 2 else "owning")
        clocks.setdefault(phase, []).append((ta, tb))
    out: dict[str, dict[str, Any]] = {}
    for phase, spans in clocks.items():
        spans = spans[1:] or spans
        secs = [tb - ta for ta, tb in spans]
        load = {w: sum(r for t, r in rows if any(ta <= t < tb for ta, tb in spans)) / len(spans)
                for w, rows in served.items()}
        load = {w: round(v, 1) for w, v in sorted(load.items()) if v > 0}
        out[phase] = {"clocks": len(spans), "clock_s_median": round(statistics.median(secs), 3),
                      "clock_s_mean": round(statistics.mean(secs), 3), "rows_served_per_clock": load,
                      "max_owner_rows_per_clock": max(load.values(), default=0.0),
                      "rows_served_per_clock_total": round(sum(load.values()), 1)}
    return out


def arrival_to_owning(ticks: list[tuple[float, int, int, int]]) -> int | None:
    """Clocks from the first clock end at which the scheduler had the third worker to the first at which
    it owned partitions (``ticks`` as for ``pull_phases``); None if either never came."""
    arrived = next((n for _, n, workers, _ in ticks if workers > 2), None)
    owning = next((n for _, n, _, owners in ticks if owners > 2), None)
    return None if arrived is None or owning is None else owning - arrived


def pull_bound(args, t0: float) -> dict[str, Any]:
    """2 workers run ``PullBound``; after ``PB_BEFORE`` clocks a third joins; the fit stops ``PB_AFTER``
    clocks after the joiner owns partitions (or at ``max_clocks``)."""
    from distributed import LocalCluster

    algo = PullBound()
    ticks: list[tuple[float, int, int, int]] = []
    owning_since: list[int] = []
    max_clocks = PB_BEFORE + PB_AFTER + 40  # room for the joiner's process start and warm-up
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        cl = dscar.connect(lc)
        cl.client.wait_for_workers(2)
        cl.client.register_plugin(SlowServing(SERVE_S_PER_ROW))
        coordinator = coordinator_of(lc)

        def hook(n: int) -> bool:
            job = next(iter(coordinator.jobs.values()), None)
            owners = len(set(job.pmap.owners.values())) if job is not None else 0
            ticks.append((time.time(), n, len(lc.scheduler.workers), owners))
            if n == PB_BEFORE:
                log(t0, f"clock {n}: a third worker joins")
                lc.scale(3)
            if owners >= 3 and not owning_since:
                owning_since.append(n)
                log(t0, f"clock {n}: the joiner owns partitions")
            return bool(owning_since) and n >= owning_since[0] + PB_AFTER

        algo.hook = hook
        log(t0, f"pull-bound fit: {PB_ROWS} x {PB_COLS} rows in {PB_PARTS} partitions, {PB_SHARDS} shards, "
                f"{SERVE_S_PER_ROW * 1e6:g} us per row served")
        res = dscar.fit(algo, {"x": np.arange(float(PB_SHARDS))}, cl, n_shards=PB_SHARDS, max_clocks=max_clocks,
                        progress=False)
        served = cl.client.run(lambda dask_worker: getattr(dask_worker, "dscar_bench_served", []))
    taken = [e for e in res.events if e["kind"] == "partitions-taken-on"]
    return {"phases": pull_phases(ticks, served), "clocks": res.n_clocks,
            "arrival_to_owning_clocks": arrival_to_owning(ticks), "partitions_taken_on": [e["partitions"] for e in taken],
            "rows_resent": [e.get("rows_resent") for e in taken], "serve_s_per_row": SERVE_S_PER_ROW,
            "losses": sum(e["kind"] == "worker-lost" for e in res.events)}


def format_pull_bound(r: dict[str, Any]) -> str:
    rows = [("clocks", f"{r['clocks']}; the joiner owned partitions {r['arrival_to_owning_clocks']} clocks after it "
                       f"arrived "
                       f"(partitions moved {r['partitions_taken_on']}, rows re-sent {r['rows_resent']}); "
                       f"losses {r['losses']}")]
    for phase in ("before", "joined", "owning"):
        p = r["phases"].get(phase)
        if p is None:
            rows.append((phase, "no clock"))
            continue
        rows.append((phase, f"{p['clocks']} clocks, {p['clock_s_median']} s per clock (median; mean "
                            f"{p['clock_s_mean']}), rows served per clock by each worker "
                            f"{list(p['rows_served_per_clock'].values())} (max {p['max_owner_rows_per_clock']}, "
                            f"total {p['rows_served_per_clock_total']})"))
    return "\n".join(f"{k:<10}{v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.elastic", description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=None, help="membership events (default 100; 4 with --quick)")
    ap.add_argument("--kinds", default="join,retire,kill", help="comma-separated event kinds: join, retire, kill")
    ap.add_argument("--workers", type=int, default=3, help="live workers at the start (kept within +-1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=None,
                    help=f"shards of the fits (default {N_SHARDS}; with --hollow, {HOLLOW_SHARDS_PER_WORKER} a worker); a "
                         f"clock's step work stays {STEP_WORK_S:g} s, cut finer (with --hollow each step sleeps {HOLLOW_STEP_S:g} s)")
    ap.add_argument("--parts", type=int, default=None,
                    help="partitions of the model's tables of the shards' rows (default: dscar's, one a worker at the "
                         "start); a count that 2, 3 and 4 divide (12) lets every worker count own an even, aligned share")
    ap.add_argument("--event-at", choices=EVENT_AT, default="boundary",
                    help="where in a clock events come: right after a clock's end (default, the first timing), "
                         "or at a uniform point of it (random)")
    ap.add_argument("--quick", action="store_true", help="a few events (< 2 min)")
    ap.add_argument("--start-method", choices=("forkserver", "spawn"), default="forkserver",
                    help="how worker processes start (default forkserver, as dscar's embedded cluster; spawn: Dask's default)")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--plot", metavar="PATH", default="elastic.png")
    ap.add_argument("--hollow", type=int, metavar="W", default=None,
                    help="instead of worker processes: W hollow workers (bench.hollow: the real plugins, steps that "
                         f"sleep {HOLLOW_STEP_S:g} s, many workers a process), {HOLLOW_SHARDS_PER_WORKER} shards a worker "
                         "unless --shards; references on the same cluster at W - 1, W and W + 1")
    ap.add_argument("--pull-bound", action="store_true",
                    help="instead: a model whose pulls dominate on 2 workers, a third joining mid-fit "
                         "(time per clock and rows served per owner before the join, after it, and once it owns partitions)")
    args = ap.parse_args(argv)
    warn_busy()
    if args.hollow is not None:
        if args.hollow < 4:
            ap.error("--hollow must be at least 4 workers")
        args.workers = args.hollow
    if args.shards is None:
        args.shards = N_SHARDS if args.hollow is None else HOLLOW_SHARDS_PER_WORKER * args.hollow
    bad = [k for k in args.kinds.split(",") if k not in KINDS]
    if args.shards < args.workers + 1:
        ap.error(f"--shards must be at least --workers + 1 ({args.workers + 1}): one shard a worker at the most live")
    if args.parts is not None and not 1 <= args.parts <= args.shards:
        ap.error(f"--parts must be between 1 and --shards ({args.shards}): a table of the shards' rows has {args.shards} rows")
    if bad or args.workers < 2:
        ap.error(f"unknown kinds {bad} (known: {', '.join(KINDS)})" if bad else "--workers must be at least 2")
    if args.events is None:
        args.events = 4 if args.quick else 100
    t0 = time.perf_counter()
    # (Dask's LocalCluster closes a removed worker's nanny after ``lost-worker-timeout`` (15 s) unless a
    # worker of its name is back by then: a killed worker whose restart is that slow on a loaded machine
    # then never comes back, and the churn driver, waiting for it, waited for ever)
    with dask.config.set({**start_method_config(args.start_method), "distributed.deploy.lost-worker-timeout": "1h"}):
        return run(args, t0)


def start_method_config(method: str) -> dict[str, str]:
    """How the bench's worker processes start, every one of them (the first, joiners, a nanny's restart
    of a killed worker): "forkserver" as dscar's embedded cluster starts its own
    (``dscar.api.cluster.forkserver_config``, this bench's models preloaded too), or "spawn", Dask's
    default (a fresh interpreter that imports Dask, NumPy and dscar: ~1 s of CPU before it registers,
    more after, that on this 2-core machine the running workers' clocks pay; on a real cluster a
    joiner starts on a machine of its own)."""
    if method == "spawn":
        return {"distributed.worker.multiprocessing-method": "spawn"}
    return dscar.api.cluster.forkserver_config(("bench.worker_models",))


def run(args, t0: float) -> int:
    if args.pull_bound:
        r = pull_bound(args, t0)
        print(format_pull_bound(r))
        print(f"load average {load_average()}")
        if args.json:
            write_json(args.json, {"pull_bound": r, "load_average": load_average(), "machine": machine_info()})
        return 0
    info = machine_info(threadpools=True)
    if args.hollow is not None:
        with tempfile.TemporaryDirectory(prefix="dscar-elastic-") as tmp:
            churn, refs = hollow_churn(args, tmp, t0)
        return report(args, churn, refs, HOLLOW_STEP_S, info)
    with tempfile.TemporaryDirectory(prefix="dscar-elastic-") as tmp:  # (the fits' checkpoints)
        counts = [max(1, args.workers - 1), args.workers, args.workers + 1]
        ref_clocks = 12 if args.quick else 20
        runs = []
        for n in counts:  # references before the churn fit and after it, in the reverse order (interleaved)
            log(t0, f"failure-free reference on {n} workers (before)")
            runs.append(reference_fit(n, ref_clocks, os.path.join(tmp, f"ref{n}a"), args.shards,
                                     churn_clocks(args.events), args.parts))
        churn = churn_fit(args, os.path.join(tmp, "churn"), t0)
        for n in reversed(counts):
            log(t0, f"failure-free reference on {n} workers (after)")
            runs.append(reference_fit(n, ref_clocks, os.path.join(tmp, f"ref{n}b"), args.shards,
                                     churn_clocks(args.events), args.parts))
    return report(args, churn, merge_references(runs), work_s(args.shards), info)


def report(args, churn: dict[str, Any], refs: dict[int, dict[str, Any]], step_s: float, info: dict[str, Any]) -> int:
    """Print the table (a shard step of ``step_s`` seconds), write the JSON and the plot."""
    s = summarize(churn, refs, args.shards, step_s)
    load = load_average()
    print(format_table(s, refs))
    print(f"load average {load}")
    if args.json:
        write_json(args.json, {"quick": args.quick, "kinds": args.kinds.split(","), "workers": args.workers,
                               "hollow": args.hollow, "seed": args.seed, "shards": args.shards, "parts": args.parts, "event_at": args.event_at, "summary": s, "references": refs,
                               "driver_events": churn["driver"].events, "load_average": load, "machine": info,
                               # what the figures are computed from, to look again: clock ends, live-count samples
                               "ticks": churn["ticks"], "live": churn["driver"].live,
                               "fit_events_all": churn["res"].events, "clocks": clock_records(churn["res"]),
                               "layouts": churn["layouts"]})
    plot(args.plot, churn)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
