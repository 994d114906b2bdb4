"""What membership changes cost the scheduler at W = 64 ... 4,096 workers: dscar's pure planners of joins,
retirements and evening out (``dscar.core.elastic``), timed on the layouts a job cut for W workers has.

Each runs on the scheduler's event loop when a worker joins or leaves, so its time there holds every
grant and commit of every job; its plan's moves are partition copies and switches at a clock boundary.
The job is one partition of each of 4 tables a worker (``n_parts`` None: one per worker at the start)
of 10,000 / 50 / 1 / 4 rows a partition, and 4 shards a worker:

The planners are the coordinator's: by units (``partitions.row_units``: the same row range of tables laid
out alike moves whole; here each table is cut its own way, so each partition is a unit of its own).

* ``join``: ``unit_even_plan`` with one joiner owning nothing (all owners even: a joiner's whole partitions
  lower no largest load, so nothing should move);
* ``doubled``: ``unit_even_plan`` where one worker took a leaver's partitions (its load doubled), of 10-row
  partitions (3 moves take it from 80 to 50 rows) and of the rows above (none pays: two 10,000-row
  partitions must share an owner);
* ``retire 1`` / ``retire half``: ``unit_handoff_plan`` + ``shard_plan`` of one leaver and of half the
  workers (an adaptive scale-down): the leavers' shards and those that follow their rows (a table of the
  data's rows, ``d``) to their rows' owners.

Seconds are the median of ``--repeats`` calls (``time.perf_counter``), with the load average printed.

Usage: ``python -m bench.planners [--workers 64,256,1024,4096] [--repeats 5] [--quick] [--json PATH] [--plot PATH]``
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

from dscar.core.elastic import shard_plan, unit_even_plan, unit_handoff_plan
from dscar.core.partitions import TableLayout, row_units, shard_homes

from .common import load_average, machine_info, pyplot, write_json

#: rows a partition of each table (one partition a worker)
TABLE_ROWS = {"a": 10_000, "b": 50, "c": 1, "d": 4}
SHARDS_PER_WORKER = 4
CASES = ("join", "doubled", "retire 1", "retire half")


def layout(W: int) -> tuple[list[str], dict, dict, dict, dict, dict]:
    """Workers, partition owners, rows, shard holders, units and shard homes of a job cut for ``W`` workers
    (its data has as many rows as table ``d``: ``d`` is its table of the data's rows)."""
    members = [f"w{i:05d}" for i in range(W)]
    rows = {(t, p): n for t, n in TABLE_ROWS.items() for p in range(W)}
    owners = {(t, p): members[p] for t, p in rows}
    n_shards, n_rows = SHARDS_PER_WORKER * W, TABLE_ROWS["d"] * W
    holders = {s: members[s // SHARDS_PER_WORKER] for s in range(n_shards)}
    layouts = [TableLayout(t, n * W, W) for t, n in TABLE_ROWS.items()]
    bounds = [(s * n_rows // n_shards, (s + 1) * n_rows // n_shards) for s in range(n_shards)]
    return members, owners, rows, holders, row_units(layouts), shard_homes(layouts, bounds)


def cases(W: int) -> dict[str, Callable[[], int]]:
    """Each case as a call that returns its plan's moves."""
    members, owners, rows, holders, units, homes = layout(W)
    doubled = {k: (members[1] if w == members[0] else w) for k, w in owners.items()}
    tens = dict.fromkeys(rows, 10)
    half = members[: W // 2]

    def retire(leaving: list[str]) -> int:
        gone = set(leaving)
        stay = [w for w in members if w not in gone]
        parts = unit_handoff_plan(owners, rows, units, leaving, stay)
        after = {**owners, **parts}
        return len(parts) + len(shard_plan(holders, stay, leaving, homes, after))

    return {
        "join": lambda: len(unit_even_plan(owners, rows, units, members + ["joiner"])),
        "doubled": lambda: (len(unit_even_plan(doubled, tens, units, members[1:]))
                            + len(unit_even_plan(doubled, rows, units, members[1:]))),
        "retire 1": lambda: retire(members[:1]),
        "retire half": lambda: retire(half),
    }


def measure(W: int, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {"workers": W}
    for name, call in cases(W).items():
        times, moves = [], 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            moves = call()
            times.append(time.perf_counter() - t0)
        out[name] = {"ms": 1e3 * statistics.median(times), "moves": moves}
    return out


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ws = [r["workers"] for r in rows]
    for name in CASES:
        ax.plot(ws, [max(r[name]["ms"], 1e-3) for r in rows], marker="o", label=name)
    ax.set(xscale="log", yscale="log", xlabel="workers W", ylabel="ms on the scheduler's loop (median)",
           title="dscar's membership planners")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="64,256,1024,4096", help="comma-separated W")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="W = 64 and 256, 3 repeats")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    args = ap.parse_args(argv)
    ws = [64, 256] if args.quick else [int(w) for w in args.workers.split(",")]
    repeats = 3 if args.quick else args.repeats
    before = load_average()
    rows = [measure(W, repeats) for W in ws]
    print(f"membership planners: median ms of {repeats} calls (moves planned); load average before {before}")
    print(f"{'W':>6} " + " ".join(f"{c:>22}" for c in CASES))
    for r in rows:
        print(f"{r['workers']:>6} " + " ".join(f"{r[c]['ms']:>12.2f} ms ({r[c]['moves']:>4})" for c in CASES))
    print(f"load average after {load_average()}")
    if args.json:
        write_json(args.json, {"machine": machine_info(), "repeats": repeats, "rows": rows,
                               "table_rows": TABLE_ROWS, "shards_per_worker": SHARDS_PER_WORKER})
    if args.plot or args.json:
        plot(rows, args.plot or args.json.rsplit(".", 1)[0] + ".png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
