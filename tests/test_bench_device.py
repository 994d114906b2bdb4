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


# ------------------------------------------------ --all: the kernels' targets and the SSP probe
def test_all_passes_the_device_choice_sizes_and_output_folder_to_the_kernel_benchmarks():
    from bench.device import kernel_args, main  # noqa: F401
    import argparse

    ns = argparse.Namespace(quick=True, kernel_sizes=None, cpu_only=True, no_probe=True, probe_timeout=90,
                            json="out/device.json")
    args = kernel_args(ns)
    assert args[:3] == ["--sizes", "quick", "--cpu-only"] and "--probe-ssp" not in args
    assert args[-2:] == ["--json", str(Path("out/kernels.json").resolve())]
    ns = argparse.Namespace(quick=False, kernel_sizes="tiny", cpu_only=False, no_probe=False, probe_timeout=30,
                            json=None)
    assert kernel_args(ns) == ["--sizes", "tiny", "--probe-ssp", "--timeout", "30"]


def test_verdicts_hold_each_figure_against_the_issues_target():
    from bench.device_kernels import verdicts

    v = verdicts({"lda": {"tokens_per_s": 2e9, "loglik_rel_diff": 0.001}, "als": {"ms_per_iter": 12.0},
                  "lasso": {"cpu_objective": 1.0}, "mlr": {"samples_per_s": 1e8}})
    assert v["lda"].startswith("met") and v["als"].startswith("missed") and v["lasso"] == "no GPU"
    assert v["mlr"].startswith("met")  # >= is met at the target itself
    assert verdicts({"lda": {"tokens_per_s": 2e9, "loglik_rel_diff": 0.01}})["lda"].startswith("missed")  # too far off
    # every LDA sweep's figures on the line, a sweep that failed with its error (the others' figures kept)
    v = verdicts({"lda": {"tokens_per_s": 1e8, "loglik_rel_diff": 0.001, "by_kernel": {
        "table": {"tokens_per_s": 1e8, "loglik_rel_diff": 0.001}, "sparse": {"error": "TypingError: no"}}}})["lda"]
    assert v.startswith("missed") and "table 1e+08/s at 0.10 %" in v and "sparse failed (TypingError: no)" in v, v
    assert verdicts({"lda": {"error": "TypingError: no"}})["lda"] == "failed: TypingError: no"


def test_all_cpu_only_runs_the_cpu_side_of_every_part_and_writes_its_files(tmp_path):
    out = tmp_path / "device.json"
    r = subprocess.run([sys.executable, "-m", "bench.device", "--all", "--cpu-only", "--quick", "--models", "lasso",
                        "--kernel-sizes", "tiny", "--no-probe", "--json", str(out)],
                       cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=170)
    assert r.returncode == 0, r.stderr[-2000:]
    runs = {x["device"]: x for x in json.loads(out.read_text())["runs"]}
    assert runs["cpu"]["clocks"] >= 2 and runs["gpu"]["skipped"] == "skipped: --cpu-only"
    k = json.loads((tmp_path / "kernels.json").read_text())
    assert k["gpu"] is False and k["sizes"] == "tiny" and not k["errors"]
    assert k["results"]["lda"]["cpu_tokens_per_s"] > 0 and k["results"]["lasso"]["cpu_objective"] > 0
    assert set(k["verdicts"].values()) == {"no GPU"}
    assert (tmp_path / "kernels.png").stat().st_size > 0 and (tmp_path / "device.png").stat().st_size > 0


def test_the_probe_reports_a_fit_past_its_deadline_with_every_threads_stack():
    """A deadline no fit can meet (1 s: the child is still importing): the probe reports the hang and keeps
    faulthandler's dump, the form a hang on the GPU machine will come back in."""
    from bench.device_kernels import probe_ssp

    rows = probe_ssp(1.0)
    assert [r["consistency"] for r in rows] == ["bsp", "ssp"]
    for r in rows:
        assert r["error"] == "hung past 1 s (stacks dumped)", r
        assert "most recent call first" in r["stderr_tail"]


def test_the_device_scripts_parse():
    root = Path(__file__).resolve().parents[1]
    for script in ("bench/device_run.sh", "bench/device_prepare.sh"):
        assert subprocess.run(["bash", "-n", str(root / script)]).returncode == 0
