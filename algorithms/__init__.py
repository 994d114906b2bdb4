"""Models for dscar, each written only against dscar's public API."""
from .lasso import Lasso, LassoCD

__all__ = ["Lasso", "LassoCD"]
