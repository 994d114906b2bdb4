"""The messages between the coordinator and the workers' shard runners, typed (no Dask here).

A worker's runner asks for work (``dscar_next``, a long poll) and gets a work item: a batch of one
or more shard attempts (``WorkItem``, ``op`` "shard" or "rebuild"), a clock-end step
(``ClockEndItem``) or ``idle``. It runs the batch's attempts, then sends one ``Commit`` naming every
attempt that finished (``Finished``), those stopped as lost races (``Stopped``) and the members it
gave back unstarted; the ``CommitAnswer`` says which were granted and carries its next work item
(a BSP commit waits for it, as a long poll: ``Commit.wait``). So a worker with k shards a clock costs
about one commit, not k grants and k commits.

On the wire every message is a plain dict of ints, strings, lists and dicts (msgpack); the classes
here are what each side builds and reads: ``to_msg`` at the sending edge, ``from_msg`` at the
receiving one, and the wire stays what it was. (The apply message is not typed here yet.)

The handler tables (``Coordinator.handlers``, ``ParamServer.handlers``) name each handler by its op;
``handler_name`` is the one place that makes Dask's handler name of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: the prefix of every dscar handler on the scheduler and the workers
PREFIX = "dscar_"

#: the answer of a long poll that found nothing to do
IDLE: dict[str, str] = {"op": "idle"}


def handler_name(op: str) -> str:
    """Dask's name of the dscar handler ``op`` (``next`` -> ``dscar_next``)."""
    return PREFIX + op


@dataclass
class Member:
    """One shard attempt of a work item."""

    shard: int
    attempt: int
    #: the worker to copy the shard's data from (None: it is here)
    fetch_from: str | None = None
    #: a backup attempt (the shard's primary still runs)
    backup: bool = False
    #: the name of the data phase the shard belongs to (None: the model has one)
    phase: str | None = None
    #: where a recovery restores the shard's state from (a checkpoint entry), if it does
    state_file: Any = None
    #: under SSP, the clock of this attempt, the newest own update it has seen, and whether its writer is it
    clock: int | None = None
    seen: Any = None
    mine: bool | None = None

    _OPTIONAL = ("state_file", "clock", "seen", "mine")

    def to_msg(self) -> dict[str, Any]:
        msg = {"shard": self.shard, "attempt": self.attempt, "fetch_from": self.fetch_from, "backup": self.backup,
               "phase": self.phase}
        for k in self._OPTIONAL:
            if (v := getattr(self, k)) is not None:
                msg[k] = v
        return msg

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> "Member":
        return cls(int(msg["shard"]), int(msg["attempt"]), msg.get("fetch_from"), bool(msg.get("backup", False)),
                   msg.get("phase"), *(msg.get(k) for k in cls._OPTIONAL))


@dataclass
class WorkItem:
    """A batch of shard attempts for one worker, run in order (``op``: "shard", or "rebuild" for a
    rebuild pass). Members not started yet may be given back (``dscar_release``)."""

    op: str
    job: str
    #: the item's id (counts up per job): a release names it
    item: int
    clock: int
    run: int
    #: ``[table, part, owner]`` of every partition (None: left out, the worker holds the map ``owners_token`` names)
    owners: list | None
    shards: list[Member]
    #: this worker's share of a fixed global batch (adaptive batch policy)
    batch_scale: float = 1.0
    #: in a rebuild pass, table -> row ranges a recovery restored
    restored: dict | None = None
    #: under SSP: the window's version, its floor and the oldest clock the batch may read
    version: int | None = None
    floor: int | None = None
    read_floor: int | None = None
    #: where restored shard states are read from, when a member has a ``state_file``
    ckpt_url: str | None = None
    storage_options: dict | None = None
    #: names the owners map (``PartitionMap.for_item``)
    owners_token: str | None = None
    #: BSP: the run of the previous clock's last pass, when this clock began with its apply (``JobState.applying``):
    #: the attempts read each owner's rows once that apply ended there; ``apply_here``: this worker is one it is
    #: sent to, and takes the item up once it ended here
    prev_run: int | None = None
    apply_here: bool | None = None

    _OPTIONAL = ("restored", "version", "floor", "read_floor", "ckpt_url", "storage_options", "owners_token",
                 "prev_run", "apply_here")

    def to_msg(self) -> dict[str, Any]:
        msg = {"op": self.op, "job": self.job, "item": self.item, "clock": self.clock, "run": self.run,
               "owners": self.owners, "batch_scale": self.batch_scale, "shards": [m.to_msg() for m in self.shards]}
        if self.owners is None:
            del msg["owners"]
        for k in self._OPTIONAL:
            if (v := getattr(self, k)) is not None:
                msg[k] = v
        return msg

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> "WorkItem":
        return cls(msg["op"], msg["job"], int(msg["item"]), int(msg["clock"]), int(msg["run"]), msg.get("owners"),
                   [Member.from_msg(m) for m in msg["shards"]], float(msg.get("batch_scale", 1.0)),
                   *(msg.get(k) for k in cls._OPTIONAL))

    def attempts(self) -> list[dict[str, Any]]:
        """Each member with the item's fields, as the runner runs it (a member's own ``clock``
        under SSP wins over the item's)."""
        common = {k: v for k, v in self.to_msg().items() if k != "shards"}
        return [{**common, **m.to_msg()} for m in self.shards]


