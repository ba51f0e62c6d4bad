#!/usr/bin/env bash
# Shared body of run_sft.sh and run_mappo.sh: `mmoa-cli train CONFIG [key=value ...]` from the
# repository root, in .venv, offline.
#   Usage: train_with_config.sh SCRIPT DEFAULT_CONFIG [CONFIG] [key=value ...]
# SCRIPT (the calling run_*.sh) is only read for --help: its header comment is its help.
# CONFIG may be given relative to the folder the user is in; `mmoa-cli train` then checks the
# model folder and the datasets (mmoa.preflight) before LLaMA-Factory loads anything, and names
# the command that makes a missing one.
set -euo pipefail
SCRIPT=$1
DEFAULT_CONFIG=$2
shift 2
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$SCRIPT"
  echo "Default CONFIG: $DEFAULT_CONFIG"
  exit 0
fi
CALLER_DIR=$PWD
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then
  # shellcheck disable=SC1091
  source .venv/bin/activate
fi
if ! command -v mmoa-cli >/dev/null 2>&1; then
  WHERE=""
  [[ "$CALLER_DIR" != "$ROOT" ]] && WHERE="cd $ROOT && "
  echo "$(basename "$SCRIPT"): error: mmoa-cli not found (no .venv in the repository, none on PATH)" >&2
  echo "  make it with: ${WHERE}bash setup_env.sh" >&2
  exit 2
fi
CONFIG=${1:-$DEFAULT_CONFIG}
shift || true
if [[ "$CONFIG" != /* && ! -e "$CONFIG" && -e "$CALLER_DIR/$CONFIG" ]]; then
  CONFIG=$CALLER_DIR/$CONFIG
fi
MMOA_CALLER_DIR=$CALLER_DIR exec mmoa-cli train "$CONFIG" "$@"
