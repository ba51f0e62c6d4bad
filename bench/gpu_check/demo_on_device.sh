#!/usr/bin/env bash
# The demo (run_demo.sh: world, index, server, SFT data, warm start, MAPPO, the four evaluation
# rows, the table) with the REAL SmolLM2 and encoder weights on the device machine, in the call
# after `carry_parts.py convert` made models/smollm2-135m-instruct and the site (the bundle's
# wheels, gguf, the encoder with its weights):
#   bash bench/gpu_check/demo_on_device.sh [SITE]          (default /tmp/mmoa_site)
# The machine's python3 (with torch) runs everything; run_demo.sh's set-up stage is skipped
# (MMOA_SETUP=0). Back in $OUT (at most 8 files): demo_results.txt (the table), demo.log (every
# stage with its start time), demo_outputs.tar.gz (metrics, plots, the server's log).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
SITE=${1:-/tmp/mmoa_site}
RESULTS=${OUT:-outputs/demo_on_device}
DEMO_OUT=/tmp/mmoa_demo_out
mkdir -p "$RESULTS"
if [[ ! -f models/smollm2-135m-instruct/provenance.json || ! -d "$SITE/llamafactory" ]]; then
  echo "demo_on_device.sh: run 'python3 bench/gpu_check/carry_parts.py convert --bundle" \
       ".gpu_bundle --site $SITE' first (no converted model or no site)" >&2
  exit 2
fi
PY=$(command -v python3)
BIN=$(mktemp -d)
printf '#!/usr/bin/env bash\nexec %s "$@"\n' "$PY" > "$BIN/python"
printf '#!%s\nimport sys\nfrom mmoa.cli import main\nsys.exit(main())\n' "$PY" > "$BIN/mmoa-cli"
chmod +x "$BIN/python" "$BIN/mmoa-cli"
export PATH="$BIN:$PATH" MMOA_PYTHON="$PY" PYTHONUNBUFFERED=1
export PYTHONPATH="$SITE:$PWD/LLaMA-Factory/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=/tmp/mmoa_hf_home
export TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg WANDB_DISABLED=true
rm -rf "$DEMO_OUT"
START=$(date +%s)
MMOA_SETUP=0 OUT="$DEMO_OUT" bash run_demo.sh 2>&1 | tee "$RESULTS/demo.log"
rc=${PIPESTATUS[0]}
echo "[demo_on_device] run_demo.sh exited $rc after $(( $(date +%s) - START )) s" \
  | tee -a "$RESULTS/demo.log"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >> "$RESULTS/demo.log" 2>&1
if [[ -f "$DEMO_OUT/results.txt" ]]; then cp "$DEMO_OUT/results.txt" "$RESULTS/demo_results.txt"; fi
if [[ -d "$DEMO_OUT" ]]; then
  tar -czf "$RESULTS/demo_outputs.tar.gz" -C "$(dirname "$DEMO_OUT")" "$(basename "$DEMO_OUT")"
fi
exit "$rc"
