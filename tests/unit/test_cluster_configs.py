"""The cluster configs (cluster/) agree with the code: resource names, ports, commands, versions.

Nothing here starts a cluster, a container or a process: every YAML is parsed, the ray-up config is
checked against Ray's own schema, the sbatch script and Dockerfiles are read as text, and each command
they run is checked against the real `bench` (typer) and `ray start` (click) options. What bash itself
says of the sbatch and CI scripts: e2e/test_cluster_scripts.py.
"""

import itertools
import json
import re
import shlex
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

import adapters
from orchestrator.cli import app
from orchestrator.matrix import placement
from orchestrator.matrix.validate import load_matrix
from tests.helpers import CI_SCRIPT, CLUSTER, DASHBOARD_PORT, GCS_PORT, ROOT, SBATCH, check_ray_start, flags

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

CONTAINERS = CLUSTER / "containers"
# the engines with an environment of their own (an image, a node resource); the numpy reference runs in any
FRAMEWORKS = sorted(fw for fw in adapters.ADAPTERS if adapters.ADAPTERS[fw].own_environment)
ENV_RESOURCES = {placement.env_resource(fw): fw for fw in FRAMEWORKS}
RAY_UP = CLUSTER / "ray-up.yaml"
RAYCLUSTER = CLUSTER / "kuberay" / "raycluster.yaml"
RAYJOB = CLUSTER / "kuberay" / "rayjob.yaml"
EXAMPLE_MATRIX = CLUSTER / "gpu-sweep.yaml"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def one(path: Path, kind: str) -> dict:
    found = [d for d in docs(path) if d.get("kind") == kind]
    assert len(found) == 1, f"{path.name}: {len(found)} documents of kind {kind}"
    return found[0]


def image_framework(image: str) -> str:
    """REGISTRY/lossless-bench-vllm:TAG -> vllm"""
    m = re.fullmatch(r"(?:.+/)?lossless-bench-([a-z0-9]+):[^/]+", image)
    assert m, f"image {image!r} is not REGISTRY/lossless-bench-<framework>:TAG"
    assert m.group(1) in FRAMEWORKS, f"image {image!r} names no framework of adapters.ADAPTERS"
    return m.group(1)


def env_resources_of(resources: dict) -> set[str]:
    return {k for k in resources if k.startswith("env_")}


# -- bench and ray start, as the code defines them ----------------------------------------------
# (ray start's options, flags() and check_ray_start() are in tests/helpers.py: e2e/test_cluster_scripts.py uses them)

def bench_options() -> dict[str, set[str]]:
    group = typer.main.get_command(app)
    return {name: {o for p in cmd.params for o in p.opts if o.startswith("--")}
            for name, cmd in group.commands.items() if not isinstance(cmd, typer.core.TyperGroup)}


def check_bench_call(argv: list[str]) -> None:
    assert argv[0] == "bench", argv
    options = bench_options()
    assert argv[1] in options, f"`bench {argv[1]}` is not a command of orchestrator.cli.app ({sorted(options)})"
    unknown = flags(argv[2:]) - options[argv[1]]
    assert not unknown, f"`{' '.join(argv)}`: bench {argv[1]} has no option {sorted(unknown)}"


def test_bench_run_has_the_flags_the_configs_use():
    result = CliRunner().invoke(app, ["run", "--help"])
    assert result.exit_code == 0, result.output
    for flag in ("--run-dir", "--address"):
        assert flag in result.output
    assert {"--run-dir", "--address"} <= bench_options()["run"]


def code(path: Path) -> str:
    """What a file runs or shows as commands: all of a config or script, a README's code only."""
    text = path.read_text()
    if path.suffix != ".md":
        return text
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))
    return "\n".join(blocks + spans)


def bench_calls(text: str) -> list[list[str]]:
    """Every `bench <command> ...` in the text, as argv (up to the end of the line, a comment or a pipe)."""
    return [shlex.split(m.group(0).replace("...", ""))
            for m in re.finditer(r"(?<![\w/.$-])bench [a-z][\w-]*[^`#|&;\n]*", text)]


