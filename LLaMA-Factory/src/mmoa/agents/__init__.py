"""The three agents (Query Rewriter, Selector, Generator).

Prompts, output parsers, candidate merging and the batched QR -> R -> S -> G pipeline.
"""
