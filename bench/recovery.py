"""Recovery time from the memory tier vs from disk, on a large table (SCAR's restore, Gemini's tier).

One param table of ``--mb`` MB (float64 rows of width 16) split over ``--workers``
worker processes; every clock each shard adds to a fixed random set of rows
(~63 % of the table: the shape of an embedding or word-topic table, big and not
wholly touched, but six times the rows a priority checkpoint saves per clock: a
touched row is saved about every 6 clocks, so a disk restore at clock 7 lags by
~3.5 clocks, well clear of the memory tier's 0 or 1). Priority
checkpoints (r = 0.1 every clock, C = 10) go to a directory on disk; with the
memory tier every owner also copies its partitions into its buddy's memory after
every clock. One worker is killed (``os._exit``) at clock ``--kill-clock`` and its
partitions are restored on the others: from the disk chain, or from the buddy.

Reported per tier: the recovery's wall time (``recovery-done``: planning to the
last partition owned again), the clocks of progress the restored partitions lack
(lag: a row's final value tells exactly how many clocks of progress it lost;
and the relative perturbation |w_ff - w| / |w_ff|), and the failure-free clock
time (what the tier costs every clock). Medians of ``--trials`` fresh clusters;
BLAS threads pinned to 1; the load average beside.

    python -m bench.recovery [--quick] [--mb 128] [--trials 3] [--json PATH] [--plot PATH]
"""
from __future__ import annotations

import argparse
import os
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
from dscar import Algorithm, TableSpec, faults  # noqa: E402

WIDTH = 16  # float64 values per row


class SparseTouch(Algorithm):
    """Each data row names a table row; a shard adds 1 to its rows every clock (a sparse update)."""

    name = "sparse-touch"
    data_names = ("idx",)

    def __init__(self, table_rows: int, n_parts: int):
        self.table_rows, self.n_parts = int(table_rows), int(n_parts)

    def tables(self, meta):
        return [TableSpec("w", self.table_rows, trailing=(WIDTH,), n_parts=self.n_parts)]

    def shard_step(self, ctx, data):
        rows = data["idx"]
        ctx.add_rows("w", rows, ctx.xp.ones((rows.shape[0], WIDTH)))

    def clock_end(self, ctx):
        probe = dscar.to_host(ctx.pull_rows("w", np.arange(8)))
        return {"objective": float(probe.sum())}

    def converged(self, history, tol):
        return False


def one_fit(mb: float, n_workers: int, clocks: int, kill_clock: int | None, memory: bool,
            ckpt_dir: str) -> dict[str, Any]:
    table_rows = int(mb * 2**20 / (8 * WIDTH))
    rng = np.random.default_rng(0)
    data = {"idx": rng.integers(0, table_rows, table_rows)}  # ~63 % of the rows touched each clock
    store = tempfile.mkdtemp(prefix="recovery-", dir=ckpt_dir)
    cfg = dscar.CheckpointConfig(store, policy="priority", every=10, fraction=0.1, memory=memory)
    plan = [] if kill_clock is None else [faults.kill(1, kill_clock)]
    t0 = time.perf_counter()
    with dscar.Cluster(n_workers=n_workers) as cl:
        cl.wait_for_workers(n_workers)
        res = dscar.fit(SparseTouch(table_rows, n_workers), data, cl, n_shards=2 * n_workers, max_clocks=clocks,
                        progress=False, checkpoint=cfg, faults=plan)
    out: dict[str, Any] = {"memory": memory, "wall_s": time.perf_counter() - t0,
                           "clock_s": [r.seconds for r in res.history]}
    done = [e for e in res.events if e["kind"] == "recovery-done"]
    restored = [e for e in res.events if e["kind"] == "partition-restored" and e["table"] == "w"]
    lost = [e for e in res.events if e["kind"] == "worker-lost"]
    if kill_clock is not None:
        out["recovery_s"] = done[0]["seconds"] if done else None
        out["loss_clock"] = lost[0]["clock"] if lost else None
        out["restored"] = [{k: e.get(k) for k in ("part", "tier", "memory_clock", "version")} for e in restored]
        # the perturbation SCAR's bound is about, measured exactly: every clock adds m(r) to row r
        # (m: how often r is named), so a row's final value tells how many clocks of progress it lost
        from dscar.core.partitions import row_bounds

        m = np.bincount(data["idx"], minlength=table_rows).astype(np.float64)
        w = res.params["w"][:, 0]
        bounds = row_bounds(table_rows, n_workers)
        lost_rows = np.concatenate([np.arange(*bounds[e["part"]]) for e in restored]) if restored else np.array([], int)
        touched = lost_rows[m[lost_rows] > 0]
        lag = (m[touched] * res.n_clocks - w[touched]) / m[touched]
        out["lag_clocks_mean"] = float(lag.mean()) if lag.size else 0.0
        out["rel_perturbation"] = float(np.linalg.norm(m[touched] * lag) / np.linalg.norm(m * res.n_clocks))
    import shutil

    shutil.rmtree(store, ignore_errors=True)
    return out


