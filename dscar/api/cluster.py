"""One entry point to a ready cluster: embedded LocalCluster, an address, or a Client."""
from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any

import dask
from distributed import Client, LocalCluster, Security

from ..scheduler.coordinator import Coordinator
from ..errors import ClusterError, InvalidInputError
from ..worker.plugin import ParamServer

#: how long a silent (hung) worker may stay before the scheduler drops it
DEFAULT_WORKER_TTL = "10s"
#: seconds to reach a scheduler given by address (``timeout=`` or a lower Dask connect timeout
#: override it): an unreachable one is reported this fast, not after Dask's 30 s connect
#: timeout (and a 60 s close on exit)
DEFAULT_CONNECT_TIMEOUT = 10.0
#: Dask settings of the embedded cluster: its idle background work (a stack sample every 10 ms, an
#: event-loop tick every 20 ms, a system sample every 500 ms) cost an idle 2-worker cluster 22 % of a
#: core (measured: 2.2 s of CPU in 10 s); without the profiler, with a 200 ms tick and a 1 s system
#: sample, 8 %, which a 2-core machine gives back to the workers. dscar's page on the dashboard does
#: not use Dask's profiles; the memory monitors keep their 100 ms.
EMBEDDED_CONFIG = {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "200ms",
                   "distributed.admin.system-monitor.interval": "1s"}
#: glibc's malloc in the embedded cluster's worker processes. Dask's nanny sets
#: ``MALLOC_TRIM_THRESHOLD_=65536``, which also turns off glibc's adaptive mmap threshold: every
#: array over 128 KiB is then a fresh mmap, and the first touch of each of its pages a fault, on
#: every pull, staged update and message of a clock. Arrays under 64 MiB stay on the heap and
#: are reused; the heap is trimmed once 256 MiB of its top is free. Measured on LDA's 2-worker
#: clock (5M tokens, 2 MB table halves): pull 12-15 -> 4.7-5.8 ms, push 3.4-4.5 -> 0.5-0.6 ms,
#: apply 7.5-10 -> 6.7-7.3 ms (glibc's own adaptive threshold, the trim setting left out, gave
#: most of it: pull 5.4-6.5 ms)
WORKER_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
#: the engine's part of what the embedded cluster's forkserver imports once (``worker_preload``)
WORKER_PRELOAD = ("distributed", "numpy", "scipy.sparse", "dscar.worker.plugin")


def worker_preload() -> list[str]:
    """What the forkserver imports: ``WORKER_PRELOAD`` and the installed models' modules (the
    ``dscar.models`` entry points, read without importing them). Each worker process then starts as
    a fork of it (0.3 s) instead of a fresh interpreter importing them (1.5-2 s and ~3 s of CPU per
    worker on 2 cores). None of them starts a thread or touches a GPU (CuPy is imported in the
    worker, when it is used); one that fails to import is skipped by the forkserver."""
    from importlib.metadata import entry_points

    return [*WORKER_PRELOAD, *dict.fromkeys(ep.module for ep in entry_points(group="dscar.models"))]


def forkserver_config(extra_preload: tuple[str, ...] = ()) -> dict[str, str]:
    """Dask configuration under which the embedded cluster's nannies fork their workers from a
    forkserver that preloaded ``worker_preload()`` and ``extra_preload`` (modules the workers will
    import anyway: a model's own module). Held while workers start (``dask.config.set``), it serves
    any ``LocalCluster`` of worker processes: a worker that joins mid-fit, or a nanny's restart of a
    killed one, then forks in 0.3 s instead of importing for seconds of CPU that a one-machine
    cluster takes from the running workers.

    The forkserver starts at the first worker process; its preload list must be set before that
    and after distributed sets its own (once, on its first forkserver context). The embedded
    cluster keeps the method while it lives (``hold_start_method``: a nanny's restart forks too).
    Where there is no forkserver (Windows) every worker is spawned: an empty configuration.
    """
    import multiprocessing

    from distributed.utils import get_mp_context

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return {}
    config = {"distributed.worker.multiprocessing-method": "forkserver"}
    with dask.config.set(config):
        get_mp_context().set_forkserver_preload([*worker_preload(), *extra_preload])
    return config


