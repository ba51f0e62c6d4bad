"""Evaluate the QR -> Retriever -> Selector -> Generator pipeline. Same as `mmoa-cli eval`.

Example:
  python evaluate/evaluate_qr_s_g.py --model_name_or_path models/tiny-llama3 --template llama3 \\
      --data_file data/demo/test.jsonl --retriever_url http://127.0.0.1:8000 \\
      --mode qr_s_g --output_dir outputs/eval/untrained
"""

import sys

from mmoa.cli import main

if __name__ == "__main__":
    sys.exit(main(["eval", *sys.argv[1:]]))
