#!/usr/bin/env bash
# Warm start of the Query Rewriter, the Selector and the Generator (one model) with
# LLaMA-Factory's SFT stage, through `mmoa-cli train` (identical to `llamafactory-cli train`).
#
#   bash LLaMA-Factory/run_sft.sh                                   # the demo config (SmolLM2)
#   bash LLaMA-Factory/run_sft.sh LLaMA-Factory/examples/real/llama3_lora_sft.yaml
#   bash LLaMA-Factory/run_sft.sh CONFIG.yaml num_train_epochs=1     # key=value overrides
#
# Paths inside the configs are relative to the repository root, where this script runs.
exec bash "$(dirname "${BASH_SOURCE[0]}")/train_with_config.sh" \
  LLaMA-Factory/examples/demo/smollm2_full_sft.yaml "$@"
