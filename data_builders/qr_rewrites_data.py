"""Synthesise Query Rewriter labels that are not the question: sampled rewrites scored by the
gold passages the live retriever returns for them, kept where they beat the question alone
(docs/real_workflow.md). Same as `mmoa-cli data qr-rewrites`; its output goes to
`qr_s_g_sft_data_alpaca.py --rewrites_file`.

Example (with the retrieval server running on the corpus's index):
  python data_builders/qr_rewrites_data.py --data_file train.json \\
      --output data/hotpotqa_distractor/qr_rewrites.json \\
      --model name=smol,path=models/smollm2-135m-instruct,template=smollm2 \\
      --model name=careful,path=models/smollm2-135m-instruct,template=smollm2,variant=careful \\
      --samples_per_model 4 --k 5 --compare --retriever_url http://127.0.0.1:8000
"""

import sys

from mmoa.cli import main

if __name__ == "__main__":
    sys.exit(main(["data", "qr-rewrites", *sys.argv[1:]]))
