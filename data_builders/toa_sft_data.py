"""Synthesise the warm-start SFT and DPO data of the three agents by tree search over several
local models (TOA; docs/toa.md). Same as `mmoa-cli data toa`.

Example (with the retrieval server running on the demo index):
  python data_builders/toa_sft_data.py --data_file data/demo/train.jsonl --name demo_toa_sft \\
      --model name=smol,path=models/smollm2-135m-instruct,template=smollm2 \\
      --model name=careful,path=models/smollm2-135m-instruct,template=smollm2,variant=careful \\
      --samples_per_model 4 --baselines --retriever_url http://127.0.0.1:8000
"""

import sys

from mmoa.cli import main

if __name__ == "__main__":
    sys.exit(main(["data", "toa", *sys.argv[1:]]))
