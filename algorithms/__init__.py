"""Models for dscar, each written only against dscar's public API.

Each model's module holds its ``Algorithm`` (what the workers run) and its CLI command; the scikit-learn
estimators live in ``estimators`` and load on first use, so a worker loads no scikit-learn.
"""
__all__ = ["Lasso", "LassoCD"]


def __getattr__(name: str):
    if name in __all__:
        from . import lasso

        return getattr(lasso, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
