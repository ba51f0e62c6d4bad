"""Build the decision agent's warm-start SFT data. Same as `mmoa-cli data decision-sft`.

A direct [Answer] for the records of group 'known' (measured: the zero-shot model answers them),
[Search] query, the live server's [Documents] and [Answer] for the others; ShareGPT with the
documents as observation turns, segmented per model turn (train with mask_history: true).
See docs/decision_agent.md.

Example (with the retrieval server running on the demo index):
  python data_builders/decision_agent_sft_data.py --data_file data/demo_decision/train.jsonl \\
      --name demo_decision_sft --retriever_url http://127.0.0.1:8000
"""

import sys

from mmoa.cli import main

if __name__ == "__main__":
    sys.exit(main(["data", "decision-sft", *sys.argv[1:]]))
