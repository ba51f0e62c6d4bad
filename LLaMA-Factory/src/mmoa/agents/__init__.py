"""The three agents (Query Rewriter, Selector, Generator): prompts, parsers, candidate merging and the batched pipeline."""
