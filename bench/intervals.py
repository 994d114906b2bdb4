"""Checkpoint intervals: the automatic (Young/Daly) interval beside fixed ones, by measured waste.

The model is ``bench.recovery``'s ``SparseTouch`` (one param table of ``--mb`` MB over
``--workers`` worker processes, ~28 % of its rows updated every clock), checkpointed in full to a
directory on disk (``--ckpt-dir``, default TMPDIR), with full recovery: a loss rolls everything
back to the newest checkpoint, so it costs exactly the checkpoint's age in clocks, the setting
Young/Daly's rule is about. For each setting (no checkpoints; every C clocks for each C of
``--fixed``; ``interval="auto"`` with the configured ``--mtbf``) a fresh cluster runs
``--clocks`` clocks, and the benchmark reports:

* overhead: the mean clock (checkpoint stalls and background writes included) over the
  no-checkpoint runs' mean, minus 1;
* expected rework: with failures every MTBF seconds, the share of time a loss throws away:
  the clocks' mean ``rework_estimate`` (the checkpoint's age under full recovery) x clock time / MTBF;
* waste = overhead + expected rework, the quantity Young/Daly minimises, and the model's
  ``cost / period + period / 2 x clock / MTBF`` from the measured checkpoint cost beside it.

The settings run in rounds (``--repeats``, each a fresh cluster, order rotated), pooled over
rounds, with the load average. BLAS threads pinned to 1. The MTBF defaults are short (2 s; 0.5 s
with ``--quick``) so that the best period, which grows as sqrt(MTBF), falls inside a run of a
minute; the rule and the comparison are the same at any scale.

    python -m bench.intervals [--quick] [--mb 32] [--mtbf 2] [--fixed 1,2,5,10,20,40] [--json PATH] [--plot PATH]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import dscar  # noqa: E402
from bench.common import machine_info, pyplot, write_json  # noqa: E402
from bench.recovery import WIDTH, SparseTouch  # noqa: E402
from dscar.core.intervals import expected_waste, young_daly_s  # noqa: E402


def one_fit(setting: str, mb: float, n_workers: int, clocks: int, mtbf: float, ckpt_dir: str | None) -> dict[str, Any]:
    """One fresh cluster, ``clocks`` clocks under ``setting`` ("none", "C=<n>" or "auto")."""
    table_rows = int(mb * 2**20 / (8 * WIDTH))
    rng = np.random.default_rng(0)
    data = {"idx": rng.integers(0, table_rows, table_rows // 3)}
    store = tempfile.mkdtemp(prefix="intervals-", dir=ckpt_dir)
    cfg = None
    if setting == "auto":
        cfg = dscar.CheckpointConfig(store, policy="full", every=clocks, recovery="full", interval="auto", mtbf=mtbf)
    elif setting != "none":
        cfg = dscar.CheckpointConfig(store, policy="full", every=int(setting[2:]), recovery="full")
    try:
        with dscar.Cluster(n_workers=n_workers) as cl:
            cl.wait_for_workers(n_workers)
            res = dscar.fit(SparseTouch(table_rows, n_workers), data, cl, n_shards=2 * n_workers,
                            max_clocks=clocks, progress=False, checkpoint=cfg)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    recs = res.history
    out: dict[str, Any] = {"setting": setting, "clock_s": [r.seconds for r in recs],
                           "checkpoints": sum(1 for e in res.events if e["kind"] == "checkpoint-started")}
    if cfg is not None:
        out["rework_clocks"] = [r.checkpoint["rework_estimate"] for r in recs if r.checkpoint]
    chosen = [e for e in res.events if e["kind"] == "checkpoint-interval" and e.get("source") == "young-daly"]
    if chosen:
        out["chosen"] = [{k: e.get(k) for k in ("clock", "period", "cost_s", "clock_s")} for e in chosen]
    return out


def summarise(runs: list[dict], base_clock_s: float, mtbf: float) -> dict[str, Any]:
    """One setting's runs pooled: mean clock, overhead over the no-checkpoint mean, mean rework
    estimate and its share of time at the MTBF, waste, and (auto) the period and cost it chose."""
    clock = statistics.fmean(s for r in runs for s in r["clock_s"])
    rework = statistics.fmean(x for r in runs for x in r.get("rework_clocks", [0.0]))
    overhead = clock / base_clock_s - 1.0
    rework_share = rework * clock / mtbf
    out = {"clock_ms": 1e3 * clock, "overhead": overhead, "rework_clocks": rework, "rework_share": rework_share,
           "waste": overhead + rework_share, "checkpoints": statistics.median(r["checkpoints"] for r in runs)}
    chosen = [c for r in runs for c in r.get("chosen", [])]
    if chosen:
        out["period"] = statistics.median(c["period"] for c in chosen)
        out["cost_s"] = statistics.median(c["cost_s"] for c in chosen)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.intervals", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 MB, 40 clocks, MTBF 0.5 s, 1 repeat (a smoke run)")
    ap.add_argument("--mb", type=float, help="table size in MB (default 32; 8 with --quick)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--clocks", type=int, help="clocks per run (default 80; 40 with --quick)")
    ap.add_argument("--mtbf", type=float, help="configured MTBF, seconds (default 2; 0.5 with --quick)")
    ap.add_argument("--fixed", default="1,2,5,10,20,40", help="fixed intervals C to compare (default 1,2,5,10,20,40)")
    ap.add_argument("--repeats", type=int, help="rounds of all settings (default 3; 1 with --quick)")
    ap.add_argument("--ckpt-dir", default=None, help="parent of the checkpoint stores (default: TMPDIR, on disk)")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--plot", metavar="PATH", default="intervals.png")
    args = ap.parse_args(argv)
    mb = args.mb or (8.0 if args.quick else 32.0)
    clocks = args.clocks or (40 if args.quick else 80)
    args.mtbf = args.mtbf or (0.5 if args.quick else 2.0)
    repeats = args.repeats or (1 if args.quick else 3)
    fixed = [int(c) for c in args.fixed.split(",") if c]
    settings = ["none", *(f"C={c}" for c in fixed), "auto"]
    t_start, load0 = time.perf_counter(), os.getloadavg()
    runs: dict[str, list] = {s: [] for s in settings}
    for rep in range(repeats):
        for s in settings[rep % len(settings):] + settings[: rep % len(settings)]:
            r = one_fit(s, mb, args.workers, clocks, args.mtbf, args.ckpt_dir)
            runs[s].append(r)
            print(f"[{time.perf_counter() - t_start:6.1f}s] round {rep} {s:<6} clock mean "
                  f"{1e3 * statistics.fmean(r['clock_s']):7.1f} ms, {r['checkpoints']} checkpoints"
                  + (f", period {r['chosen'][-1]['period']:g}" if r.get("chosen") else ""), flush=True)
    base = statistics.fmean(s for r in runs["none"] for s in r["clock_s"])
    summary = {s: summarise(runs[s], base, args.mtbf) for s in settings if s != "none"}
    auto = summary["auto"]
    cost, clock_s = auto.get("cost_s"), auto["clock_ms"] / 1e3
    print(f"\nCheckpoint interval: {mb:.0f} MB table over {args.workers} worker processes, full checkpoints to "
          f"{args.ckpt_dir or tempfile.gettempdir()}, full recovery, MTBF {args.mtbf:g} s, {clocks} clocks x "
          f"{repeats} round(s); load average {load0[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"no checkpoints: clock mean {1e3 * base:.1f} ms")
    if cost is not None:
        yd = young_daly_s(cost, args.mtbf)
        print(f"measured checkpoint cost (stall + write, median) {1e3 * cost:.1f} ms: Young/Daly sqrt(2 c M) = "
              f"{yd:.2f} s = {yd / clock_s:.1f} clocks; auto chose {auto['period']:g}")
    print(f"  {'setting':<8}{'period':>7}{'ckpts':>6}{'clock ms':>10}{'overhead':>10}{'rework (clk)':>13}"
          f"{'rework %':>9}{'waste %':>9}{'model %':>9}")
    for s, v in summary.items():
        period = v.get("period") if s == "auto" else float(s[2:])
        model = expected_waste(period, clock_s, cost, args.mtbf) if cost is not None and period else float("nan")
        v["model_waste"] = model
        v["period_used"] = period
        print(f"  {s:<8}{period if period else float('nan'):>7g}{v['checkpoints']:>6g}{v['clock_ms']:>10.1f}"
              f"{100 * v['overhead']:>9.1f}%{v['rework_clocks']:>13.2f}{100 * v['rework_share']:>8.1f}%"
              f"{100 * v['waste']:>8.1f}%{100 * model:>8.1f}%")
    best = min((s for s in summary if s != "auto"), key=lambda s: summary[s]["waste"])
    print(f"  lowest measured waste of the fixed intervals: {best} ({100 * summary[best]['waste']:.1f}%); "
          f"auto {100 * auto['waste']:.1f}%")
    out = {"machine": machine_info(), "mb": mb, "workers": args.workers, "clocks": clocks, "repeats": repeats, "mtbf_s": args.mtbf,
           "loadavg": [load0[0], os.getloadavg()[0]], "base_clock_ms": 1e3 * base, "summary": summary,
           "runs": runs, "seconds": time.perf_counter() - t_start}
    if args.json:
        write_json(args.json, out)
    if args.plot:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(6, 3.8))
        fx = [s for s in summary if s != "auto"]
        ax.plot([summary[s]["period_used"] for s in fx], [100 * summary[s]["waste"] for s in fx], "o-",
                color="#555", label="fixed C: measured waste")
        ax.plot([summary[s]["period_used"] for s in fx], [100 * summary[s]["model_waste"] for s in fx], ":",
                color="#999", label="model (measured cost)")
        if auto.get("period"):
            ax.plot([auto["period"]], [100 * auto["waste"]], "*", ms=14, color="#2a7", label="auto (Young/Daly)")
        ax.set_xscale("log")
        ax.set_xlabel("clocks between checkpoints")
        ax.set_ylabel("overhead + expected rework (%)")
        ax.set_title(f"{mb:.0f} MB table, MTBF {args.mtbf:g} s")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
