"""Build the search agent's format-learning SFT data. Same as `mmoa-cli data search-sft`.

Trajectories follow each question's known hops (the demo world's decomposition, or HotpotQA's
supporting titles) with the documents the live server retrieves, as ShareGPT conversations whose
<information> blocks are observation turns (never trained on), segmented per model turn as RAG-R1
does (train with mask_history: true). See docs/search_agent.md.

Example (with the retrieval server running on the demo index):
  python data_builders/search_agent_sft_data.py --data_file data/demo/train.jsonl \\
      --name demo_search_sft --retriever_url http://127.0.0.1:8000
"""

import sys

from mmoa.cli import main

if __name__ == "__main__":
    sys.exit(main(["data", "search-sft", *sys.argv[1:]]))
