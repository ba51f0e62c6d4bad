#!/usr/bin/env bash
# The test command: sets up the environment from nothing (idempotent), lints, runs the whole suite.
# Extra arguments go to pytest, e.g.  bash run_tests.sh -k metrics -x  (--help: this text)
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then  # the header comment above
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
  exit 0
fi
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
# Two pytest-xdist workers (MMOA_TEST_WORKERS=0: one process): much of the suite's time goes
# to starting processes, loading libraries and waiting on servers, which a second worker
# overlaps. Each worker's torch gets its share of the cores: OpenMP threads that outnumber the
# cores spin-wait at every barrier and stall each other (docs/retrieval.md, troubleshooting,
# "CPU threads").
WORKERS=${MMOA_TEST_WORKERS:-2}
XDIST=()
if (( WORKERS > 0 )); then
  SHARE=$(( $(nproc) / WORKERS ))
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( SHARE > 0 ? SHARE : 1 ))}
  # one group per module (tests/conftest.py), handed out in the suite's order, slow ones first
  XDIST=(-n "$WORKERS" --dist loadgroup --no-loadscope-reorder)
fi
echo "[tests] pytest (${WORKERS} xdist workers)"
# --durations: the slowest tests, to keep the suite within its 15-minute budget
python -m pytest "${XDIST[@]}" --durations=15 "$@"
