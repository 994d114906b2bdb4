"""Who fetches which staged updates from whom when a pass is applied: direct, or through a tree.

Pure (no Dask). At the end of a pass every owner must apply, exactly once, the committed attempts'
updates to its partitions, and those updates are staged on the workers that ran the attempts (the
*stagers*). Fetching them **directly** costs one message per (owner, stager) pair whose stager staged
something for the owner: W·(W−1) a pass where every shard touches every partition (MLR, Lasso's
gradient tables), O(W²) messages a clock. Past ``direct_per_worker``·W such fetches the plan is an
**aggregation tree** of fan-in ``fanin`` over the stagers: each stager *combines* (fetches its
children's combined sets, all partitions, and adds its own committed attempts' updates), and each
owner fetches only its partitions from the root, less the updates it staged itself. Every stager is
fetched from once and every owner fetches once: fewer than 2·W messages a pass.

Combining concatenates: each update keeps its key, table, partition, first row and rows, so the owner
applies the same updates in the same (shard) order as under the direct plan, with the same sums to the
last bit. (Adding dense deltas of one partition at a combiner would save bytes, but floating-point
addition is not associative: the sums would differ from the direct plan's, so it is not done.)

Keys are opaque here (the glue uses ``(clock, shard, attempt)``); ``touched`` is what the commits
reported (``partition_store.touched_parts``, merged per worker): ``{table: [parts] or None}`` (None:
every partition of the table), or None for a worker whose updates are not known (it may touch any).

**Inline updates.** An attempt whose staged updates are small (``rides_commit``: at most
``INLINE_BYTES``) sends them with its commit, one payload per partition; the coordinator holds them
until the pass is applied and puts each in the apply message of that partition's owner
(``Role.inline``). Nobody fetches those keys: at W stagers of a few rows each and one owner, that
owner's W - 1 fetch round trips a pass become none, and each stager serves none.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Hashable, Iterable, Mapping

#: ``(table, part)``
Part = tuple[str, int]
#: how many direct fetches per worker a pass may cost before the plan uses a tree (``dscar.apply-direct-per-worker``)
DIRECT_PER_WORKER = 8
#: how many children a combiner fetches from (``dscar.apply-fanin``)
FANIN = 16
#: an attempt whose staged updates hold at most this many bytes (their arrays) sends them with its
#: commit (``rides_commit``). A fetch round trip costs its owner and its stager ~0.6-0.9 ms of CPU
#: each (bench.hollow at W = 64, on 2 cores); passing bytes through the scheduler costs it a copy in and
#: one out, ~1 us a KiB, so 4 KiB adds < 10 us to the commit and the apply while it saves a round trip.
#: Kept small because every inline byte of a pass passes the scheduler's one event loop: 1,000 such
#: stagers add at most 4 MB (a few ms) a clock there, where larger updates are fetched worker to worker.
#: ``dscar.apply-inline-bytes`` sets it; 0: every update is fetched.
INLINE_BYTES = 4 * 1024


def rides_commit(nbytes: int, limit: int = INLINE_BYTES) -> bool:
    """Whether an attempt's staged updates of ``nbytes`` bytes go with its commit (inline) rather
    than stay on the worker until each owner fetches them (``limit`` 0: none do)."""
    return limit > 0 and 0 <= nbytes <= limit


def merge_touched(into: dict[str, set[int] | None], touched: dict[str, Any]) -> None:
    """Add one attempt's ``touched_parts`` (as a message carries it) to ``into`` (None: every partition)."""
    for table, parts in touched.items():
        if parts is None or into.get(table, set()) is None:
            into[table] = None
        else:
            into.setdefault(table, set()).update(int(p) for p in parts)


def touches(touched: Mapping[str, Any] | None, owned: Iterable[Part]) -> bool:
    """Whether updates that touched ``touched`` (None: unknown) may add to any partition in ``owned``."""
    if touched is None:
        return True
    for table, part in owned:
        if table in touched and (touched[table] is None or int(part) in touched[table]):
            return True
    return False


@dataclass(frozen=True)
class Combine:
    """A stager's part in the tree: what it serves is its own keys' updates plus its children's sets."""

    #: the committed keys staged on this worker (each checked to be staged here under the pass's run)
    keys: tuple
    #: ``(worker, height)`` of the stagers it fetches combined sets from (height: of their subtrees)
    children: tuple[tuple[str, int], ...]
    #: how many keys its combined set holds (its subtree's): a mismatch is a bug, not a loss
    expect: int
    #: this worker's height in the tree (a leaf's is 0)
    height: int


