"""dscar's exceptions: one family, each naming the problem it reports."""
from __future__ import annotations

import threading
from typing import Sequence


class DscarError(Exception):
    """Base class of every error dscar raises on purpose."""

    #: a failed fit's events up to the failure (the same dicts as ``FitResult.events``)
    events: Sequence[dict] = ()


class InvalidInputError(DscarError, ValueError):
    """Bad data, shapes, hyperparameters or options, caught before work starts."""


class ClusterError(DscarError, RuntimeError):
    """The Dask cluster cannot be reached or cannot run the job."""


class ShardFailedError(DscarError, RuntimeError):
    """A shard failed more often than allowed; carries the shard id and every failure."""

    def __init__(self, shard: int, clock: int, failures: list[str]):
        self.shard = shard
        self.clock = clock
        self.failures = list(failures)
        detail = "\n".join(f"  attempt {i + 1}: {f}" for i, f in enumerate(self.failures))
        super().__init__(
            f"shard {shard} failed {len(self.failures)} time(s) in clock {clock}:\n{detail}"
        )


class JobFailedError(DscarError, RuntimeError):
    """The job stopped on the cluster; the message carries the cause."""


class RefusedCallError(DscarError, PermissionError):
    """A dscar handler refused a call: it lacked the job's token, or claimed to come from a worker
    it is not (``dscar.core.membership``). Nothing of it was applied; the job records a ``forged-call`` event."""


def describe(e: BaseException) -> str:
    """``Type: message`` of ``e``, then of the exceptions behind it (``__cause__`` / ``__context__``),
    skipping repeated messages: a library's error that says only the URL (``https://...``) gets the
    cause that does say something (a DNS failure, a refused connection, a missing backend)."""
    parts: list[str] = []
    seen: set[str] = set()
    cur: BaseException | None = e
    while cur is not None and len(parts) < 4:
        text = str(cur).strip()
        if text not in seen:
            seen.add(text)
            parts.append(f"{type(cur).__name__}: {text}" if text else type(cur).__name__)
        cur = cur.__cause__ or cur.__context__
    return parts[0] + "".join(f" (caused by {p})" for p in parts[1:])


_made = threading.Lock()


def __getattr__(name: str) -> type:
    """``ConvergenceWarning``, made on first use: it subclasses scikit-learn's, and importing
    scikit-learn (scipy, pandas) costs every process that imports dscar ~1.2 s of CPU, which a
    worker process starting mid-fit (a joiner, a killed worker's restart) takes from the running
    workers' clocks; only the driver's estimators warn with it."""
    if name != "ConvergenceWarning":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _made:
        if name not in globals():
            from sklearn.exceptions import ConvergenceWarning as SklearnConvergenceWarning

            class ConvergenceWarning(SklearnConvergenceWarning):
                """A fit stopped at its iteration limit before its stopping rule held: a scikit-learn
                ``ConvergenceWarning`` (and so a ``UserWarning``), so filters on either catch it."""

            ConvergenceWarning.__qualname__ = "ConvergenceWarning"  # (pickled by reference: dscar.errors.ConvergenceWarning)
            globals()[name] = ConvergenceWarning
    return globals()[name]
