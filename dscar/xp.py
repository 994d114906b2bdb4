"""The array namespace of a process: CuPy when a GPU is visible, NumPy otherwise.

Kernels are written once against ``xp``; only the edges (wire, checkpoints,
results) convert to host NumPy with ``to_host``.
"""
from __future__ import annotations

import os
from types import ModuleType

import numpy as np
import scipy.sparse as sp


def select_namespace(prefer_gpu: bool = True) -> ModuleType:
    """CuPy if it imports and sees a device (and ``DSCAR_DEVICE`` is not ``cpu``), else NumPy."""
    if not prefer_gpu or os.environ.get("DSCAR_DEVICE", "").lower() == "cpu":
        return np
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception:  # no cupy, no driver, no device: all mean NumPy
        pass
    return np


def is_array(v) -> bool:
    """A NumPy, CuPy, SciPy-sparse or CuPy-sparse array (not a tuple or dict of them)."""
    return (isinstance(v, np.ndarray) or sp.issparse(v) or hasattr(v, "__cuda_array_interface__")
            or type(v).__module__.startswith("cupyx.scipy.sparse"))


def to_host(a):
    """A host NumPy (or SciPy sparse) copy-or-view of ``a``."""
    if isinstance(a, np.ndarray) or sp.issparse(a):
        return a
    if hasattr(a, "get"):  # cupy arrays and cupyx sparse matrices
        return a.get()
    return np.asarray(a)


def to_device(a, xp: ModuleType):
    """``a`` in the namespace ``xp`` (sparse stays sparse)."""
    if xp is np:
        return to_host(a)
    if sp.issparse(a):
        import cupyx.scipy.sparse as csp

        return csp.csr_matrix(a.tocsr())
    return xp.asarray(a)


def synchronize(xp: ModuleType) -> None:
    """Wait until the device has run what was queued on it (CuPy launches return before the kernels run), so a
    timer around a step measures the step and not its launches; nothing on NumPy."""
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()
