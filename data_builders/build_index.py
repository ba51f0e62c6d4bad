"""Build a retrieval index folder (index.faiss + memory-mapped corpus/ + meta.json).

Examples::

    # demo corpus, bundled all-MiniLM-L6-v2, exact search
    python data_builders/build_index.py --corpus data/demo/corpus.jsonl --output data/demo/index

    # DPR Wikipedia with a local Contriever copy, compressed IVF-PQ index
    python data_builders/build_index.py --corpus data/psgs_w100.tsv --output data/wiki_contriever \\
        --preset contriever --encoder models/facebook/contriever --factory IVF65536,PQ64 \\
        --device cuda --fp16

All logic lives in ``mmoa.retrieval.builder``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "LLaMA-Factory" / "src"))

import mmoa  # noqa: F401  (sets the offline environment first)
from mmoa.retrieval.builder import main

if __name__ == "__main__":
    sys.exit(main())
