"""TLS: a LocalCluster on tls:// with certificates the test creates; fits through
``dscar.connect(address, security=...)`` and ``dscar run --tls-*``; every mismatch a ClusterError."""
import subprocess
import sys
import time

import pytest
from distributed import Security

import dscar
from dscar.algorithms.datasets import make_regression
from dscar.algorithms.lasso import LassoCD


@pytest.fixture(scope="module")
def tls_cluster():
    sec = Security.temporary()  # a fresh self-signed CA and certificate, in memory
    with dscar.Cluster(n_workers=2, security=sec) as cl:
        cl.wait_for_workers(2)
        yield cl.client.scheduler.address, sec


@pytest.mark.timeout(120)
def test_fit_on_a_tls_cluster_through_connect(tls_cluster):
    address, sec = tls_cluster
    assert address.startswith("tls://")
    X, y, _ = make_regression(2000, 30, 5, seed=1)
    with dscar.connect(address, security=sec) as cl:
        res = dscar.fit(LassoCD(0.01), {"X": X, "y": y}, cl)
    assert res.converged and len(res.workers) == 2


@pytest.mark.timeout(60)
def test_tls_mismatches_are_prompt_cluster_errors(tls_cluster):
    address, sec = tls_cluster
    cases = [
        (address, None, "TLS address but no TLS settings"),  # no certificates at all
        (address, Security.temporary(), "cannot reach the Dask scheduler .* TLS certificate"),  # another CA
        (address.replace("tls://", "tcp://"), None, "cannot reach the Dask scheduler"),  # plain TCP to a TLS port
        (address.replace("tls://", "tcp://"), sec, "not encrypted, but the security settings require TLS"),
    ]
    for addr, s, match in cases:
        t0 = time.monotonic()
        with pytest.raises(dscar.ClusterError, match=match):
            dscar.connect(addr, security=s, timeout=5)
        assert time.monotonic() - t0 < 6, (addr, match)


@pytest.mark.timeout(180)
def test_cli_with_tls_files(tls_cluster, tmp_path):
    address, sec = tls_cluster
    files = {"ca.pem": sec.tls_ca_file, "cert.pem": sec.tls_client_cert, "key.pem": sec.tls_client_key}
    for name, pem in files.items():
        (tmp_path / name).write_text(pem)
    base = [sys.executable, "-m", "dscar", "run", "lasso", "--scheduler", address, "--rows", "2000",
            "--features", "30", "--no-progress"]
    tls = ["--tls-ca-file", str(tmp_path / "ca.pem"), "--tls-cert", str(tmp_path / "cert.pem"),
           "--tls-key", str(tmp_path / "key.pem")]
    r = subprocess.run(base + tls, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stderr
    assert "converged" in r.stdout.splitlines()[-1]
    r = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("dscar: error: ") and "--tls-ca-file" in r.stderr, r.stderr