@pytest.mark.parametrize("path", [RAY_UP, RAYCLUSTER, RAYJOB, SBATCH, CLUSTER / "README.md"], ids=lambda p: p.name)
def test_every_bench_command_written_in_the_cluster_files_exists(path):
    checked = bench_calls(code(path))
    for argv in checked:
        check_bench_call(argv)
    if path in (RAYJOB, SBATCH):
        assert any(c[1] == "run" for c in checked), f"{path.name} never calls bench run"


# -- names: env_<framework> ---------------------------------------------------------------------

def test_every_env_resource_named_in_the_cluster_files_is_a_frameworks():
    assert ENV_RESOURCES == {"env_hf": "hf", "env_vllm": "vllm", "env_trtllm": "trtllm",
                             "env_lmdeploy": "lmdeploy", "env_llamacpp": "llamacpp"}
    named = set()
    for path in CLUSTER.rglob("*"):
        if path.is_file():
            named |= set(re.findall(r"\benv_[a-z0-9_]+", path.read_text()))
    named -= {"env_resources"}   # the matrix key run.env_resources
    assert named, "the cluster files name no env resource"
    unknown = named - set(ENV_RESOURCES)
    assert not unknown, f"not env_resource(framework) of any adapter: {sorted(unknown)}"
    assert named == set(ENV_RESOURCES), f"no cluster file provides {sorted(set(ENV_RESOURCES) - named)}"


# -- containers ----------------------------------------------------------------------------------

def dockerfile(fw: str) -> str:
    return (CONTAINERS / f"Dockerfile.{fw}").read_text()


def arg(text: str, name: str) -> str:
    found = re.findall(rf"^ARG {name}=(\S+)", text, re.M)
    assert found, f"no ARG {name}"
    assert len(set(found)) == 1, f"ARG {name} has several defaults: {found}"
    return found[0].strip('"')


def env(text: str, name: str) -> str:
    m = re.search(rf"\b{name}=('[^']*'|\"[^\"]*\"|\S+)", text)
    assert m, f"no ENV {name}"
    return m.group(1).strip("'\"")


def test_every_framework_has_a_container_recipe_that_declares_its_env_resource():
    recipes = sorted(p.name.removeprefix("Dockerfile.") for p in CONTAINERS.glob("Dockerfile.*"))
    assert recipes == FRAMEWORKS
    for fw in FRAMEWORKS:
        text = dockerfile(fw)
        assert env(text, "BENCH_FRAMEWORK") == fw
        assert env(text, "BENCH_ENV_RESOURCE") == placement.env_resource(fw)
        assert json.loads(env(text, "BENCH_RAY_RESOURCES")) == {placement.env_resource(fw): 1000}
        assert f'io.lossless-bench.env-resource="{placement.env_resource(fw)}"' in text
        assert f'io.lossless-bench.framework="{fw}"' in text


def test_container_recipes_install_lossless_bench_and_share_python_ray_and_interpreter_path():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    ray_req = next(d for d in pyproject["project"]["dependencies"] if d.startswith("ray"))
    from packaging.requirements import Requirement

    for fw in FRAMEWORKS:
        text = dockerfile(fw)
        assert arg(text, "PYTHON_VERSION") == "3.12", fw
        assert Requirement(ray_req).specifier.contains(arg(text, "RAY_VERSION")), (fw, ray_req)
        assert arg(text, "RAY_VERSION") == arg(dockerfile("hf"), "RAY_VERSION"), fw
        assert "/opt/bench/venv" in text and "ENV PATH=/opt/bench/venv/bin:$PATH" in text, fw
        assert re.search(r'pip install .*"ray\[default\]==\$\{RAY_VERSION\}"', text), fw
        assert re.search(r'"/opt/lossless-bench(\[[a-z,]+\])?"', text), fw
        for part in ("orchestrator", "adapters"):
            assert f"COPY {part} /opt/lossless-bench/{part}" in text, fw
        assert "COPY pyproject.toml README.md /opt/lossless-bench/" in text, fw
        assert "bench --help" in text, fw
        # a base image with a server entry point would swallow the `bash` / ray start a node runs
        if re.search(r"^FROM (vllm/|nvcr\.io/)", text, re.M):
            assert "ENTRYPOINT []" in text, fw
    extras = {m for fw in FRAMEWORKS for m in re.findall(r'/opt/lossless-bench\[([a-z,]+)\]', dockerfile(fw))}
    for extra in ",".join(extras).split(","):
        assert extra in pyproject["project"]["optional-dependencies"], f"no extra {extra!r} in pyproject.toml"


