"""The pure core imports no Dask: enforced, not declared.

Each module below is imported in a fresh interpreter in which ``dask`` and ``distributed`` cannot be
imported (a meta-path finder raises ImportError for them). ``dscar/__init__.py`` itself imports the
Dask side (``Cluster``, ``fit``), so the child puts an empty ``dscar`` package in front of the
directory: each module is imported with exactly what it pulls in, and nothing else.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: the pure core: every module in dscar/core, found by listing the folder (a module put there is held to it)
CORE = sorted(f"dscar.core.{p.stem}" for p in (ROOT / "dscar" / "core").glob("*.py") if p.stem != "__init__")

#: modules outside the core that hold data, formats or stores without Dask
PURE = CORE + [
    "dscar.validation", "dscar.errors", "dscar.checkpoint", "dscar.wire", "dscar.inflight", "dscar.faults",
    "dscar.algorithm", "dscar.xp",
    "dscar.api.report", "dscar.api.data", "dscar.api.results", "dscar.api.estimator", "dscar.api.progress",
    "dscar.worker.pull_cache", "dscar.worker.partition_store", "dscar.worker.shard_store", "dscar.worker.mirror_store",
    # the simulator drives the pure core alone: bench.scale's figures are the core's, not Dask's
    "bench.sim",
]

CHILD = textwrap.dedent("""
    import importlib, importlib.abc, sys, types
    class NoDask(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("dask", "distributed"):
                raise ImportError(f"{name} is blocked: this module must not import Dask")
    sys.meta_path.insert(0, NoDask())
    package = types.ModuleType("dscar")
    package.__path__ = [sys.argv[1] + "/dscar"]
    sys.modules["dscar"] = package
    importlib.import_module(sys.argv[2])
    assert not any(m.split(".")[0] in ("dask", "distributed") for m in sys.modules), sorted(sys.modules)
""")


def import_without_dask(module: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, str(ROOT), module], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("module", PURE)
def test_a_pure_module_imports_with_dask_blocked(module):
    r = import_without_dask(module)
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_core_folder_holds_the_control_plane():
    """The folders are the architecture: the core holds the schedules, dispatch and ledger."""
    assert {"dscar.core.job", "dscar.core.schedule", "dscar.core.dispatch", "dscar.core.ledger"} <= set(CORE)


def test_the_block_does_stop_a_module_that_imports_dask():
    r = import_without_dask("dscar.scheduler.coordinator")
    assert r.returncode != 0 and "is blocked: this module must not import Dask" in r.stderr
