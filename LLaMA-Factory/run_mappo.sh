#!/usr/bin/env bash
# Joint optimisation of the Query Rewriter, the Selector and the Generator with MAPPO
# (stage: mappo), through `mmoa-cli train`. The retrieval server must be running.
#
#   bash LLaMA-Factory/run_mappo.sh                                 # the demo config (SmolLM2)
#   bash LLaMA-Factory/run_mappo.sh LLaMA-Factory/examples/real/llama3_lora_mappo.yaml
#   bash LLaMA-Factory/run_mappo.sh CONFIG.yaml max_steps=10        # key=value overrides
#
# Paths inside the configs are relative to the repository root, where this script runs.
exec bash "$(dirname "${BASH_SOURCE[0]}")/train_with_config.sh" \
  LLaMA-Factory/examples/demo/smollm2_full_mappo.yaml "$@"
