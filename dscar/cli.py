"""The ``dscar`` command: ``dscar run MODEL [options]`` on the embedded cluster or a given one."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Protocol

from .errors import DscarError

class CliModel(Protocol):
    """What a model offers the ``dscar run`` command (registered under the ``dscar.models`` entry points)."""

    help: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Model flags (data size, hyperparameters)."""

    def build(self, args: argparse.Namespace) -> tuple[Any, Any, str]:
        """``(algorithm, data, description)`` from the parsed flags."""


def load_models() -> dict[str, CliModel]:
    """Every model installed under the ``dscar.models`` entry-point group."""
    from importlib.metadata import entry_points

    return {ep.name: ep.load() for ep in entry_points(group="dscar.models")}


def build_parser(models: dict[str, CliModel] | None = None) -> argparse.ArgumentParser:
    models = load_models() if models is None else models
    p = argparse.ArgumentParser(
        prog="dscar",
        description="Train iterative-convergent models on a Dask cluster, through slow and lost workers.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train a model (on an embedded LocalCluster unless --scheduler is given)")
    per_model = run.add_subparsers(dest="model", required=True, metavar="MODEL")
    for name, model in sorted(models.items()):
        mp = per_model.add_parser(name, help=model.help, description=model.help)
        _add_common(mp)
        model.add_arguments(mp.add_argument_group(f"{name} model and data"))
    return p


def _add_common(run: argparse.ArgumentParser) -> None:
    g = run.add_argument_group("cluster")
    g.add_argument("--workers", type=int, default=2, help="worker processes of the embedded cluster (default 2)")
    g.add_argument("--scheduler", metavar="ADDR", help="address of a running Dask scheduler, e.g. tcp://host:8786")
    g = run.add_argument_group("run")
    g.add_argument("--shards", type=int, help="data shards (default 4 per worker)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    g.add_argument("--tol", type=float, default=None, help="convergence tolerance (default: the model's)")
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
    g = run.add_argument_group("checkpoints and recovery")
    g.add_argument("--checkpoint", metavar="DIR_OR_URL",
                   help="checkpoint store (local directory or fsspec URL); needed to survive a lost worker "
                        "(with --kill/--hang and no --checkpoint, a temporary directory is used)")
    g.add_argument("--checkpoint-policy", choices=("priority", "full"), default="priority",
                   help="priority: the fraction r of rows that moved most every r*C clocks (SCAR, default); "
                        "full: everything every C clocks")
    g.add_argument("--checkpoint-every", type=int, default=10, metavar="C", help="C, in clocks (default 10)")
    g.add_argument("--checkpoint-fraction", type=float, default=0.1, metavar="R", help="r (default 0.1)")
    g.add_argument("--keep", type=int, default=3, help="checkpoint versions kept (default 3)")
    g.add_argument("--recovery", choices=("partial", "full"), default="partial",
                   help="partial: restore only a lost worker's partitions (SCAR, default); full: roll back everything")
    g.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --checkpoint")
    run.add_argument("--no-progress", action="store_true", help="do not show a progress bar")


def _checkpoint_config(args, faults: list):
    from .checkpoint import CheckpointConfig

    url = args.checkpoint
    if url is None:
        if args.resume:
            from .errors import InvalidInputError

            raise InvalidInputError("--resume needs --checkpoint DIR_OR_URL")
        if not any(f.kind in ("kill", "hang") for f in faults):
            return None
        import tempfile

        url = tempfile.mkdtemp(prefix="dscar-checkpoints-")
        print(f"dscar: injected worker losses: keeping checkpoints in {url}", flush=True)
    return CheckpointConfig(url, policy=args.checkpoint_policy, every=args.checkpoint_every,
                            fraction=args.checkpoint_fraction, keep=args.keep, recovery=args.recovery)


def main(argv: list[str] | None = None) -> int:
    models = load_models()
    args = build_parser(models).parse_args(argv)
    from .driver import fit

    from . import faults as faults_mod

    try:
        faults = [faults_mod.parse(kind, text) for kind in ("slow", "kill", "hang") for text in getattr(args, kind)]
        policies = None
        if args.policies is not None:
            policies = [] if args.policies == "none" else [p.strip() for p in args.policies.split(",") if p.strip()]
        checkpoint = _checkpoint_config(args, faults)
        algo, data, desc = models[args.model].build(args)
        where = args.scheduler or f"embedded LocalCluster, {args.workers} workers"
        print(f"dscar run {args.model}: {desc}; cluster: {where}", flush=True)
        t0 = time.perf_counter()
        res = fit(algo, data, args.scheduler, n_workers=args.workers, n_shards=args.shards,
                  tol=args.tol, max_clocks=args.max_clocks, progress=not args.no_progress, sharding=args.sharding,
                  policies=policies, faults=faults, checkpoint=checkpoint, resume=args.resume)
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
            print(f"event clock {e.get('clock', '-')}: {e['kind']} {info}"[:300])
    if res.checkpoints:
        print(f"checkpoints: {len(res.checkpoints)} published, {res.checkpoint_bytes / max(res.n_clocks, 1):.0f} "
              f"bytes per clock, newest version {res.checkpoints[-1]['version']} (clock {res.checkpoints[-1]['clock']})")
    print(f"dscar {args.model}: {res.summary()} (total {time.perf_counter() - t0:.2f}s)")
    return 0 if res.converged else 1


if __name__ == "__main__":
    sys.exit(main())
