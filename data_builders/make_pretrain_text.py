"""Write the tiny demo model's pre-training text (demo worlds of other seeds) for `stage: pt`.

Example:
  python data_builders/make_pretrain_text.py --exclude-corpus data/demo/corpus.jsonl
"""

import sys

from mmoa_demo.pretrain_text import main

if __name__ == "__main__":
    sys.exit(main())
