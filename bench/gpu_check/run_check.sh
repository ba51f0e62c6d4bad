#!/usr/bin/env bash
# The GPU check on the device machine, from the repository root:
#   bash bench/gpu_check/run_check.sh [run_check.py options]     (default: --bundle .gpu_bundle --out $OUT)
# Same as python3 bench/gpu_check/run_check.py; unbuffered output so a cut-off run still shows
# how far it got.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}
exec "$PYTHON" bench/gpu_check/run_check.py --bundle .gpu_bundle --out "${OUT:-gpu_check_out}" "$@"
