"""Write the paragraphs of HotpotQA / 2WikiMultihopQA / FlashRAG QA files as a retrieval corpus.

Each record's ``context`` paragraphs (FlashRAG: ``metadata.context``) become JSONL
``{"id", "title", "text"}`` rows, each distinct paragraph once with a stable id, ready for
``build_index.py``. Example::

    python data_builders/build_corpus.py \\
        --data_file data/hotpotqa/hotpot_train_v1.1.json \\
        data/hotpotqa/hotpot_dev_distractor_v1.json \\
        --output data/hotpotqa/corpus.jsonl
    python data_builders/build_index.py --corpus data/hotpotqa/corpus.jsonl \\
        --output data/hotpotqa/index

All logic lives in ``mmoa.data.context_corpus``.
"""

import sys

from mmoa.data.context_corpus import main

if __name__ == "__main__":
    sys.exit(main())
