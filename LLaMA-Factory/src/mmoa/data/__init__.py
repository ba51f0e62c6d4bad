"""Datasets: loaders into one record type, the demo world and atomic file writing."""