@dataclass
class ClockEndItem:
    """The clock-end step of ``clock`` (under SSP, of the window's ``version``)."""

    job: str
    clock: int
    run: int
    owners: list
    version: int | None = None
    op: str = "clock_end"

    def to_msg(self) -> dict[str, Any]:
        msg = {"op": self.op, "job": self.job, "clock": self.clock, "run": self.run, "owners": self.owners}
        if self.version is not None:
            msg["version"] = self.version
        return msg

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> "ClockEndItem":
        return cls(msg["job"], int(msg["clock"]), int(msg["run"]), msg["owners"], msg.get("version"))


@dataclass
class ClockEndOutcome:
    """What a clock end folded into a worker's apply (``ApplyPass.clock_end``) came to, sent back in
    the apply's answer (``clock_end``): its ``metrics`` (and ``seconds``), or the ``error`` it raised
    (``unreachable``: the worker it failed to reach), or why it did not run (``not_run``: the item
    path runs it then). ``stop``: the algorithm's stopping rule on the fit's history with these
    metrics (``RuleHistory``; None: not evaluated there, so the driver evaluates it)."""

    metrics: dict[str, float] | None = None
    seconds: float = 0.0
    error: str | None = None
    unreachable: str | None = None
    not_run: str | None = None
    stop: bool | None = None

    def to_msg(self) -> dict[str, Any]:
        if self.metrics is not None:
            return {"metrics": self.metrics, "seconds": self.seconds,
                    **({} if self.stop is None else {"stop": self.stop})}
        if self.error is not None:
            return {"error": self.error, **({} if self.unreachable is None else {"unreachable": self.unreachable})}
        return {"not_run": self.not_run or "not run"}

    @classmethod
    def from_msg(cls, msg: dict[str, Any] | None) -> "ClockEndOutcome":
        """None (no answer, or an apply answered without one): not run."""
        if not isinstance(msg, dict):
            return cls(not_run="no clock-end outcome in the apply's answer")
        if isinstance(msg.get("metrics"), dict):
            stop = msg.get("stop")
            return cls(metrics={str(k): float(v) for k, v in msg["metrics"].items()}, seconds=float(msg.get("seconds", 0.0)),
                       stop=None if stop is None else bool(stop))
        if msg.get("error") is not None:
            return cls(error=str(msg["error"]), unreachable=msg.get("unreachable"))
        return cls(not_run=str(msg.get("not_run", "not run")))


@dataclass
class RuleHistory:
    """The metrics of a fit's completed clocks in order, skipped clocks left out: the history the
    stopping rule (``Algorithm.converged``) reads, as the driver keeps it. The coordinator keeps it
    and sends a worker that runs a folded clock end only the entries it lacks (``part_for``); the
    worker keeps its copy (``extend_copy``) and evaluates the rule there (``ClockEndOutcome.stop``)."""

    #: each completed clock's metrics, from the job's first clock
    metrics: list[dict[str, float]] = field(default_factory=list)
    #: worker -> how many entries it was sent (its copy holds them, unless it lost it)
    sent: dict[str, int] = field(default_factory=dict)

    def add(self, metrics: dict[str, float]) -> None:
        """A clock completed (not skipped) with ``metrics``."""
        self.metrics.append(dict(metrics))

    def part_for(self, worker: str) -> dict[str, Any]:
        """What ``worker``'s copy lacks: ``{"from": index of the first entry, "metrics": entries}``."""
        start = self.sent.get(worker, 0)
        self.sent[worker] = len(self.metrics)
        return {"from": start, "metrics": self.metrics[start:]}

    def forget(self, worker: str) -> None:
        """``worker`` could not evaluate the rule (its copy is not what it was sent): send it everything next."""
        self.sent.pop(worker, None)


def extend_copy(copy: list[dict[str, float]], part: dict[str, Any]) -> bool:
    """A worker's ``copy`` of the history brought up to date with ``part`` (``RuleHistory.part_for``);
    False, leaving it as it was, when it lacks entries sent before (a copy the worker no longer has)."""
    start = int(part["from"])
    if len(copy) < start:
        return False
    del copy[start:]
    copy.extend({str(k): float(v) for k, v in m.items()} for m in part["metrics"])
    return True


