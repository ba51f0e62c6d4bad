"""bench/behaviour_ratio.py with truncated importance sampling on (issue #71): on the tiny model
and the live demo server, ``--tis-cap`` reports the weights ``min(r, cap)`` the learner would put
on each token's policy loss beside the behaviour ratio ``r``, for every run of the table."""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.bench_fixtures import load_bench


def test_the_bench_reports_the_tis_weights(tiny_model_dir: Path, tiny_world_dir: Path,
                                           tiny_server_url: str) -> None:
    bench = load_bench("behaviour_ratio")
    args = argparse.Namespace(model=str(tiny_model_dir), template="llama3",
                              data_file=str(tiny_world_dir / "dev.jsonl"),
                              retriever_url=tiny_server_url, questions=2, k=5,
                              temperature=0.95, top_p=[0.9], seed=0, tis_cap=2.0)
    results = bench.measure(args)
    assert results["tis_cap"] == 2.0 and len(results["runs"]) == 2  # scored at T = 1 and 0.95
    for row in results["runs"].values():
        assert 0 < row["tis_weight_min"] <= row["tis_weight_mean"] <= 2.0
        assert 0.0 <= row["tis_capped_fraction"] <= 1.0
        # below the cap every weight is the ratio itself: the mean cannot exceed the ratio's
        assert row["tis_weight_mean"] <= row["mean"] + 1e-6
    assert "tis_mean" in bench.table(results).splitlines()[0]
