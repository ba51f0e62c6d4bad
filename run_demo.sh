#!/usr/bin/env bash
# The whole method on the embedded demo, end to end, on a CPU, with nothing downloaded:
#
#   set-up -> demo world -> tiny model (tokenizer + pre-training) -> index -> retrieval server
#   -> SFT data -> warm start (SFT) -> MAPPO data -> MAPPO -> evaluation -> one table + plots
#
# Environment knobs (defaults are the demo the README reports):
#   SEED          seed of the world, the model and the trainings (default 42)
#   PORT          loopback port of the retrieval server (default 8000)
#   DATA_DIR      datasets and dataset_info.json (default data; the world goes to DATA_DIR/demo)
#   MODEL_DIR     the tiny model before training (default models/tiny-llama3)
#   SAVES         trained models: SAVES/pt, SAVES/full/sft, SAVES/full/mappo (saves/tiny-llama3)
#   OUT           the table, metrics, plots and the server log (default outputs/demo)
#   DEMO_SCALE    "full" (default) or "small": a smaller world and fewer steps, for the CI test
#   PRECISION     "auto" (default: bf16 when the GPU or the CPU supports it), "bf16" or "fp32"
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False

SEED=${SEED:-42}
PORT=${PORT:-8000}
OUT=${OUT:-outputs/demo}
DEMO_SCALE=${DEMO_SCALE:-full}
PRECISION=${PRECISION:-auto}
DATA_DIR=${DATA_DIR:-data}
DEMO_DIR=$DATA_DIR/demo
MODEL_DIR=${MODEL_DIR:-models/tiny-llama3}
SAVES=${SAVES:-saves/tiny-llama3}
URL="http://127.0.0.1:$PORT"
K=5

case "$DEMO_SCALE" in
  full)  WORLD=(--n-passages 2000 --n-train 2000 --n-dev 200 --n-test 200)
         PT_ARGS=(); SFT_ARGS=(); MAPPO_ARGS=(); PT_WORLDS=(--n-passages 2000) ;;
  small) WORLD=(--n-passages 300 --n-train 60 --n-dev 20 --n-test 20)
         PT_ARGS=(max_steps=4 logging_steps=1); SFT_ARGS=(max_steps=4 logging_steps=1)
         MAPPO_ARGS=(max_steps=2 mappo_questions_per_rollout=4 mappo_rollout_batch_size=4
                     save_steps=2)
         PT_WORLDS=(--n-passages 200 --seeds 1001) ;;
  *) echo "run_demo.sh: DEMO_SCALE must be full or small, got '$DEMO_SCALE'" >&2; exit 2 ;;
esac

START=$(date +%s)
stage() { printf '\n== [%s/11] %s   (%ds)\n' "$1" "$2" "$(( $(date +%s) - START ))"; }

SERVER_PID=""
cleanup() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "[demo] stopping the retrieval server (pid $SERVER_PID)"
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
}
trap cleanup EXIT
trap 'echo "[demo] interrupted" >&2; exit 130' INT TERM

stage 1 "environment"
bash setup_env.sh
# shellcheck disable=SC1091
source .venv/bin/activate
mkdir -p "$OUT"

# Mixed precision where the hardware has it: bf16 autocast on a GPU, or on a CPU with AVX-512
# BF16 / AMX (about 1.7x faster for the tiny model); plain fp32 elsewhere.
if [[ "$PRECISION" == auto ]]; then
  PRECISION=$(python - <<'EOF'
from pathlib import Path

import torch
if torch.cuda.is_available():
    print("bf16" if torch.cuda.is_bf16_supported() else "fp32")
else:
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.exists() else ""
    print("bf16-cpu" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "fp32")
EOF
)
fi
case "$PRECISION" in
  bf16) PREC_ARGS=(bf16=true) ;;
  bf16-cpu) PREC_ARGS=(bf16=true use_cpu=true) ;;
  fp32) PREC_ARGS=(bf16=false) ;;
  *) echo "run_demo.sh: PRECISION must be auto, bf16, bf16-cpu or fp32" >&2; exit 2 ;;
esac
echo "[demo] precision: $PRECISION"

stage 2 "demo world -> $DEMO_DIR"
python data_builders/make_demo_world.py --out "$DEMO_DIR" --seed "$SEED" "${WORLD[@]}"

stage 3 "tiny model -> $MODEL_DIR (tokenizer trained on the pre-training text, random init)"
# Three copy drills per passage, of names drawn afresh for every drill: the pre-training from which
# the tiny model learns to copy names out of its context (the Query Rewriter and the Generator need
# it; see "The tiny model" in the README).
python data_builders/make_pretrain_text.py --exclude-corpus "$DEMO_DIR/corpus.jsonl" \
  --dataset-dir "$DATA_DIR" --copy-drills 3 --fresh-copy-names "${PT_WORLDS[@]}"
