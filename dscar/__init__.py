"""dscar: iterative-convergent ML on Dask that keeps training through slow and lost workers.

Every public name is loaded on first use (PEP 562): a worker process unpickles dscar's worker plugin and an
algorithm, and should not pay for the driver's API, the scheduler's coordinator or scikit-learn. Each new
worker, joiner or restarted one, pays its imports in CPU, taken on a shared machine from the running
workers' clocks (issue 41's churn benchmark; ``tests/test_worker_imports.py``).
"""
from __future__ import annotations

import importlib
import importlib.util

#: public name -> the module (relative to dscar) that defines it; a module's own name maps to itself
_PUBLIC = {
    **dict.fromkeys(("Algorithm", "ClockContext", "DataMeta", "ShardContext", "StateSpec", "TableSpec"), "algorithm"),
    **dict.fromkeys(("ArrayData", "FileData", "PhasedData", "check_indices"), "api.data"),
    **dict.fromkeys(("CheckpointConfig", "CorruptCheckpointError"), "checkpoint"),
    **dict.fromkeys(("Cluster", "connect"), "api.cluster"),
    **dict.fromkeys(("ClockRecord", "FitResult", "cancel", "fit", "jobs"), "api.driver"),
    # the estimator module and ConvergenceWarning import scikit-learn (``dscar.errors.__getattr__`` says why)
    **dict.fromkeys(("EstimatorMixin", "check_features"), "api.estimator"),
    **dict.fromkeys(("ClusterError", "ConvergenceWarning", "DscarError", "InvalidInputError", "JobFailedError",
                     "RefusedCallError", "ShardFailedError"), "errors"),
    "to_host": "xp",
    "faults": "faults", "validation": "validation", "policies": "core.policies",
}

__all__ = sorted(_PUBLIC)
__version__ = "0.1.0"


def submodule(package: str, name: str):
    """``package.name`` imported on first attribute use, as an eager ``import dscar`` once made
    ``dscar.api.data`` reachable; AttributeError where there is no such module."""
    if importlib.util.find_spec(f"{package}.{name}") is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return importlib.import_module(f"{package}.{name}")


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        return submodule(__name__, name)
    loaded = importlib.import_module(f".{module}", __name__)
    value = loaded if module.rsplit(".", 1)[-1] == name else getattr(loaded, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