#: the embedded clusters alive that keep their nannies forking (``hold_start_method``), and the
#: multiprocessing method this process had before the first of them
_START_METHOD_HOLDERS: set[int] = set()
_START_METHOD_BEFORE: list[Any] = []
_MP_METHOD = "distributed.worker.multiprocessing-method"


def hold_start_method(holder: object, config: dict[str, str]) -> None:
    """Keep ``config``'s multiprocessing method in this process while ``holder`` lives (until
    ``release_start_method``). A nanny reads the method each time it starts its worker process, so a
    method set only while the cluster started (``forkserver_config``) left a nanny's restart of a
    killed worker to spawn a fresh interpreter: ~0.7 s of CPU on the cores the fit runs on, against
    ~0.05 s forked."""
    if _MP_METHOD not in config:
        return
    if not _START_METHOD_HOLDERS:
        _START_METHOD_BEFORE[:] = [dask.config.get(_MP_METHOD, None)]
        dask.config.set({_MP_METHOD: config[_MP_METHOD]})
    _START_METHOD_HOLDERS.add(id(holder))


def release_start_method(holder: object) -> None:
    """``holder`` is closed: the last one gives the process its method back."""
    if id(holder) not in _START_METHOD_HOLDERS:
        return
    _START_METHOD_HOLDERS.discard(id(holder))
    if not _START_METHOD_HOLDERS and _START_METHOD_BEFORE:
        dask.config.set({_MP_METHOD: _START_METHOD_BEFORE.pop()})


def default_memory_limit(n_workers: int) -> float:
    """Memory per worker of the embedded LocalCluster (Dask's "auto": the machine's memory
    shared by its one-thread workers), known before it starts."""
    from distributed.system import MEMORY_LIMIT

    return MEMORY_LIMIT / max(1, n_workers)


def _security(security: "Security | bool | None") -> Security | None:
    if security is None or security is False:
        return None
    if security is True:
        return Security.temporary()  # self-signed, in memory: for an embedded cluster
    if not isinstance(security, Security):
        raise InvalidInputError(f"security must be a distributed.Security, True (temporary certificates) or None, "
                                f"not {type(security).__name__}")
    return security


def check_address(address: str, security: Security | None, timeout: float) -> None:
    """Reach the scheduler at ``address`` once (handshake) before a ``Client`` is built, so every
    way of failing (malformed address, TLS settings missing or refused, nothing listening, too
    slow) becomes one prompt ``ClusterError`` naming the address and the cause. A ``Client`` that
    fails in its constructor instead waits twice its timeout when garbage-collected."""
    from distributed.comm import connect, parse_address

    try:
        scheme, _ = parse_address(address, strict=True)
        if ":" not in address.split("://", 1)[-1]:
            raise ValueError("no port")
    except (ValueError, TypeError) as e:
        raise ClusterError(f"{address!r} is not a scheduler address like tcp://HOST:8786 ({e})") from None
    sec = security or Security()  # Dask's configuration may hold TLS settings
    args = sec.get_connection_args("client")
    if scheme == "tls" and args.get("ssl_context") is None:
        raise ClusterError(f"{address!r} is a TLS address but no TLS settings were given: pass "
                           "security=distributed.Security(tls_ca_file=..., tls_client_cert=..., tls_client_key=...) "
                           "(dscar run: --tls-ca-file, --tls-cert, --tls-key)")
    if scheme == "tcp" and args.get("require_encryption"):
        raise ClusterError(f"{address!r} is not encrypted, but the security settings require TLS (use tls://)")

    async def probe() -> None:
        comm = await connect(address, timeout=timeout, **args)
        await comm.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # its own event loop: callers may run one
        try:
            pool.submit(asyncio.run, probe()).result(timeout=timeout + 5)
        except Exception as e:  # whatever answers there (or not), it is no scheduler we can use
            cause = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            if isinstance(e, MemoryError):
                cause = "what answers there does not speak Dask's protocol"
            hint = " (a TLS scheduler? use tls:// and security=...)" if scheme == "tcp" and "Timed out" not in cause else ""
            raise ClusterError(f"cannot reach the Dask scheduler at {address!r}: {cause}{hint}") from None