python models/make_tiny_model.py --output-dir "$MODEL_DIR" --seed "$SEED" \
  --text-files "$DATA_DIR/demo_pt.jsonl"

stage 4 "pre-training of the tiny model on other worlds' text (LLaMA-Factory stage: pt)"
mmoa-cli train LLaMA-Factory/examples/demo/tiny_full_pt.yaml seed="$SEED" \
  model_name_or_path="$MODEL_DIR" dataset_dir="$DATA_DIR" output_dir="$SAVES/pt" \
  "${PREC_ARGS[@]}" "${PT_ARGS[@]}"

stage 5 "retrieval index + server on $URL"
python data_builders/build_index.py --corpus "$DEMO_DIR/corpus.jsonl" \
  --output "$DEMO_DIR/index" --overwrite
if ! python -c "import socket, sys; s = socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $PORT)) == 0)"
then
  echo "run_demo.sh: port $PORT is already in use (another retrieval server?); stop it or set" \
       "PORT=<free port>" >&2
  exit 2
fi
bash run_server.sh --index "$DEMO_DIR/index" --port "$PORT" > "$OUT/retrieval_server.log" 2>&1 &
SERVER_PID=$!
python - "$URL" <<'EOF'
import sys
from mmoa.retrieval.client import RetrievalClient
RetrievalClient(sys.argv[1]).wait_until_ready(timeout=180)
print(f"[demo] retrieval server ready on {sys.argv[1]}")
EOF

stage 6 "SFT data (QR, Selector, Generator) from the train split"
python data_builders/qr_s_g_sft_data_alpaca.py --data_file "$DEMO_DIR/train.jsonl" \
  --dataset_dir "$DATA_DIR" --name demo_sft --k "$K" --retriever_url "$URL" --seed "$SEED"

stage 7 "warm start: SFT of all three agents on one model"
bash LLaMA-Factory/run_sft.sh LLaMA-Factory/examples/demo/tiny_full_sft.yaml seed="$SEED" \
  model_name_or_path="$SAVES/pt" dataset_dir="$DATA_DIR" output_dir="$SAVES/full/sft" \
  "${PREC_ARGS[@]}" "${SFT_ARGS[@]}"

stage 8 "MAPPO prompt set"
python data_builders/get_ppo_data_alpaca.py --data_file "$DEMO_DIR/train.jsonl" \
  --dataset_dir "$DATA_DIR" --name demo_mappo

stage 9 "MAPPO: joint optimisation of QR, Selector and Generator"
bash LLaMA-Factory/run_mappo.sh LLaMA-Factory/examples/demo/tiny_full_mappo.yaml \
  seed="$SEED" model_name_or_path="$SAVES/full/sft" dataset_dir="$DATA_DIR" \
  output_dir="$SAVES/full/mappo" mappo_retriever_url="$URL" mappo_top_k="$K" \
  "${PREC_ARGS[@]}" "${MAPPO_ARGS[@]}"

stage 10 "evaluation on the test split (generation limits as in the MAPPO rollout)"
# The limits are read from the MAPPO config, so evaluation generates as the rollout did.
read -r -a LIMITS < <(python - <<'EOF'
import yaml
config = yaml.safe_load(open("LLaMA-Factory/examples/demo/tiny_full_mappo.yaml"))
print(" ".join(f"--max_new_tokens_{agent} {config[f'mappo_max_new_tokens_{agent}']}"
               for agent in ("qr", "selector", "generator")))
EOF
)
EVALUATED=()
evaluate() {  # name model mode
  echo "-- $1 ($3)"
  python evaluate/evaluate_qr_s_g.py --model_name_or_path "$2" --mode "$3" \
    --data_file "$DEMO_DIR/test.jsonl" --retriever_url "$URL" --k "$K" "${LIMITS[@]}" \
    --output_dir "$OUT/eval_$1" | tail -n 1
  EVALUATED+=("$OUT/eval_$1")
}
evaluate untrained "$MODEL_DIR" qr_s_g
evaluate base "$SAVES/pt" qr_s_g
evaluate sft "$SAVES/full/sft" qr_s_g
evaluate mappo "$SAVES/full/mappo" qr_s_g
evaluate rag_sft "$SAVES/full/sft" rag

stage 11 "results -> $OUT"
for plot in "$SAVES"/full/mappo/training_*.png; do cp "$plot" "$OUT/mappo_$(basename "$plot")"; done
cp "$SAVES/full/sft/training_loss.png" "$OUT/sft_training_loss.png"
cp "$SAVES/pt/training_loss.png" "$OUT/pt_training_loss.png"
mmoa-cli eval --compare "${EVALUATED[@]}" | tee "$OUT/results.txt"
echo
echo "demo finished in $(( $(date +%s) - START )) s: table $OUT/results.txt, metrics" \
     "$OUT/eval_*/metrics.json, plots $OUT/*.png"
