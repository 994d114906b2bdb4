"""dscar: iterative-convergent ML on Dask that keeps training through slow and lost workers."""
from . import faults, validation
from .core import policies
from .algorithm import Algorithm, ClockContext, DataMeta, ShardContext, StateSpec, TableSpec
from .checkpoint import CheckpointConfig, CorruptCheckpointError
from .api.cluster import Cluster, connect
from .api.data import ArrayData, FileData, PhasedData, check_indices
from .api.driver import ClockRecord, FitResult, cancel, fit, jobs
from .errors import (
    ClusterError,
    ConvergenceWarning,
    DscarError,
    InvalidInputError,
    JobFailedError,
    RefusedCallError,
    ShardFailedError,
)
from .api.estimator import EstimatorMixin, check_features
from .xp import to_host

__all__ = [
    "Algorithm", "ArrayData", "CheckpointConfig", "CorruptCheckpointError", "ClockContext", "ClockRecord", "Cluster", "ClusterError", "ConvergenceWarning", "DataMeta",
    "DscarError", "EstimatorMixin", "FileData", "FitResult", "InvalidInputError", "JobFailedError", "PhasedData",
    "RefusedCallError", "ShardContext", "ShardFailedError", "StateSpec", "TableSpec", "cancel", "check_features", "check_indices", "connect",
    "faults", "fit", "jobs", "policies",
    "to_host", "validation",
]
__version__ = "0.1.0"
