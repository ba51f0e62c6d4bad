#!/usr/bin/env bash
# Joint optimisation of the Query Rewriter, the Selector and the Generator with MAPPO
# (stage: mappo), through `mmoa-cli train`. The retrieval server must be running.
#
#   bash LLaMA-Factory/run_mappo.sh                                 # the demo config (SmolLM2)
#   bash LLaMA-Factory/run_mappo.sh LLaMA-Factory/examples/real/llama3_lora_mappo.yaml
#   bash LLaMA-Factory/run_mappo.sh CONFIG.yaml max_steps=10        # key=value overrides
#   cd LLaMA-Factory && bash run_mappo.sh                            # the same, from here
#
# The config's model folder (the warm start of run_sft.sh) and datasets (data/dataset_info.json)
# are checked first, then the server at mappo_retriever_url: a missing one is named, with the
# command that makes it, before the model loads.
# Paths inside the configs are relative to the repository root, where this script runs.
# Environment: FORCE_TORCHRUN=1 / NPROC_PER_NODE=N for one MAPPO process per GPU.
exec bash "$(dirname "${BASH_SOURCE[0]}")/train_with_config.sh" "${BASH_SOURCE[0]}" \
  LLaMA-Factory/examples/demo/smollm2_full_mappo.yaml "$@"
