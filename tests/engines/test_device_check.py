"""tests/gpu/device_check.sh, the one-command check of the transformers CUDA path on a bare GPU box, run
here with --cpu-only: the script, the worker it drives and the checks it makes are real, only the device
differs. (On a GPU box it compares CUDA fp32 and bf16 with the CPU; that path is unverified without one.)"""

import os
import subprocess
import sys

from tests.helpers import ROOT


def test_device_check_script_runs_the_worker_and_its_checks_on_cpu(tmp_path, tiny_model):
    proc = subprocess.run(["bash", "tests/gpu/device_check.sh", ".cache/gpu-wheels", "--", "--cpu-only",
                           "--work", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=os.environ | {"PYTHON": sys.executable})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "all checks passed" in out and "FAIL" not in out
    # each of its three workers ran both cells through the contract, and the logprobs were compared
    for run in ("cpu-fp32", "cpu-fp32-again", "cpu-bf16"):
        assert (tmp_path / run / "b1.json").exists() and (tmp_path / run / "b4.npz").exists(), run
    assert "greedy tokens identical" in out and "max |dlogprob|" in out
    # the rescoring child, twice: every sample scored, the two alike
    assert (tmp_path / "rescore-cpu" / "rescored.npz").exists() and (tmp_path / "rescore-cpu-again" / "rescored.npz").exists()
    assert "rescore cpu-again vs cpu: max |dlogprob|" in out
