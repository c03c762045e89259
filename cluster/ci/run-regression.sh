#!/usr/bin/env bash
# The lossless regression check, for any CI: runs a matrix on the team's Ray cluster into a new run
# dir on the cluster's shared storage, follows it, then gates it against the golden run.
# (GitHub Actions: lossless-regression.yml next to this file does the same in steps.)
#
#   RAY_ADDRESS=http://HEAD:8265 RESULTS_ROOT=/shared/results GOLDEN_RUN=/shared/results/golden \
#   RAY_AUTH_TOKEN=... cluster/ci/run-regression.sh [MATRIX [POLICY]]
#
# MATRIX   default cluster/gpu-sweep.yaml        POLICY   default cluster/ci/policy.yaml
# RUN_DIR  default $RESULTS_ROOT/ci/<UTC date>-<commit>: kept there, the history of the check
# OUT      where junit.xml and gate.md go (default: ci-out)
# Ray token authentication: RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, a file) holds the cluster's token;
# RAY_AUTH_MODE=token is then set here.
#
# Runs from the repo root, with this project installed (pip install -e .), where the dashboard port is
# reachable and the shared storage is mounted at the same path as on the head: the gate reads both
# runs from it. Exit: 0 the gate passed, 1 it failed or the run did not finish, 2 a usage error.
set -euo pipefail

usage() { echo "run-regression.sh: $1 (see the top of $0)" >&2; exit 2; }
(($# <= 2)) || usage "at most two arguments: MATRIX POLICY"
MATRIX=${1:-${MATRIX:-cluster/gpu-sweep.yaml}}
POLICY=${2:-${POLICY:-cluster/ci/policy.yaml}}
[[ -n "${RAY_ADDRESS:-}" ]] || usage "set RAY_ADDRESS to the dashboard of the cluster, e.g. http://HEAD:8265"
[[ -n "${RESULTS_ROOT:-}" ]] || usage "set RESULTS_ROOT to the results directory on the shared storage of the cluster"
[[ -n "${GOLDEN_RUN:-}" ]] || usage "set GOLDEN_RUN to the golden run dir on the shared storage"
COMMIT=${COMMIT:-$(git rev-parse HEAD)}
RUN_DIR=${RUN_DIR:-$RESULTS_ROOT/ci/$(date -u +%Y-%m-%d)-${COMMIT:0:12}}
OUT=${OUT:-ci-out}
if [[ -n "${RAY_AUTH_TOKEN:-}${RAY_AUTH_TOKEN_PATH:-}" ]]; then
  export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
fi
mkdir -p "$OUT"

job=$(bench submit "$MATRIX" --address "$RAY_ADDRESS" --run-dir "$RUN_DIR" | tail -n 1)
echo "run $RUN_DIR: Ray job $job" >&2
bench status "$job" --address "$RAY_ADDRESS" --follow >&2
rc=0
# the earlier CI runs are the history: their drift from the golden run is the run-to-run noise a speed bound
# needs (without it speed bounds are not checked, and the gate says so)
bench gate "$RUN_DIR" --against "$GOLDEN_RUN" --history "$RESULTS_ROOT/ci" --policy "$POLICY" --junit "$OUT/junit.xml" --format md > "$OUT/gate.md" || rc=$?
cat "$OUT/gate.md"
exit "$rc"
