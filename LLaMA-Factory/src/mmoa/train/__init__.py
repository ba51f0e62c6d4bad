"""Training stages owned by this project (LLaMA-Factory runs every other stage)."""