def test_engine_versions_in_the_images_are_the_ones_the_project_pins():
    from adapters.engines.lmdeploy import adapter as lmdeploy
    from adapters.engines.trtllm import adapter as trtllm

    makefile = (ROOT / "Makefile").read_text()
    assert arg(dockerfile("vllm"), "VLLM_VERSION") == re.search(r"^VLLM_VERSION \?= (\S+)", makefile, re.M).group(1)
    assert "FROM vllm/vllm-openai:v${VLLM_VERSION}" in dockerfile("vllm")
    assert arg(dockerfile("trtllm"), "TRTLLM_VERSION") == trtllm.TRTLLM_VERSION
    assert "FROM nvcr.io/nvidia/tensorrt-llm/release:${TRTLLM_VERSION}" in dockerfile("trtllm")
    assert arg(dockerfile("lmdeploy"), "LMDEPLOY_VERSION") == lmdeploy.LMDEPLOY_VERSION
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["llamacpp"]
    assert f"llama-cpp-python[server]=={arg(dockerfile('llamacpp'), 'LLAMA_CPP_PYTHON_VERSION')}" in pins
    assert "-DGGML_CUDA=on" in dockerfile("llamacpp")


# -- ray up ----------------------------------------------------------------------------------------

def ray_up() -> dict:
    return yaml.safe_load(RAY_UP.read_text())


def commands(cmds: list[str]) -> list[list[str]]:
    """The `ray start` calls of a command list ("ulimit ...; ray start ..." -> argv)."""
    out = []
    for cmd in cmds:
        for part in cmd.split(";"):
            argv = shlex.split(part.strip())
            if argv[:2] == ["ray", "start"]:
                out.append(argv)
    return out


def test_ray_up_config_is_valid_for_rays_own_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = ray_up()
    validate_config(config)
    validate_config(prepare_config(config))
    assert config["provider"]["type"] == "aws"


def test_ray_up_head_is_cpu_only_and_serves_the_dashboard_on_8265():
    config = ray_up()
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"] == {"CPU": 0, "GPU": 0}
    assert not env_resources_of(head["resources"])
    image_framework(config["docker"]["head_image"])
    (start,) = commands(config["head_start_ray_commands"])
    check_ray_start(start)
    assert "--head" in start
    assert start[start.index("--dashboard-host") + 1] == "0.0.0.0"
    assert start[start.index("--dashboard-port") + 1] == str(DASHBOARD_PORT)
    assert f"--port={GCS_PORT}" in start


def test_ray_up_gpu_workers_declare_gpus_and_the_env_resource_of_their_image():
    from ray.util import accelerators

    config = ray_up()
    workers = {name: t for name, t in config["available_node_types"].items() if name != config["head_node_type"]}
    assert workers
    gpu_types = {getattr(accelerators, n) for n in dir(accelerators) if n.startswith("NVIDIA_")}
    provided = set()
    for name, t in workers.items():
        res = t["resources"]
        assert res["GPU"] > 0 and res["CPU"] > 0, name
        fw = image_framework(t["docker"]["worker_image"])
        assert env_resources_of(res) == {placement.env_resource(fw)}, name
        accel = [k for k in res if k.startswith("accelerator_type:")]
        assert len(accel) == 1 and accel[0].removeprefix("accelerator_type:") in gpu_types, name
        assert accel[0] == placement.accelerator_resource(accel[0].split(":", 1)[1])
        assert t["min_workers"] == t["max_workers"] > 0, f"{name}: a fixed node count (see cluster/README.md)"
        provided.add(fw)
    assert provided == set(FRAMEWORKS)
    assert config["max_workers"] == sum(t["max_workers"] for t in workers.values())
    assert {t["node_config"]["InstanceType"] for t in workers.values()} == {"p5.48xlarge", "g6.4xlarge"}


