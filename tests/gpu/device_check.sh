#!/usr/bin/env bash
# The transformers CUDA path on a bare GPU box (torch and transformers installed, no network), one command:
#   bash tests/gpu/device_check.sh [WHEEL_DIR] [-- device_check.py options]
# What the worker needs beyond torch and transformers (pydantic, psutil, nvidia-ml-py) is installed from
# WHEEL_DIR (default .cache/gpu-wheels, made by `make gpu-wheels` where a registry is reachable: a few
# MB), and only where it is missing. Exits as tests/gpu/device_check.py does: 0 all passed, 1 a check failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
wheels=${1:-.cache/gpu-wheels}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
# NVML only where there is a GPU to read (its memory figures need it)
gpu=$(command -v nvidia-smi >/dev/null && echo 1 || echo 0)
missing=$(GPU=$gpu "$PY" - <<'PYEOF'
import importlib.util as u, os
need = {"pydantic": "pydantic", "psutil": "psutil", "numpy": "numpy"}
if os.environ["GPU"] == "1":
    need["pynvml"] = "nvidia-ml-py"
print(" ".join(pkg for mod, pkg in need.items() if u.find_spec(mod) is None))
PYEOF
)
if [ -n "$missing" ]; then
  echo "installing from $wheels: $missing"
  "$PY" -m pip install -q --no-index --find-links "$wheels" $missing
fi
exec "$PY" tests/gpu/device_check.py "$@"
