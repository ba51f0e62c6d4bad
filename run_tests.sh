#!/usr/bin/env bash
# The test command: sets up the environment from nothing (idempotent), lints, runs the whole suite.
# Extra arguments go to pytest, e.g.  bash run_tests.sh -k metrics -x
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
bash setup_env.sh
# shellcheck disable=SC1091
source .venv/bin/activate
# The op DeepSpeed compiles for the two-process CPU runs (deepspeed_shm_comm) is built against
# this environment, so it is kept with it: in the shared ~/.cache folder every other checkout's
# environment forces a rebuild (30-85 s here), and one interrupted build blocks them all.
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.venv/torch_extensions}
echo "[tests] ruff check"
ruff check .
echo "[tests] pytest"
# --durations: the slowest tests, to keep the suite within its 15-minute budget
python -m pytest --durations=15 "$@"
