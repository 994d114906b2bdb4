"""Messages per clock per worker as W grows, on hollow workers, for a model that pulls, stages and checks.

Issue 39 asks what finds O(W) or O(W^2) behaviour. The simulator (``bench.scale``) models the control
plane only, and ``bench.hollow``'s ``HollowStep`` pulls nothing. So neither saw that a step's read of the
small tables went to every owner: W - 1 messages a worker a clock, W^2 a clock (fixed in 1ca9fc3,
``dscar.worker.runner.WHOLE_READ_OWNERS``). This script counts what a model with a data plane sends.

For each W (default 16, 32, 64, 128), on a ``bench.hollow.HollowCluster`` of W workers in
``max(2, W / 32)`` processes:

* the model is ``bench.worker_models.ExactlyOnce``:
  - each shard step sleeps ``--step`` seconds and pulls its row of ``steps``;
  - it stages updates to ``seen``, ``steps`` and ``fanout`` (a 16-row table every step adds to whole);
  - its clock end checks that every shard committed once;
* 4 shards a worker, the tables cut as dscar cuts them (one partition a worker, so every worker owns some);
* two variants on the same cluster: without checkpoints, and with checkpoints every 2 clocks plus the memory
  tier (``bench.elastic.checkpoint_config``);
* every ``dscar_*`` handler of the scheduler and the workers is counted (``bench.overhead.install_counters``):
  a fit of ``--clocks`` clocks less a fit of 2, per steady clock, divided by W, by handler
  (``scheduler:<op>``, ``worker:<op>``).

A kind **grows** when its count per clock per worker rises, from the smallest W to the largest, by more
than ``GROW_SLOPE`` (0.1) for each worker added. A message a worker sends to every other worker rises by 1
for each: it is O(W^2) a clock, and the table marks it GROWS (exit status 1). A kind bounded per worker
stays "flat", even when a loaded machine raises it (a shard moved off a slow worker, a backup, the memory
copies those moves drop: none at W = 16 here, under 1 a worker a clock at W = 128, where the clock is 4-5x
the step on 2 cores). Every fit's clocks are checked for exactly-once too (``ExactlyOnce``'s violations,
and ``check_final`` on the final table).

Usage: ``python -m bench.fanout [--quick] [--workers 16,32,64,128] [--clocks N] [--step S] [--json PATH]
[--plot PATH]``. ``--quick``: W = 12 and 24 (both past ``WHOLE_READ_OWNERS``), few clocks (the test).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

import dscar
from bench.common import load_average, log, machine_info, pyplot, warn_busy, write_json
from bench.elastic import checkpoint_config
from bench.hollow import HollowCluster, count_messages, message_counts
from bench.worker_models import ExactlyOnce, check_final

SHARDS_PER_WORKER = 4
SHORT_CLOCKS = 2  #: the fit whose messages are taken off the long one's: setup, the first clocks, the end
#: grows: its count a clock a worker rises by more than this for each worker added (all-to-all: by 1)
GROW_SLOPE = 0.1
VARIANTS = ("no checkpoint", "checkpoint+memory")


def fit(hc: HollowCluster, clocks: int, step_s: float, ckpt) -> tuple[dscar.FitResult, dict[str, int]]:
    """One fit of ``ExactlyOnce`` on every worker of ``hc``: its result and the messages it sent, by handler."""
    n_shards = hc.n_workers * SHARDS_PER_WORKER
    m0 = message_counts(hc.client)
    res = dscar.fit(ExactlyOnce(clocks, step_s), {"x": np.arange(float(n_shards))}, hc.cluster, n_shards=n_shards,
                    max_clocks=clocks, checkpoint=ckpt, progress=False)
    m1 = message_counts(hc.client)
    return res, {k: m1.get(k, 0) - m0.get(k, 0) for k in set(m0) | set(m1)}


def violations(res: dscar.FitResult) -> int:
    """Exactly-once breaches: each clock's check, and the final table's."""
    checked = [r for r in res.history if "violations" in r.metrics]
    last = res.history[-1]
    return int(sum(r.metrics["violations"] for r in checked)
               + check_final(res.params["seen"], last.clock, "violations" in last.metrics)) + (not checked)


def measure(w: int, procs: int, clocks: int, step_s: float, t0: float) -> list[dict[str, Any]]:
    """Both variants at ``w`` workers: messages per steady clock per worker by handler, clock times, breaches."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp, HollowCluster(w, procs) as hc:
        hc.register()
        count_messages(hc.client)
        for variant in VARIANTS:
            ckpt = None if variant == "no checkpoint" else checkpoint_config(os.path.join(tmp, f"ck{w}"))
            short, short_msgs = fit(hc, SHORT_CLOCKS, step_s, ckpt)
            long, long_msgs = fit(hc, clocks, step_s, ckpt)
            steady = clocks - SHORT_CLOCKS
            per = {k: (long_msgs.get(k, 0) - short_msgs.get(k, 0)) / steady / w for k in long_msgs}
            secs = [r.seconds for r in long.history[SHORT_CLOCKS:]]
            row = {"workers": w, "procs": procs, "variant": variant, "clocks": clocks, "step_s": step_s,
                   "clock_s_median": statistics.median(secs), "ideal_clock_s": SHARDS_PER_WORKER * step_s,
                   "per_clock_per_worker": {k: round(v, 3) for k, v in sorted(per.items()) if v > 0},
                   "total_per_clock_per_worker": round(sum(v for v in per.values() if v > 0), 3),
                   "violations": violations(short) + violations(long),
                   "lost": sum(e["kind"] == "worker-lost" for r in (short, long) for e in r.events)}
            rows.append(row)
            log(t0, f"W={w} {variant}: clock {row['clock_s_median']:.3f} s, "
                    f"{row['total_per_clock_per_worker']:.2f} messages a clock a worker, {row['violations']} violations")
    return rows


