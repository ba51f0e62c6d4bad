"""LLaMA-Factory web UI with the MAPPO stage and a RAG playground."""
