"""Dense retrieval: encoder, Faiss index, memory-mapped corpus store, Flask app and HTTP client.

One server process holds one index and answers every trainer process (the original system ran
eight copies of a 65 GB index behind Flask's development server). Modules, each with one job:

* ``corpus``  - readers for JSONL / FlashRAG JSONL / DPR TSV and the memory-mapped Arrow store;
* ``encoder`` - :class:`~mmoa.retrieval.encoder.Encoder` over ``transformers.AutoModel``
  (mean/CLS pooling, L2 normalisation, e5-style prefixes) and named presets;
* ``index``   - the index folder (``index.faiss``, ``corpus/``, ``meta.json``), its validation
  and the in-process :class:`~mmoa.retrieval.index.Retriever`;
* ``builder`` - ``data_builders/build_index.py``: corpus file -> index folder, atomically;
* ``batcher`` - dynamic micro-batching of concurrent requests (and the unbatched baseline);
* ``sampling`` - stochastic retrieval (HARR): Plackett-Luce sampling of an ordered top-k from
  a candidate pool (Gumbel-top-k) and its log-probability, shared by server and trainer;
* ``app``     - the Flask app: ``POST /search``, ``POST /retrieve`` (greedy or sampled),
  ``GET /health``, ``POST /admin/reload_encoder``;
* ``server``  - the gunicorn launcher behind ``flask_server.py`` and ``run_server.sh``;
* ``client``  - :class:`~mmoa.retrieval.client.RetrievalClient` with time-outs and retries.

Nothing is imported here, so ``import mmoa.retrieval.client`` stays light (no torch, no faiss).
"""
