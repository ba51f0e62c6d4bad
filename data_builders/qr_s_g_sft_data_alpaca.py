"""Build the warm-start SFT data of the three agents. Same as `mmoa-cli data sft`.

Example (with the retrieval server running on the demo index):
  python data_builders/qr_s_g_sft_data_alpaca.py --data_file data/demo/train.jsonl \\
      --name demo_sft --retriever_url http://127.0.0.1:8000
"""

import sys

from mmoa.cli import main

if __name__ == "__main__":
    sys.exit(main(["data", "sft", *sys.argv[1:]]))
