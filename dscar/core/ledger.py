"""Checkpoint bookkeeping and recovery plans (no Dask here).

``CheckpointLedger`` follows every checkpoint version from the moment the
coordinator asks the owners to snapshot it to the moment the driver has
published its manifest:

    pending (writers still writing) ─▶ complete (a manifest is built) ─▶ published
                 └─ a writer failed or was lost ─▶ abandoned (never visible)

A version is *complete* once every writer reported its files durable and
checksummed; its manifest names only those files. Versions complete in
order: a priority checkpoint's chain extends the previous manifest's. A
complete manifest may serve a recovery before the driver has published it
(its files are durable and verified); only publication makes it visible to a
later ``resume``.

``plan_recovery`` decides, from the ownership map and the ledger, what a loss
costs: which partitions come back from where (partial recovery: the lost
owner's only; full recovery: every param table rolls back), onto which live
worker, and which shards take their state from a checkpoint. The same
``restore_candidates`` list (newest checkpoint that verifies first, then the
initial values, "checkpoint 0") serves recovery and resume; ``restore_sources``
puts a live buddy's memory copy before it and leaves out a copy whose holder died
(the owner and its buddy lost together: their partitions come from disk).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from ..checkpoint import FORMAT, MAX_CHAIN, NEWEST_TAKEN, chain_key


@dataclass
class PendingVersion:
    """A checkpoint version whose writers have not all reported."""

    version: int
    clock: int
    #: workers still writing their files
    waiting: set[str]
    #: the files reported so far (path, sha256, bytes, table/part or shards)
    files: list[dict] = field(default_factory=list)
    #: why the version cannot complete (a writer failed or was lost); None while it can
    failed: str | None = None
    #: partitions ``(table, part)`` this version saves whole (their chains reached ``max_chain``)
    whole: set = field(default_factory=set)
    #: per shard, the newest clock whose update the saved tables hold (SSP: may pass ``clock``);
    #: None: ``clock`` for every shard (BSP)
    cut: list[int] | None = None


class CheckpointLedger:
    """Versions pending, complete (manifest built, waiting to be published) and published."""

    def __init__(self, policy: str, keep: int, resume: dict | None = None, max_chain: int = MAX_CHAIN):
        #: "full" (each version replaces every chain) or "priority" (each version extends them)
        self.policy = policy
        #: published versions kept for recovery
        self.keep = max(int(keep), 1)
        #: a priority chain this long has its partition saved whole next (``whole_due``)
        self.max_chain = max(int(max_chain), 2)
        #: the newest version started
        self.version = 0
        #: versions still being written, by number
        self.pending: dict[int, PendingVersion] = {}
        #: the newest manifest built (the next priority chain extends it)
        self.built: dict | None = None
        #: complete manifests the driver has not published yet, oldest first
        self.to_publish: list[dict] = []
        #: published manifests, oldest first (at most ``keep``)
        self.published: list[dict] = []
        #: shard -> the clock its state was last saved (the rotation of state saves)
        self.state_saved: dict[int, int] = {}
        if resume is not None:
            self.rebase(resume)

    def rebase(self, manifest: dict) -> None:
        """Continue from ``manifest`` (a resume: its chains are the ones the next version extends).
        New versions are numbered past ``manifest``'s and past every number the store showed
        (``NEWEST_TAKEN``, set by ``checkpoint.find_resume``: a newer manifest that could not be read,
        an abandoned version's folder), so no version is written over another."""
        self.published, self.built = [manifest], manifest
        self.version = max(self.version, int(manifest["version"]), int(manifest.get(NEWEST_TAKEN, 0)))
        self.state_saved = {int(s): int(manifest["clock"]) for s in manifest.get("states", {})}

    def start(self, clock: int, writers: Iterable[str], whole: Iterable[tuple[str, int]] = (),
              cut: list[int] | None = None) -> int:
        """A new version: ``writers`` snapshot now and report when their files are durable;
        the partitions of ``whole`` (``whole_due``) save all their rows. ``cut``: per shard, the
        newest clock whose update the snapshot holds (SSP), kept in the manifest so that a resume
        applies none of them again."""
        self.version += 1
        self.pending[self.version] = PendingVersion(self.version, clock, set(writers), whole=set(whole),
                                                    cut=None if cut is None else [int(c) for c in cut])
        return self.version

    def whole_due(self, parts: dict[str, int]) -> list[tuple[str, int]]:
        """Partitions ``(table, part)`` the next version should save whole: their chains in the
        newest manifest hold ``max_chain`` entries and no pending version saves them whole yet.

        Longest chains first, at most one partition in ``max_chain`` per version: chains that grew
        together are made whole over several versions, not in one burst of bytes. Whatever
        happens to the version (abandoned: a writer lost), the chain stays long and is asked again.
        """
        if self.policy != "priority" or self.built is None:
            return []
        asked = set().union(*(p.whole for p in self.pending.values()))
        chains = self.built["chains"]
        lengths = [(len(chains.get(chain_key(t, p), ())), t, p) for t, n in parts.items() for p in range(n)]
        due = [x for x in lengths if x[0] >= self.max_chain and x[1:] not in asked]
        cap = -(-sum(parts.values()) // self.max_chain)
        return [(t, p) for _, t, p in sorted(due, key=lambda x: (-x[0], x[1], x[2]))[:cap]]

    def written(self, version: int, worker: str, files: list[dict], error: str | None = None) -> bool:
        """``worker`` finished writing ``version`` (or failed); False for an unknown version."""
        p = self.pending.get(version)
        if p is None:
            return False
        p.files.extend(files)
        p.waiting.discard(worker)
        if error:
            p.failed = f"{worker}: {error}"
        return True

    def writer_lost(self, worker: str) -> None:
        """A worker was lost: every version it was still writing can never complete."""
        for p in self.pending.values():
            if worker in p.waiting:
                p.failed = f"{worker} was lost while writing"

    def build(self, parts: dict[str, int], now: float, **fields: Any) -> tuple[list[dict], list[tuple[int, str]]]:
        """Turn complete versions into manifests, oldest first.

        ``parts``: param table -> number of partitions; ``fields`` are copied into every
        manifest. Returns the new manifests and ``(version, reason)`` of every abandoned version.
        """
        built, abandoned = [], []
        while self.pending:
            v = min(self.pending)
            p = self.pending[v]
            if p.failed:
                abandoned.append((v, p.failed))
                del self.pending[v]
                continue
            if p.waiting:
                break
            del self.pending[v]
            prev = self.built["chains"] if self.built else {}
            chains = {}
            for table, n_parts in parts.items():
                for part in range(n_parts):
                    key = chain_key(table, part)
                    new = [f for f in p.files if f.get("table") == table and f.get("part") == part]
                    whole = bool(new) and (self.policy == "full" or not new[-1].get("partial", True))
                    chains[key] = new if whole else list(prev.get(key, [])) + new  # a whole save starts it anew
            states = dict(self.built["states"]) if self.built else {}  # shard -> newest file with its state
            for f in p.files:
                for shard in f.get("shards", ()):
                    states[str(shard)] = f
                    self.state_saved[int(shard)] = p.clock
            manifest = {
                **fields, "format": FORMAT, "version": v, "clock": p.clock, "policy": self.policy, "chains": chains,
                "states": states, "bytes": sum(f["bytes"] for f in p.files), "created": now,
            }
            if p.cut is not None and any(c != p.clock for c in p.cut):
                manifest["cut"] = {str(shard): c for shard, c in enumerate(p.cut)}
            self.built = manifest
            self.to_publish.append(manifest)
            built.append(manifest)
        return built, abandoned

    def mark_published(self, version: int) -> dict | None:
        """The driver wrote ``version``'s manifest; returns it (None if it was not waiting)."""
        for m in self.to_publish:
            if m["version"] == version:
                self.to_publish.remove(m)
                self.published = (self.published + [m])[-self.keep:]
                return m
        return None

    def newest_first(self) -> list[dict]:
        """Every complete manifest a recovery may use, newest first."""
        return list(reversed(self.published + self.to_publish))


def manifest_cut(manifest: dict, n_shards: int) -> list[int]:
    """Per shard, the newest clock whose update ``manifest``'s tables hold: its ``cut`` (an SSP
    checkpoint taken while shards ran ahead), else its clock for every shard (BSP, or a
    manifest written before the cut was kept)."""
    clock = int(manifest["clock"])
    cut = manifest.get("cut") or {}
    return [int(cut.get(str(s), clock)) for s in range(n_shards)]


def cut_refusal(manifest: dict, n_shards: int, consistency: str, staleness: int) -> str | None:
    """Why a fit of ``n_shards`` shards under ``consistency`` and ``staleness`` cannot resume from
    ``manifest`` without applying some update twice or reading past its staleness (None: it can).
    Its cut must name the same shards, and reach no further past its clock than the window allows."""
    cut = manifest.get("cut")
    if not cut:
        return None
    clock, ahead = int(manifest["clock"]), max(int(c) for c in cut.values()) - int(manifest["clock"])
    if len(cut) != n_shards:
        return (f"checkpoint version {manifest['version']} holds updates past its clock {clock} (an SSP cut) of "
                f"{len(cut)} shards; resume it with {len(cut)} shards, not {n_shards}")
    if consistency != "ssp" or ahead > staleness:
        return (f"checkpoint version {manifest['version']} holds updates of shards up to {ahead} clock(s) past its "
                f"clock {clock} (an SSP cut); resume it with consistency='ssp' and staleness >= {ahead}")
    return None


def restore_candidates(manifests: list[dict], table: str, part: int) -> list[tuple[int, list[dict]]]:
    """``(version, chain)`` to try in order for one partition: each manifest's chain, newest
    first, then ``(0, [])`` — the initial values, which always verify."""
    key = chain_key(table, part)
    return [(int(m["version"]), list(m["chains"].get(key, []))) for m in manifests] + [(0, [])]


def restore_sources(manifests: list[dict], table: str, part: int, memory: tuple[str, int] | None,
                    live: Iterable[str], tried: Iterable[tuple[int, str | None]] = ()) -> list[tuple[int, list[dict], str | None]]:
    """``(version, chain, holder)`` to try in order for one partition, as things stand now.

    First the memory tier's copy (``memory``: ``(holder, clock)``; ``version`` 0, no chain) while its
    holder is ``live``, then ``restore_candidates`` (``holder`` None). ``tried``: ``(version, holder)``
    of the sources already tried (failed, or their holder gone meanwhile): left out. A copy whose
    holder died is no reason to give up on the partition, nor on the worker restoring it: the disk
    tier serves it, and checkpoint 0 when no version saved it."""
    live, tried = set(live), set(tried)
    sources: list[tuple[int, list[dict], str | None]] = []
    if memory is not None and memory[0] in live:
        sources.append((0, [], memory[0]))
    sources += [(v, chain, None) for v, chain in restore_candidates(manifests, table, part)]
    return [s for s in sources if (s[0], s[2]) not in tried]


@dataclass(frozen=True)
class RecoveryPlan:
    """What a loss costs: partitions to restore (and where), shard states to restore."""

    #: (table, part) -> the live worker that restores and then owns it
    restores: dict[tuple[str, int], str]
    #: shard -> the checkpoint file entry its state comes from before its next step (``INITIAL_STATE``:
    #: none, as before its first step)
    states: dict[int, dict]
    #: manifests to restore from, newest first
    manifests: list[dict]
    #: every param table rolls back (traditional recovery)
    full: bool
    #: (table, part) -> (buddy, clock): restored from the live buddy's memory copy as of ``clock``
    #: (the memory tier), else from ``manifests``
    from_memory: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)

    @property
    def version(self) -> int:
        return int(self.manifests[0]["version"]) if self.manifests else 0


#: a shard's state in a full rollback to a version that never saved it: none, as before its first step
INITIAL_STATE: dict[str, Any] = {"initial": True}


def plan_recovery(
    *,
    owners: dict[tuple[str, int], str],
    kinds: dict[str, str],
    rows: dict[tuple[str, int], int],
    lost: set[str],
    live: list[str],
    full: bool,
    manifests: list[dict],
    lost_shards: Iterable[int],
    n_shards: int,
    mirrors: dict[tuple[str, int], tuple[str, int]] | None = None,
    state_mirrors: dict[int, tuple[str, int]] | None = None,
) -> RecoveryPlan:
    """Plan the restore after the workers in ``lost`` are gone.

    Partial recovery restores only partitions owned by a lost worker, full
    recovery every ``param`` partition (reduction partitions come back as the
    initial values either way: they are recomputed each clock). A lost
    partition goes to the least loaded live worker (by rows owned, counting the
    plan so far); a surviving one is restored in place. Shards whose state was
    lost take it from the newest manifest that saved it; the others keep theirs.
    Full recovery rolls every shard's state back with the tables: to its saved
    copy, or to none (``INITIAL_STATE``) where the version holds none, as at
    checkpoint 0 (a state kept from after the version would not be a rollback).
    Under partial recovery, a lost param
    partition whose memory copy (``mirrors``: ``(table, part) -> (buddy,
    clock)``) is on a live buddy comes from there, unless a disk version is
    newer (a full one, or a priority one by more than a clock). A lost shard's
    state comes from its buddy's memory copy (``state_mirrors``: ``shard ->
    (buddy, clock)``) whenever the buddy is live, however new the disk version
    (its saved file, if any, is kept as the fallback should the copy not be had).
    """
    if not live:
        raise ValueError("no live worker to restore onto")
    load = {w: 0 for w in live}
    for key, w in owners.items():
        if w in load:
            load[w] += rows[key]
    restores: dict[tuple[str, int], str] = {}
    for key in sorted(owners):
        owner = owners[key]
        gone = owner in lost or owner not in load
        if not gone and not (full and kinds[key[0]] == "param"):
            continue
        if gone:
            target = min(sorted(load), key=lambda w: load[w])
            load[target] += rows[key]
        else:
            target = owner
        restores[key] = target
    saved = manifests[0].get("states", {}) if manifests else {}
    shards = range(n_shards) if full else sorted(set(lost_shards))
    if full:  # every shard rolls back: to its saved state, or to none
        states = {int(s): saved.get(str(s), INITIAL_STATE) for s in shards}
    else:  # a lost shard's state from its buddy's memory (the saved file, if any, as a fallback)
        states = {int(s): saved[str(s)] for s in shards if str(s) in saved}
        for s in shards:
            buddy, clock = (state_mirrors or {}).get(int(s), (None, 0))
            if buddy in load:
                states[int(s)] = {"memory": buddy, "clock": clock, "file": saved.get(str(s))}
    # the memory copy holds every row as of its clock; a priority version only the rows that moved
    # most as of its clock: a copy one clock older is preferred to it (it is travelling when a loss
    # strikes at the start of the next clock)
    disk_clock = int(manifests[0].get("clock", 0)) if manifests else 0
    slack = 1 if manifests and manifests[0].get("policy") == "priority" else 0
    from_memory = {} if full else {
        key: mirrors[key] for key in restores
        if key in (mirrors or {}) and kinds[key[0]] == "param" and mirrors[key][0] in load
        and mirrors[key][1] >= disk_clock - slack}
    return RecoveryPlan(restores, states, list(manifests), full, from_memory)


def describe(plan: RecoveryPlan) -> dict[str, Any]:
    """The plan as an event's fields."""
    return {"partitions": [[t, p, w] for (t, p), w in sorted(plan.restores.items())],
            "shard_states": sorted(plan.states), "version": plan.version,
            "policy": "full" if plan.full else "partial",
            "from_memory": [[t, p, b, c] for (t, p), (b, c) in sorted(plan.from_memory.items())],
            "states_from_memory": [[s, e["memory"], e["clock"]] for s, e in sorted(plan.states.items())
                                   if "memory" in e]}


def perturbations(events: list[dict]) -> dict[str, dict[str, float]]:
    """Per table, the perturbation a recovery caused, ``sqrt(sum ||restored - lost||^2)`` over its
    restored partitions, and the norm of what was lost: from its ``partition-perturbation`` events
    (simulated losses); empty when there are none."""
    pert: dict[str, float] = {}
    lost: dict[str, float] = {}
    for e in events:
        if e.get("kind") == "partition-perturbation":
            pert[e["table"]] = pert.get(e["table"], 0.0) + e["perturbation"] ** 2
            lost[e["table"]] = lost.get(e["table"], 0.0) + e["lost_norm"] ** 2
    if not pert:
        return {}
    return {"perturbation": {t: v ** 0.5 for t, v in pert.items()}, "lost_norm": {t: v ** 0.5 for t, v in lost.items()}}