def growth(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant and message kind: its count per clock per worker at the smallest and the largest W, and
    whether it is flat (module docstring)."""
    out = []
    for variant in VARIANTS:
        mine = sorted((r for r in rows if r["variant"] == variant), key=lambda r: r["workers"])
        if len(mine) < 2:
            continue
        lo, hi = mine[0], mine[-1]
        kinds = sorted(set(lo["per_clock_per_worker"]) | set(hi["per_clock_per_worker"]))
        for k in kinds:
            a, b = lo["per_clock_per_worker"].get(k, 0.0), hi["per_clock_per_worker"].get(k, 0.0)
            slope = (b - a) / (hi["workers"] - lo["workers"])
            out.append({"variant": variant, "kind": k, "w_lo": lo["workers"], "w_hi": hi["workers"],
                        "at_lo": a, "at_hi": b, "per_worker_added": round(slope, 4), "flat": slope <= GROW_SLOPE})
    return out


def format_rows(rows: list[dict[str, Any]], top: int = 6) -> str:
    lines = [f"{'W':>5} {'procs':>5} {'variant':<18} {'clock s':>8} {'ideal s':>7} {'msgs/clk/W':>10} "
             f"{'breaches':>8} {'lost':>4}  largest kinds (messages a clock a worker)"]
    for r in rows:
        biggest = sorted(r["per_clock_per_worker"].items(), key=lambda kv: -kv[1])[:top]
        lines.append(f"{r['workers']:>5} {r['procs']:>5} {r['variant']:<18} {r['clock_s_median']:>8.3f} "
                     f"{r['ideal_clock_s']:>7.3f} {r['total_per_clock_per_worker']:>10.2f} {r['violations']:>8} "
                     f"{r['lost']:>4}  " + ", ".join(f"{k}={v:g}" for k, v in biggest))
    return "\n".join(lines)


def format_growth(g: list[dict[str, Any]]) -> str:
    lines = [f"{'variant':<18} {'kind':<32} {'at W lo':>8} {'at W hi':>8} {'/W added':>8}  flat?"]
    for r in g:
        lines.append(f"{r['variant']:<18} {r['kind']:<32} {r['at_lo']:>8.3f} {r['at_hi']:>8.3f} "
                     f"{r['per_worker_added']:>8.4f}  "
                     + ("flat" if r["flat"] else f"GROWS (W {r['w_lo']} -> {r['w_hi']})"))
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str, top: int = 6) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(VARIANTS), figsize=(6 * len(VARIANTS), 4), sharey=True)
    for ax, variant in zip(np.atleast_1d(axes), VARIANTS):
        mine = sorted((r for r in rows if r["variant"] == variant), key=lambda r: r["workers"])
        if not mine:
            continue
        ws = [r["workers"] for r in mine]
        kinds = sorted({k for r in mine for k in r["per_clock_per_worker"]},
                       key=lambda k: -max(r["per_clock_per_worker"].get(k, 0) for r in mine))[:top]
        for k in kinds:
            ax.plot(ws, [r["per_clock_per_worker"].get(k, 0) for r in mine], marker="o", label=k)
        ax.plot(ws, [r["total_per_clock_per_worker"] for r in mine], marker="s", color="k", label="all dscar_* messages")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers W")
        ax.set_title(variant)
        ax.legend(fontsize=7)
    np.atleast_1d(axes)[0].set_ylabel("messages a clock / W (flat: O(W) a clock)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="W = 12 and 24, 5 clocks (the test)")
    ap.add_argument("--workers", default=None, help="comma-separated W (default 16,32,64,128; 12,24 with --quick)")
    ap.add_argument("--clocks", type=int, default=None, help="clocks of the long fit (default 8, 5 with --quick)")
    ap.add_argument("--step", type=float, default=0.05, help="seconds each shard step sleeps (default 0.05)")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--plot", metavar="PATH", default="fanout.png")
    args = ap.parse_args(argv)
    workers = [int(x) for x in (args.workers or ("12,24" if args.quick else "16,32,64,128")).split(",")]
    clocks = args.clocks or (5 if args.quick else 8)
    if clocks <= SHORT_CLOCKS:
        ap.error(f"--clocks must be more than {SHORT_CLOCKS}")
    warn_busy()
    t0 = time.perf_counter()
    rows = []
    for w in workers:
        rows += measure(w, max(2, w // 32), clocks, args.step, t0)
    g = growth(rows)
    print(format_rows(rows))
    print()
    print(format_growth(g))
    grows = [r for r in g if not r["flat"]]
    breaches = sum(r["violations"] for r in rows)
    print(f"messages a clock per worker flat in W (each kind rises by <= {GROW_SLOPE} a worker added): "
          + ("yes" if not grows else f"NO ({len(grows)} kinds grow)"))
    print(f"exactly-once breaches: {breaches}; load average {load_average()}")
    if args.json:
        write_json(args.json, {"machine": machine_info(), "rows": rows, "growth": g,
                               "flat": not grows, "violations": breaches})
    if args.plot:
        plot(rows, args.plot)
    return 0 if not grows and not breaches else 1


if __name__ == "__main__":
    sys.exit(main())
