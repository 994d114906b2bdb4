"""One entry point to a ready cluster: embedded LocalCluster, an address, or a Client."""
from __future__ import annotations

import time
from typing import Any

import dask
from distributed import Client, LocalCluster

from .coordinator import Coordinator
from .errors import ClusterError, InvalidInputError
from .worker import ParamServer

#: how long a silent (hung) worker may stay before the scheduler drops it
DEFAULT_WORKER_TTL = "10s"


class Cluster:
    """A Dask client with dscar's plugins registered; closes what it started.

    ``Cluster()`` starts an embedded LocalCluster (worker processes, one thread
    each); ``Cluster("tcp://host:8786")`` or ``Cluster(client)`` uses a running
    cluster. Registration is idempotent: several ``Cluster`` objects on one
    Dask cluster share one coordinator and one ParamServer per worker.
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
    ):
        self._owned: list[Any] = []
        if isinstance(address, Cluster):
            self.client = address.client
        elif isinstance(address, Client):
            self.client = address
        elif address is None or isinstance(address, LocalCluster):
            if address is None:
                if n_workers < 1:
                    raise InvalidInputError(f"n_workers must be >= 1, got {n_workers}")
                with dask.config.set({"distributed.scheduler.worker-ttl": worker_ttl}):
                    address = LocalCluster(
                        n_workers=n_workers,
                        threads_per_worker=1,
                        processes=processes,
                        dashboard_address=dashboard_address,
                    )
                self._owned.append(address)
            self.client = Client(address, set_as_default=False)
            self._owned.insert(0, self.client)
        elif isinstance(address, str):
            if timeout is None:  # Dask's own connect timeout (30 s unless configured)
                timeout = dask.utils.parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"))
            try:
                self.client = Client(address, timeout=timeout, set_as_default=False)
            except (OSError, TimeoutError) as e:
                raise ClusterError(f"cannot reach the Dask scheduler at {address!r}: {e}") from None
            self._owned.append(self.client)
        else:
            raise InvalidInputError(
                f"cluster must be None, an address, a distributed.Client or a LocalCluster, "
                f"not {type(address).__name__}"
            )
        self.client.register_plugin(Coordinator())
        self.client.register_plugin(ParamServer())

    @property
    def workers(self) -> list[str]:
        return sorted(self.client.scheduler_info(n_workers=-1)["workers"])

    def wait_for_workers(self, n: int = 1, timeout: float = 30.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while len(ws := self.workers) < n:
            if time.monotonic() > deadline:
                raise ClusterError(f"the cluster has {len(ws)} worker(s); needed {n} within {timeout:.0f}s")
            time.sleep(0.1)
        return ws

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

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<dscar.Cluster scheduler={self.client.scheduler.address} workers={len(self.workers)}>"


def connect(cluster: "str | Client | LocalCluster | Cluster | None" = None, **kwargs: Any) -> Cluster:
    """A ready ``Cluster`` (see its docstring for what ``cluster`` may be)."""
    return Cluster(cluster, **kwargs)
