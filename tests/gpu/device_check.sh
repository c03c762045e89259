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
missing=$("$PY" - <<'PYEOF'
import importlib.util as u
need = {"pydantic": "pydantic", "psutil": "psutil", "pynvml": "nvidia-ml-py", "numpy": "numpy"}
print(" ".join(pkg for mod, pkg in need.items() if u.find_spec(mod) is None))
PYEOF
)
if [ -n "$missing" ]; then
  echo "installing from $wheels: $missing"
  "$PY" -m pip install -q --no-index --find-links "$wheels" $missing
fi
exec "$PY" tests/gpu/device_check.py "$@"
