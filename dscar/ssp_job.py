"""One fit's control state under stale-synchronous clocks (no Dask here).

``SspJobState`` is ``JobState`` with the clock window (``dscar.ssp``) in place of
the BSP clock machine: the window says which shards may start and in which clock,
when committed updates are applied (in batches, eagerly) and when a clock ends;
the shard queue (``dscar.shards``) still keeps attempts, first-commit-wins,
backups and where each shard's data lives. The two agree at every step: a shard
the window runs is DOING in the queue, one it has committed is DONE, and one it
moved on (applied, voided by a loss, written off) is back in TODO
(``_sync_queue``). Ownership, the checkpoint ledger, recovery planning, the
monitor and the policies are ``JobState``'s, unchanged.

The coordinator sees the same effects as under BSP (``ApplyPass`` with a batch
id and per-update clocks, ``StartRecovery``, ``Checkpoint``, ``Mirror``) and asks
the same questions; the driver reads finished clocks' reports in order as
before, while later clocks already run.
"""
from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Any

from .errors import ShardFailedError
from .job import ApplyPass, Checkpoint, Effect, JobConfig, JobState, StartRecovery
from .ledger import manifest_cut
from .monitor import step_seconds
from .partitions import PartitionMap
from .shards import Attempt, ShardQueue, ShardStatus
from .ssp import ApplyBatch, ClockWindow, RunClockEnd, ShardPhase, SkipClock, StartRebuild
from .ssp import StartRecovery as WindowRecovery