def summarise(runs: list[dict]) -> dict[str, Any]:
    rec = [r["recovery_s"] for r in runs if r.get("recovery_s") is not None]
    lags = [r["lag_clocks_mean"] for r in runs if "lag_clocks_mean" in r]
    return {"n": len(runs), "recovery_s_median": statistics.median(rec) if rec else None,
            "recovery_s": rec, "lag_clocks_mean": statistics.fmean(lags) if lags else None,
            "rel_perturbation": [r["rel_perturbation"] for r in runs if "rel_perturbation" in r],
            "tiers": sorted({e.get("tier") or "disk" for r in runs for e in r.get("restored", [])})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 16 MB table, 1 trial (a smoke run)")
    ap.add_argument("--mb", type=float, help="table size in MB (default 128; 16 with --quick)")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--trials", type=int, help="fresh clusters per tier (default 3; 1 with --quick)")
    ap.add_argument("--clocks", type=int, default=12)
    ap.add_argument("--kill-clock", type=int, default=7)
    ap.add_argument("--ckpt-dir", default=None, help="parent of the checkpoint stores (default: TMPDIR, on disk)")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--plot", metavar="PATH", default="recovery.png")
    args = ap.parse_args(argv)
    mb = args.mb or (16.0 if args.quick else 128.0)
    trials = args.trials or (1 if args.quick else 3)
    if args.workers < 2:
        ap.error("--workers must be >= 2 (one is killed)")
    t_start = time.perf_counter()
    load0 = os.getloadavg()
    results: dict[str, Any] = {}
    for memory in (False, True):
        name = "memory" if memory else "disk"
        ff = one_fit(mb, args.workers, args.clocks, None, memory, args.ckpt_dir)
        kills = [one_fit(mb, args.workers, args.clocks, args.kill_clock, memory, args.ckpt_dir)
                 for _ in range(trials)]
        results[name] = {"failure_free": ff, "kills": kills, **summarise(kills),
                         "clock_s_median_ff": statistics.median(ff["clock_s"][1:])}
        s = results[name]
        print(f"[{time.perf_counter() - t_start:6.1f}s] {name:<6} recovery median {s['recovery_s_median']:.3f}s "
              f"{[round(x, 3) for x in s['recovery_s']]}  lag {s['lag_clocks_mean']:.2f} clocks  "
              f"perturbation {[round(x, 4) for x in s['rel_perturbation']]}  restored from {s['tiers']}  "
              f"ff clock {1e3 * s['clock_s_median_ff']:.1f} ms", flush=True)
    d, m = results["disk"], results["memory"]
    print(f"\nRecovery after a killed worker, {mb:.0f} MB param table over {args.workers} worker processes, "
          f"kill at clock {args.kill_clock}; load average {load0[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"  {'tier':<8}{'recovery s (median)':>21}{'lost rows lag (clocks)':>24}{'|dw|/|w|':>10}"
          f"{'clock ms (ff median)':>22}")
    for name, s in results.items():
        print(f"  {name:<8}{s['recovery_s_median']:>21.3f}{s['lag_clocks_mean']:>24.2f}"
              f"{statistics.median(s['rel_perturbation']):>10.4f}{1e3 * s['clock_s_median_ff']:>22.1f}")
    ratio = d["recovery_s_median"] / m["recovery_s_median"] if m["recovery_s_median"] else float("nan")
    print(f"  memory tier recovers {ratio:.1f}x faster; costs {1e3 * (m['clock_s_median_ff'] - d['clock_s_median_ff']):+.1f} ms"
          f" per clock")
    out = {"machine": machine_info(), "mb": mb, "workers": args.workers, "trials": trials, "kill_clock": args.kill_clock, "clocks": args.clocks,
           "loadavg": [load0[0], os.getloadavg()[0]], "results": results, "speedup": ratio,
           "seconds": time.perf_counter() - t_start}
    if args.json:
        write_json(args.json, out)
    if args.plot:
        plt = pyplot()
        fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
        names = list(results)
        a.bar(names, [results[n]["recovery_s_median"] for n in names], color=["#888", "#2a7"])
        for i, n in enumerate(names):
            a.plot([i] * len(results[n]["recovery_s"]), results[n]["recovery_s"], "k.")
        a.set_ylabel("recovery (s)")
        a.set_title(f"restore after a kill, {mb:.0f} MB table")
        b.bar(names, [1e3 * results[n]["clock_s_median_ff"] for n in names], color=["#888", "#2a7"])
        b.set_ylabel("failure-free clock (ms)")
        b.set_title("what the tier costs per clock")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
