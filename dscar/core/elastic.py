"""Elastic membership: how many workers a job can use, which workers Dask may retire, and where a
retiring worker's partitions go (pure: no Dask here).

Dask's adaptive scaling counts only Dask tasks, and dscar runs none, so without help it sees a
fit's workers as idle: it retires them mid-fit (a loss, and rework) and never asks for more. The
coordinator (``dscar.scheduler.coordinator``) answers Dask's two questions with these functions:

- ``workers_wanted``: how many workers a running job can use (its shard count: a worker with no
  shard to run adds nothing; or fewer, by the user's ``dscar.core.elastic-workers``), which the
  coordinator puts under Dask's own ``adaptive_target`` (``adaptive_target``): adaptive grows the
  cluster toward its ``maximum`` while a fit runs and shrinks it once the fit has ended;
- ``retirable``: the candidates Dask may retire as idle (Dask's ``valid_workers_downscaling``,
  ``Elastic.may_retire``): none of a running job's workers.

Joins, hand-offs and losses leave the partitions unevenly owned; ``even_plan`` says which move so
the largest owner holds fewer rows (copied while clocks run, switched at a clock boundary).

A worker retired explicitly (``retire_workers([w])``, ``cluster.scale(n)``) is not vetoed: it hands
its partitions off at the next clock boundary before Dask closes it (``handoff_plan``); under SSP,
once it is drained and the tables hold still (``ssp_leave_step``).
"""
from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Container, Iterable, Mapping
from heapq import heapify, heapreplace


def workers_wanted(n_shards: int, setting: int | None = None) -> int:
    """Workers a job can use: one per shard, at most ``setting`` (the user's ``dscar.core.elastic-workers``;
    None or 0: no limit of the user's). Never fewer than one."""
    if n_shards < 1:
        raise ValueError(f"a job has at least one shard, not {n_shards}")
    if setting is not None and (type(setting) is not int or setting < 0):
        raise ValueError(f"dscar.core.elastic-workers must be a whole number >= 0, not {setting!r}")
    return max(1, min(n_shards, setting) if setting else n_shards)


def adaptive_target(dask_target: int, wanted: Iterable[int]) -> int:
    """What Dask's adaptive scaling is told: the larger of its own target (from Dask tasks and
    memory) and what the running jobs can use (``wanted``, one entry a job; none when no job runs)."""
    return max([int(dask_target), *wanted])


def retirable(candidates: Iterable[str], in_use: Iterable[str]) -> list[str]:
    """The ``candidates`` Dask may retire as idle: those no running job uses (``in_use``)."""
    busy = set(in_use)
    return [w for w in candidates if w not in busy]


def handoff_plan(owners: Mapping[tuple[str, int], str], rows: Mapping[tuple[str, int], int],
                 leaving: Iterable[str], staying: Iterable[str]) -> dict[tuple[str, int], str]:
    """Where each partition of the ``leaving`` workers goes: to the ``staying`` worker holding the
    fewest rows at that point (largest partition first, ties by name), so the hand-off evens the
    load rather than piling it on one worker. Returns partition -> new owner; empty when nobody
    stays (the leavers' retirement is then a loss)."""
    gone = set(leaving)
    stay = sorted(set(staying) - gone)
    if not stay:
        return {}
    load = {w: 0 for w in stay}
    for key, w in owners.items():
        if w in load:
            load[w] += rows[key]
    lightest = [(n, w) for w, n in load.items()]  # (a heap: a mass retirement's partitions x the stayers)
    heapify(lightest)
    plan: dict[tuple[str, int], str] = {}
    for key in sorted((k for k, w in owners.items() if w in gone), key=lambda k: (-rows[k], k)):
        n, target = lightest[0]
        plan[key] = target
        heapreplace(lightest, (n + rows[key], target))
    return plan


