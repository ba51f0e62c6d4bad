"""Retrieval server entry point (same name as in the original MMOA-RAG repository).

    python flask_server.py --index data/demo/index --port 8000

Starts the production server: gunicorn with one worker process holding the index and a pool
of request threads sharing one micro-batcher (see ``mmoa.retrieval.server``). ``run_server.sh``
runs exactly this. All options: ``python flask_server.py --help``; each also reads
``MMOA_RETRIEVER_<OPTION>`` from the environment.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "LLaMA-Factory" / "src"))

import mmoa  # noqa: F401  (sets the offline environment before any HF import)
from mmoa.retrieval.server import main

if __name__ == "__main__":
    sys.exit(main())
