"""The clock state machine: where a clock is and what a loss does to it (no Dask here).

This module is the specification of a clock. The coordinator feeds it what
happened (a pass completed, the owners applied, the clock-end step reported, a
worker was lost, a recovery finished) and carries out the actions it returns.

Stages of clock ``t`` (``Stage``)::

    begin ──▶ [REBUILD ─▶ APPLY] ─▶ SHARDS(phase 0) ─▶ APPLY ─▶ SHARDS(phase 1) ─▶ APPLY ─▶ … ─▶ CLOCK_END ─▶ DONE
                                                                                              (a loss) ─▶ SKIPPED
                                                                       (a clock end ahead) CLOCK_END ─▶ ENDING ─▶ DONE
                                                          (the next clock begins with the apply) APPLY ─▶ ENDING ─▶ DONE

* **Data phases.** An algorithm with ``phases`` (ALS: ``user`` then ``item``)
  runs ``SHARDS -> APPLY`` once per data phase, over that phase's own shards;
  each phase's steps see the previous phases' updates. Reduction tables are
  zeroed by the first data phase's apply and sum every phase of the clock.
* **Run id.** One integer raised at every pass that starts (a data phase, a
  rebuild pass, a redo) and at every loss. Everything a worker does is tagged
  with the run id it started under: pulled values are cached per run id, staged
  updates carry it, and a commit or a clock-end report of an older run id is
  refused. So nothing read, staged or computed before a loss or before the
  tables last changed is ever used after.
* **Updates are staged before commit.** A shard attempt stages its update on
  its own worker, then asks to commit; the first attempt to ask wins
  (``dscar.core.shards``). When every shard of the pass has committed, ``APPLY``
  tells every owner to collect and apply exactly the committed attempts'
  updates of this run id; the rest are dropped: each shard's update is applied
  exactly once per completed clock. A worker lost with committed, unapplied
  attempts voids them: during the pass those shards simply run again; during
  ``APPLY`` the clock is skipped (the rebuild pass runs again).
* **A loss** that takes parameter partitions or shard state with it starts a
  recovery (``Recover``); the machine is then ``recovering`` until
  ``recovered()``, and nothing completes meanwhile. What the loss means for the
  clock depends on the stage it hit:

  - ``SHARDS`` / ``REBUILD``: nothing of the pass is applied yet, so the pass
    runs again from its start once recovered (its staged updates discarded;
    earlier, applied data phases are not redone). If a reduction partition was
    lost after an earlier phase of the clock added to it, the clock's
    reductions are incomplete: the clock is skipped at its end.
  - ``APPLY`` / ``CLOCK_END``: some owners may have applied and others not, or
    the clock-end step read a table being restored: the clock is **skipped**. A
    skipped clock never runs (or keeps) its clock-end step, its record says so,
    and the stopping rule does not see it. The clock counter is not rolled back,
    not even by full recovery: rolled-back clocks count as rework.
  - ``DONE`` / between clocks: nothing to redo.
* **A clock end ahead.** Where the clock end only reads the tables, the next clock may begin
  while it runs (``end_ahead``: the clock is ``ENDING``): the next clock's shards run and commit,
  but its first apply is held (``held``) until the clock end reported (``ended_ahead``), so the
  tables stay as the clock end reads them. A recovery restores nothing until it reported (the
  coordinator waits: ``JobState.clock_end_ahead``), so a loss meanwhile changes nothing it reads; where
  it took the clock end itself (its worker, or an owner it still had to read) the clock is skipped
  (``ending_skip``). A held apply is not sent after a loss: its pass is open again (``unhold``) and
  follows the rule for ``SHARDS``.

* **The next clock begins with the apply.** Where the clock end runs ahead, the next clock may begin
  as soon as the clock's last pass is told to apply (``apply_ahead``: ENDING with its apply under way,
  ``ending_applying``): each worker takes up the next clock's work once its own apply is done, and
  reads another owner's rows once that owner's is. ``ending_applied`` ends the apply (every worker
  answered, or it was cut short); the clock end then reports as above. A loss while the apply is under
  way skips the ending clock (``ending_skip``: some owners may have applied, others not, as a loss in
  ``APPLY`` does); the running clock follows its own stage's rule.

  A loss during a recovery simply extends it: the coordinator re-plans from the
  current ownership until no loss is left unrecovered.
* **A kept pass.** A loss in the first data phase's ``SHARDS``, before anything
  of the clock was applied, may *keep* the pass (``lose(keep=True)``): when
  every restore turns out to be an exact memory copy of the clock's start, the
  tables read by the pass are what they were, so the commits of the live
  workers stay and only the lost worker's attempts (running, or committed with
  their updates staged on it) run again. The run id is not raised, commits of
  it are granted during the recovery (the pass completes once it ends), and
  ``recovered(exact=True)`` goes on with the pass. ``recovered(exact=False)``
  (a restore from disk, an older copy, a later loss that cannot keep) falls back
  to the rule above: the run id is raised and the pass runs again from its start.
* **Rebuild pass.** After a recovery, an algorithm that names ``rebuild_tables``
  recomputes them from the data and the shard state in one pass over every
  shard of every phase (those tables are zeroed first), before the interrupted
  data phase runs again or, between clocks, before the next clock's first phase.
  Not before the first pass of the job was applied: then no table holds
  anything to rebuild, and the interrupted pass computes it.
* A loss that takes neither partitions nor shard state (an idle worker that
  held nothing) changes nothing here: its running attempts are simply requeued.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Stage(str, enum.Enum):
    IDLE = "idle"  # no clock begun yet
    REBUILD = "rebuild"  # the rebuild pass: every shard of every phase
    SHARDS = "shards"  # a data phase's shards are handed out and committed
    APPLY = "apply"  # owners apply the committed updates of the pass
    CLOCK_END = "clock-end"  # one worker runs the algorithm's clock-end step
    ENDING = "ending"  # the clock-end step runs while the next clock may begin (``end_ahead``)
    DONE = "done"  # the clock completed; its metrics count
    SKIPPED = "skipped"  # the clock was cut short by a loss; no clock-end step, no metrics


#: the stages that hand shards out, as a module name: every hand-out and commit asks (an enum member's
#: lookup through its class costs ~75 ns)
_HANDING_OUT = (Stage.SHARDS, Stage.REBUILD)


# ---------------------------------------------------------------- actions
@dataclass(frozen=True)
class StartPass:
    """Hand out a pass's shards: ``data_phase`` (None: the rebuild pass over every shard)."""

    run_id: int
    data_phase: int | None
    redo: bool = False  # the pass runs again after a recovery: discard its staged updates first