class SspJobState(JobState):
    """The scheduler's truth of one fit under ``consistency="ssp"``. Every method is a pure decision."""

    def __init__(self, cfg: JobConfig, queue: ShardQueue, pmap: PartitionMap, *, staleness: int,
                 max_clocks: int, **kw: Any):
        super().__init__(cfg, queue, pmap, **kw)
        #: the open clocks and each shard's place in them
        self.window = ClockWindow(cfg.n_shards, staleness, has_rebuild=bool(cfg.rebuild),
                                  floor=self.machine.clock, limit=max_clocks)
        queue.reopen(range(cfg.n_shards))  # every shard waits for its first clock
        if kw.get("resume") is not None:  # the tables come back from the checkpoint: rebuild them first
            self.window.resume_from(manifest_cut(kw["resume"], cfg.n_shards))
            self.window.needs_rebuild = self.window.applied_before = bool(cfg.rebuild)
        #: the driver began the fit (before, nothing is handed out: shards may still be placed)
        self.begun = False
        #: clock -> its report for the driver, once finished (kept until a newer one is read)
        self.reports: dict[int, dict[str, Any]] = {}
        #: clock -> {"t0": first hand-out, "shards_done": {worker: n}, "timings": {worker: {k: s}}}
        self.tallies: dict[int, dict[str, Any]] = {}

    # ------------------------------------------------------------- queries
    @property
    def clock(self) -> int:
        """The oldest open clock."""
        return self.window.floor + 1

    @property
    def recovering(self) -> bool:
        return self.window.recovering

    @property
    def run_id(self) -> int:
        return self.window.epoch

    @property
    def handing_out(self) -> bool:
        return self.begun and not self.window.recovering

    def report_for(self, clock: int) -> dict | None:
        if self.failed or self.window.holding or clock not in self.reports:
            return None
        for c in [c for c in self.reports if c < clock]:
            del self.reports[c]
        return self.reports[clock]

    # ---------------------------------------------------------- carrying out
    def _sync_queue(self) -> None:
        """Every shard the window has back in TODO (applied, voided, written off) is TODO in the
        queue too, with no attempt left: a late commit of an older attempt is refused there."""
        w = self.window
        back = [s for s in range(self.cfg.n_shards)
                if w.phase(s) is ShardPhase.TODO and self.queue.status(s) is not ShardStatus.TODO]
        if back:
            self.queue.reopen(back)

    def _give_back_idle(self) -> None:
        """Shards the queue has in TODO again (every attempt failed, was lost or given back)."""
        for s in range(self.cfg.n_shards):
            if self.window.phase(s) is ShardPhase.RUNNING and self.queue.status(s) is ShardStatus.TODO:
                self.window.give_back(s)

    def _carry(self, actions: list, now: float) -> list[Effect]:
        """Turn the window's actions into queue changes, events and effects."""
        effects: list[Effect] = []
        w = self.window
        for a in actions:
            if isinstance(a, ApplyBatch):
                attempts = {s: (att, wk) for s, att, wk in self.queue.committed_attempts()}
                committed = [(s, attempts[s][0], wk) for s, _, wk in a.updates]
                clocks = [w.shard_clock(s) if a.rebuild else c for s, c, _ in a.updates]
                effects.append(ApplyPass(a.epoch, max(clocks), committed, list(self.cfg.rebuild) if a.rebuild else [],
                                         a.rebuild, batch=a.batch, clocks=clocks, floor=w.floor))
            elif isinstance(a, RunClockEnd):
                self.clock_end_worker = None
            elif isinstance(a, SkipClock):
                self.events.append({"time": now, "clock": a.clock, "kind": "clock-end-skipped", "reason": a.reason})
                self.reports[a.clock] = self._report(a.clock, {"objective": float("nan"), "skipped": 1.0}, True)
            elif isinstance(a, WindowRecovery):
                effects.append(StartRecovery())
            elif isinstance(a, StartRebuild):
                self.queue.reopen(range(self.cfg.n_shards))
                self.event(now, "rebuild-started", tables=list(self.cfg.rebuild))
        if w.clock_end is None:
            self.clock_end_worker = None
        self._sync_queue()
        return effects

    def _report(self, clock: int, metrics: dict, skipped: bool, seconds: float | None = None) -> dict[str, Any]:
        t = self.tallies.pop(clock, {})
        return {
            "status": "done", "metrics": dict(metrics), "skipped": skipped, "checkpoint": self.checkpoint_status(),
            "shards_per_worker": dict(t.get("shards_done", {})), "timings": dict(t.get("timings", {})),
            "stage_s": {} if seconds is None else {"clock_end_compute": float(seconds)},
            "ahead": sum(1 for _, c in self.window.applied if c > clock),
            "workers": self._workers_report(),
        }

    # ---------------------------------------------------------------- clocks
    def begin(self, clock: int, now: float) -> list[Effect]:
        """The driver's first ``begin`` opens the window (up to ``max_clocks``); later ones only
        wait for their clock's report, which the window produces on its own."""
        if self.begun:
            return []
        self.begun = True
        self.window.min_batch = max(1, 2 * len(self.workers))  # about two commits per worker per batch
        self._start_schedule(now)
        return self._carry(self.window.allow(self.window.limit), now)

    def _held_back(self, worker: str) -> bool:
        """Under SSP a straggler takes the newest clocks' shards, or none: its older ones move."""
        return worker in self.stragglers

    def next_item(self, worker: str, now: float) -> dict | None:
        """The clock-end step when one is due and nobody runs it, else a batch of shard attempts
        the window allows (or a backup), else None."""
        self.last_seen[worker] = now
        w = self.window
        if self.failed or worker in self.lost or not self.handing_out:
            return None
        if w.clock_end is not None and self.clock_end_worker is None:
            self.clock_end_worker = worker
            return {"op": "clock_end", "job": self.cfg.job_id, "clock": w.clock_end, "run": w.epoch,
                    "owners": self.pmap.to_msg(), "version": w.version}
        tiers = self._oldest_first(w.startable())
        if worker in self.stragglers and w.rebuilding is None:
            tiers = [t for t in tiers[::-1] if not self._leave_to_others(worker, self._slack(min(
                w.shard_clock(s) for s in t)))]  # its shard holds its clock's end back least in the newest clock
        worth = partial(self._worth_moving, worker, now)
        a = next((a for among in tiers if (a := self.queue.next_shard(worker, now, among=among, worth_moving=worth))),
                 None)
        if a is None and w.rebuilding is None:
            a = self._idle_policies(worker, now)
        elif a is not None and a.fetch_from:
            self.event(now, "shard-moved", shard=a.shard, source=a.fetch_from, target=worker)
        if a is None:
            return None
        batch = [a]
        if a.fetch_from is None and not a.backup:  # more of the worker's own shards, while steps are short
            size = self._batch_size(worker)
            for among in tiers:
                while len(batch) < size and (b := self.queue.next_shard(worker, now, local_only=True, among=among)):
                    batch.append(b)
        self._set_batched(worker, [(b.shard, b.attempt) for b in batch[1:]])  # its earlier items are done
        clocks = [w.shard_clock(b.shard) if b.backup else w.start(b.shard) for b in batch]
        if w.rebuilding is None:
            self.running_items[worker] = (now, len(batch))
            for c in set(clocks):
                self.tallies.setdefault(c, {"t0": now, "shards_done": {}, "timings": {}})
        return self._ssp_item(batch, clocks)

    def _slack(self, clock: int) -> int:
        """How many shard updates the window lets the other workers run while an attempt of
        ``clock`` is running: every update of clocks up to ``clock + s`` (clock ``clock`` cannot end
        before the attempt does, so no later clock can start)."""
        w = self.window
        top = min(clock + w.staleness, w.limit)
        return sum(max(0, top - w.shard_clock(s) + 1) for s in range(self.cfg.n_shards)) - 1

    def _oldest_first(self, shards: list[int]) -> list[set[int]]:
        """``shards`` grouped by clock, oldest first: the oldest open clock's shards hold the window
        back, so they go first (moving to another worker if theirs is busy)."""
        by_clock: dict[int, set[int]] = {}
        for s in shards:
            by_clock.setdefault(self.window.shard_clock(s), set()).add(s)
        return [by_clock[c] for c in sorted(by_clock)]

    def _ssp_item(self, batch: list[Attempt], clocks: list[int]) -> dict:
        w = self.window
        item = self._item(batch, w.rebuilding is not None)
        for member, a, clock in zip(item["shards"], batch, clocks):
            seen, writer = w.own_update(a.shard)
            member.update(clock=clock, seen=seen, mine=writer == a.worker)
        item.update(clock=max(clocks), run=w.epoch,
                    version=w.version, floor=w.floor, read_floor=max(w.read_floor(a.shard) for a in batch))
        return item

    def idle(self, worker: str, now: float) -> list[Effect]:
        """``worker`` found nothing to do: apply the commits waiting (their shards' next clocks may
        be what it could run)."""
        if not self.handing_out or worker in self.lost:
            return []
        return self._carry(self.window.flush(), now)

    def releasable(self, asker: str) -> tuple[str, list[tuple[int, int]]] | None:
        if not self.handing_out or self.window.startable():
            return None
        return self._ask_back(asker)

    def released(self, worker: str, asked: list, released: list, now: float) -> None:
        super().released(worker, asked, released, now)
        self._give_back_idle()

    def commit(self, worker: str, clock: int, run_id: int, shard: int, attempt: int, now: float,
               timings: dict | None = None, rebuild: bool = False) -> tuple[bool, list[Effect]]:
        """An attempt of ``shard`` in ``clock`` asks to commit: granted to the first live attempt of
        the shard's current clock and epoch; the window applies it in its next batch."""
        if self.failed or worker in self.lost:
            return False, []
        self.running_items.pop(worker, None)
        self.last_seen[worker] = now
        self._note_move(next((a for a in self.queue.running_attempts(shard) if a.attempt == attempt), None), timings)
        if not rebuild and timings:
            self.monitor.record(worker, step_seconds(timings))
        if not self.window.accepts(shard, clock, run_id):  # a lost backup, an attempt of a voided epoch
            self.event(now, "commit-refused", shard=shard, attempt=attempt, worker=worker, late=True,
                       seconds=round(step_seconds(timings or {}), 4))  # its step time, wasted
            return False, []
        self._started(worker, shard, attempt)
        if not self.queue.commit(shard, attempt, worker):
            self.event(now, "commit-refused", shard=shard, attempt=attempt, worker=worker, late=False,
                       seconds=round(step_seconds(timings or {}), 4))
            return False, []
        self.restore_state.pop(shard, None)  # the attempt started from the restored state; it lives on now
        tally = self.tallies.get(clock)
        if tally is not None and not rebuild:
            tally["shards_done"][worker] = tally["shards_done"].get(worker, 0) + 1
            sums = tally["timings"].setdefault(worker, {})
            for k, v in (timings or {}).items():
                sums[k] = sums.get(k, 0.0) + float(v)
        return True, self._carry(self.window.commit(shard, clock, worker, run_id), now)

    def attempt_failed(self, worker: str, clock: int, run_id: int, shard: int, attempt: int, error: str,
                       now: float, lost_data: bool = False, seconds: float = 0.0, stopped: bool = False) -> None:
        w = self.window
        current = w.phase(shard) is ShardPhase.RUNNING and (w.rebuilding is not None or w.shard_clock(shard) == clock)
        late = not current or run_id != w.epoch or (stopped and not self._live(shard, attempt, worker))
        self.event(now, "attempt-stopped" if stopped else "shard-failed", shard=shard, attempt=attempt,
                   worker=worker, error=error, late=late, seconds=round(seconds, 4))
        self.running_items.pop(worker, None)
        if not current:
            return
        self._started(worker, shard, attempt)
        try:
            self.queue.fail(shard, attempt, worker, error, count=run_id == w.epoch and not stopped, lost_data=lost_data)
        except ShardFailedError as e:
            self.fail(now, str(e))
        self._give_back_idle()

    def applied(self, run_id: int, now: float, batch: int | None = None) -> list[Effect]:
        in_flight = self.window.in_flight
        if batch is None or in_flight is None or in_flight.batch != batch:
            return []
        actions = self.window.batch_applied(batch)
        if in_flight.rebuild:  # (the rebuild pass is one batch)
            self.rebuild_done(now)
        return self._carry(actions, now)

    def clock_end_done(self, worker: str, run_id: int, metrics: dict, seconds: float, now: float,
                       clock: int | None = None) -> list[Effect]:
        if clock is None or worker != self.clock_end_worker or not self.window.clock_end_done(clock, run_id):
            return []
        self.clock_end_worker = None
        self.metrics = dict(metrics)
        started = self.tallies.get(clock, {}).get("t0", now)
        self.reports[clock] = self._report(clock, metrics, False, seconds)
        effects = self._clock_finished(clock, metrics, now, started)
        if not self.snapshotting:
            effects += self._carry(self.window.go_on(), now)
        return effects

    def _start_checkpoint(self, clock: int, now: float, **info: Any) -> Checkpoint:
        """At a clock end, while no batch applies: the tables hold exactly the updates ``cut`` lists
        (per shard, its newest clock applied) and each shard's saved state is as of that clock."""
        return super()._start_checkpoint(clock, now, cut=self.window.cut(), **info)

    def snapshotted(self, what: str, now: float) -> list[Effect]:
        self.snapshotting.discard(what)
        if self.snapshotting or not self.window.holding:
            return []
        return self._carry(self.window.go_on(), now)

    def clock_end_failed(self, worker: str, run_id: int, error: str, now: float,
                         clock: int | None = None) -> list[Effect]:
        w = self.window
        if worker != self.clock_end_worker or w.clock_end != clock:
            return []
        if run_id != w.epoch or w.recovering or clock in w.skip_reasons:
            return self._carry(w.clock_end_failed(clock), now)
        self.fail(now, f"clock_end of clock {clock} failed on {worker}:\n{error}")
        return []

    def stop(self, clock: int) -> None:
        """The driver stops after ``clock``: no later clock starts or applies."""
        self.window.stop(clock)
        self._sync_queue()

    @property
    def quiet(self) -> bool:
        """Nothing is being applied or ended: the tables hold still (the driver gathers them)."""
        return self.window.in_flight is None and self.window.clock_end is None and not self.snapshotting

    # --------------------------------------------------------------- losses
    def lose(self, worker: str, now: float) -> list[Effect]:
        if worker in self.lost:
            return []
        w = self.window
        in_flight = w.in_flight
        owned, restores = self._forget_worker(worker, self.queue.held_by(worker), set(), now)
        if self.failed or restores is None:
            return []
        self._give_back_idle()  # its attempts were requeued by the queue
        actions = w.lose(worker, restores=restores,
                         reductions_lost=any(self.cfg.kinds[t] == "reduction" for t, _ in owned),
                         owned_in_flight=bool(owned) and in_flight is not None)
        if self.clock_end_worker == worker and w.clock_end is not None:
            actions += w.clock_end_failed(w.clock_end)
        return self._carry(actions, now)

    def rebase(self, manifest: dict) -> None:
        """The job resumes from an older manifest than it was started with (a newer one did not
        verify; the driver says so before its first clock): the window opens the clock after that
        manifest's, or the driver would wait for ever for a clock the window never runs."""
        if self.begun:
            raise RuntimeError("rebase after the first clock began")
        super().rebase(manifest)
        w = self.window
        self.window = ClockWindow(self.cfg.n_shards, w.staleness, has_rebuild=w.has_rebuild,
                                  floor=self.machine.clock, limit=w.limit)
        self.window.resume_from(manifest_cut(manifest, self.cfg.n_shards))
        self.window.needs_rebuild = self.window.applied_before = w.needs_rebuild

    def recovered(self, covered: set[str], now: float) -> list[Effect]:
        self.unrecovered -= covered
        if self.needs_recovery or not self.window.recovering:
            return []
        return self._carry(self.window.recovered(), now)

    def progress(self) -> tuple[Any, bool]:
        w = self.window
        key = (w.epoch, w.floor, w.version, len(w.applied), w.clock_end, w.in_flight is not None, w.holding,
               w.recovering, w.rebuilding is not None, *self._queue_progress())
        return key, self.begun and not w.done and not self.failed

    def stall_report(self) -> dict[str, Any]:
        w = self.window
        phases = Counter(w.phase(s).value for s in range(self.cfg.n_shards))
        return {**super().stall_report(), "stage": "ssp", "open_clocks": w.open_clocks(), "shard_phases": dict(phases),
                "batch_in_flight": None if w.in_flight is None else [list(u) for u in w.in_flight.updates],
                "clock_end": w.clock_end, "clock_end_worker": self.clock_end_worker, "holding": w.holding}

    def snapshot(self, live: set[str], now: float) -> dict[str, Any]:
        out = super().snapshot(live, now)
        w = self.window
        out.update(stage="ssp", recovering=w.recovering, run_id=w.epoch, open_clocks=w.open_clocks(),
                   staleness=w.staleness)
        return out
