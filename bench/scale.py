"""The control plane's pure core at W = 64 ... 4,096 simulated workers (``bench.sim``): CPU per decision,
messages per clock, exactly-once and starvation, with stragglers, a crash, a hang and a join in the mix.

    python -m bench.scale                      # W = 64, 256, 1024, 4096 (see the modes below)
    python -m bench.scale --quick              # W = 64, 256
    python -m bench.scale --workers 64 1024 --modes bsp --json out.json --plot out.png
    python -m bench.scale --digests --workers 64 256   # a digest of every decision (tests/test_scale.py)

Modes: ``bsp`` (BSP, no straggler policy), ``bsp+backup`` (BSP with the default backup policy) and
``ssp+backup`` (staleness 1). Every mode runs at every W, twice (timed, then counted: below; the full run takes about 2 minutes here).

Columns: ``dec/s`` decisions per CPU second of the core; ``us/gc`` CPU microseconds of the core per
grant+commit (the worker's polls, releases and commits, over the attempts committed); ``med us/gc`` the same from
each decision's median call (a loaded machine's preemptions left out); ``touch/gc`` shard-status
entries the core read per grant+commit (machine-independent; flat in W means O(1); the queue's index of
the running shards keeps its keys in their entries, so its reads count too); ``att/cmt`` attempts
per commit message (a work item's members: 1.0 when every item holds one shard); ``ctl/clk/W`` control
messages per clock per worker (scheduler <-> workers and driver); ``fetch/clk/W`` the owners' fetches of
staged updates per clock per worker (data plane: O(W) per worker is O(W^2) per clock); ``B/item`` bytes
of a work item; ``recheck/clk/W`` waiting long polls woken per clock per worker (a change wakes those it
may concern: ``dscar.core.wake``); ``wake us`` CPU microseconds of that rule per change that found polls
waiting; ``once`` exactly-once; ``starve`` no healthy worker left without a shard in a clock.
The CPU figures are this machine's (shared, loaded): compare rows, not machines. They come from a run
without the counting lists (``SimConfig.count_reads``); ``touch/gc`` from a second run of the same
scenario, which makes the same decisions (``--counted-cpu``: one run, timed with the counting lists).

A second table sums up the targets per mode (issue 39: the core's CPU per grant+commit <= 20 us and
flat in W, >= 50,000 decisions/s): the median-based us/gc at each W, the grant+commits per second
that gives at the costliest W (``gc/s``), and the ratio of the largest W's us/gc and touch/gc to
the smallest W's (``x W``: 1.0 is flat).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from bench.common import log, machine_info, pyplot, warn_busy, write_json
from bench.sim import SimConfig, decision_digest, simulate

COLUMNS = [("W", "W", 5), ("mode", "mode", 10), ("clocks", "clk", 3), ("wall_s", "wall_s", 7),
           ("decisions_per_s", "dec/s", 8), ("cpu_us_per_grant_commit", "us/gc", 7),
           ("median_us_per_grant_commit", "med us/gc", 9),
           ("touched_per_grant_commit", "touch/gc", 8), ("attempts_per_commit", "att/cmt", 7), ("control_msgs_per_clock_per_W", "ctl/clk/W", 9),
           ("fetch_staged_per_clock_per_W", "fetch/clk/W", 11), ("item_bytes_per_grant", "B/item", 7),
           ("poll_rechecks_per_clock_per_W", "recheck/clk/W", 13), ("wake_us_per_change", "wake us", 7),
           ("exactly_once", "once", 5),
           ("starvation_ok", "starve", 6), ("skipped", "skip", 4)]


#: mode -> (consistency, backup policy on)
MODES = {"bsp": ("bsp", False), "bsp+backup": ("bsp", True), "ssp+backup": ("ssp", True)}


def scenario(workers: int, consistency: str, clocks: int, seed: int = 0, backup: bool = True) -> SimConfig:
    """W workers, 4 shards each, 1 s steps (a clock takes about 4.5 s), 1 in 32 workers 4x slower, a
    crash in clock 1, a join after it, a hang in clock 2 (found in clock 3: ``dscar.core.liveness``)."""
    return SimConfig(workers, clocks=clocks, consistency=consistency, staleness=1, step_s=1.0,
                     stragglers=max(1, workers // 32), losses=[(2.2, workers // 3)], hangs=[(5.5, 2 * workers // 3)],
                     joins=[2.5], seed=seed, policies=("backup",) if backup else ())


def table(rows: list[dict]) -> str:
    head = " ".join(f"{h:>{w}}" for _, h, w in COLUMNS)
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(" ".join(f"{str(r[k]):>{w}}" for k, _, w in COLUMNS))
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    """Per mode: the median-based CPU per grant+commit at each W, the decisions per second it gives,
    and how much the largest W costs over the smallest (CPU and shard entries read: 1.0 is flat)."""
    ws = sorted({r["W"] for r in rows})
    head = f"{'mode':>10} " + " ".join(f"{f'us/gc W={w}':>12}" for w in ws) + \
        f" {'gc/s':>8} {'us/gc x W':>9} {'touch x W':>9} {'<=20us':>6}"
    lines = ["median CPU per grant+commit (us) by W; the ratio of the largest W to the smallest", head, "-" * len(head)]
    for mode in sorted({r["mode"] for r in rows}, key=list(MODES).index):
        by_w = {r["W"]: r for r in rows if r["mode"] == mode}
        first, last = by_w[min(by_w)], by_w[max(by_w)]
        cells = " ".join(f"{by_w[w]['median_us_per_grant_commit'] if w in by_w else '-':>12}" for w in ws)
        rate = round(1e6 / max(max(r["median_us_per_grant_commit"] for r in by_w.values()), 1e-9))
        cpu_x = last["median_us_per_grant_commit"] / max(first["median_us_per_grant_commit"], 1e-9)
        touch_x = last["touched_per_grant_commit"] / max(first["touched_per_grant_commit"], 1e-9)
        ok = all(r["median_us_per_grant_commit"] <= 20 for r in by_w.values())
        lines.append(f"{mode:>10} {cells} {rate:>8} {cpu_x:>9.2f} {touch_x:>9.2f} {'yes' if ok else 'no':>6}")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for mode in sorted({r["mode"] for r in rows}):
        rs = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["W"])
        ws = [r["W"] for r in rs]
        line, = axes[0].plot(ws, [r["median_us_per_grant_commit"] for r in rs], "o-", label=f"{mode} (median)")
        axes[0].plot(ws, [r["cpu_us_per_grant_commit"] for r in rs], "x:", color=line.get_color(), label=f"{mode} (mean)")
        axes[1].plot(ws, [r["touched_per_grant_commit"] for r in rs], "o-", label=mode)
        axes[2].plot(ws, [r["control_msgs_per_clock_per_W"] for r in rs], "o-", label=f"{mode} control")
        axes[2].plot(ws, [r["fetch_staged_per_clock_per_W"] for r in rs], "s--", label=f"{mode} fetch_staged")
    axes[0].axhline(20, color="grey", lw=0.8, ls=":", label="target 20 us")
    for ax, title in zip(axes, ["core CPU per grant+commit (us)", "shard entries read per grant+commit",
                                "messages per clock / W"]):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers W")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[64, 256, 1024, 4096])
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--clocks", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="only W <= 256 (64 and 256 by default)")
    ap.add_argument("--counted-cpu", action="store_true",
                    help="time the run that counts shard-entry reads (one run, as before: each counted read "
                         "adds ~0.3 us to the decision that makes it)")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ap.add_argument("--digests", action="store_true",
                    help="print a digest of every decision of each mode and W (``bench.sim.decision_digest``; "
                         "the same under any PYTHONHASHSEED) as JSON, and nothing else")
    args = ap.parse_args(argv)
    if not args.digests:  # (digests are the output, alone)
        warn_busy()
    if args.digests:
        print(json.dumps({f"{mode} W={w}": decision_digest(scenario(w, MODES[mode][0], args.clocks, args.seed,
                                                                    backup=MODES[mode][1]))
                          for mode in args.modes for w in args.workers}))
        return 0
    if args.quick:
        args.workers, args.clocks = [w for w in args.workers if w <= 256] or [64], 4
    t0 = time.perf_counter()
    rows = []
    for mode in args.modes:
        consistency, backup = MODES[mode]
        for w in args.workers:
            cfg = scenario(w, consistency, args.clocks, args.seed, backup=backup)
            r = counted = simulate(cfg)
            if not args.counted_cpu:  # the CPU from a run without counting lists: the same decisions
                r = simulate(dataclasses.replace(cfg, count_reads=False))
                if (r.decisions, r.messages) != (counted.decisions, counted.messages):
                    print(f"warning: {mode} W={w}: the timed run's decisions differ from the counted run's")
            rows.append({**r.row(), "touched_per_grant_commit": round(counted.touched_per_grant_commit, 1),
                         "mode": mode})
            log(t0, f"{mode} W={w}: {r.clocks_done} clocks in {r.wall_s:.1f} s, {r.cpu_us_per_grant_commit:.1f} us/gc")
    print(table(rows))
    print()
    print(summary(rows))
    ok = all(r["exactly_once"] and r["starvation_ok"] for r in rows)
    print("exactly-once and no starvation at every W:", "yes" if ok else "NO")
    machine = machine_info()
    print(f"this machine's speed probes: loop {machine['speed_probe_ms']:.2f} ms, walk {machine['walk_probe_ms']:.2f} ms "
          "(bench.common: lower is faster; set a figure against the probes of the run it is compared with)")
    if args.json:
        write_json(args.json, {"machine": machine, "clocks": args.clocks, "rows": rows})
    if args.plot:
        plot(rows, args.plot)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
