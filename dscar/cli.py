"""The ``dscar`` command: ``dscar run MODEL [options]`` on the embedded cluster or a given one."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

from .errors import DscarError

#: model name -> function(args) that returns (algorithm, data, description)
MODELS: dict[str, Callable] = {}


def _lasso(args):
    from algorithms.datasets import lasso_alpha_max, make_regression
    from algorithms.lasso import LassoCD

    if args.data:
        from .data import FileData

        data = FileData(args.data, n_shards=args.shards or 4 * args.workers)
        alpha = args.alpha if args.alpha is not None else 0.1
        desc = f"data {args.data}"
    else:
        X, y, _ = make_regression(args.rows, args.features, args.informative, noise=args.noise,
                                  rho=args.rho, seed=args.seed)
        data = {"X": X, "y": y}
        alpha = args.alpha if args.alpha is not None else args.alpha_ratio * lasso_alpha_max(X, y)
        desc = f"synthetic {args.rows} x {args.features}, {args.informative} informative, seed {args.seed}"
    algo = LassoCD(alpha, tol=args.tol)
    return algo, data, f"{desc}, alpha={alpha:.4g}"


MODELS["lasso"] = _lasso


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dscar",
        description="Train iterative-convergent models on a Dask cluster, through slow and lost workers.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train a model (on an embedded LocalCluster unless --scheduler is given)")
    run.add_argument("model", choices=sorted(MODELS), help="the model to train")
    g = run.add_argument_group("cluster")
    g.add_argument("--workers", type=int, default=2, help="worker processes of the embedded cluster (default 2)")
    g.add_argument("--scheduler", metavar="ADDR", help="address of a running Dask scheduler, e.g. tcp://host:8786")
    g = run.add_argument_group("data")
    g.add_argument("--data", metavar="PATH_OR_URL", help="directory of .npy arrays (X.npy, y.npy) or .npz shards")
    g.add_argument("--rows", type=int, default=20_000, help="rows of the generated dataset (default 20000)")
    g.add_argument("--features", type=int, default=500, help="features of the generated dataset (default 500)")
    g.add_argument("--informative", type=int, default=25, help="true non-zero coefficients (default 25)")
    g.add_argument("--noise", type=float, default=1.0, help="noise standard deviation (default 1)")
    g.add_argument("--rho", type=float, default=0.0, help="AR(1) correlation between features (default 0)")
    g.add_argument("--shards", type=int, help="data shards (default 4 per worker)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    g = run.add_argument_group("model")
    g.add_argument("--alpha", type=float, help="L1 penalty (default: --alpha-ratio x alpha_max)")
    g.add_argument("--alpha-ratio", type=float, default=0.01, help="alpha as a fraction of alpha_max (default 0.01)")
    g.add_argument("--tol", type=float, default=1e-6, help="stop at relative duality gap <= tol (default 1e-6)")
    g.add_argument("--max-clocks", type=int, default=100, help="stop after this many clocks (default 100)")
    g = run.add_argument_group("stragglers and faults")
    g.add_argument("--sharding", choices=("dynamic", "static"), default="dynamic",
                   help="dynamic: workers pull shards (default); static: each keeps its own (BSP baseline)")
    g.add_argument("--policies", default=None,
                   help="comma-separated straggler policies: backup, adaptive, restart; 'none' for none "
                        "(default: backup)")
    g.add_argument("--slow", action="append", default=[], metavar="W:FACTOR[:FROM[:TO]]",
                   help="slow worker W by FACTOR from clock FROM (default 1) to TO (default: the end)")
    g.add_argument("--kill", action="append", default=[], metavar="W:CLOCK", help="kill worker W at clock CLOCK")
    g.add_argument("--hang", action="append", default=[], metavar="W:CLOCK",
                   help="hang worker W (SIGSTOP) at clock CLOCK; the scheduler's worker-ttl drops it")
    run.add_argument("--no-progress", action="store_true", help="do not show a progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .driver import fit

    from . import faults as faults_mod

    try:
        faults = [faults_mod.parse(kind, text) for kind in ("slow", "kill", "hang") for text in getattr(args, kind)]
        policies = None
        if args.policies is not None:
            policies = [] if args.policies == "none" else [p.strip() for p in args.policies.split(",") if p.strip()]
        algo, data, desc = MODELS[args.model](args)
        where = args.scheduler or f"embedded LocalCluster, {args.workers} workers"
        print(f"dscar run {args.model}: {desc}; cluster: {where}", flush=True)
        t0 = time.perf_counter()
        res = fit(algo, data, args.scheduler, n_workers=args.workers, n_shards=args.shards,
                  max_clocks=args.max_clocks, progress=not args.no_progress, sharding=args.sharding,
                  policies=policies, faults=faults)
    except DscarError as e:
        print(f"dscar: error: {e}", file=sys.stderr)
        return 2
    for rec in res.history:
        m = rec.metrics
        extra = " ".join(f"{k}={v:.3g}" for k, v in m.items() if k not in ("objective", "converged"))
        print(f"clock {rec.clock:3d}  objective={m['objective']:.10g}  {extra}  {rec.seconds * 1e3:.1f} ms")
    for e in res.events:
        if e["kind"] not in ("job-started", "shard-moved"):
            info = " ".join(f"{k}={v}" for k, v in e.items() if k not in ("time", "kind", "clock"))
            print(f"event clock {e.get('clock', '-')}: {e['kind']} {info}")
    print(f"dscar {args.model}: {res.summary()} (total {time.perf_counter() - t0:.2f}s)")
    return 0 if res.converged else 1


if __name__ == "__main__":
    sys.exit(main())
