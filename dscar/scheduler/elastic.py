"""The coordinator's elastic part: Dask's workers come and go while a job runs (issue 41).

A worker Dask retires (``retire_workers``, ``scale`` down, adaptive scaling) hands its partitions and shards
off at the job's next clock boundary before Dask closes it (``hand_off_first`` holds the retirement;
``hand_off`` copies, then switches owners in one step: no rework); a worker that joins warms up, takes
shards at once, and takes the partitions that even the load out, copied while clocks run
(``prepare_joiner``, ``even_out``) and switched at a boundary (``switch_copies``); with
``active_workers="auto"`` some workers stand by and rejoin as the job needs them (``resize``, ``refill``).
Every decision is pure (``dscar.core.elastic``, ``dscar.core.active_set``); this part carries them out
with the coordinator's messages, and keeps what the coordinator asks of it: which workers are taking
no work now (``holds_back``), which stand by, and whether a boundary has work to do (``boundary_work``).

The order at a BSP clock boundary (``Coordinator._begin``): the leavers' hand-off, then the copies'
switch, then the active count; a loss meanwhile is recovered before the clock begins.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Coroutine, Protocol

import dask.config

from ..core import active_set
from ..core.clock import Stage
from ..core.elastic import (adaptive_target, handoff_targets, retirable, shard_plan, unit_even_plan,
                            unit_handoff_plan, workers_wanted)
from ..core.job import JobState
from ..core.monitor import step_seconds
from ..core.wake import Woken

logger = logging.getLogger("dscar.coordinator")

#: seconds a joining worker may take to install a job and load its kernels before it is handed work anyway
WARM_UP_TIMEOUT_S = 60.0


def copied(answer: object) -> bool:
    """Whether a copy's answer (``adopt_all``'s, or the error its message raised) says it was made."""
    return isinstance(answer, dict) and answer.get("status") == "OK"


def handoff_timeout() -> float:
    """Seconds a retirement of a job's worker is held for its hand-off (``dscar.handoff-timeout``):
    the job must reach a clock boundary first; past this, Dask retires it and it is a loss."""
    return float(dask.config.get("dscar.handoff-timeout", 60.0))


class Host(Protocol):
    """What the elastic part uses of the coordinator that hosts it (``Coordinator``): its jobs and Dask
    scheduler, its messages to workers, and its carrying out of a job's decisions."""

    jobs: dict[str, JobState]
    scheduler: Any

    def _live(self, job: JobState) -> list[str]: ...
    def _setting_up(self, job: JobState, live: list[str] | None = None) -> set[str]: ...
    def _live_changed(self, job_id: str) -> None: ...
    def _do(self, job: JobState, effects: list, polls: bool = True) -> None: ...
    def _wake(self, everyone: bool = False, polls: bool = True, driver: bool = True) -> None: ...
    def _wake_polls(self, woken: list[Woken]) -> None: ...
    def _wait_change(self, timeout: float, driver: bool = False) -> Awaitable[bool]: ...
    def _rpc(self, worker: str, op: str, timeout: float = ..., **kw) -> Awaitable[Any]: ...
    def _bundles(self, job: JobState, calls: list[tuple[str, str, dict]]) -> Awaitable[list]: ...
    def _background(self, coro: Coroutine) -> asyncio.Future: ...