@dataclass(frozen=True)
class Apply:
    """Every owner applies the committed attempts of ``run_id``; ``reset`` names what starts from zero."""

    run_id: int
    reset_reductions: bool  # the clock's first data phase: reduction tables start from zero
    reset_rebuild: bool  # the rebuild pass: the rebuild tables start from zero


@dataclass(frozen=True)
class RunClockEnd:
    run_id: int


@dataclass(frozen=True)
class Recover:
    """Restore what the lost workers took with them; call ``recovered()`` when done."""

    run_id: int


@dataclass(frozen=True)
class Skip:
    reason: str


Action = StartPass | Apply | RunClockEnd | Recover | Skip


class ClockError(RuntimeError):
    """A transition that the specification does not allow (a bug in the caller)."""


@dataclass
class ClockMachine:
    """The stage of the current clock, its run id and what a loss has left to do.

    Invariants (checked by ``check``):

    * ``recovering`` implies nothing completes: no pass completes, no apply or
      clock-end report is accepted;
    * ``stage is SKIPPED`` implies the clock-end step did not run to completion;
    * the run id never decreases, and rises at every pass start and every loss that
      starts or extends a recovery.
    """

    #: data phases per clock (1 for an algorithm without ``phases``)
    n_phases: int = 1
    #: the algorithm names rebuild tables (they are recomputed after a recovery)
    has_rebuild: bool = False
    #: the clock being run (0 before the first)
    clock: int = 0
    #: where the clock is
    stage: Stage = Stage.IDLE
    #: the active data phase (also during a rebuild pass: the one to go on with)
    data_phase: int = 0
    #: raised by every pass start and every loss; stale work carries an older one
    run_id: int = 0
    #: losses are being recovered; nothing completes meanwhile
    recovering: bool = False
    #: the active pass runs again once recovered
    redo: bool = False
    #: why this clock will be skipped (None: it will not)
    skip_reason: str | None = None
    #: a restore happened: the rebuild pass runs before the next data phase
    needs_rebuild: bool = False
    #: the pass being applied is the rebuild pass
    applying_rebuild: bool = False
    #: some pass has been told to apply: tables may hold the data's contributions. Before that a
    #: loss leaves nothing to rebuild: the interrupted first pass computes the rebuild tables
    #: itself (an algorithm's first step may add them), and a rebuild pass too would count them twice
    applied_before: bool = False
    #: the recovery under way keeps the pass (``lose(keep=True)``): commits of ``run_id`` are granted,
    #: and ``recovered(exact=...)`` says whether the pass goes on or runs again
    keeping: bool = False
    #: (clock, run id) of the clock whose clock end runs ahead of the current clock (``end_ahead``);
    #: None: none. The current clock's first apply waits for it (``held``)
    ending: tuple[int, int] | None = None
    #: why the ending clock's clock end does not count (its worker was lost, or it did not run); None: it counts
    ending_skip: str | None = None
    #: the current clock's applies wait (``held``): a clock end runs ahead, or a snapshot of its clock is
    #: being taken; ``release_held`` ends it
    hold: bool = False
    #: the current clock's first apply, held while ``hold`` (None: none held)
    held: Apply | None = None
    #: the ending clock's last apply is still under way: the current clock began with it (``apply_ahead``)
    ending_applying: bool = False

    # ---------------------------------------------------------- transitions
    def begin(self, clock: int) -> list[Action]:
        """Start clock ``clock`` (after the previous one is DONE or SKIPPED, or ENDING: ``end_ahead``)."""
        if self.stage not in (Stage.IDLE, Stage.DONE, Stage.SKIPPED, Stage.ENDING):
            raise ClockError(f"clock {self.clock} is in stage {self.stage.value}: cannot begin clock {clock}")
        if self.recovering:
            raise ClockError("cannot begin a clock while recovering")
        if clock <= self.clock:
            raise ClockError(f"clock {clock} does not follow clock {self.clock}")
        self.clock, self.data_phase, self.redo, self.skip_reason = clock, 0, False, None
        return [self._start_pass()]

    def pass_complete(self, run_id: int) -> list[Action]:
        """Every shard of the active pass committed under ``run_id``: apply them."""
        if not self.accepts(run_id) or self.stage not in (Stage.SHARDS, Stage.REBUILD):
            return []
        rebuild = self.stage is Stage.REBUILD
        self.stage = Stage.APPLY
        self.applying_rebuild = rebuild
        self.applied_before = True
        apply = Apply(self.run_id, reset_reductions=not rebuild and self.data_phase == 0, reset_rebuild=rebuild)
        if self.hold:  # (the tables stay as the clock end ahead, or its clock's snapshot, reads them)
            self.held = apply
            return []
        return [apply]

    def end_ahead(self) -> None:
        """The clock end (stage ``CLOCK_END``) runs on while the next clock may begin: the clock is
        ``ENDING``; ``ended_ahead`` takes its report."""
        if self.stage is not Stage.CLOCK_END or self.recovering or self.ending is not None:
            raise ClockError(f"clock {self.clock} cannot end ahead in stage {self.stage.value}")
        self.ending, self.ending_skip, self.hold = (self.clock, self.run_id), None, True
        self.stage = Stage.ENDING

    def apply_ahead(self) -> None:
        """The clock's last pass is being applied (stage ``APPLY``) and its clock end runs ahead: the next
        clock may begin now, with the apply. The clock is ``ENDING``, its apply under way until
        ``ending_applied``; ``ended_ahead`` takes its clock end's report, as after ``end_ahead``."""
        if (self.stage is not Stage.APPLY or self.applying_rebuild or self.data_phase + 1 < self.n_phases
                or self.recovering or self.ending is not None or self.skip_reason is not None or self.hold):
            raise ClockError(f"clock {self.clock} cannot begin the next with its apply in stage {self.stage.value}")
        self.ending, self.ending_skip, self.hold, self.ending_applying = (self.clock, self.run_id), None, True, True
        self.stage = Stage.ENDING

    def ending_applied(self, run_id: int) -> bool:
        """The ending clock's last apply (run ``run_id``) ended: every worker answered, or a loss cut it short
        (``ending_skip``). Whether it was under way."""
        if self.ending is None or self.ending[1] != run_id or not self.ending_applying:
            return False
        self.ending_applying = False
        return True

    def ended_ahead(self, run_id: int, ran: bool) -> bool:
        """The clock end ahead of run ``run_id`` reported (``ran``: it ran to completion): whether its
        metrics count. The next clock's applies stay held until ``release_held``."""
        if self.ending is None or self.ending[1] != run_id:
            return False
        counts = ran and self.ending_skip is None and not self.ending_applying
        why, self.ending, self.ending_skip, self.ending_applying = self.ending_skip, None, None, False
        if self.stage is Stage.ENDING:
            self.stage = Stage.DONE if counts else Stage.SKIPPED
            if not counts:
                self.skip_reason = f"the clock end ahead: {why or 'it did not run to completion'}"
        return counts

    def release_held(self) -> list[Action]:
        """The next clock's applies go on (no clock end runs ahead, no snapshot of its clock is taken): the
        held apply, sent now (none where a loss made it stale meanwhile)."""
        if self.ending is not None:
            raise ClockError("a clock end still runs ahead: its applies stay held")
        held, self.held, self.hold = self.held, None, False
        if held is None or held.run_id != self.run_id or self.stage is not Stage.APPLY or self.recovering:
            return []
        return [held]

    def applied(self, run_id: int) -> list[Action]:
        """Every owner applied the pass of ``run_id``: go on with the next pass or the clock-end step."""
        if not self.accepts(run_id) or self.stage is not Stage.APPLY:
            return []
        if self.applying_rebuild:
            self.applying_rebuild = False
            return [self._start_pass()]  # the data phase the rebuild interrupted (or the clock's first)
        if self.data_phase + 1 < self.n_phases:
            self.data_phase += 1
            return [self._start_pass()]
        if self.skip_reason is not None:
            return self._skip()
        self.stage = Stage.CLOCK_END
        return [RunClockEnd(self.run_id)]

    def clock_end_done(self, run_id: int) -> bool:
        """The clock-end step reported under ``run_id``; True if its metrics count (the clock is DONE)."""
        if not self.accepts(run_id) or self.stage is not Stage.CLOCK_END:
            return False
        self.stage = Stage.DONE
        return True

    def unhold(self) -> None:
        """The held apply is not sent: a loss took some of the pass's commits (or restored what its steps
        read), so the pass is open again, as if it had not completed; nothing of it was applied."""
        if self.held is None:
            return
        self.stage = Stage.REBUILD if self.applying_rebuild else Stage.SHARDS
        self.applying_rebuild, self.held = False, None

    def withdraw(self, clock: int) -> None:
        """The clock begun while ``clock``'s end ran ahead is withdrawn (that clock end said stop, or
        left the stopping rule to the driver): nothing of it was applied (its first apply was held), so
        the machine is back at ``clock``'s end, under a new run id that makes what ran of it stale."""
        if self.ending is not None or self.clock != clock + 1:
            raise ClockError(f"clock {self.clock} cannot be withdrawn to clock {clock}")
        self.clock, self.stage, self.data_phase = clock, Stage.DONE, 0
        self.redo, self.skip_reason, self.held, self.hold, self.applying_rebuild = False, None, None, False, False
        self.keeping = False  # (a recovery under way goes on: it restores the tables for the next clock)
        self.run_id += 1

    def lose(self, *, restores: bool, reductions_lost: bool = False, unapplied: bool = False,
             keep: bool = False) -> list[Action]:
        """A worker was lost. ``restores``: it took partitions or shard state with it (a recovery
        is needed); ``reductions_lost``: one of them was a reduction partition; ``unapplied``: it
        took committed updates of the pass being applied with it; ``keep``: its restores are
        expected to be exact copies of the pass's start (a kept pass, above: only in the first data
        phase's ``SHARDS``, and only while no recovery that does not keep the pass is under way)."""
        if restores and keep and self.stage is Stage.SHARDS and self.data_phase == 0 \
                and (self.keeping or not self.recovering):
            was = self.recovering
            self.recovering = self.keeping = True
            return [] if was else [Recover(self.run_id)]
        if restores and self.keeping:  # a loss that cannot keep the pass: the rule for SHARDS
            self.keeping = False
        if unapplied and not restores and self.stage is Stage.APPLY:
            self.run_id += 1  # the apply under way is stale: some owners may have applied, others not
            if self.applying_rebuild:
                self.applying_rebuild, self.needs_rebuild = False, True
                return [self._start_pass(redo=True)]
            self.skip_reason = self.skip_reason or "a worker was lost while the clock's updates were applied"
            return [] if self.recovering else self._skip()
        if not restores:
            return []  # its running attempts are requeued (and its unapplied commits, in a pass); tables keep their values
        self.run_id += 1  # whatever was pulled, staged or computed before is stale now
        self.needs_rebuild = self.needs_rebuild or (self.has_rebuild and self.applied_before)
        if self.stage in (Stage.SHARDS, Stage.REBUILD):
            self.redo = True
            if reductions_lost and self.data_phase > 0 and self.stage is Stage.SHARDS:
                self.skip_reason = "a reduction partition was lost after an earlier data phase of this clock"
        elif self.stage in (Stage.APPLY, Stage.CLOCK_END):
            if self.stage is Stage.APPLY and self.applying_rebuild:
                self.redo, self.applying_rebuild = True, False  # the rebuild pass runs again
                self.stage = Stage.REBUILD
            else:
                self.skip_reason = self.skip_reason or "a worker was lost while the clock's updates were applied"
        was = self.recovering
        self.recovering = True
        return [] if was else [Recover(self.run_id)]

    def clock_end_failed(self) -> list[Action]:
        """The clock-end worker was lost or its step failed because of a loss: skip the clock."""
        if self.stage is not Stage.CLOCK_END:
            return []
        self.skip_reason = self.skip_reason or "the clock-end step was cut short by a loss"
        if self.recovering:
            return []  # recovered() skips it
        self.run_id += 1
        return self._skip()

    def recovered(self, exact: bool = False) -> list[Action]:
        """Every loss so far is recovered: redo the interrupted pass, skip the clock, or go on.
        ``exact``: every restore of a kept pass's recovery was an exact copy of the pass's start:
        the pass goes on under the same run id (otherwise it runs again, as after any loss)."""
        if not self.recovering:
            raise ClockError("recovered() without a recovery")
        self.recovering = False
        if self.keeping:
            self.keeping = False
            if exact:
                return []
            self.run_id += 1  # what ``lose`` did not raise: the pass's commits are void now
            self.needs_rebuild = self.needs_rebuild or (self.has_rebuild and self.applied_before)
            self.redo = True
        self.run_id += 1
        if self.stage in (Stage.SHARDS, Stage.REBUILD) and self.redo:
            self.redo = False
            return [self._start_pass(redo=True)]
        if self.stage in (Stage.APPLY, Stage.CLOCK_END) and self.skip_reason is not None:
            return self._skip()
        return []

    # ------------------------------------------------------------- queries
    def accepts(self, run_id: int) -> bool:
        """Work tagged ``run_id`` may complete now: the current run, no recovery under way."""
        return run_id == self.run_id and not self.recovering

    def grants(self, run_id: int) -> bool:
        """A shard attempt tagged ``run_id`` may commit now: the current run, in a pass that hands
        shards out or is kept through a recovery (its completion waits for ``recovered``)."""
        return run_id == self.run_id and (self.keeping or (not self.recovering and self.stage in _HANDING_OUT))

    @property
    def handing_out(self) -> bool:
        """Shards may be handed out (they may not commit while recovering)."""
        return self.stage in _HANDING_OUT and not self.recovering

    @property
    def finished(self) -> bool:
        return self.stage in (Stage.DONE, Stage.SKIPPED) and not self.recovering

    def check(self) -> None:
        assert self.run_id >= 0
        assert not (self.stage is Stage.IDLE and self.clock), self
        if self.stage is Stage.SKIPPED:
            assert self.skip_reason is not None, self

    # ------------------------------------------------------------- helpers
    def _start_pass(self, redo: bool = False) -> StartPass:
        self.run_id += 1
        if self.needs_rebuild and self.has_rebuild:
            self.needs_rebuild = False
            self.stage = Stage.REBUILD
            return StartPass(self.run_id, None, redo)
        self.needs_rebuild = False
        self.stage = Stage.SHARDS
        return StartPass(self.run_id, self.data_phase, redo)

    def _skip(self) -> list[Action]:
        self.stage = Stage.SKIPPED
        return [Skip(self.skip_reason or "a worker was lost in this clock")]