@dataclass(frozen=True)
class Role:
    """What one worker does when a pass is applied (its share of the apply message)."""

    #: direct: ``(stager, keys)`` to fetch its updates to this owner's partitions from
    fetch: tuple[tuple[str, tuple], ...] = ()
    #: tree: the root to fetch this owner's partitions from (its own updates excepted), or None
    root: str | None = None
    #: tree: the root's height (how many hops its answer waits on)
    root_height: int = 0
    #: tree: how many keys the root's answer holds (every tree key this worker did not stage)
    expect: int = 0
    #: tree: this worker's combine step, when it is a stager in the tree
    combine: Combine | None = None
    #: ``(key, (table, part))`` of the updates to this owner's partitions that rode their commits: the
    #: coordinator puts them in the apply message (nothing is fetched for those keys)
    inline: tuple[tuple[Hashable, Part], ...] = ()

    def to_msg(self) -> dict:
        """The role as the apply message carries it (lists and ints only)."""
        out: dict[str, Any] = {}
        if self.fetch:
            out["fetch"] = [[w, [list(k) for k in keys]] for w, keys in self.fetch]
        if self.root is not None:
            out["tree"] = {"root": self.root, "height": self.root_height, "expect": self.expect}
        if self.combine is not None:
            c = self.combine
            out["combine"] = {"keys": [list(k) for k in c.keys], "children": [[w, h] for w, h in c.children],
                              "expect": c.expect, "height": c.height}
        if self.inline:
            out["inline"] = [[list(k), t, p] for k, (t, p) in self.inline]
        return out


@dataclass(frozen=True)
class ApplyPlan:
    """Every worker's role in applying one pass (workers with nothing to do have none)."""

    #: whether the updates go through the tree
    tree: bool
    #: worker -> its role
    roles: dict[str, Role] = field(default_factory=dict)
    #: the tree's members in heap order (node i's parent is node (i-1)//fanin); empty: direct
    members: tuple[str, ...] = ()
    fanin: int = FANIN

    def role(self, worker: str) -> Role:
        return self.roles.get(worker, Role())

    def messages(self) -> int:
        """Worker-to-worker messages the plan costs: fetches by owners and by combiners."""
        return sum(fetch_count(self, w) for w in self.roles)

    def depth(self) -> int:
        """Edges from the deepest tree member up to the root (0: direct, or one member)."""
        return max((_depth(i, self.fanin) for i in range(len(self.members))), default=0)


def _depth(i: int, fanin: int) -> int:
    d = 0
    while i:
        i, d = (i - 1) // fanin, d + 1
    return d


