#!/usr/bin/env bash
# Warm start of the Query Rewriter, the Selector and the Generator (one model) with
# LLaMA-Factory's SFT stage, through `mmoa-cli train` (identical to `llamafactory-cli train`).
#
#   bash LLaMA-Factory/run_sft.sh                                   # the demo config (SmolLM2)
#   bash LLaMA-Factory/run_sft.sh LLaMA-Factory/examples/real/llama3_lora_sft.yaml
#   bash LLaMA-Factory/run_sft.sh CONFIG.yaml num_train_epochs=1     # key=value overrides
#   cd LLaMA-Factory && bash run_sft.sh                              # the same, from here
#
# The config's model folder and datasets (data/dataset_info.json) are checked first: a missing
# one is named, with the command that makes it, before anything loads.
# Paths inside the configs are relative to the repository root, where this script runs.
# Environment: FORCE_TORCHRUN=1 / NPROC_PER_NODE=N for several processes, as llamafactory-cli.
exec bash "$(dirname "${BASH_SOURCE[0]}")/train_with_config.sh" "${BASH_SOURCE[0]}" \
  LLaMA-Factory/examples/demo/smollm2_full_sft.yaml "$@"