def test_ray_up_workers_join_the_gcs_port_with_the_images_env_resources():
    config = ray_up()
    (start,) = commands(config["worker_start_ray_commands"])
    check_ray_start(start)
    assert f"--address=$RAY_HEAD_IP:{GCS_PORT}" in start
    assert "--resources=$BENCH_RAY_RESOURCES" in start   # the variable every Dockerfile sets
    for fw in FRAMEWORKS:
        assert "BENCH_RAY_RESOURCES=" in dockerfile(fw)


# -- KubeRay ---------------------------------------------------------------------------------------

RAYCLUSTER_SPEC = {"headGroupSpec", "workerGroupSpecs", "rayVersion", "enableInTreeAutoscaling",
                   "autoscalerOptions", "headServiceAnnotations", "suspend", "managedBy", "gcsFaultToleranceOptions"}
HEAD_GROUP = {"serviceType", "headService", "enableIngress", "rayStartParams", "template"}
WORKER_GROUP = {"groupName", "replicas", "minReplicas", "maxReplicas", "numOfHosts", "rayStartParams", "template",
                "scaleStrategy", "suspend", "idleTimeoutSeconds"}
RAYJOB_SPEC = {"activeDeadlineSeconds", "backoffLimit", "rayClusterSpec", "submitterPodTemplate", "metadata",
               "clusterSelector", "submitterConfig", "managedBy", "deletionStrategy", "entrypoint", "runtimeEnvYAML",
               "jobId", "submissionMode", "entrypointResources", "entrypointNumCpus", "entrypointNumGpus",
               "ttlSecondsAfterFinished", "shutdownAfterJobFinishes", "suspend", "schedule"}


def start_params_resources(params: dict) -> dict:
    """KubeRay's rayStartParams.resources: '"{\\"env_vllm\\": 1000}"' -> {"env_vllm": 1000}"""
    value = params["resources"]
    assert value.startswith('"') and value.endswith('"'), f"KubeRay wants the JSON quoted: {value!r}"
    return json.loads(json.loads(value))


def check_cluster_spec(spec: dict, where: str) -> dict[str, dict]:
    assert set(spec) <= RAYCLUSTER_SPEC, f"{where}: unknown fields {set(spec) - RAYCLUSTER_SPEC}"
    assert spec["rayVersion"] == arg(dockerfile("hf"), "RAY_VERSION"), where
    assert spec.get("enableInTreeAutoscaling") is False, f"{where}: fixed worker counts (see cluster/README.md)"
    head = spec["headGroupSpec"]
    assert set(head) <= HEAD_GROUP, f"{where}: unknown head fields {set(head) - HEAD_GROUP}"
    params = head["rayStartParams"]
    assert all(isinstance(v, str) for v in params.values()), f"{where}: rayStartParams values must be strings"
    check_ray_start(["ray", "start"] + [f"--{k}" for k in params])
    assert params["num-gpus"] == "0" and params["num-cpus"] == "0", where
    assert params["dashboard-host"] == "0.0.0.0" and params["dashboard-port"] == str(DASHBOARD_PORT), where
    assert params["port"] == str(GCS_PORT), where
    (container,) = head["template"]["spec"]["containers"]
    image_framework(container["image"])
    assert {p["containerPort"] for p in container["ports"]} >= {GCS_PORT, DASHBOARD_PORT}, where
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {}), where
    groups = {}
    for g in spec["workerGroupSpecs"]:
        name = f"{where}:{g['groupName']}"
        assert set(g) <= WORKER_GROUP, f"{name}: unknown fields {set(g) - WORKER_GROUP}"
        assert g["replicas"] == g["minReplicas"] == g["maxReplicas"] > 0, name
        params = g["rayStartParams"]
        assert all(isinstance(v, str) for v in params.values()), name
        check_ray_start(["ray", "start"] + [f"--{k}" for k in params])
        (container,) = g["template"]["spec"]["containers"]
        fw = image_framework(container["image"])
        gpus = container["resources"]["limits"]["nvidia.com/gpu"]
        assert gpus > 0 and params["num-gpus"] == str(gpus), f"{name}: num-gpus and the nvidia.com/gpu limit differ"
        assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus, name
        declared = start_params_resources(params)
        assert env_resources_of(declared) == {placement.env_resource(fw)}, f"{name}: {declared} for a {fw} image"
        groups[g["groupName"]] = {"framework": fw, "gpus": gpus}
    assert {g["framework"] for g in groups.values()} == set(FRAMEWORKS), where
    return groups


