#!/usr/bin/env bash
# Shared body of run_sft.sh and run_mappo.sh: `mmoa-cli train CONFIG [key=value ...]` from the
# repository root, in .venv, offline. Usage: train_with_config.sh DEFAULT_CONFIG [CONFIG] [k=v ...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then
  # shellcheck disable=SC1091
  source .venv/bin/activate
fi
DEFAULT_CONFIG=$1
shift
CONFIG=${1:-$DEFAULT_CONFIG}
shift || true
exec mmoa-cli train "$CONFIG" "$@"
