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

#: modules that decide, or hold data, without Dask (the control plane's pure core first)
PURE = [
    "dscar.clock", "dscar.ssp", "dscar.shards", "dscar.job", "dscar.schedule", "dscar.effects", "dscar.ledger", "dscar.events",
    "dscar.tally", "dscar.losses", "dscar.checkpoint_plan", "dscar.dispatch", "dscar.protocol",
    "dscar.monitor", "dscar.policies", "dscar.liveness", "dscar.elastic", "dscar.partitions", "dscar.intervals", "dscar.stall",
    "dscar.report", "dscar.validation", "dscar.errors", "dscar.checkpoint", "dscar.wire", "dscar.inflight",
    "dscar.faults", "dscar.algorithm", "dscar.data", "dscar.results", "dscar.estimator", "dscar.progress",
    "dscar.xp", "dscar.pull_cache", "dscar.apply_plan", "dscar.partition_store", "dscar.shard_store", "dscar.mirror_store", "dscar.shard_count",
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


def test_the_block_does_stop_a_module_that_imports_dask():
    r = import_without_dask("dscar.coordinator")
    assert r.returncode != 0 and "is blocked: this module must not import Dask" in r.stderr