def test_kuberay_raycluster():
    kinds = [(d["apiVersion"], d["kind"]) for d in docs(RAYCLUSTER)]
    assert kinds == [("v1", "PersistentVolumeClaim"), ("ray.io/v1", "RayCluster")]
    rc = one(RAYCLUSTER, "RayCluster")
    groups = check_cluster_spec(rc["spec"], "raycluster.yaml")
    assert {g["gpus"] for g in groups.values()} == {8, 1}
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    pvc = one(RAYCLUSTER, "PersistentVolumeClaim")["metadata"]["name"]
    results = next(v["name"] for v in head["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName") == pvc)
    mounts = {m["name"]: m["mountPath"] for m in head["containers"][0]["volumeMounts"]}
    assert mounts[results] == "/results"
    # the port-forward the README and the comments use: KubeRay names the head service <cluster>-head-svc
    assert f"svc/{rc['metadata']['name']}-head-svc" in (CLUSTER / "README.md").read_text()


def test_kuberay_rayjob_runs_bench_run_on_the_head_into_the_results_volume():
    kinds = [(d["apiVersion"], d["kind"]) for d in docs(RAYJOB)]
    assert kinds == [("v1", "PersistentVolumeClaim"), ("ray.io/v1", "RayJob")]
    job = one(RAYJOB, "RayJob")
    spec = job["spec"]
    assert set(spec) <= RAYJOB_SPEC, f"unknown RayJob fields {set(spec) - RAYJOB_SPEC}"
    check_cluster_spec(spec["rayClusterSpec"], "rayjob.yaml")
    argv = shlex.split(spec["entrypoint"])
    check_bench_call(argv)
    assert argv[:2] == ["bench", "run"]
    matrix, run_dir = Path(argv[2]), Path(argv[argv.index("--run-dir") + 1])
    assert spec["shutdownAfterJobFinishes"] is True
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    volumes = {v["name"]: v for v in head["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in head["containers"][0]["volumeMounts"]}
    # the matrix comes from a ConfigMap mounted on the head, made from a file of this repository
    configmap = volumes[mounts[str(matrix.parent)]]["configMap"]["name"]
    made = re.search(rf"kubectl create configmap {configmap} --from-file=(\S+)", (CLUSTER / "README.md").read_text())
    assert made, f"cluster/README.md never says how to create the ConfigMap {configmap}"
    assert Path(made.group(1)).name == matrix.name and (ROOT / made.group(1)).is_file()
    assert f"kubectl create configmap {configmap} --from-file={made.group(1)}" in RAYJOB.read_text()
    # the results go to the PersistentVolumeClaim, which outlives the cluster
    pvc = one(RAYJOB, "PersistentVolumeClaim")["metadata"]["name"]
    assert volumes[mounts[str(run_dir.parent)]]["persistentVolumeClaim"]["claimName"] == pvc
    assert one(RAYCLUSTER, "PersistentVolumeClaim")["metadata"]["name"] == pvc
    # KubeRay names the submitter Job after the RayJob
    assert f"job/{job['metadata']['name']}" in RAYJOB.read_text()


# -- the example matrix ----------------------------------------------------------------------------

def test_example_matrix_is_valid_routes_by_env_and_every_framework_has_nodes():
    m, _ = load_matrix(EXAMPLE_MATRIX)
    assert m.run.env_resources is True
    assert m.run.device == "cuda"
    assert sorted(m.axes.framework) == FRAMEWORKS
    kube = check_cluster_spec(one(RAYCLUSTER, "RayCluster")["spec"], "raycluster.yaml")
    tp = max(int(opts.get("tensor_parallel_size", 1)) for sets in m.flags.values() for opts in sets.values())
    for fw in m.axes.framework:
        assert any(g["framework"] == fw and g["gpus"] >= (tp if fw in m.flags else 1) for g in kube.values()), fw


# -- the CI recipe ---------------------------------------------------------------------------------

CI = CLUSTER / "ci"
CI_WORKFLOW, CI_POLICY = CI / "lossless-regression.yml", CI / "policy.yaml"   # CI_SCRIPT: tests/helpers.py


@pytest.mark.parametrize("path", [CI_SCRIPT, CI_WORKFLOW], ids=lambda p: p.name)
def test_the_ci_recipe_submits_follows_and_gates_with_bench_as_it_is(path):
    calls = bench_calls(code(path))
    assert [c[1] for c in calls if c[1] != "ls"] == ["submit", "status", "gate"], calls
    gate = calls[[c[1] for c in calls].index("gate")]
    assert {"--against", "--policy", "--junit", "--format"} <= flags(gate) and gate[gate.index("--format") + 1] == "md"
    assert "--follow" in calls[1]
    for argv in calls:
        if argv[1] != "gate":
            check_bench_call(argv)
    if "--against" not in bench_options()["gate"]:
        pytest.skip("bench gate --against/--junit/--format are not in this checkout yet")
    check_bench_call(gate)


def test_ci_workflow_runs_nightly_by_hand_and_on_config_prs_and_passes_the_ray_secrets():
    wf = yaml.safe_load(CI_WORKFLOW.read_text())
    on = wf.get("on", wf.get(True))   # YAML 1.1 reads the key `on` as true
    assert on["schedule"][0]["cron"] and "workflow_dispatch" in on and "golden" in on["workflow_dispatch"]["inputs"]
    assert {"adapters/**", "cluster/ci/**"} <= set(on["pull_request"]["paths"])
    job = wf["jobs"]["regression"]
    assert job["defaults"]["run"]["shell"] == "bash"   # GitHub's bash -eo pipefail
    env = job["env"]
    assert env["RAY_ADDRESS"] == "${{ secrets.RAY_ADDRESS }}" and env["RAY_AUTH_TOKEN"] == "${{ secrets.RAY_AUTH_TOKEN }}"
    assert "'token'" in env["RAY_AUTH_MODE"] and "inputs.golden" in env["GOLDEN_RUN"]
    uses = [s.get("uses", "") for s in job["steps"]]
    assert any(u.startswith("mikepenz/action-junit-report@") for u in uses)
    assert any(u.startswith("actions/upload-artifact@") for u in uses)
    assert "GITHUB_STEP_SUMMARY" in CI_WORKFLOW.read_text()


def test_ci_policy_names_cells_of_the_example_matrix():
    from orchestrator.matrix.cells import expand

    cells = {tuple(sorted(c.axes().items())) for c in expand(load_matrix(EXAMPLE_MATRIX)[0])}
    rules = yaml.safe_load(CI_POLICY.read_text())["rules"]
    for rule in rules:
        assert rule["must_be"] in ("identical", "lossless", "near-lossless")
        assert {k for k in rule if k.startswith("max_")} <= {"max_slowdown", "max_ttft_p99_increase", "max_memory_increase"}
        wants = {a: v if isinstance(v, list) else [v] for a, v in rule["match"].items()}
        for combo in itertools.product(*wants.values()):   # the gate fails a listed value no cell has
            assert any(all(dict(c)[a] == x for a, x in zip(wants, combo)) for c in cells), (rule, combo)