def shard_plan(holders: Mapping[int, str | None], staying: Iterable[str], leaving: Iterable[str] = (),
               homes: Mapping[int, tuple[str, int]] | None = None, owners: Mapping[tuple[str, int], str] | None = None,
               follow: bool = True) -> dict[int, str]:
    """Where shards go (``holders``: shard -> holder) when workers leave or partitions change owner: every shard
    of the ``leaving`` workers, and (``follow``) each one a ``staying`` worker holds away from its rows, goes to
    the staying owner of its home partition (``homes``, ``partitions.shard_homes``; ``owners``: the owners once
    the partitions have moved), so its steps read and update those rows locally, while that owner holds fewer
    than an even share of the shards (a pass waits for its busiest worker: rows that whole units leave uneven
    must not make the shards uneven too). What a worker holds counts every shard it holds at that point of the
    plan, so a shard that leaves it makes room for one of its own rows, and shards that wait for room at each
    other's holders swap (``_rotations``). A leaver's shard goes before a stayer's (it must move anyway); one
    that finds no room goes to the staying worker holding the fewest (ties by name), and a stayer's that finds
    none stays where it is. Shards held by neither stay put. Empty when nobody stays."""
    gone = set(leaving)
    held = dict.fromkeys(sorted(set(staying) - gone), 0)
    if not held:
        return {}
    for w in holders.values():
        if w in held:
            held[w] += 1
    share = -(-len(holders) // len(held))
    going = sorted(s for s, w in holders.items() if w in gone)
    plan: dict[int, str] = {}
    if homes and owners:
        # shards waiting for room at their rows' owner, leavers' first; a departure reopens its holder's line
        line: dict[str, deque[int]] = {}
        strays = sorted(s for s, w in holders.items() if follow and w in held)
        for s in going + strays:
            w = owners.get(homes.get(s))  # type: ignore[arg-type]
            if w in held and w != holders[s]:
                line.setdefault(w, deque()).append(s)
        todo = deque(line)
        while todo:
            w = todo.popleft()
            waiting = line.get(w)
            while waiting and held[w] < share:
                s = waiting.popleft()
                plan[s] = w
                held[w] += 1
                was = holders[s]
                if was in held:
                    held[was] -= 1
                    if line.get(was):
                        todo.append(was)
        plan.update(_rotations(line, holders, held))
    fewest = [(held[w], w) for w in held]
    heapify(fewest)
    for s in going:
        if s not in plan:
            n, target = fewest[0]
            plan[s] = target
            heapreplace(fewest, (n + 1, target))
    return plan


def _rotations(line: Mapping[str, Iterable[int]], holders: Mapping[int, str | None],
               held: Container[str]) -> dict[int, str]:
    """Of the shards still waiting for room at their rows' owner (``line``: owner -> shards), those that can
    swap round a cycle of ``held``'s workers (a's shard waits for b while b's waits for a): moving a whole cycle
    keeps every worker's count. Shard -> its rows' owner. A walk along the waiting shards (each followed once)
    drops those that lead nowhere and takes each cycle it closes."""
    target = {s: w for w, waiting in line.items() for s in waiting}
    out: dict[str, list[int]] = {}
    for s in sorted(target, reverse=True):
        if holders[s] in held:
            out.setdefault(holders[s], []).append(s)  # type: ignore[index]
    moved: dict[int, str] = {}
    for start in sorted(out):
        path: list[int] = []  # the shards walked along, from ``start``
        at: dict[str, int] = {}  # worker on the path -> the index in ``path`` of the shard it sends
        x = start
        while True:
            if x in at:  # a cycle closed: its shards move
                i = at[x]
                for s in path[i:]:
                    moved[s] = target[s]
                    del at[holders[s]]  # type: ignore[arg-type]
                del path[i:]
            if out.get(x):
                s = out[x].pop()
                at[x] = len(path)
                path.append(s)
                x = target[s]
                continue
            if not path:
                break
            s = path.pop()  # (it leads nowhere: dropped)
            x = holders[s]  # type: ignore[assignment]
            del at[x]
    return moved


def _all_alone(units: Mapping[tuple[str, int], tuple[str, int]]) -> bool:
    """Whether every partition is a unit of its own (no two tables laid out alike)."""
    return len(set(units.values())) == len(units)


def _units(owners: Mapping[tuple[str, int], str], rows: Mapping[tuple[str, int], int],
           units: Mapping[tuple[str, int], tuple[str, int]]):
    """The partitions of each unit (``partitions.row_units``; a partition without one is a unit of its own),
    each unit's owner (who owns most of its rows; ties by name) and its rows."""
    members: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for k in owners:
        members.setdefault(units.get(k, k), []).append(k)
    unit_owner, unit_rows = {}, {}
    for u, keys in members.items():
        if len(keys) == 1:  # (a table cut its own way: most units of a large job's layout)
            unit_owner[u], unit_rows[u] = owners[keys[0]], rows[keys[0]]
            continue
        by: dict[str, int] = {}
        for k in keys:
            by[owners[k]] = by.get(owners[k], 0) + rows[k]
        unit_owner[u] = min(by, key=lambda w: (-by[w], w))
        unit_rows[u] = sum(by.values())
    return members, unit_owner, unit_rows


def unit_handoff_plan(owners: Mapping[tuple[str, int], str], rows: Mapping[tuple[str, int], int],
                      units: Mapping[tuple[str, int], tuple[str, int]], leaving: Iterable[str],
                      staying: Iterable[str]) -> dict[tuple[str, int], str]:
    """``handoff_plan`` by units (``partitions.row_units``): the ``leaving`` workers' partitions go where the
    rest of their unit is (its owner, when that one stays), and a unit the leavers own goes whole to one
    stayer, so a row range's partitions keep one owner through a retirement (moved one by one, they end
    on as many owners, and every step on those rows asks each of them). Empty when nobody stays."""
    if _all_alone(units):  # (no two tables laid out alike: the plain plan, without the units' bookkeeping)
        return handoff_plan(owners, rows, leaving, staying)
    gone = set(leaving)
    stay = set(staying) - gone
    if not stay:
        return {}
    members, unit_owner, unit_rows = _units(owners, rows, units)
    moving = {w for w in unit_owner.values() if w not in stay}
    unit_plan = handoff_plan(unit_owner, unit_rows, moving, stay)
    return {k: unit_plan.get(units.get(k, k), unit_owner[units.get(k, k)]) for k, w in owners.items() if w in gone}


def unit_even_plan(owners: Mapping[tuple[str, int], str], rows: Mapping[tuple[str, int], int],
                   units: Mapping[tuple[str, int], tuple[str, int]], workers: Iterable[str]) -> dict[tuple[str, int], str]:
    """``even_plan`` by units (``partitions.row_units``): whole units move between the ``workers``, and a unit
    whose partitions have several owners (a layout of before) is brought together on its owner. Units with
    a partition owned outside ``workers`` stay as they are. Returns partition -> new owner."""
    if _all_alone(units):  # (no two tables laid out alike: the plain plan, without the units' bookkeeping)
        return even_plan(owners, rows, workers)
    members_of, unit_owner, unit_rows = _units(owners, rows, units)
    members = set(workers)
    movable = {u: w for u, w in unit_owner.items() if all(owners[k] in members for k in members_of[u])}
    unit_plan = even_plan(movable, unit_rows, members)
    plan = {}
    for u, w in movable.items():
        target = unit_plan.get(u, w)
        plan.update({k: target for k in members_of[u] if owners[k] != target})
    return plan


def setting_up(live: Iterable[str], registered: Container[str], owners: Iterable[str],
               holders: Iterable[str | None]) -> set[str]:
    """The ``live`` workers still setting up dscar: not ``registered`` (no key yet: a joiner, a restarted
    worker, whose event loop is busy importing as its plugins are set up), owning no partition and
    holding no shard. Such a worker cannot have run or staged anything (every call as a worker needs
    its key), so no apply pass or hand-off copy need go to it, and one would wait for its set-up."""
    fresh = {w for w in live if w not in registered}
    if fresh:
        fresh -= set(owners)
        fresh -= set(holders)
    return fresh


def handoff_targets(staying: Iterable[str], fresh: Container[str]) -> list[str]:
    """Who may take a leaver's partitions and shards: the ``staying`` workers set up (not in ``fresh``,
    ``setting_up``'s), or every staying one when none is."""
    stay = list(staying)
    return [w for w in stay if w not in fresh] or stay


#: a plan pays only if it lowers the largest owner's load by at least this fraction: each move is a copy
#: and a switch at a clock boundary, and on a large cluster of even owners a join could otherwise
#: shuffle thousands of small partitions to shave a few rows off the largest (W = 1,000: 1,814 moves
#: for 5 of 10,055 rows, 5.9 s of the scheduler's loop)
EVEN_MIN_GAIN = 0.01
#: swaps are sought with this many of the least loaded workers only (every worker of a small cluster):
#: the best move's target is the least loaded, and a swap pays most with a light owner
SWAP_CANDIDATES = 8


def even_plan(owners: Mapping[tuple[str, int], str], rows: Mapping[tuple[str, int], int],
              workers: Iterable[str]) -> dict[tuple[str, int], str]:
    """Partitions that move between the ``workers`` (joiners owning nothing yet included) so the largest
    owner holds fewer rows: after a join, a hand-off or a loss's re-placement the layout is uneven, and
    a BSP clock waits for its most loaded owner (its applies, the pulls it serves). While a step lowers
    the most loaded worker's load, it moves one of that worker's partitions to another worker, or swaps
    one for a smaller one of another's (one move evens ``6, 5, 4`` against ``4, 4, 4`` no further),
    taking the step that leaves the pair most even (a move before a swap: one copy, not two; swaps with
    the ``SWAP_CANDIDATES`` least loaded). The steps after the largest load last fell are left out
    (with several owners at the top, evening one of them lowers no clock). Returns partition -> new
    owner (partitions whose owner is not in ``workers`` stay); empty unless it lowers the largest load
    by ``EVEN_MIN_GAIN`` or more: a move costs a copy and a switch at a clock boundary, and pays only
    then. Cost: O(steps x (partitions a worker x SWAP_CANDIDATES + workers)), not O(steps x partitions)."""
    members = sorted(set(workers))
    if len(members) < 2:
        return {}
    rank = {w: i for i, w in enumerate(members)}
    load = dict.fromkeys(members, 0)
    held: dict[str, list[tuple[str, int]]] = {w: [] for w in members}
    for key, w in owners.items():
        if w in rank:
            load[w] += rows[key]
            held[w].append(key)
    start = max(load.values())
    # the largest load cannot fall below the mean: a layout that even the best plan improves too little
    # is left alone (and a large cluster's join of even owners costs one pass, not thousands of steps)
    if start - sum(load.values()) / len(members) < EVEN_MIN_GAIN * start:
        return {}
    order = sorted((load[w], rank[w]) for w in members)  # (load, rank) ascending: the top is the last
    steps: list[tuple[tuple[str, int], str]] = []  # (partition, new owner), in order
    lowest, kept = start, 0  # the largest load so far, and the steps that reached it

    def shift(w: str, by: int) -> None:
        del order[bisect_left(order, (load[w], rank[w]))]
        load[w] += by
        insort(order, (load[w], rank[w]))

    while True:
        top_load, top_rank = order[-1]
        top = members[top_rank]
        light = [members[i] for _, i in order[:SWAP_CANDIDATES + 1] if i != top_rank][:SWAP_CANDIDATES]
        best = None  # (pair's larger load after, copies, key, other, other's key or None)
        for key in held[top]:
            r = rows[key]
            for w in light:
                if load[w] + r < top_load:
                    step = (max(top_load - r, load[w] + r), 1, key, w, None)
                    best = step if best is None or step < best else best
                for back in held[w]:
                    d = r - rows[back]
                    if d > 0 and load[w] + d < top_load:
                        step = (max(top_load - d, load[w] + d), 2, key, w, back)
                        best = step if best is None or step < best else best
        if best is None:
            break
        _, _, key, w, back = best
        for k, src, dst in ((key, top, w), *(((back, w, top),) if back is not None else ())):
            held[src].remove(k)
            held[dst].append(k)
            shift(src, -rows[k])
            shift(dst, rows[k])
            steps.append((k, dst))
        if order[-1][0] < lowest:
            lowest, kept = order[-1][0], len(steps)
    if start - lowest < EVEN_MIN_GAIN * start:
        return {}
    moved = dict(steps[:kept])  # (a partition moved twice ends where its last kept step put it)
    return {k: w for k, w in moved.items() if owners[k] != w}


def ssp_leave_step(leaver: str, running: Iterable[str], unapplied: Iterable[str], quiet: bool) -> str:
    """The next step of an SSP job's retirement of ``leaver`` (BSP waits for a clock boundary; under
    SSP clocks overlap and there is none, so the leaver is drained instead):

    - "drain": it still runs attempts (``running``: the workers that do): it is handed no new work,
      and those it runs commit (or are released) as usual;
    - "flush": committed updates of it are staged on it and not yet applied by every owner
      (``unapplied``: the workers holding such updates): the applies fetch them first, or they would
      be lost with it and their shards run again;
    - "wait": nothing of it is in flight but an apply or a clock end is (not ``quiet``): the tables
      move;
    - "hand-off": its partitions (with the SSP updates they hold) and shards are copied to the others
      and switched in one step (``handoff_plan``, ``shard_plan``), then it leaves, as under BSP.

    Each step's condition is checked in this order, so a leaver never hands off while an update of
    it could still be lost."""
    if leaver in set(running):
        return "drain"
    if leaver in set(unapplied):
        return "flush"
    return "hand-off" if quiet else "wait"