@dataclass
class Finished:
    """An attempt that ran to its end and staged its results: it asks to commit."""

    shard: int
    attempt: int
    clock: int
    #: seconds by part of the step (``data_s``, ``pull_s``, ``compute_s``, ...)
    timings: dict | None = None
    #: table -> the partitions its updates touched (None: every one): owners fetch only from stagers
    parts: dict | None = None
    #: the attempt moved its shard's data or state (ran from a copy or a fresh read, as a backup, set or
    #: restored a state): applying its pass changes shard stores, so every worker gets the apply
    moved: bool = False
    #: its staged updates, when small (``apply_plan.rides_commit``): ``[[table, part, payload], ...]``,
    #: one opaque payload per partition, which the coordinator hands to that partition's owner in
    #: the pass's apply message (no owner fetches them); None: they stay staged on the worker
    inline: list | None = None

    def to_msg(self) -> dict[str, Any]:
        return {"shard": self.shard, "attempt": self.attempt, "clock": self.clock, "timings": self.timings,
                "parts": self.parts, **({"moved": True} if self.moved else {}),
                **({} if self.inline is None else {"inline": self.inline})}

    @classmethod
    def from_msg(cls, msg: dict[str, Any], clock: int) -> "Finished":
        return cls(int(msg["shard"]), int(msg["attempt"]), int(msg.get("clock", clock)), msg.get("timings"),
                   msg.get("parts"), bool(msg.get("moved", False)), msg.get("inline"))


@dataclass
class Stopped:
    """An attempt that stopped as a lost race after ``seconds`` (another attempt of its shard won)."""

    shard: int
    attempt: int
    clock: int
    seconds: float = 0.0

    def to_msg(self) -> dict[str, Any]:
        return {"shard": self.shard, "attempt": self.attempt, "clock": self.clock, "seconds": self.seconds}

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> "Stopped":
        return cls(int(msg["shard"]), int(msg["attempt"]), int(msg["clock"]), float(msg.get("seconds", 0.0)))


@dataclass
class Commit:
    """One worker's commit of a work item's attempts (``dscar_commit``): what finished, what stopped,
    and the members it gave back unstarted (``[shard, attempt]``)."""

    job_id: str
    clock: int
    run: int
    worker: str
    commits: list[Finished] = field(default_factory=list)
    #: the item was of a rebuild pass
    rebuild: bool = False
    released: list = field(default_factory=list)
    stopped: list[Stopped] = field(default_factory=list)
    #: when no next item is ready, the answer waits for one (a long poll, as ``dscar_next``): the worker
    #: needs the grants only with its next item (BSP), so its commit and its next poll are one round trip
    wait: bool = False
    #: the wait's timeout (None: the coordinator's idle poll timeout); then the answer's next item is ``IDLE``
    wait_timeout: float | None = None
    #: job -> the token of the owners map the worker holds (``PartitionMap.for_item``)
    owners_known: dict[str, str] | None = None

    def to_msg(self) -> dict[str, Any]:
        """The handler's keyword arguments."""
        msg = {"job_id": self.job_id, "clock": self.clock, "run": self.run, "worker": self.worker,
               "commits": [c.to_msg() for c in self.commits], "rebuild": self.rebuild,
               "released": [list(m) for m in self.released], "stopped": [s.to_msg() for s in self.stopped]}
        if self.wait:
            msg["wait"] = True
            if self.wait_timeout is not None:
                msg["wait_timeout"] = self.wait_timeout
        if self.owners_known:
            msg["owners_known"] = self.owners_known
        return msg

    @classmethod
    def from_msg(cls, job_id: str, clock: int, run: int, worker: str, commits: list, rebuild: bool = False,
                 released: list | None = None, stopped: list | None = None, wait: bool = False,
                 wait_timeout: float | None = None, owners_known: dict | None = None) -> "Commit":
        return cls(job_id, int(clock), int(run), worker, [Finished.from_msg(c, int(clock)) for c in commits],
                   bool(rebuild), [[int(s), int(a)] for s, a in released or ()],
                   [Stopped.from_msg(s) for s in stopped or ()], bool(wait),
                   None if wait_timeout is None else float(wait_timeout), dict(owners_known) if owners_known else None)


@dataclass
class CommitAnswer:
    """Which of a commit's attempts were granted (in order), and the worker's next work item (None: it asks)."""

    granted: list[bool]
    next: dict | None = None

    def to_msg(self) -> dict[str, Any]:
        return {"granted": list(self.granted), "next": self.next}

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> "CommitAnswer":
        return cls([bool(g) for g in msg["granted"]], msg.get("next"))
