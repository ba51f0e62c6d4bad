"""Dense retrieval: encoder, Faiss index, memory-mapped corpus store, Flask app and HTTP client."""
