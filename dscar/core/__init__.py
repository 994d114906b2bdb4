"""The pure core: every decision of the control plane (schedules, dispatch, ledger, policies, liveness,
membership, elastic plans). Nothing here imports Dask; tests/test_pure_imports.py enforces it."""
