"""bench.device: the GPU / CPU comparison pairs runs by model, and a quick run reports both devices."""
import json
import subprocess
import sys
from pathlib import Path

from bench.device import compare


def test_compare_pairs_each_models_gpu_run_with_its_cpu_run():
    rows = [{"model": "mf", "device": "cpu", "clock_s": 0.72, "step_s": 0.49},
            {"model": "mf", "device": "gpu", "clock_s": 0.36, "step_s": 0.245},
            {"model": "mlr", "device": "cpu", "clock_s": 0.2, "step_s": 0.18},
            {"model": "mlr", "device": "gpu", "skipped": "skipped: no GPU"},
            {"model": "lda", "device": "gpu", "error": "timed out after 300 s"}]
    q = compare(rows)
    assert set(q) == {"mf"}  # no pair without both runs
    assert abs(q["mf"]["clock"] - 0.5) < 1e-12 and abs(q["mf"]["step"] - 0.5) < 1e-12


def test_quick_run_trains_on_the_cpu_and_reports_the_gpu_run(tmp_path):
    out = tmp_path / "device.json"
    r = subprocess.run([sys.executable, "-m", "bench.device", "--quick", "--models", "lasso", "--json", str(out)],
                       cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=170)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(out.read_text())
    runs = {x["device"]: x for x in d["runs"]}
    cpu = runs["cpu"]
    assert cpu["namespace"] == ["numpy"] and cpu["clocks"] >= 2 and cpu["clock_s"] > 0 and cpu["step_s"] > 0
    # where a worker's shard time goes besides its steps (two workers: each pulls the other's rows)
    assert set(cpu["shard_split_s"]) == {"data", "pull", "push"} and cpu["shard_split_s"]["pull"] > 0
    gpu = runs["gpu"]  # skipped without a GPU; on one, CuPy in every worker and the same Lasso
    if d["gpu"] == "visible":
        assert gpu["namespace"] == ["cupy"] and abs(gpu["objective"] - cpu["objective"]) < 1e-6 * abs(cpu["objective"])
    else:
        assert gpu["skipped"].startswith("skipped: ")
    assert (tmp_path / "device.png").stat().st_size > 0
