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
* 4 shards a worker, the tables cut as dscar cuts them: the shards' rows (``seen``, ``bad``, ``steps``) one
  partition a worker, so every worker owns some; ``fanout``'s 16 rows at most 16 partitions;
* two variants on the same cluster: without checkpoints, and with checkpoints every 2 clocks plus the memory
  tier (``bench.elastic.checkpoint_config``);
* every ``dscar_*`` handler of the scheduler and the workers is counted (``bench.overhead.install_counters``):
  a fit of ``--clocks`` clocks less a fit of 2, per steady clock, divided by W, by handler
  (``scheduler:<op>``, ``worker:<op>``).

A kind **grows** when its count a clock a worker follows W: the slope of ``log(count + 1)`` against
``log W``, a least-squares fit over every W measured, is above ``GROW_EXPONENT`` (0.6). A message a worker
sends to every other worker has W - 1 a clock, a slope of 1: it is O(W^2) a clock, and the table marks it
GROWS (exit status 1). So does one to W / 16 of them (0.72 from W = 16 to 128). A kind bounded per worker
has a slope near 0, and stays flat when a loaded machine raises it: a shard moved off a slow worker, its
pulls, the memory copies the moves drop (none at W = 16 here, under 1 a worker a clock at W = 128, where a
clock is 4-5x the step on 2 cores: slopes 0.2-0.3). The + 1 keeps counts under one message a clock from
reading as growth; a kind of one message to W / 64 of the others (2 a clock at W = 128) reads 0.42, under
the line, until a wider range of W shows it. Every fit's clocks are checked for exactly-once too
(``bench.elastic.audit``: ``ExactlyOnce``'s check of every clock, and ``check_final`` on the final table).

Usage: ``python -m bench.fanout [--quick] [--workers 16,32,64,128] [--clocks N] [--step S] [--json PATH]
[--plot PATH]``. ``--quick``: W = 12, 24 and 48 (all past ``WHOLE_READ_OWNERS``), few clocks (the test).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

import dscar
from bench.common import load_average, log, machine_info, pyplot, warn_busy, write_json
from bench.elastic import audit, checkpoint_config
from bench.hollow import HollowCluster, count_messages, message_counts
from bench.worker_models import ExactlyOnce

SHARDS_PER_WORKER = 4
SHORT_CLOCKS = 2  #: the fit whose messages are taken off the long one's: setup, the first clocks, the end
#: grows: the slope of log(count a clock a worker + 1) against log W above this (all-to-all: 1)
GROW_EXPONENT = 0.6
VARIANTS = ("no checkpoint", "checkpoint+memory")


def fit(hc: HollowCluster, clocks: int, step_s: float, ckpt_dir: str | None) -> tuple[dscar.FitResult, dict[str, int]]:
    """One fit of ``ExactlyOnce`` on every worker of ``hc`` (with checkpoints and the memory tier in
    ``ckpt_dir``, a folder of its own; None: none): its result and the messages it sent, by handler."""
    n_shards = hc.n_workers * SHARDS_PER_WORKER
    ckpt = None if ckpt_dir is None else checkpoint_config(ckpt_dir)
    m0 = message_counts(hc.client)
    res = dscar.fit(ExactlyOnce(clocks, step_s), {"x": np.arange(float(n_shards))}, hc.cluster, n_shards=n_shards,
                    max_clocks=clocks, checkpoint=ckpt, progress=False)
    m1 = message_counts(hc.client)
    return res, {k: m1.get(k, 0) - m0.get(k, 0) for k in set(m0) | set(m1)}


def violations(res: dscar.FitResult) -> int:
    """Exactly-once breaches (``bench.elastic.audit``: each clock's check and the final table's); a fit
    whose clocks none checked counts one."""
    a = audit(res, len(res.history))
    return a["violations"] + (a["checked_clocks"] == 0)


def measure(w: int, procs: int, clocks: int, step_s: float, t0: float) -> list[dict[str, Any]]:
    """Both variants at ``w`` workers: messages per steady clock per worker by handler, clock times, breaches."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp, HollowCluster(w, procs) as hc:
        hc.register()
        count_messages(hc.client)
        for variant in VARIANTS:
            ckpt = None if variant == "no checkpoint" else os.path.join(tmp, f"ck{w}")
            short, short_msgs = fit(hc, SHORT_CLOCKS, step_s, ckpt and f"{ckpt}-short")
            long, long_msgs = fit(hc, clocks, step_s, ckpt and f"{ckpt}-long")
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


def exponent(ws: list[int], counts: list[float]) -> float:
    """The least-squares slope of ``log(count + 1)`` against ``log W`` (1: the count follows W; 0: flat)."""
    x = [math.log(w) for w in ws]
    y = [math.log(c + 1.0) for c in counts]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)


def growth(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant and message kind: its count per clock per worker at the smallest and the largest W, the
    slope of its ``exponent`` over every W, and whether it is flat (module docstring)."""
    out = []
    for variant in VARIANTS:
        mine = sorted((r for r in rows if r["variant"] == variant), key=lambda r: r["workers"])
        if len(mine) < 2:
            continue
        ws = [r["workers"] for r in mine]
        for k in sorted({k for r in mine for k in r["per_clock_per_worker"]}):
            counts = [r["per_clock_per_worker"].get(k, 0.0) for r in mine]
            e = exponent(ws, counts)
            out.append({"variant": variant, "kind": k, "w_lo": ws[0], "w_hi": ws[-1], "at_lo": counts[0],
                        "at_hi": counts[-1], "exponent": round(e, 3), "flat": e <= GROW_EXPONENT})
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
    lines = [f"{'variant':<18} {'kind':<32} {'at W lo':>8} {'at W hi':>8} {'exponent':>8}  flat?"]
    for r in g:
        lines.append(f"{r['variant']:<18} {r['kind']:<32} {r['at_lo']:>8.3f} {r['at_hi']:>8.3f} "
                     f"{r['exponent']:>8.3f}  "
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
    ap.add_argument("--quick", action="store_true", help="W = 12, 24 and 48, 5 clocks (the test)")
    ap.add_argument("--workers", default=None, help="comma-separated W (default 16,32,64,128; 12,24,48 with --quick)")
    ap.add_argument("--clocks", type=int, default=None, help="clocks of the long fit (default 8, 5 with --quick)")
    ap.add_argument("--step", type=float, default=0.05, help="seconds each shard step sleeps (default 0.05)")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--plot", metavar="PATH", default="fanout.png")
    args = ap.parse_args(argv)
    workers = [int(x) for x in (args.workers or ("12,24,48" if args.quick else "16,32,64,128")).split(",")]
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
    print(f"messages a clock per worker flat in W (each kind's exponent <= {GROW_EXPONENT}): "
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