class Elastic:
    """Hand-offs, joiners, even-outs, switches and standby workers of the coordinator's jobs (the
    coordinator's ``elastic``). Its state is by job id, dropped with the job (``forget``)."""

    def __init__(self, coordinator: Host):
        self.coordinator = coordinator
        #: job -> how many workers it can use (``elastic.workers_wanted``): what adaptive scaling is told
        self.wanted: dict[str, int] = {}
        #: Dask's own handlers that this wraps (``wrap_dask``), to put back at close
        self.dask_handlers: dict[str, Any] = {}
        #: worker Dask is retiring -> done once it has handed off (or been given up): the retirement waits on it
        self.leaving: dict[str, asyncio.Future] = {}
        #: job -> workers that joined while it ran and are being prepared (the job installed, the
        #: kernels loaded, partitions copied in the background): no work is handed to them meanwhile
        self.preparing: dict[str, set[str]] = {}
        #: job -> partition -> (joiner, owner): copied to the joiner in the background, switched at the
        #: next clock boundary (``switch_copies``)
        self.copies: dict[str, dict[tuple[str, int], tuple[str, str]]] = {}
        #: job -> partition -> (new owner, owner): being copied now (``even_out``), then into ``copies``
        self.moving: dict[str, dict[tuple[str, int], tuple[str, str]]] = {}
        #: job -> shard -> the partition its steps update locally (``partitions.shard_homes``): hand-offs and
        #: switches move a shard to that partition's owner (``elastic.shard_plan``)
        self.shard_homes: dict[str, dict[int, tuple[str, int]]] = {}
        #: leaver -> the sending on of the memory copies it keeps for others (``pass_copies``), while under
        #: way: its retirement goes on once it is done (``release_leavers``)
        self.passing: dict[str, asyncio.Future] = {}
        #: SSP jobs whose leavers are being drained and handed off (``_ssp_hand_off``)
        self.ssp_leaving: set[str] = set()
        #: SSP jobs handing a leaver's partitions off right now: no work is handed out meanwhile
        self.switching: set[str] = set()
        #: job -> how many of its workers are active, and which stand by (``dscar.core.active_set``)
        self.active: dict[str, active_set.ActiveSet] = {}

    def forget(self, job_id: str) -> None:
        """The job ended: its state goes; with no job left, no retirement is held back any more."""
        for d in (self.wanted, self.active, self.preparing, self.copies, self.moving, self.shard_homes):
            d.pop(job_id, None)
        if not self.coordinator.jobs:
            self.passing.clear()
            for fut in self.leaving.values():
                if not fut.done():
                    fut.set_result(False)
            self.leaving.clear()

    def start_job(self, job_id: str, workers: list[str], consistency: str, sharding: str, phase_shards: list[int],
                  active_workers: str, active_floor: int, data_bytes: int | None) -> list[str]:
        """A new job on ``workers``: which of them are active (``active_workers="auto"``: as many as the data's
        size asks, ``active_set.initial_count``, never more than a data phase has shards; the others stand
        by). The active workers, in order."""
        active = self.active[job_id] = active_set.ActiveSet(active_set.mode(active_workers), int(active_floor))
        if active.mode == "auto" and (consistency == "ssp" or sharding != "dynamic"):
            active.mode = "all"  # (SSP has no clock boundary to hand off at; static shards cannot move to a joiner)
        if active.mode == "auto":
            active.ceiling = min(len(workers), *phase_shards)
            active.wanted = active_set.initial_count(data_bytes, active.floor, active.ceiling)
            workers, standby = workers[:active.wanted], workers[active.wanted:]
            active.standby.update(standby)
        return workers

    def job_started(self, job_id: str, wanted: int) -> None:
        """The job exists: adaptive scaling is told how many workers it can use (``wanted``; no more than
        ``start_job`` made active, with standby workers)."""
        active = self.active[job_id]
        self.wanted[job_id] = min(wanted, active.wanted) if active.mode == "auto" else wanted

    # ------------------------------------------------------------ what the coordinator asks
    def standby(self, job_id: str) -> set[str]:
        """The job's workers standing by (``active_workers="auto"``)."""
        a = self.active.get(job_id)
        return a.standby if a is not None else set()

    def standing_by(self, worker: str) -> bool:
        """``worker`` stands by for a running job: no change but its rejoining concerns its poll."""
        return any(worker in a.standby for a in self.active.values())

    def holds_back(self, job_id: str, job: JobState, worker: str) -> bool:
        """Whether ``worker`` is handed no work of ``job`` now: a joiner warming up (work handed to it would
        hold the clock's barrier), a worker standing by, or under SSP a leaver draining, or anyone while a
        leaver's partitions switch (the shards and tables hold still)."""
        return (worker in self.preparing.get(job_id, ()) or worker in self.standby(job_id) or (
            job.consistency == "ssp" and (worker in self.leaving or job_id in self.switching)))

    def boundary_work(self, job: JobState) -> bool:
        """Whether beginning the next clock moves partitions (``Coordinator._begin``: a retiring worker's
        hand-off, a joiner's copies switched, the active workers' count decided), which no clock end may
        read meanwhile."""
        job_id = job.cfg.job_id
        active = self.active.get(job_id)
        return (any(w in self.leaving for w in self.coordinator._live(job)) or bool(self.copies.get(job_id))
                or (active is not None and active.mode == "auto" and not active.decided))

    # ------------------------------------------------------------ Dask's hooks
    def wrap_dask(self, scheduler) -> None:
        """Put the running jobs into Dask's adaptive target (``elastic.adaptive_target``): Dask's
        own target counts Dask tasks only, and dscar runs none (``may_retire`` keeps the jobs' workers from
        being retired as idle); and hold a retirement of a job's workers for their hand-off (``hand_off_first``)."""
        original = scheduler.handlers["adaptive_target"]
        if getattr(original, "dscar_wrapped", False):  # (a plugin registered again: wrap once)
            original = original.dscar_original
        self.dask_handlers["adaptive_target"] = original

        def target(target_duration=None) -> int:
            return adaptive_target(original(target_duration=target_duration), self.wanted.values())

        target.dscar_wrapped, target.dscar_original = True, original
        scheduler.handlers["adaptive_target"] = target

        retire = scheduler.handlers["retire_workers"]
        if getattr(retire, "dscar_wrapped", False):
            retire = retire.dscar_original
        self.dask_handlers["retire_workers"] = retire

        async def retire_workers(workers=None, *, names=None, **kw):
            if workers is not None or names is not None:
                await self.hand_off_first(self._addresses(workers, names))
            return await retire(workers=workers, names=names, **kw)

        retire_workers.dscar_wrapped, retire_workers.dscar_original = True, retire
        scheduler.handlers["retire_workers"] = retire_workers

    def _addresses(self, workers: list | None, names: list | None) -> list[str]:
        """The addresses of the workers a ``retire_workers`` call names (by address or by name)."""
        if workers is not None:
            return [w for w in workers if w in self.coordinator.scheduler.workers]
        wanted = {str(n) for n in names or ()}
        return [w for w, ws in self.coordinator.scheduler.workers.items() if str(ws.name) in wanted]

    def may_retire(self, workers: list) -> list:
        """Of Dask's ``workers`` (``WorkerState``s) it would retire as idle, those it may (Dask's
        ``valid_workers_downscaling``): no worker of a running job (``elastic.retirable``): to Dask they look
        idle, since dscar runs no Dask tasks."""
        in_use = {w for job in self.coordinator.jobs.values() if not job.failed for w in self.coordinator._live(job)}
        keep = set(retirable([ws.address for ws in workers], in_use))
        return [ws for ws in workers if ws.address in keep]

    # ------------------------------------------------------------ leaving
    async def hand_off_first(self, workers: list[str]) -> None:
        """Hold Dask's retirement of a running job's ``workers`` until they have handed off their
        partitions and shards (``hand_off``), at most ``handoff_timeout()``: Dask itself would close
        them at once (its ``RetireWorker`` policy waits only for Dask keys, and dscar holds none).
        Under BSP the hand-off waits for the job's next clock boundary; under SSP clocks overlap and
        there is none, so the leavers are drained first (``_ssp_hand_off``)."""
        waits = []
        for job_id, job in self.coordinator.jobs.items():
            if job.failed:
                continue
            for w in set(workers) & self.standby(job_id):  # (nothing to hand off: its removal is a leave)
                job.left.add(w)
            for w in set(workers) & set(self.coordinator._live(job)):
                if w not in self.leaving:
                    self.leaving[w] = asyncio.get_running_loop().create_future()
                    job.event(time.time(), "worker-leaving", worker=w)
                waits.append(self.leaving[w])
                if job.consistency == "ssp" and job_id not in self.ssp_leaving:
                    self.ssp_leaving.add(job_id)
                    self.coordinator._background(self._ssp_hand_off(job_id))
        if not waits:
            return
        self.coordinator._wake()
        _, late = await asyncio.wait(waits, timeout=handoff_timeout())
        for w in workers:
            fut = self.leaving.get(w)
            if fut is not None and fut in late:
                self.leaving.pop(w)
                for job in self.coordinator.jobs.values():
                    job.event(time.time(), "handoff-timeout", worker=w, timeout=handoff_timeout())

    async def _ssp_hand_off(self, job_id: str) -> None:
        """Retire an SSP job's leavers with no rework, each by the steps of ``SspSchedule.leave_step``:
        it is handed no work (``_item_for``) until nothing runs on it or copies from it, its committed
        updates are applied at once, then no batch or clock end starts (``SspSchedule.pause``) until
        those under way are done; once the tables hold still, hand-outs stop too (``_switching``) for
        as long as its partitions and shards are copied and switched (``hand_off``), which is short."""
        try:
            while True:
                job = self.coordinator.jobs.get(job_id)
                if job is None or job.failed:
                    return
                leaving = [w for w in self.coordinator._live(job) if w in self.leaving]
                if not leaving:
                    return
                if job.recovering or not job.schedule.handing_out:
                    await self.coordinator._wait_change(1.0)
                    continue
                steps = {w: job.schedule.leave_step(w) for w in leaving}
                if {"drain", "flush"} & set(steps.values()):
                    if job.schedule.window.paused:  # (a leaver that came later is not drained yet)
                        self.coordinator._do(job, job.schedule.resume(time.time()))
                    if "flush" in steps.values():
                        self.coordinator._do(job, job.schedule.flush_now(time.time()))
                else:
                    job.schedule.pause()  # (the batch or clock end under way finishes: then it is quiet)
                ready = [w for w, step in steps.items() if step == "hand-off"]
                if ready:
                    job.schedule.pause()
                    self.switching.add(job_id)
                    # attempts handed out before the switch read by the old owner map: Dask closes the
                    # leavers only once they are done (a pull from a closed leaver would fail the attempt)
                    before = {(a.shard, a.attempt) for a in job.queue.running()}
                    try:
                        await self.hand_off(job, ready, release=False)
                    finally:
                        self.switching.discard(job_id)
                        self.coordinator._do(job, job.schedule.resume(time.time()))
                        self.coordinator._wake(everyone=True)  # (the polls turned away while it switched)
                    deadline = time.monotonic() + handoff_timeout()
                    while (job_id in self.coordinator.jobs and time.monotonic() < deadline
                           and any((a.shard, a.attempt) in before for a in job.queue.running())):
                        await self.coordinator._wait_change(0.5)
                    self.release_leavers(ready)
                    continue
                await self.coordinator._wait_change(0.5)
        finally:
            self.ssp_leaving.discard(job_id)
            job = self.coordinator.jobs.get(job_id)
            if job is not None and job.consistency == "ssp" and job.schedule.window.paused:
                self.coordinator._do(job, job.schedule.resume(time.time()))

    async def hand_off(self, job: JobState, leaving: list[str], release: bool = True, standby: bool = False) -> None:
        """At a clock boundary (nothing staged, nothing running), the leaving workers' partitions and
        shards are copied from them to the others (``elastic.unit_handoff_plan``, a row range's partitions
        together, and ``shard_plan``, a shard to its rows' owner, with the stayers' shards that follow
        their rows to a new owner), then the owners and holders switch in one step and the leavers leave
        the job (``JobState.leave``): nothing to restore, no rework. A leaver lost meanwhile goes the loss's
        way: nothing of it is switched. ``standby``: the leavers stay in the cluster and the job, standing
        by (``stand_by``)."""
        t0 = time.perf_counter()
        staying = [w for w in self.coordinator._live(job) if w not in leaving]
        # (a worker still setting up takes nothing: a copy to it would wait, at the boundary)
        staying = handoff_targets(staying, self.coordinator._setting_up(job))
        if not staying:  # nobody to hand off to: the retirement goes on, and is a loss
            for w in leaving:
                fut = self.leaving.pop(w, None)
                if fut is not None and not fut.done():
                    fut.set_result(False)
            return
        parts = unit_handoff_plan(job.pmap.owners, job.pmap.rows, job.pmap.units, leaving, staying)
        moves = [(k, w, job.pmap.owners[k]) for k, w in sorted(parts.items())]
        holders = {s: job.queue.holder(s) for s in range(job.queue.n_shards)}
        shards = {s: (w, holders[s]) for s, w in shard_plan(holders, staying, leaving, self.shard_homes.get(
            job.cfg.job_id), {**job.pmap.owners, **parts}, follow=self.shards_follow(job)).items()}
        results, shard_answers = await self.adopt(job, moves, "whole", shards)
        part_ok = [copied(r) for r in results]
        for (k, w, src), done in zip(moves, part_ok):
            if done and src not in job.lost and w not in job.lost:
                job.pmap.owners[k] = w
        taken = self.shards_taken(job, shards, shard_answers)
        gone = set(leaving)
        followed = [(s, src) for s, src in taken if src not in gone]
        # (before the leavers' records go with them; the ring of the next clock's copies, ``_start_mirror``'s)
        passes = job.checkpoints.handed_copies(gone, [w for w in self.coordinator._live(job) if w not in gone])
        for w in leaving:
            if w in job.lost:
                continue
            if standby:
                await self.stand_by(job, w, [k for (k, new, src), done in zip(moves, part_ok)
                                              if done and new != w and src == w])
            else:
                self.coordinator._do(job, job.leave(w, time.time()))
        await self.drop_moved(job, [], followed)
        if passes:  # (beside the next clock, not before it: each leaver is released once they landed)
            passing = self.coordinator._background(self.pass_copies(job, passes))
            if not standby:
                self.passing.update({w: passing for w in leaving})
        failed = len(moves) - sum(part_ok) + len(shards) - len(taken)
        job.event(time.time(), "handoff", workers=sorted(leaving), partitions=sum(part_ok),
                  shards=len(taken) - len(followed), failed=failed, followed=len(followed),
                  copies_to_pass=sum(len(ps) + len(ss) for dests in passes.values() for ps, ss in dests.values()),
                  seconds=round(time.perf_counter() - t0, 4))
        # (the stayers took its partitions as they came: even them out)
        self.coordinator._background(self.even_out(job))
        if release:
            self.release_leavers(leaving)

    async def pass_copies(self, job: JobState, passes: dict[str, dict[str, tuple[list, list]]]) -> None:
        """The memory copies of ``passes`` (``CheckpointPlanner.handed_copies``: holder -> new holder -> (parts,
        shards)) sent on by their holders, one message to each (``pass_copies``), side by side; each lands
        recorded as any memory copy (``dscar_mirrored``, before its holder answers). A holder that cannot
        send them leaves those partitions to the disk, as before."""
        await asyncio.gather(*(
            self.coordinator._rpc(holder, "pass_copies", job_id=job.cfg.job_id,
                                  to=[[dest, [list(k) for k in parts], list(shards)]
                                      for dest, (parts, shards) in sorted(dests.items())])
            for holder, dests in sorted(passes.items())), return_exceptions=True)

    def release_leavers(self, leaving: list[str]) -> None:
        """Dask's retirement of ``leaving`` goes on: they have handed off (each once the memory copies it
        passes on have landed: ``passing``; a retirement that times out meanwhile is a ``handoff-timeout``)."""
        for w in leaving:
            passing = self.passing.pop(w, None)
            if passing is None or passing.done():
                self._release(w)
            else:
                passing.add_done_callback(lambda _, w=w: self._release(w))

    def _release(self, worker: str) -> None:
        fut = self.leaving.pop(worker, None)
        if fut is not None and not fut.done():
            fut.set_result(True)

    # ------------------------------------------------------------ joining
    async def prepare_joiner(self, job_id: str, worker: str) -> None:
        """A worker joined mid-fit: it installs the job and loads the kernels (``warm_up``) before it
        is handed work, so its first shard does not hold the clock's barrier; then, under BSP, the
        partitions that even the load are copied to it while clocks run (``even_out``)."""
        t0 = time.perf_counter()
        preparing = self.preparing.setdefault(job_id, set())
        preparing.add(worker)
        try:
            await self.coordinator._rpc(worker, "warm_up", timeout=WARM_UP_TIMEOUT_S, job_id=job_id)
        except Exception as e:  # noqa: BLE001 - gone (its loss is handled as any), or slow: it works unwarmed
            logger.info("dscar: joiner %s did not warm up for job %s: %r", worker, job_id, e)
        finally:
            preparing.discard(worker)
            self.coordinator._wake(everyone=True)
        job = self.coordinator.jobs.get(job_id)
        if job is None or job.failed or worker not in self.coordinator._live(job):
            return
        job.event(time.time(), "worker-ready", worker=worker, seconds=round(time.perf_counter() - t0, 4))
        await self.even_out(job)

    async def even_out(self, job: JobState) -> None:
        """Copy, while clocks run, the partitions whose move lowers the largest owner's load among the
        job's workers not warming up or leaving (``elastic.unit_even_plan``: a row range's partitions move
        together; the copies made or under way count as moved): after a joiner's warm-up, a hand-off, a
        switch that left copies stale. Each is switched at the next clock boundary (``switch_copies``),
        where the shards follow (``follow_plan``). A copy that fails is not moved."""
        job_id = job.cfg.job_id
        if job.consistency != "bsp" or job.failed or job_id not in self.coordinator.jobs:
            return
        moving = self.moving.setdefault(job_id, {})
        copies = {**self.copies.get(job_id, {}), **moving}
        planned = {**job.pmap.owners, **{k: w for k, (w, _) in copies.items()}}
        plan = {k: w for k, w in unit_even_plan(planned, job.pmap.rows, job.pmap.units, self.members(job)).items()
                if k not in copies}
        if not plan:
            return
        moves = [(k, w, job.pmap.owners[k]) for k, w in sorted(plan.items())]
        results, _ = await self.adopt(job, moves, "copy")
        for (k, w, src), r in zip(moves, results):
            if copied(r) and job_id in self.coordinator.jobs:
                # (not into ``copies``: a boundary may have taken that dict while these copies ran)
                self.copies.setdefault(job_id, {})[k] = (w, src)

    async def adopt(self, job: JobState, moves: list[tuple[tuple[str, int], str, str]], step: str,
                     shards: dict[int, tuple[str, str]] | None = None) -> tuple[list, dict[int, Any]]:
        """``adopt`` step ``step`` of each (partition, new owner, old owner) at its new owner, and a copy of
        each of ``shards`` (shard -> (new holder, holder)) at its new holder, one message to each
        (``adopt_all``); the partitions' answers (or errors) in order, and the shards' by shard. The
        partitions count as moving meanwhile, so an even-out plans around them."""
        shards = shards or {}
        moving = self.moving.setdefault(job.cfg.job_id, {})
        moving.update({k: (w, src) for k, w, src in moves})
        takes: dict[str, tuple[list[int], list[int]]] = {}
        for i, (_, w, _) in enumerate(moves):
            takes.setdefault(w, ([], []))[0].append(i)
        for s, (w, _) in sorted(shards.items()):
            takes.setdefault(w, ([], []))[1].append(s)
        takers = sorted(takes)
        try:
            results = await asyncio.gather(*(
                self.coordinator._rpc(w, "adopt_all", job_id=job.cfg.job_id, step=step,
                          parts=[[moves[i][0][0], moves[i][0][1], moves[i][2]] for i in takes[w][0]],
                          shards=[[s, shards[s][1]] for s in takes[w][1]]) for w in takers),
                return_exceptions=True)
        finally:
            for k, w, src in moves:
                if moving.get(k) == (w, src):  # (not another move's of it under way: a hand-off's beside a copy)
                    moving.pop(k)
        out: list = [None] * len(moves)
        shard_out: dict[int, Any] = {}
        for w, r in zip(takers, results):
            answered = copied(r)
            for j, i in enumerate(takes[w][0]):
                out[i] = r["parts"][j] if answered else r
            for j, s in enumerate(takes[w][1]):
                shard_out[s] = r["shards"][j] if answered else r
        return out, shard_out

    async def drop_moved(self, job: JobState, parts: list[tuple[tuple[str, int], str]],
                          shards: list[tuple[int, str]], forget: list[tuple[tuple[str, int], str]] = ()) -> None:
        """At a clock boundary, the old owners drop ``parts`` (``(partition, old owner)``) and the old holders
        ``shards`` (``(shard, old holder)``); ``forget``: copies that will not switch (``forget_copy``). One
        message to each worker. With the memory tier, each keeps what it drops of param partitions and shard
        states as its memory copy of this clock (``keep``), recorded as any buddy's copy: a switch leaves the
        freshest copy on the new owner until that owner's own copy lands at its buddy, and losing the new
        owner meanwhile would go back to the disk."""
        ck = job.cfg.checkpoint
        keep = {"keep": int(job.clock)} if ck is not None and ck.memory else {}
        kinds = job.cfg.kinds
        calls = ([(src, "lend", {"table": t, "part": p, "step": "drop", **(keep if kinds[t] == "param" else {})})
                  for (t, p), src in parts]
                 + [(src, "drop_shard", {"shard": s, **keep}) for s, src in shards]
                 + [(w, "forget_copy", {"table": t, "part": p}) for (t, p), w in forget])
        # each drop's copy as ``JobState.mirrored`` takes it, (partitions, shards); the forgets, last, keep none
        copies = [([[t, p]], []) for (t, p), _ in parts] + [([], [s]) for s, _ in shards]
        answers = await self.coordinator._bundles(job, calls)
        drops = []
        for (src, _, _), (kept_parts, kept_shards), r in zip(calls, copies, answers):
            if isinstance(r, dict) and r.get("kept"):
                drops += job.mirrored(src, keep["keep"], kept_parts, time.time(), kept_shards)
        if drops:
            self.coordinator._do(job, drops, polls=False)

    def members(self, job: JobState) -> list[str]:
        """The job's workers that may take partitions and shards now: live, not warming up (each evens out
        once warm: ``prepare_joiner``) and not leaving."""
        warming = self.preparing.get(job.cfg.job_id, set())
        return [w for w in self.coordinator._live(job) if w not in warming and w not in self.leaving]

    def shards_follow(self, job: JobState) -> bool:
        """Whether ``job``'s shards follow their rows to a new owner (``elastic.shard_plan``'s ``follow``): BSP
        and dynamic sharding only (an SSP hand-off has no boundary; static shards stay with their worker)."""
        return job.consistency == "bsp" and job.queue.sharding == "dynamic" and not job.failed

    def follow_plan(self, job: JobState, owners: dict[tuple[str, int], str]) -> dict[int, tuple[str, str]]:
        """The shards held away from the owner of their home partition under ``owners`` that go to it
        (``elastic.shard_plan``): shard -> (that owner, its holder)."""
        homes = self.shard_homes.get(job.cfg.job_id)
        if not homes or not self.shards_follow(job):
            return {}
        holders = {s: job.queue.holder(s) for s in homes}
        return {s: (w, holders[s]) for s, w in shard_plan(holders, self.members(job), (), homes, owners).items()}

    def shards_taken(self, job: JobState, plan: dict[int, tuple[str, str]], answers: dict[int, Any]) -> list:
        """The shards of ``plan`` copied to their new holder (``answers``, ``adopt``'s) change holder, unless
        one of the two was lost meanwhile; ``(shard, old holder)`` of each, whose copy there must go."""
        moved = []
        for s, (w, src) in sorted(plan.items()):
            if copied(answers.get(s)) and job.queue.holder(s) == src and src not in job.lost and w not in job.lost:
                job.queue.set_holder(s, w)
                moved.append((s, src))
        return moved

    async def switch_copies(self, job: JobState) -> None:
        """At a clock boundary, the partitions copied to new owners (``even_out``) switch owner in one step:
        each new owner takes the rows changed since its copy (``adopt`` step "switch"), the owner map changes,
        and the old owners drop them. A copy whose joiner or owner is gone, or whose partition moved meanwhile
        (a loss, a hand-off), is not switched, and is forgotten where it is kept; one that fails stays with
        its owner."""
        pending = self.copies.pop(job.cfg.job_id, {})
        if not pending:
            return
        t0 = time.perf_counter()
        live = set(self.coordinator._live(job))
        moves = sorted((k, w, src) for k, (w, src) in pending.items()
                       if job.pmap.owners.get(k) == src and w in live and src in live)
        # the shards follow their rows in the same messages, as if every switch succeeds
        follow = self.follow_plan(job, {**job.pmap.owners, **{k: w for k, w, _ in moves}})
        results, shard_answers = await self.adopt(job, moves, "switch", follow)
        switched = []
        for (k, w, src), r in zip(moves, results):
            if copied(r) and src not in job.lost and w not in job.lost:
                job.pmap.owners[k] = w
                switched.append((k, w, src, int(r.get("rows_resent", 0))))
        # a copy that did not switch is forgotten where it is kept (the new owner's, the old owner's lent
        # one: a leaver too, whose retirement Dask may yet cancel), before a new plan may copy the same
        # partition there again; a worker gone holds nothing
        done = {k for k, *_ in switched}
        stale = [(k, holder) for k, (new, old) in sorted(pending.items()) if k not in done
                 for holder in (new, old) if holder in self.coordinator.scheduler.workers]
        followed = self.shards_taken(job, follow, shard_answers)
        await self.drop_moved(job, [(k, src) for k, _, src, _ in switched], followed, stale)
        if len(switched) < len(pending):
            # copies went stale or failed (a loss, a hand-off): plan anew
            self.coordinator._background(self.even_out(job))
        if switched:
            job.event(time.time(), "partitions-taken-on", workers=sorted({w for _, w, _, _ in switched}),
                      partitions=len(switched), moved=[list(k) for k, *_ in switched],
                      failed=len(pending) - len(switched),
                      shards_followed=len(followed),
                      rows_resent=sum(n for *_, n in switched), rows=sum(job.pmap.rows[k] for k, *_ in switched),
                      seconds=round(time.perf_counter() - t0, 4))

    # -------------------------------------------------------- active workers
    async def resize(self, job: JobState) -> None:
        """At a clock boundary: once, after the first measured clock, the active count is decided from
        that clock's costs (``active_set.choose``), and workers stand by (``hand_off`` to the others)
        or rejoin; at every boundary, standby workers rejoin while fewer than decided are active (a
        retirement took one). A fit that lost a worker before a clock was measured keeps its starting
        count (a recovery's time would count as the clock's)."""
        job_id = job.cfg.job_id
        act = self.active[job_id]
        if act.mode != "auto":
            return
        live = self.coordinator._live(job)
        if (not act.decided and job.clock >= 1 and job.machine.stage is Stage.DONE and not job.lost
                and job.shards_done):
            act.decided = True
            clock_s = time.time() - job.tally.clock_t0
            step_work_s = sum(step_seconds(t) for t in job.timings.values())
            parallel_s, per_worker_s = active_set.measured_costs(step_work_s, clock_s, len(live))
            ceiling = min(len(live) + len(act.standby), act.ceiling)
            k = active_set.choose(parallel_s, per_worker_s, len(live), act.floor, ceiling)
            lo, hi = active_set.bounds(act.floor, ceiling)
            job.event(time.time(), "active-workers", active=k, measured_on=len(live), reason="measured",
                      parallel_s=round(parallel_s, 5), per_worker_s=round(per_worker_s, 5),
                      predicted_s={n: round(active_set.predicted_clock_s(parallel_s, per_worker_s, n), 5)
                                   for n in range(lo, hi + 1)})
            act.wanted = k
            self.wanted[job_id] = min(workers_wanted(job.cfg.n_shards), k)
            if k < len(live):
                owned = job.pmap.rows_by_worker()
                load = {w: owned.get(w, 0) for w in live}
                _, going = active_set.split(load, k)
                await self.hand_off(job, going, release=False, standby=True)
                return
            self.refill(job, "grow")
            return
        self.refill(job, "retirement")

    async def stand_by(self, job: JobState, worker: str, handed: list[tuple[str, int]]) -> None:
        """``worker`` handed its partitions and shards off (``hand_off``): it stands by, owning nothing
        and running nothing, in the cluster and known to the job; it drops the ``handed`` partitions it
        still holds (no apply or checkpoint there touches them again). One that still owns or holds
        something (a copy failed) stays active."""
        job_id = job.cfg.job_id
        if job.pmap.owned_by(worker) or job.queue.held_by(worker):
            job.event(time.time(), "standby-refused", worker=worker, reason="its hand-off did not complete")
            return
        self.active[job_id].standby.add(worker)
        self.coordinator._live_changed(job_id)
        job.monitor.forget(worker)
        job.dispatch.forget(worker)
        job.checkpoints.worker_lost(worker, planned=True, now=time.time())  # (its memory copies serve no restore)
        await asyncio.gather(*(self.coordinator._rpc(worker, "lend", job_id=job_id, table=t, part=p, step="drop")
                               for t, p in handed), return_exceptions=True)
        job.event(time.time(), "worker-standby", worker=worker, partitions=len(handed))

    def refill(self, job: JobState, why: str) -> None:
        """Standby workers rejoin, through the join path (``prepare_joiner``), while fewer than the
        decided count are active: they take shards at once, partitions copied in the background (or
        restored onto them by a recovery)."""
        job_id = job.cfg.job_id
        a = self.active.get(job_id)
        if a is None or a.mode != "auto" or not a.standby or job.failed:
            return
        live = [w for w in self.coordinator._live(job) if w in self.coordinator.scheduler.workers]
        back = active_set.rejoiners(a.standby, len(live), a.wanted or 0)
        if not back:
            return
        a.standby.difference_update(back)
        self.coordinator._live_changed(job_id)
        job.event(time.time(), "active-workers", active=len(live) + len(back), rejoined=back, reason=why)
        for w in back:
            self.coordinator._background(self.prepare_joiner(job_id, w))
        self.coordinator._wake_polls([Woken(w, None) for w in back])  # (their polls wait out of the line)
