"""Warm-start data synthesis by tree search over several models (TOA; docs/toa.md).

``tree``: the pure search tree; ``policies``: the local models that generate and refine;
``rewards``: the three agents' replaceable rewards; ``search``: TOA and best-of-N at the same
budget; ``builder``: SFT and DPO records and the label-quality summary; ``chunks``: the
questions in resumable chunks kept on disk.
"""
