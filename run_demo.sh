#!/usr/bin/env bash
# The main job on the embedded demo (work in progress: builds the demo world and the tiny model).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
bash setup_env.sh
