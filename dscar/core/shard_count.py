"""How many shards a fit cuts its data into when the user does not say (``fit(n_shards=None)``).

A shard is not free. Every clock, each one is handed out, committed, and its update staged and
applied: about a millisecond of engine work (``SHARD_COST_S``). For a model whose steps read the
parameters as of the clock's start (AD-LDA), shards also cost quality: the more of them run on
the same clock's parameters, the staler each one's view (issue 43: Reuters after 200 sweeps,
1 shard per worker within 0.3 % of sequential Gibbs sampling, 4 per worker 0.8-1.2 % below).

Extra shards buy balance: dynamic sharding moves work off a slow worker only a shard at a time,
and a backup attempt redoes one whole shard, so with one big shard per worker a straggler's
whole share waits for it or is redone. That is worth their cost only where a clock's step work
is large beside it.

So the rule (``shards_per_worker``):

* one shard per worker where extra ones cannot help (static sharding and no backups) or cost
  quality (the algorithm says so: ``shards_cost_quality``);
* otherwise as many per worker, up to ``MAX_PER_WORKER``, as keep the extra shards' cost within
  ``SHARD_COST_SHARE`` of a worker's step work per clock, estimated from the data's bytes at
  ``STEP_S_PER_MIB`` (the cheapest step work per byte measured among the bundled models, so the
  estimate errs toward fewer shards);
* data of unknown size keeps the old default: ``MAX_PER_WORKER`` per worker;
* never more shards than rows, never fewer than one per worker (``fit`` then refuses data with
  fewer rows than workers).

An explicit ``n_shards`` always wins: this module is consulted only without one.

Membership churn does not change the rule (issue 41, measured). A worker that joins mid-clock takes
whole shards of what is left of the clock, so its landing clock loses, beside work that could be
split at will, about a third of a step when it arrives at a random point (``bench.elastic``'s
``join_granularity``: 0.029 s a join at 0.15 s steps with ``--event-at random``; 0.046-0.056 s when
every join lands at one early point of its clock). Finer shards shrink that loss with the step,
but each one costs its hand-out, commit and apply every clock: on 3 worker processes of a 2-core
machine, the same 1.8 s of step work a clock cut into 48 shards instead of 12 took 0.015-0.027 s
more a clock (0.4-0.75 ms a shard), 24 instead of 12 nothing measurable on a loaded machine. They
pay when the joins a clock times the loss they lift exceeds their cost: at the benchmark's churn (an
event every 3.7 clocks, half of them joins: 0.13 joins a clock), 24 shards instead of 12 would lift
about 0.13 x 0.015 = 0.002 s a clock at a cost of up to 12 x 0.5 ms = 0.006 s; a churn run at 24
shards measured no gain (clock rate 1.157 /s against 1.197 /s at 12, both at load 6-10). A cluster
whose membership changed every clock or two would want finer shards; dscar does not know a cluster's
churn before a fit, and no fit re-cuts its data during one.
"""
from __future__ import annotations

#: most shards per worker chosen by default (dscar's fixed default before issue 43)
MAX_PER_WORKER = 4
#: engine seconds one more shard costs a clock: handed out, committed, its update staged and applied
#: (README: "a shard costs about a millisecond to hand out, commit and apply")
SHARD_COST_S = 1e-3
#: step seconds per MiB of a worker's data per clock: the cheapest measured (``bench.scaling --quick``,
#: 1 worker, the steps' compute time over the data's bytes: MLR local SGD on digits 0.96 ms/MiB, ALS
#: rank 20 12.7 ms/MiB a phase, LDA K=20 on Reuters 13.8 ms/MiB)
STEP_S_PER_MIB = 1e-3
#: the share of a worker's step work per clock that extra shards may cost
SHARD_COST_SHARE = 0.05

MIB = 1 << 20


def shards_per_worker(data_bytes_per_worker: float | None, *, balancing: bool, shards_cost_quality: bool,
                      step_s_per_mib: float = STEP_S_PER_MIB, shard_cost_s: float = SHARD_COST_S,
                      cost_share: float = SHARD_COST_SHARE, max_per_worker: int = MAX_PER_WORKER) -> int:
    """Shards per worker for ``data_bytes_per_worker`` of data on each worker (None: unknown).

    ``balancing``: extra shards can move between workers or be backed up (dynamic sharding or the
    backup policy); ``shards_cost_quality``: the algorithm converges slower per clock with more
    shards. See the module docstring for the rule."""
    if not balancing or shards_cost_quality:
        return 1
    if data_bytes_per_worker is None:
        return max_per_worker
    step_s = data_bytes_per_worker / MIB * step_s_per_mib
    affordable = int(cost_share * step_s / shard_cost_s) if shard_cost_s > 0 else max_per_worker
    return max(1, min(max_per_worker, 1 + affordable))


def default_n_shards(n_workers: int, n_rows: int | None, n_bytes: int | None, *, balancing: bool = True,
                     shards_cost_quality: bool = False, **costs: float) -> int:
    """The number of shards for ``n_rows`` rows and ``n_bytes`` bytes (None: unknown) on ``n_workers``
    workers: ``shards_per_worker`` each, no more than the rows, one per worker at least. ``costs``:
    ``shards_per_worker``'s measured constants, to override."""
    per_worker = shards_per_worker(None if n_bytes is None else n_bytes / max(n_workers, 1), balancing=balancing,
                                   shards_cost_quality=shards_cost_quality, **costs)
    n = per_worker * n_workers
    if n_rows is not None:
        n = min(n, n_rows)
    return max(n_workers, n)
