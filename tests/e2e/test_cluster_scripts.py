"""The cluster's shell scripts as bash runs them (child processes; unit/test_cluster_configs.py reads the
same files as text): the sbatch script parses and starts a head, workers and `bench run` with the
resources placement names; the CI script parses and exits 2 on a usage error."""

import json
import re
import shlex
import subprocess

from orchestrator.matrix import placement
from tests.helpers import CI_SCRIPT, DASHBOARD_PORT, GCS_PORT, SBATCH, check_ray_start

# -- Slurm -----------------------------------------------------------------------------------------

def test_sbatch_script_is_valid_bash_and_starts_head_workers_and_bench_run():
    text = SBATCH.read_text()
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    assert re.search(r"^#SBATCH --gpus-per-task=\d+", text, re.M)
    assert f"GCS_PORT={GCS_PORT}" in text and f"DASHBOARD_PORT={DASHBOARD_PORT}" in text
    joined = [line for line in text.replace("\\\n", " ").splitlines() if not line.lstrip().startswith("#")]
    starts = [shlex.split("ray start" + line.split("ray start", 1)[1].rstrip(" &")) for line in joined
              if "ray start" in line]
    assert len(starts) == 2, starts
    head, worker = starts
    for argv in starts:
        check_ray_start(argv)
        assert "--resources=$resources" in argv and "--num-gpus" in argv, argv
    assert "--head" in head and "--port=$GCS_PORT" in head and "--dashboard-port" in head
    assert head[head.index("--dashboard-port") + 1] == "$DASHBOARD_PORT"
    assert "--address=$head:$GCS_PORT" in worker
    assert re.search(r'^bench run "\$MATRIX" --address "\$head:\$GCS_PORT" --run-dir "\$RESULTS"$', text, re.M)
    assert re.search(r"srun .*-w \"\$node\"", text), "workers are started with srun"


def test_sbatch_declares_env_resources_as_placement_names_them():
    text = SBATCH.read_text()
    snippet = "\n".join(line for line in text.splitlines() if line.startswith("resources="))
    out = subprocess.run(["bash", "-c", f'BENCH_ENVS="hf vllm llamacpp"\n{snippet}\nprintf %s "$resources"'],
                         check=True, capture_output=True, text=True).stdout
    assert json.loads(out) == {placement.env_resource(fw): 1000 for fw in ("hf", "vllm", "llamacpp")}


# -- the CI recipe ---------------------------------------------------------------------------------

def test_ci_script_is_valid_bash_and_its_usage_errors_exit_2():
    subprocess.run(["bash", "-n", str(CI_SCRIPT)], check=True)
    text = CI_SCRIPT.read_text()
    assert "set -euo pipefail" in text
    done = subprocess.run([str(CI_SCRIPT)], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert done.returncode == 2 and "RAY_ADDRESS" in done.stderr, done.stderr
    assert 'export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}' in text   # a token given: token mode
