"""The pure core: every decision of the control plane (schedules, dispatch, ledger, policies, liveness,
membership, elastic plans). Nothing here imports Dask; tests/test_pure_imports.py enforces it."""


def __getattr__(name: str):  # ``dscar.core.x`` loads on first use (dscar/__init__.py says why)
    from .. import submodule

    return submodule(__name__, name)
