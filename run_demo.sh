#!/usr/bin/env bash
# The main job on the embedded demo: everything runs on a CPU, nothing is downloaded.
# Stages so far: environment, demo world, tiny model. (Index, server, SFT, MAPPO and evaluation
# are added by the issues that build them.)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False

DEMO_DIR=${DEMO_DIR:-data/demo}
MODEL_DIR=${MODEL_DIR:-models/tiny-llama3}
SEED=${SEED:-42}

bash setup_env.sh
# shellcheck disable=SC1091
source .venv/bin/activate

echo "== [1/2] demo world -> $DEMO_DIR"
python data_builders/make_demo_world.py --out "$DEMO_DIR" --seed "$SEED"

echo "== [2/2] tiny model -> $MODEL_DIR"
python models/make_tiny_model.py --output-dir "$MODEL_DIR" --text-files "$DEMO_DIR"/*.jsonl

echo
echo "demo ready: corpus and QA splits in $DEMO_DIR, model in $MODEL_DIR (template llama3)"