def plan_apply(stagers: Mapping[str, Iterable[Hashable]], touched: Mapping[str, Mapping[str, Any] | None],
               owners: Mapping[str, Iterable[Part]], fanin: int = FANIN,
               direct_per_worker: float = DIRECT_PER_WORKER,
               inline: Mapping[Hashable, Iterable[Part]] | None = None) -> ApplyPlan:
    """The fetch plan of a pass.

    ``inline``: key -> the partitions its updates reach, for the keys whose updates rode their
    commit (``rides_commit``): each goes to the owner of each of those partitions (``Role.inline``)
    but to its own stager, and nobody fetches it; ``touched`` must describe only the other keys.

    ``stagers``: worker -> the committed keys it ran (their updates are staged there); ``touched``:
    worker -> the partitions those updates touched (a worker missing, or None: unknown, any);
    ``owners``: every live worker -> the partitions it owns. Direct while the fetches it costs are at
    most ``direct_per_worker`` times the number of workers, otherwise a tree of fan-in ``fanin``.
    Its cost is O(W + partitions + what the commits touched), not O(W²), even where every stager
    touches every owner (then the direct plan's count is cut short at its limit)."""
    if fanin < 2:
        raise ValueError(f"dscar.apply-fanin must be at least 2, not {fanin}")
    if not direct_per_worker >= 0:
        raise ValueError(f"dscar.apply-direct-per-worker must be a number >= 0, not {direct_per_worker}")
    owned = {w: [(t, int(p)) for t, p in parts] for w, parts in owners.items()}
    if inline:
        fetched = {w: rest for w, keys in stagers.items() if (rest := [k for k in keys if k not in inline])}
        # (every update rode its commit, as small tables' do: nothing to fetch, no plan of fetches to make)
        plan = plan_apply(fetched, touched, owned, fanin, direct_per_worker) if fetched else ApplyPlan(False, fanin=fanin)
        return _with_inline(plan, stagers, inline, owned)
    stagers = {w: tuple(keys) for w, keys in stagers.items() if keys}
    touchers = _Touchers(stagers, touched)
    limit = direct_per_worker * max(len(set(owned) | set(stagers)), 1)
    need: dict[str, list[str]] = {}
    count = 0
    for o in sorted(w for w, parts in owned.items() if parts) if not touchers.anywhere else sorted(owned):
        for s in touchers.touching(owned[o], o):  # (an owner of no partition is touched only by unknown updates)
            need.setdefault(o, []).append(s)
            count += 1
            if count > limit:
                break
        if count > limit:
            break
    else:
        return ApplyPlan(False, {o: Role(fetch=tuple((s, stagers[s]) for s in ss)) for o, ss in need.items()},
                         fanin=fanin)
    members = tuple(sorted(s for s in stagers if touchers.reaches_other(s, owned)))
    if not members:  # (only stagers of unknown updates, "touching" owners of no partition: nothing to fetch)
        return ApplyPlan(False, fanin=fanin)
    needs = {o for o, parts in owned.items() if next(touchers.touching(parts, o), None) is not None}
    index = {w: i for i, w in enumerate(members)}
    children = {i: list(range(i * fanin + 1, min(i * fanin + fanin, len(members) - 1) + 1))
                for i in range(len(members))}
    height: dict[int, int] = {}
    size: dict[int, int] = {}
    for i in reversed(range(len(members))):  # children have larger indices: done first
        height[i] = max((height[c] + 1 for c in children[i]), default=0)
        size[i] = len(stagers[members[i]]) + sum(size[c] for c in children[i])
    root, total = members[0], size[0]
    roles: dict[str, Role] = {}
    for w in sorted(needs | set(members)):
        combine = None
        if w in index:
            i = index[w]
            combine = Combine(stagers[w], tuple((members[c], height[c]) for c in children[i]), size[i], height[i])
        own = len(stagers[w]) if w in index else 0
        if w in needs:  # (the root reads its own combined set, without a message)
            roles[w] = Role(root=root, root_height=height[0], expect=total - own, combine=combine)
        else:
            roles[w] = Role(combine=combine)
    return ApplyPlan(True, roles, members, fanin)


def _with_inline(plan: ApplyPlan, stagers: Mapping[str, Iterable[Hashable]], inline: Mapping[Hashable, Iterable[Part]],
                 owned: Mapping[str, list[Part]]) -> ApplyPlan:
    """``plan`` with each inline key's partitions given to their owners (not to the key's stager,
    which applies its own staged copy; a partition no live worker owns is applied by nobody, as a
    fetch would be)."""
    owner_of = {part: w for w, parts in owned.items() for part in parts}
    got: dict[str, list] = {}
    for s in sorted(stagers):
        for key in stagers[s]:
            for t, p in inline.get(key, ()):
                o = owner_of.get((t, int(p)))
                if o is not None and o != s:
                    got.setdefault(o, []).append((key, (t, int(p))))
    roles = dict(plan.roles)
    for o, entries in got.items():
        roles[o] = replace(roles.get(o, Role()), inline=tuple(entries))
    return ApplyPlan(plan.tree, roles, plan.members, plan.fanin)


class _Touchers:
    """Which stagers touched which partitions, indexed by partition (a stager of unknown updates, or
    one that touched every partition of a table, is kept once, not once per partition)."""

    def __init__(self, stagers: Mapping[str, tuple], touched: Mapping[str, Mapping[str, Any] | None]):
        self.touched = {s: touched.get(s) for s in stagers}
        #: stagers whose updates are unknown: they may touch any partition
        self.anywhere = sorted(s for s, t in self.touched.items() if t is None)
        #: table -> stagers that touched every partition of it
        self.whole: dict[str, list[str]] = {}
        #: (table, part) -> stagers that touched it (and not the whole table)
        self.part: dict[Part, list[str]] = {}
        #: (table, part) -> its live owner, made on first use by ``reaches_other``
        self._owner_of: dict[Part, str] | None = None
        for s in sorted(stagers):
            for table, parts in (self.touched[s] or {}).items():
                if parts is None:
                    self.whole.setdefault(table, []).append(s)
                else:
                    for p in parts:
                        self.part.setdefault((table, int(p)), []).append(s)

    def touching(self, parts: list[Part], me: str):
        """The stagers other than ``me`` that touched any of ``parts``, each once (lazily: a caller
        that needs only the first, or a count up to a limit, pays for no more)."""
        seen = {me}
        for lists in ([self.anywhere], [self.whole.get(t, ()) for t in sorted({t for t, _ in parts})],
                      [self.part.get(p, ()) for p in parts]):
            for ss in lists:
                for s in ss:
                    if s not in seen:
                        seen.add(s)
                        yield s

    def reaches_other(self, s: str, owned: Mapping[str, list[Part]]) -> bool:
        """Whether ``s`` touched a partition another live worker owns (someone fetches from it)."""
        if self._owner_of is None:
            self._owner_of = {part: w for w, parts in owned.items() for part in parts}
            self._owners = {w for w, parts in owned.items() if parts}
            self._table_owners: dict[str, set[str]] = {}
            for (table, _), w in self._owner_of.items():
                self._table_owners.setdefault(table, set()).add(w)
        t = self.touched[s]
        if t is None:
            return _other(self._owners, s)
        for table, parts in t.items():
            if parts is None:
                if _other(self._table_owners.get(table, set()), s):
                    return True
            elif any(self._owner_of.get((table, int(p)), s) != s for p in parts):
                return True
        return False


