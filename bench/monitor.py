"""Does the straggler monitor cry wolf or go blind?

* **False positives**: ``--runs`` failure-free fits at 2 and 4 worker processes, on the
  machine as it is and (``--busy N``) with N busy-loop processes beside them; every
  ``straggler`` event counts. Target (issue 9): none.
* **Detection**: one worker slowed 2x from clock 1, backups on and off: the clock of the
  first ``straggler`` event naming it. Target: within 5 clocks.
* **Mitigation**: one worker slowed 8x with ``policies=["backup", "restart"]``: is it
  restarted (a ``worker-restart`` event)? Target: yes.

The model's shard step sleeps ``--step-ms`` (sleep-based, so a slowdown is exact whatever
the load); its clock-end step is trivial. Prints a table, writes ``--json`` and a PNG.

Usage: ``python -m bench.monitor [--quick] [--runs N] [--busy N] [--json PATH] [--plot PATH]``.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from typing import Any

import numpy as np

import dscar
from bench.common import load_average, machine_info, pyplot, write_json
from dscar import Algorithm, TableSpec, faults


class Sleeper(Algorithm):
    """Each shard step sleeps ``step_s`` and adds one to its rows: nothing but a steady speed."""

    name = "sleeper"
    data_names = ("row",)

    def __init__(self, step_s: float = 0.01):
        self.step_s = step_s

    def tables(self, meta):
        return [TableSpec("count", meta.n_rows)]

    def shard_step(self, ctx, data):
        time.sleep(self.step_s)
        rows = data["row"]
        ctx.add("count", ctx.xp.ones(rows.shape[0]), start=int(rows[0]))

    def clock_end(self, ctx):
        return {"objective": float(dscar.to_host(ctx.pull("count")).sum())}

    def converged(self, history, tol):
        return False


def _busy() -> None:
    while True:
        pass


def one_fit(n_workers: int, clocks: int, step_s: float, plan: list, policies: list[str]) -> dscar.FitResult:
    data = {"row": np.arange(64 * n_workers, dtype=np.int64)}
    with dscar.Cluster(n_workers=n_workers) as cl:
        return dscar.fit(Sleeper(step_s), data, cl, n_shards=4 * n_workers, max_clocks=clocks, faults=plan,
                         policies=policies)


def first_flag(res: dscar.FitResult, worker: str) -> int | None:
    return next((e["clock"] for e in res.events if e["kind"] == "straggler" and e["worker"] == worker), None)


def false_positives(runs: int, clocks: int, step_s: float, busy: int) -> list[dict[str, Any]]:
    rows = []
    procs = [mp.Process(target=_busy, daemon=True) for _ in range(busy)]
    for p in procs:
        p.start()
    try:
        for n in (2, 4):
            events = 0
            runs_with = 0
            for _ in range(runs):
                res = one_fit(n, clocks, step_s, [], ["backup"])
                k = sum(e["kind"] == "straggler" for e in res.events)
                events += k
                runs_with += k > 0
            rows.append({"workers": n, "busy": busy, "runs": runs, "straggler_events": events,
                         "runs_with_events": runs_with, "load": load_average()})
    finally:
        for p in procs:
            p.kill()
    return rows


def detection(clocks: int, step_s: float) -> list[dict[str, Any]]:
    rows = []
    for n in (2, 4):
        for policies in (["backup"], []):
            res = one_fit(n, clocks, step_s, [faults.slow(0, 2.0)], policies)
            slow = res.workers[0]
            others = sum(e["kind"] == "straggler" and e["worker"] != slow for e in res.events)
            rows.append({"workers": n, "policies": ",".join(policies) or "none", "slowdown": 2.0,
                         "flagged_at_clock": first_flag(res, slow), "other_flags": others})
    return rows


def mitigation(clocks: int, step_s: float) -> dict[str, Any]:
    res = one_fit(3, clocks, step_s, [faults.slow(0, 8.0)], ["backup", "restart"])
    slow = res.workers[0]
    restart = next((e for e in res.events if e["kind"] == "worker-restart"), None)
    return {"workers": 3, "slowdown": 8.0, "flagged_at_clock": first_flag(res, slow),
            "restarted_at_clock": None if restart is None else restart["clock"],
            "restarted_worker_is_the_slow_one": restart is not None and restart["worker"] == slow}


def plot(d: dict, path: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    fp = d["false_positives"]
    labels = [f"{r['workers']}w busy={r['busy']}" for r in fp]
    axes[0].bar(labels, [r["straggler_events"] for r in fp], color="tab:gray")
    axes[0].set_ylim(0, max(1, *(r["straggler_events"] for r in fp)) * 1.1)  # a row of zeros stays readable
    axes[0].set_title(f"straggler events in failure-free runs ({fp[0]['runs']} per bar)")
    axes[0].set_ylabel("events")
    det = d["detection"]
    labels = [f"{r['workers']}w {r['policies']}" for r in det]
    axes[1].bar(labels, [r["flagged_at_clock"] or 0 for r in det], color="tab:orange")
    axes[1].axhline(5, color="k", ls="--", lw=1, label="target: clock 5")
    axes[1].set_title("2x-slowed worker: first flagged at clock (0: never)")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.monitor", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 runs per setting, 8 clocks")
    ap.add_argument("--runs", type=int, default=None, help="failure-free runs per setting (default 25 x 2 loads)")
    ap.add_argument("--clocks", type=int, default=None)
    ap.add_argument("--busy", type=int, default=4, help="busy-loop processes for the busy-machine runs")
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--plot", metavar="PATH", default="monitor.png")
    a = ap.parse_args(argv)
    runs = a.runs or (3 if a.quick else 25)
    clocks = a.clocks or (8 if a.quick else 12)
    step = a.step_ms / 1e3
    t0 = time.perf_counter()
    fp = false_positives(runs, clocks, step, 0) + false_positives(runs, clocks, step, a.busy)
    det = detection(clocks, step)
    mit = mitigation(max(clocks, 10), step)
    d = {"machine": machine_info(), "false_positives": fp, "detection": det, "mitigation": mit,
         "seconds": time.perf_counter() - t0}
    print(f"== false positives: {runs} failure-free runs per row, {clocks} clocks, {a.step_ms:g} ms steps")
    print(f"{'workers':>7} {'busy procs':>10} {'runs':>5} {'straggler events':>17} {'runs with any':>14}  load")
    for r in fp:
        print(f"{r['workers']:>7} {r['busy']:>10} {r['runs']:>5} {r['straggler_events']:>17} "
              f"{r['runs_with_events']:>14}  {r['load']}")
    total = sum(r["straggler_events"] for r in fp)
    print(f"target: no straggler event in {sum(r['runs'] for r in fp)} failure-free runs: "
          f"{'MET' if total == 0 else f'NOT MET ({total} events)'}")
    print("== detection: worker 0 slowed 2x from clock 1")
    for r in det:
        ok = r["flagged_at_clock"] is not None and r["flagged_at_clock"] <= 5
        print(f"  {r['workers']} workers, policies {r['policies']:<7}: flagged at clock {r['flagged_at_clock']} "
              f"({'MET' if ok else 'NOT MET'}), other workers flagged {r['other_flags']} time(s)")
    print(f"== mitigation: worker 0 of 3 slowed 8x, policies backup,restart: flagged at clock "
          f"{mit['flagged_at_clock']}, restarted at clock {mit['restarted_at_clock']} "
          f"({'MET' if mit['restarted_worker_is_the_slow_one'] else 'NOT MET'})")
    if a.json:
        write_json(a.json, d)
    if a.plot:
        plot(d, a.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