def worker_info(client: Client) -> dict[str, dict]:
    """Each live worker's address -> what the scheduler knows of it, asked of the scheduler itself (a synchronous
    client). Not ``Client.scheduler_info``: that returns the client's shared cache, which its periodic refresh
    (totals only, no workers) can overwrite between the fetch and the read; a fit under load once saw
    "0 worker(s)" on a two-worker cluster."""
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


class Cluster:
    """A Dask client with dscar's plugins registered; closes what it started.

    ``Cluster()`` starts an embedded LocalCluster (worker processes, one thread
    each); ``Cluster("tcp://host:8786")`` or ``Cluster(client)`` uses a running
    cluster. ``security``: a ``distributed.Security`` passed to the ``Client`` (and to
    the embedded cluster, which then listens on TLS); ``timeout``: seconds to reach
    a scheduler given by address (default ``DEFAULT_CONNECT_TIMEOUT``). Registration is idempotent: several ``Cluster`` objects on one
    Dask cluster share one coordinator and one ParamServer per worker.

    ``set_as_default``: the client this ``Cluster`` makes (not one it is given) becomes the process's
    default Dask client until it closes, as ``distributed.Client`` does, so collections on this cluster
    (tables a fit keeps there, ``res.params["w"]``) compute with a plain ``.compute()``.

    ``coordinator_only``: register the scheduler's coordinator and nothing on the workers, for a
    question to the scheduler (``dscar.jobs``, ``dscar.cancel``): registering the worker plugin sends
    it to every worker, which a one-off question need not pay or wait for.
    """

    def __init__(
        self,
        address: "str | Client | LocalCluster | Cluster | None" = None,
        *,
        n_workers: int = 2,
        worker_ttl: str = DEFAULT_WORKER_TTL,
        processes: bool = True,
        dashboard_address: str = ":0",  # a free port: embedded clusters never fight over 8787
        timeout: float | None = None,
        security: "Security | bool | None" = None,
        set_as_default: bool = True,
        coordinator_only: bool = False,
    ):
        from ..validation import integer, number

        self._owned: list[Any] = []
        security = _security(security)
        if isinstance(address, Cluster):
            self.client = address.client
        elif isinstance(address, Client):
            self.client = address
        elif address is None or isinstance(address, LocalCluster):
            if address is None:
                n_workers = integer("n_workers", n_workers, 1)
                extra = {} if security is None else {"security": security, "protocol": "tls://"}
                config = {"distributed.scheduler.worker-ttl": worker_ttl, **EMBEDDED_CONFIG,
                          **(forkserver_config() if processes else {}),
                          **{f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in WORKER_MALLOC_ENV.items()}}
                if processes:  # each nanny hands its worker these, a worker started by ``scale`` too
                    extra["config"] = EMBEDDED_CONFIG
                hold_start_method(self, config)
                try:
                    with dask.config.set(config):
                        address = LocalCluster(
                            n_workers=n_workers,
                            threads_per_worker=1,
                            processes=processes,
                            dashboard_address=dashboard_address,
                            **extra,
                        )
                except BaseException:
                    release_start_method(self)
                    raise
                self._owned.append(address)
                security = security or getattr(address, "security", None)
            self.client = Client(address, set_as_default=set_as_default, security=security)
            self._owned.insert(0, self.client)
        elif isinstance(address, str):
            if timeout is None:  # Dask's connect timeout when set lower than dscar's default
                timeout = min(DEFAULT_CONNECT_TIMEOUT,
                              dask.utils.parse_timedelta(dask.config.get("distributed.comm.timeouts.connect")))
            timeout = number("timeout", timeout, 0.0, strict_min=True)
            check_address(address, security, timeout)
            try:
                self.client = Client(address, timeout=timeout, set_as_default=set_as_default, security=security)
            except (OSError, TimeoutError, ValueError, TypeError) as e:
                raise ClusterError(f"cannot reach the Dask scheduler at {address!r}: {type(e).__name__}: {e}") from None
            self._owned.append(self.client)
        else:
            raise InvalidInputError(
                f"cluster must be None, an address, a distributed.Client or a LocalCluster, "
                f"not {type(address).__name__}"
            )
        self.client.register_plugin(Coordinator())
        if coordinator_only:
            return
        self.client.register_plugin(ParamServer())
        from ..scheduler.dashboard import register as register_dashboard

        register_dashboard(self.client)  # the /dscar page on the scheduler's dashboard (needs bokeh)

    @property
    def workers(self) -> list[str]:
        return sorted(worker_info(self.client))

    def wait_for_workers(self, n: int = 1, timeout: float = 30.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while len(ws := self.workers) < n:
            if time.monotonic() > deadline:
                raise ClusterError(f"the cluster has {len(ws)} worker(s); needed {n} within {timeout:.0f}s")
            time.sleep(0.1)
        return ws

    def scale(self, n: int) -> None:
        """Ask the embedded cluster for ``n`` workers (``LocalCluster.scale``), not waited for: a fit
        running on it takes a joiner's shards and moves partitions to it. Workers started this way
        run under the same settings as the first (``EMBEDDED_CONFIG``, the forkserver)."""
        from ..validation import integer

        n = integer("n", n, 0)
        started = [obj for obj in self._owned if isinstance(obj, LocalCluster)]
        if not started:
            raise ClusterError("this dscar.Cluster did not start its Dask cluster: scale it where it was started")
        started[0].scale(n)

    @property
    def memory_limit(self) -> float | None:
        """The smallest worker memory limit in bytes (None: no limit set on any worker)."""
        info = worker_info(self.client).values()
        limits = [w.get("memory_limit") or 0 for w in info]
        return min(limits) if limits and all(limits) else None

    @property
    def dashboard_link(self) -> str | None:
        return getattr(self.client, "dashboard_link", None)

    def close(self) -> None:
        for obj in self._owned:
            try:
                obj.close()
            except Exception:
                pass
        self._owned.clear()
        release_start_method(self)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __copy__(self) -> "Cluster":
        return self

    def __deepcopy__(self, memo: dict) -> "Cluster":
        """A handle on a running cluster: a copy is the same handle (copying an estimator or its
        hyperparameters never starts or connects a cluster)."""
        return self

    def __reduce__(self):
        """Pickled as its scheduler's address (and security): unpickling connects to it again."""
        return _reconnect, (self.client.scheduler.address, getattr(self.client, "security", None))

    def __repr__(self) -> str:
        return f"<dscar.Cluster scheduler={self.client.scheduler.address} workers={len(self.workers)}>"


def _reconnect(address: str, security: "Security | None") -> Cluster:
    return Cluster(address, security=security)


def connect(cluster: "str | Client | LocalCluster | Cluster | None" = None, *,
            security: "Security | bool | None" = None, **kwargs: Any) -> Cluster:
    """A ready ``Cluster`` (see its docstring for what ``cluster`` may be).

    ``security``: a ``distributed.Security`` for a TLS scheduler (``tls://`` addresses), or
    True for an embedded cluster on TLS with temporary certificates.
    """
    return Cluster(cluster, security=security, **kwargs)