def _other(workers: set[str], s: str) -> bool:
    """Whether ``workers`` holds one other than ``s``."""
    return len(workers) > (s in workers)


def fetch_count(plan: ApplyPlan, worker: str) -> int:
    """The messages ``worker`` sends to apply the pass (the root fetches from itself locally)."""
    r = plan.role(worker)
    return len(r.fetch) + (r.root is not None and r.root != worker) + (len(r.combine.children) if r.combine else 0)


def shard_ranges(shards: Iterable[int]) -> list[list[int]]:
    """``[[lo, hi), ...]`` covering exactly ``shards``: what an apply message says of a clock's committed
    shards (every worker drops its copies of those another worker won), in a few numbers where the
    pass's shards are a data phase's contiguous block."""
    out: list[list[int]] = []
    for s in sorted(set(int(s) for s in shards)):
        if out and out[-1][1] == s:
            out[-1][1] = s + 1
        else:
            out.append([s, s + 1])
    return out


def batch_fields(committed: Iterable, clocks: Iterable[int]) -> tuple[dict[str, tuple[list, list]], list]:
    """What an apply message says to each worker, of a BSP pass (its commits all of one clock) or an SSP
    batch (``committed``: ``[shard, attempt, worker]`` of each of its commits, ``clocks`` theirs):
    ``own[worker]``, its commits and their clocks, and for every worker the committed shards per clock as
    ranges, ``[[clock, [[lo, hi), ...]], ...]`` (each worker drops its copies of those another worker won).
    Each message is the size of its worker's commits and a few ranges, where every worker was sent every
    commit of an SSP batch: O(W) bytes a message, O(W^2) a batch (95 kB a clock a worker at W = 1,024 simulated)."""
    own: dict[str, tuple[list, list]] = {}
    by_clock: dict[int, list[int]] = {}
    for (shard, attempt, worker), clock in zip(committed, clocks):
        mine = own.setdefault(worker, ([], []))
        mine[0].append([int(shard), int(attempt), worker])
        mine[1].append(int(clock))
        by_clock.setdefault(int(clock), []).append(int(shard))
    return own, [[c, shard_ranges(ss)] for c, ss in sorted(by_clock.items())]


def apply_receivers(targets: Iterable[str], owners: Iterable[str], plan: ApplyPlan, keep: Iterable[str] = (),
                    shards_moved: bool = True, involved: Iterable[str] | None = None) -> list[str]:
    """The ``targets`` a BSP pass's apply message must reach, in their order: every owner of a
    partition (``owners``), every worker with a role in ``plan`` (fetches, a combine step) and every
    worker in ``keep`` (the folded clock end's, a joiner's, ...). The others have nothing to apply
    when no committed attempt of the pass moved a shard's data or state (``shards_moved`` False:
    each ran on the shard's holder and set no state): their message would only drop what they
    staged and raise the run they have seen applied, which their next work item's newer run does
    as well (``Job.settle_before``). At W workers and one owner that is W - 1 messages a pass.

    When a shard moved, the workers whose shard stores the apply changes must get it too:
    ``involved``, those the moves involved (each moved or stopped or failed attempt's worker, the
    shard's holder before it, every worker handed a copying attempt of the pass and the holder it
    copied from: a copy is dropped, a new state installed, a running copy's attempt learns it lost);
    None: not known, every target gets it."""
    if shards_moved and involved is None:
        return list(targets)
    needed = set(owners) | set(keep) | {w for w, role in plan.roles.items() if role.to_msg()}
    if shards_moved:
        needed |= set(involved or ())
    return [w for w in targets if w in needed]
