"""The ``dscar`` command: ``dscar run MODEL [options]`` on the embedded cluster or a given one."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Protocol

from ..errors import DscarError, InvalidInputError
from ..validation import arg_float, arg_int, fault_clocks


class _Parser(argparse.ArgumentParser):
    """Every usage error is one line ``dscar: error: ...`` and exit status 2 (no usage dump)."""

    def error(self, message: str):  # type: ignore[override]
        where = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        print(f"dscar: error: {where}{message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


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
    listing = "\n".join(f"  {name:<8} {model.help}" for name, model in sorted(models.items()))
    p = _Parser(
        prog="dscar",
        description="Train iterative-convergent models on a Dask cluster, through slow and lost workers.",
        epilog=f"models (dscar run MODEL --help for each one's flags):\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from .. import __version__

    p.add_argument("--version", action="version", version=f"dscar {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train a model (on an embedded LocalCluster unless --scheduler is given)")
    per_model = run.add_subparsers(dest="model", required=True, metavar="MODEL")
    for name, model in sorted(models.items()):
        mp = per_model.add_parser(name, help=model.help, description=model.help)
        _add_common(mp)
        model.add_arguments(mp.add_argument_group(f"{name} model and data"))
    for command, text in (("jobs", "list the dscar jobs running on a cluster (id, model, clock, workers, lease age)"),
                          ("cancel", "end a running dscar job by hand (its workers free its partitions)")):
        jp = sub.add_parser(command, help=text, description=text)
        if command == "cancel":
            jp.add_argument("job", metavar="JOB", help="the job's id, as `dscar jobs` lists it")
        jp.add_argument("--scheduler", metavar="ADDR", required=True, help="address of the Dask scheduler")
        jp.add_argument("--timeout", type=arg_float(0, strict_min=True), default=None, metavar="SECONDS",
                        help="seconds to reach --scheduler (default 10)")
    return p


def _jobs_command(args) -> int:
    """``dscar jobs`` / ``dscar cancel``: one line per job, or one line saying what was ended."""
    from .cluster import Cluster
    from .driver import cancel, jobs

    cluster = Cluster(args.scheduler, timeout=args.timeout, set_as_default=False, coordinator_only=True)
    try:
        if args.command == "cancel":
            cancel(args.job, cluster)
            print(f"dscar: job {args.job} cancelled")
            return 0
        running = jobs(cluster)
    finally:
        cluster.close()
    if not running:
        print("no dscar job running")
    for j in running:
        print(f"{j['job']}  model={j['model']}  clock={j['clock']}  workers={len(j['workers'])}  "
              f"lease_age={j['lease_age']}s (timeout {j['lease_timeout']:g}s)")
    return 0


def _add_common(run: argparse.ArgumentParser) -> None:
    from ..checkpoint import MAX_CHAIN

    g = run.add_argument_group("cluster")
    g.add_argument("--workers", type=arg_int(1), default=2, help="worker processes of the embedded cluster (default 2)")
    g.add_argument("--scheduler", metavar="ADDR", help="address of a running Dask scheduler, e.g. tcp://host:8786")
    g.add_argument("--timeout", type=arg_float(0, strict_min=True), default=None, metavar="SECONDS",
                   help="seconds to reach --scheduler (default 10)")
    g.add_argument("--tls-ca-file", metavar="PEM", help="TLS: CA certificate of a tls:// scheduler")
    g.add_argument("--tls-cert", metavar="PEM", help="TLS: client certificate (with --tls-key)")
    g.add_argument("--tls-key", metavar="PEM", help="TLS: client private key")
    g = run.add_argument_group("run")
    g.add_argument("--shards", type=arg_int(1), help="data shards (default: one per worker, up to 4 for large data; see README, Data)")
    g.add_argument("--seed", type=arg_int(0), default=0, help="random seed (default 0)")
    g.add_argument("--tol", type=arg_float(0, strict_min=True), default=None,
                   help="convergence tolerance (default: the model's)")
    g.add_argument("--max-clocks", type=arg_int(1), default=100, help="stop after this many clocks (default 100)")
    g = run.add_argument_group("stragglers and faults")
    g.add_argument("--sharding", choices=("dynamic", "static"), default="dynamic",
                   help="dynamic: workers pull shards (default); static: each keeps its own (BSP baseline)")
    g.add_argument("--policies", default=None,
                   help="comma-separated straggler policies: backup, adaptive, restart; 'none' for none "
                        "(default: backup)")
    g.add_argument("--consistency", choices=("bsp", "ssp"), default="bsp",
                   help="bsp: a clock is a barrier (default); ssp: stale-synchronous, a fast worker runs "
                        "up to --staleness clocks ahead of the slowest")
    g.add_argument("--staleness", type=arg_int(0), default=None,
                   help="with --consistency ssp: clocks a shard may run ahead (default: the model's max_staleness)")
    g.add_argument("--slow", action="append", default=[], metavar="W:FACTOR[:FROM[:TO]]",
                   help="slow worker W by FACTOR from clock FROM (default 1) to TO (default: the end)")
    g.add_argument("--kill", action="append", default=[], metavar="W:CLOCK[:POINT]",
                   help="kill worker W at clock CLOCK, at POINT (default start: before a shard step; checkpoint: "
                        "when it snapshots its partitions, which every partition owner does)")
    g.add_argument("--hang", action="append", default=[], metavar="W:CLOCK[:POINT]",
                   help="hang worker W (SIGSTOP) at clock CLOCK, at POINT (as --kill); the scheduler's "
                        "worker-ttl drops it")
    g = run.add_argument_group("checkpoints and recovery")
    g.add_argument("--checkpoint", metavar="DIR_OR_URL",
                   help="checkpoint store (local directory or fsspec URL); needed to survive a lost worker "
                        "(with --kill/--hang and no --checkpoint, a temporary directory is used)")
    g.add_argument("--checkpoint-policy", choices=("priority", "full"), default="priority",
                   help="priority: the fraction r of rows that moved most every r*C clocks (SCAR, default); "
                        "full: everything every C clocks")
    g.add_argument("--checkpoint-every", type=arg_int(1), default=None, metavar="C",
                   help=f"C, in clocks (default {CHECKPOINT_EVERY})")
    g.add_argument("--checkpoint-fraction", type=arg_float(0, 1, strict_min=True), default=None, metavar="R",
                   help=f"r, in (0, 1] (default {CHECKPOINT_FRACTION}); with priority checkpoints r*C >= 1")
    g.add_argument("--checkpoint-interval", choices=("fixed", "auto"), default="fixed",
                   help="fixed: every C clocks (r*C for priority); auto: the Young/Daly period sqrt(2 cost MTBF) "
                        "from the checkpoints' measured cost and --mtbf (or the job's own losses)")
    g.add_argument("--mtbf", type=arg_float(0, strict_min=True), metavar="SECONDS",
                   help="mean time between worker failures, for --checkpoint-interval auto "
                        "(default: observed from the job's losses; C until one happens)")
    g.add_argument("--keep", type=arg_int(1), default=3, help="checkpoint versions kept (default 3)")
    g.add_argument("--max-chain", type=arg_int(2), default=MAX_CHAIN, metavar="N",
                   help="priority checkpoints: a partition whose chain holds N entries is saved whole next, "
                        f"so old files can go (default {MAX_CHAIN})")
    g.add_argument("--recovery", choices=("partial", "full"), default="partial",
                   help="partial: restore only a lost worker's partitions and shard states (SCAR, default); full: roll every parameter "
                        "table and shard state back to the newest checkpoint (the clock counter keeps counting)")
    g.add_argument("--memory-tier", action="store_true",
                   help="also keep each owner's partitions and shard states in a buddy worker's memory, refreshed every clock; "
                        "partial recovery restores from there when the buddy is alive")
    g.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --checkpoint")
    run.add_argument("-v", "--verbose", action="store_true",
                     help="print every clock and every event (default: a sample of the clocks and the events' "
                          "counts per kind), and Dask's own warnings")
    run.add_argument("--no-progress", action="store_true",
                     help="do not show a progress bar (shown by default when stderr is a terminal)")
    run.add_argument("--plot", metavar="PATH", help="write a picture of the fit (objective, seconds per clock, "
                     "events) to PATH, e.g. fit.png (needs matplotlib)")


def _checkpoint_config(args, faults: list):
    """The run's ``CheckpointConfig`` (None without one); with injected worker losses and no
    --checkpoint, a temporary store that ``main`` removes at the end (as ``dscar.fit`` does)."""
    from ..checkpoint import CheckpointConfig, needs_store, temporary_store

    url = args.checkpoint
    every = CHECKPOINT_EVERY if args.checkpoint_every is None else args.checkpoint_every
    fraction = CHECKPOINT_FRACTION if args.checkpoint_fraction is None else args.checkpoint_fraction
    if args.checkpoint_policy == "priority" and fraction * every < 1 - 1e-9:
        raise InvalidInputError(
            f"--checkpoint-fraction {fraction:g} x --checkpoint-every {every} = {fraction * every:g}: a priority "
            f"checkpoint saves the fraction r of rows every r*C clocks, so r*C must be >= 1 (e.g. "
            f"--checkpoint-fraction {1 / every:g}, or --checkpoint-policy full)")
    if url is None:
        if args.resume:
            raise InvalidInputError("--resume needs --checkpoint DIR_OR_URL")
        if args.checkpoint_interval != "fixed" or args.mtbf is not None:
            raise InvalidInputError("--checkpoint-interval and --mtbf need --checkpoint DIR_OR_URL")
        if not needs_store(faults):
            if args.checkpoint_every is not None or args.checkpoint_fraction is not None:
                raise InvalidInputError("--checkpoint-every and --checkpoint-fraction need --checkpoint DIR_OR_URL")
            return None
        url = temporary_store()
        print(f"dscar: injected worker losses: keeping checkpoints in {url} (removed at the end)", flush=True)
    cfg = CheckpointConfig(url, policy=args.checkpoint_policy, every=every, fraction=fraction, keep=args.keep,
                           recovery=args.recovery, memory=args.memory_tier, interval=args.checkpoint_interval,
                           mtbf=args.mtbf, max_chain=args.max_chain)
    cfg.validate()  # before the data is built: a bad flag costs no corpus load
    return cfg


def _cluster(args):
    """``--scheduler`` (with its TLS files and timeout) as a ``dscar.Cluster``, or None (embedded)."""
    tls = (args.tls_ca_file, args.tls_cert, args.tls_key)
    if args.scheduler is None:
        if any(tls) or args.timeout is not None:
            raise InvalidInputError("--tls-* and --timeout apply to --scheduler only")
        return None
    from .cluster import Cluster

    security = None
    if any(tls):
        from distributed import Security

        if not all(tls):
            raise InvalidInputError("TLS needs all of --tls-ca-file, --tls-cert and --tls-key")
        security = Security(tls_ca_file=tls[0], tls_client_cert=tls[1], tls_client_key=tls[2], require_encryption=True)
    return Cluster(args.scheduler, timeout=args.timeout, security=security)


def _show_driver_log() -> None:
    import logging

    log = logging.getLogger("dscar.driver")
    if not log.handlers:
        h = logging.StreamHandler(sys.stdout)
        h.setFormatter(logging.Formatter("dscar: %(message)s"))
        log.addHandler(h)
        log.setLevel(logging.INFO)


#: checkpoint interval C and fraction r when --checkpoint-every / --checkpoint-fraction are not given
CHECKPOINT_EVERY, CHECKPOINT_FRACTION = 10, 0.1
#: clock lines printed without --verbose (the first, the last and evenly spaced ones between)
CLOCK_LINES = 8


def clock_sample(n: int, most: int = CLOCK_LINES) -> list[int]:
    """Indices of the ``n`` clock records printed without --verbose: all when ``n <= most``, else
    ``most`` evenly spaced ones from the first to the last."""
    if n <= most:
        return list(range(n))
    return sorted({round(k * (n - 1) / (most - 1)) for k in range(most)})


def kernels_cached(model: str) -> bool | None:
    """Whether numba's cache holds compiled kernels of ``dscar.algorithms.<model>_kernels`` (None:
    the model has no such module). Looked for where numba writes them: the module's
    ``__pycache__``, or ``NUMBA_CACHE_DIR``."""
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec(f"dscar.algorithms.{model}_kernels")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    src = Path(spec.origin)
    pattern = f"{src.stem}.*.nbi"
    if any((src.parent / "__pycache__").glob(pattern)):
        return True
    try:
        from numba.core.config import CACHE_DIR
    except ImportError:
        return None
    return bool(CACHE_DIR) and any(Path(CACHE_DIR).rglob(pattern))


def _quiet_dask() -> None:
    """Dask's own log lines (a nanny killing a worker that closes slowly, ...) only with --verbose:
    what matters to the run is in dscar's events."""
    import logging

    for name in ("distributed", "bokeh"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    from ..checkpoint import remove_temporary

    models = load_models()
    args = build_parser(models).parse_args(argv)
    if args.command in ("jobs", "cancel"):
        try:
            return _jobs_command(args)
        except DscarError as e:
            print(f"dscar: error: {e}", file=sys.stderr)
            return 2
    from .driver import fit

    from .. import faults as faults_mod

    checkpoint = cluster = None
    try:
        faults = [faults_mod.parse(kind, text) for kind in ("slow", "kill", "hang") for text in getattr(args, kind)]
        fault_clocks(faults, args.max_clocks)
        policies = None
        if args.policies is not None:
            policies = [] if args.policies == "none" else [p.strip() for p in args.policies.split(",") if p.strip()]
        checkpoint = _checkpoint_config(args, faults)
        if args.plot:
            from .plot import check_target

            check_target(args.plot)
        try:
            algo, data, desc = models[args.model].build(args)
        except ImportError as e:  # a model's optional package (e.g. the lda package's Reuters corpus)
            what = "needs a package that is not installed: " if isinstance(e, ModuleNotFoundError) else ""
            raise InvalidInputError(f"dscar run {args.model}: {what}{e}") from None
        cluster = _cluster(args)
        where = args.scheduler or f"embedded LocalCluster, {args.workers} workers"
        print(f"dscar run {args.model}: {desc}; cluster: {where}", flush=True)
        _show_driver_log()  # the dashboard page's URL once the job starts
        if not args.verbose:
            _quiet_dask()
        if kernels_cached(args.model) is False:
            print(f"dscar: compiling the {args.model} kernels (first run only: numba caches them)...", flush=True)
        t0 = time.perf_counter()
        res = fit(algo, data, cluster, n_workers=args.workers, n_shards=args.shards,
                  tol=args.tol, max_clocks=args.max_clocks, progress=False if args.no_progress else None,
                  sharding=args.sharding, policies=policies, faults=faults, checkpoint=checkpoint, resume=args.resume,
                  consistency=args.consistency, staleness=args.staleness)
    except DscarError as e:
        print(f"dscar: error: {e}", file=sys.stderr)
        return 2
    finally:
        if cluster is not None:
            cluster.close()
        if checkpoint is not None and args.checkpoint is None:
            remove_temporary(checkpoint.url)
    shown = range(len(res.history)) if args.verbose else clock_sample(len(res.history))
    for j in shown:
        rec = res.history[j]
        m = rec.metrics
        extra = " ".join(f"{k}={v:.3g}" for k, v in m.items() if k not in ("objective", "converged"))
        print(f"clock {rec.clock:3d}  objective={m['objective']:.10g}  {extra}  {rec.seconds * 1e3:.1f} ms")
    from . import report

    if args.verbose:
        print(report.legend(res.events))
        for line in report.event_lines(res.events, hide=report.ROUTINE_KINDS):
            print(f"event {line}")
    hint = "" if args.verbose else f" (-v: every {'clock and ' if len(shown) < len(res.history) else ''}event)"
    print(report.counts_line(res.events) + hint)
    if res.checkpoints:
        print(f"checkpoints: {len(res.checkpoints)} published, {res.checkpoint_bytes / max(res.n_clocks, 1):.0f} "
              f"bytes per clock, newest version {res.checkpoints[-1]['version']} (clock {res.checkpoints[-1]['clock']})")
    if args.plot:
        res.plot().savefig(args.plot, dpi=100)
        print(f"plot: {args.plot}")
    print(f"dscar {args.model}: {res.summary()} (total {time.perf_counter() - t0:.2f}s)")
    return 0  # a run that stops at --max-clocks ended normally too; errors exit 2


if __name__ == "__main__":
    sys.exit(main())
