"""What a worker process imports as it starts: every joiner and every restarted worker pays it in CPU,
taken, on a shared machine, from the running workers' clocks (issue 41's churn benchmark)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_a_worker_process_does_not_import_scikit_learn():
    """dscar's worker plugin (what a new worker process unpickles and runs) loads no scikit-learn:
    ~1.2 s of CPU (scipy, pandas) a worker never uses; the driver's estimators load it when used."""
    r = run_child("""
        import sys
        import distributed, dscar, dscar.worker.plugin, dscar.worker.runner
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("sklearn", "pandas"))
        assert not loaded, loaded
    """)
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_lazy_names_are_the_same_objects_everywhere():
    """``dscar.ConvergenceWarning`` is made once, on first use, whichever way it is reached, and pickles
    by reference; ``EstimatorMixin`` and ``check_features`` are the estimator module's; ``import *`` has them."""
    r = run_child("""
        import pickle, warnings
        import dscar
        from dscar.errors import ConvergenceWarning
        from dscar.api.estimator import EstimatorMixin, check_features
        import sklearn.exceptions
        assert dscar.ConvergenceWarning is ConvergenceWarning
        assert issubclass(ConvergenceWarning, sklearn.exceptions.ConvergenceWarning)
        assert pickle.loads(pickle.dumps(ConvergenceWarning)) is ConvergenceWarning
        assert dscar.EstimatorMixin is EstimatorMixin and dscar.check_features is check_features
        ns = {}
        exec("from dscar import *", ns)
        assert ns["ConvergenceWarning"] is ConvergenceWarning and ns["EstimatorMixin"] is EstimatorMixin
        try:
            dscar.NoSuchName
        except AttributeError as e:
            assert "NoSuchName" in str(e)
        else:
            raise AssertionError("dscar.NoSuchName did not raise")
    """)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_worker_that_loads_a_bundled_model_does_not_import_scikit_learn():
    """A worker unpickles a bundled model's ``Algorithm`` from its module; the model's scikit-learn
    estimator lives in ``algorithms/estimators.py`` and loads only where it is used (the driver), at its
    home's name (``dscar.algorithms.lasso.Lasso``), pickled by reference to it."""
    r = run_child("""
        import pickle, sys
        import dscar.algorithms.lasso, dscar.algorithms.lda, dscar.algorithms.mf, dscar.algorithms.mlr
        import dscar.algorithms
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "sklearn")
        assert not loaded, loaded[:5]
        from dscar.algorithms.lasso import Lasso
        from dscar.algorithms.mlr import MLR, LogisticRegression
        from dscar.algorithms import Lasso as Lasso2
        assert "sklearn" in sys.modules and Lasso2 is Lasso and LogisticRegression is MLR
        assert Lasso.__module__ == "dscar.algorithms.lasso" and MLR.__module__ == "dscar.algorithms.mlr"
        assert type(pickle.loads(pickle.dumps(MLR(max_iter=3)))) is MLR
        try:
            dscar.algorithms.lasso.NoSuch
        except AttributeError as e:
            assert "NoSuch" in str(e)
        else:
            raise AssertionError("no AttributeError")
    """)
    assert r.returncode == 0, r.stderr[-2000:]
