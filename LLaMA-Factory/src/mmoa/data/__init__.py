"""Datasets: loaders into one record type, the dataset registry, the SFT and MAPPO data builders.

The demo world's generator and the tiny model's pre-training text are demo-only code and live in
the separate package ``mmoa_demo``; the demo world's files are one more format these loaders read.
"""
