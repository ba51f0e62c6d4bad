"""Stochastic retrieval (HARR): the Plackett-Luce log-probability against values worked out by
hand and against sampling frequencies, alpha -> 0 is greedy; then the real server on loopback:
sampled answers reproducible with a seed, their log-probabilities those of the in-process
encoder, bad sample fields as 400s, and the query encoder reloaded from a checkpoint."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import torch

from mmoa.retrieval.client import RetrievalClient, RetrieverRequestError
from mmoa.retrieval.sampling import (
    gumbel_top_k,
    plackett_luce_logprob,
    query_rng,
    sample_pool,
)
from tests.retrieval_fixtures import HARR_TOKEN as TOKEN
from tests.retrieval_fixtures import ServerProcess, harr_server, perturbed_encoder

AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUERIES = ["Who directed Crimson Bridge?", "capital of Moristan", "Who founded it?"]


# ------------------------------------------------------------------------------- maths


def test_logprob_of_3_candidates_k2_matches_hand_computation() -> None:
    scores = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    e1, e2, e3 = math.e ** 1, math.e ** 2, math.e ** 3
    # first the best (3 of {1,2,3}), then 1 of what is left ({1,2})
    want = math.log(e3 / (e1 + e2 + e3)) + math.log(e1 / (e1 + e2))
    got = plackett_luce_logprob(scores, torch.tensor([2, 0]), alpha=1.0)
    assert float(got) == pytest.approx(want, abs=1e-12)
    # alpha 0.5 doubles the logits: exp(2 s)
    f1, f2, f3 = math.e ** 2, math.e ** 4, math.e ** 6
    want_half = math.log(f2 / (f1 + f2 + f3)) + math.log(f3 / (f1 + f3))
    got_half = plackett_luce_logprob(scores, torch.tensor([1, 2]), alpha=0.5)
    assert float(got_half) == pytest.approx(want_half, abs=1e-12)
    # a batch of rows gives each row its own value
    batch = plackett_luce_logprob(scores.expand(2, 3), torch.tensor([[2, 0], [1, 2]]), 1.0)
    assert float(batch[0]) == pytest.approx(want, abs=1e-12)


def test_all_orderings_sum_to_one_and_invalid_slots_are_not_candidates() -> None:
    scores = torch.tensor([0.3, -0.1, 0.8, 0.5], dtype=torch.float64)
    orders = torch.tensor(list(itertools.permutations(range(4), 2)))
    total = torch.logsumexp(plackett_luce_logprob(scores.expand(len(orders), 4), orders, 0.2),
                            dim=0)
    assert float(total) == pytest.approx(0.0, abs=1e-12)
    # slot 3 masked out: the same as a pool of the first three
    valid = torch.tensor([True, True, True, False])
    masked = plackett_luce_logprob(scores, torch.tensor([2, 0]), 0.2, valid)
    assert float(masked) == pytest.approx(
        float(plackett_luce_logprob(scores[:3], torch.tensor([2, 0]), 0.2)), abs=1e-12)
    with pytest.raises(ValueError, match="invalid pool slot"):
        plackett_luce_logprob(scores, torch.tensor([3, 0]), 0.2, valid)
    with pytest.raises(ValueError, match="repeats"):
        plackett_luce_logprob(scores, torch.tensor([1, 1]), 0.2)
    with pytest.raises(ValueError, match="alpha"):
        plackett_luce_logprob(scores, torch.tensor([1, 0]), 0.0)


def test_logprob_gradient_matches_finite_differences() -> None:
    scores = torch.tensor([[0.2, 0.9, -0.4, 0.5]], dtype=torch.float64, requires_grad=True)
    picks = torch.tensor([[1, 3, 0]])
    assert torch.autograd.gradcheck(lambda s: plackett_luce_logprob(s, picks, 0.3), (scores,))


def test_sampling_frequencies_match_the_logprob() -> None:
    """20000 seeded samples of ordered pairs from 4 candidates against exp(logprob):
    Pearson chi-square with 11 degrees of freedom below its 0.999 quantile (31.26)."""
    scores = np.array([0.9, 0.7, 0.6, 0.2])
    alpha, n = 0.25, 20000
    rng = np.random.default_rng(1234)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(n):
        pick = tuple(int(p) for p in gumbel_top_k(scores, 2, alpha, rng))
        counts[pick] = counts.get(pick, 0) + 1
    chi2 = 0.0
    for order in itertools.permutations(range(4), 2):
        p = math.exp(float(plackett_luce_logprob(torch.tensor(scores), torch.tensor(order),
                                                 alpha)))
        expected = n * p
        chi2 += (counts.get(order, 0) - expected) ** 2 / expected
    assert chi2 < 31.26, (chi2, counts)


def test_alpha_towards_zero_is_the_greedy_ranking() -> None:
    rng = np.random.default_rng(0)
    scores = np.sort(rng.normal(size=30))[::-1] + np.linspace(0.0, 1e-3, 30)[::-1]
    for seed in range(20):
        picks, logprob = sample_pool(scores, 5, 1e-6, query_rng(seed, 0))
        assert picks.tolist() == [0, 1, 2, 3, 4]
        assert logprob == pytest.approx(0.0, abs=1e-9)
    # and a large alpha does leave the greedy order for some seed (the test can fail)
    assert any(sample_pool(scores, 5, 10.0, query_rng(s, 0))[0].tolist() != [0, 1, 2, 3, 4]
               for s in range(20))


def test_query_streams_are_reproducible_and_independent() -> None:
    scores = np.linspace(1.0, 0.0, 30)
    first = gumbel_top_k(scores, 5, 1.0, query_rng(7, 0))
    assert gumbel_top_k(scores, 5, 1.0, query_rng(7, 0)).tolist() == first.tolist()
    others = [gumbel_top_k(scores, 5, 1.0, query_rng(7, i)).tolist() for i in range(1, 6)]
    assert any(o != first.tolist() for o in others)


# ---------------------------------------------------------------------------- server


@pytest.fixture(scope="module")
def server(tiny_index_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    return harr_server(tiny_index_dir, tmp_path_factory)


@pytest.fixture(scope="module")
def reference(tiny_index_dir: Path) -> Any:
    from mmoa.retrieval.index import Retriever

    return Retriever.load(tiny_index_dir, device="cpu", verify_checksums=False)


def post(server: ServerProcess, path: str, body: Any) -> requests.Response:
    return requests.post(server.url + path, data=json.dumps(body), headers=AUTH, timeout=60)


@pytest.mark.slow
def test_sampled_retrieve_is_reproducible_and_its_logprob_is_the_encoders(
        server: ServerProcess, reference: Any) -> None:
    body = {"queries": QUERIES, "topk": 3, "return_scores": True,
            "sample": {"pool_size": 20, "alpha": 0.05, "seed": 42}}
    first, again = post(server, "/retrieve", body), post(server, "/retrieve", body)
    assert first.status_code == 200, first.text
    assert first.json() == again.json()
    payload = first.json()
    assert payload["sample"] == {"pool_size": 20, "alpha": 0.05, "seed": 42, "query_offset": 0}
    scores, rows = reference.search(QUERIES, 20)
    for hits, record, sc, rw in zip(payload["result"], payload["sampling"], scores, rows,
                                    strict=True):
        assert record["pool_rows"] == rw.tolist()
        assert [h["document"]["id"] for h in hits] == [
            p.id for p in reference.corpus.get([int(rw[i]) for i in record["picks"]])]
        np.testing.assert_allclose([h["score"] for h in hits], sc[record["picks"]], atol=1e-4)
        recomputed = plackett_luce_logprob(torch.tensor(sc, dtype=torch.float64),
                                           torch.tensor(record["picks"]), 0.05)
        assert record["logprob"] == pytest.approx(float(recomputed), abs=1e-2)
    other = post(server, "/retrieve", {**body, "sample": {**body["sample"], "seed": 43}})
    assert other.json()["sampling"] != payload["sampling"]  # fixed seeds: deterministic


@pytest.mark.slow
def test_alpha_towards_zero_equals_greedy_on_the_server(server: ServerProcess) -> None:
    greedy = post(server, "/retrieve", {"queries": QUERIES, "topk": 5}).json()["result"]
    sampled = post(server, "/retrieve", {"queries": QUERIES, "topk": 5, "sample": {
        "pool_size": 30, "alpha": 1e-6, "seed": 3}}).json()
    assert sampled["result"] == greedy
    assert all(r["picks"] == [0, 1, 2, 3, 4] for r in sampled["sampling"])
    search = post(server, "/search", {"questions": QUERIES, "N": 4, "sample": {
        "pool_size": 30, "alpha": 1e-6, "seed": 3}}).json()
    greedy_search = post(server, "/search", {"questions": QUERIES, "N": 4}).json()
    assert [i["top_k_docs"] for i in search] == [i["top_k_docs"] for i in greedy_search]
    assert set(greedy_search[0]) == {"question", "top_k_docs"}  # greedy answers unchanged
    assert {"logprob", "picks", "pool_rows", "scores", "sample"} <= set(search[0])


@pytest.mark.slow
def test_client_samples_the_same_however_the_batch_is_split(server: ServerProcess) -> None:
    queries = QUERIES * 3  # repeated queries: independent samples, like a GRPO group
    whole = RetrievalClient(server.url, token=TOKEN, max_queries_per_request=16)
    split = RetrievalClient(server.url, token=TOKEN, max_queries_per_request=2)
    a = whole.retrieve_sampled(queries, 3, pool_size=30, alpha=0.5, seed=9)
    b = split.retrieve_sampled(queries, 3, pool_size=30, alpha=0.5, seed=9)
    # the same pools, picks and documents; the scores only to float precision: the encoder's
    # matrix products may round differently for a batch of 2 than of 9 (seen on an AVX-512
    # CPU: 0.38377511 vs 0.38377505)
    assert len(a) == len(b) == len(queries)
    for x, y in zip(a, b, strict=True):
        assert (x["pool_rows"], x["picks"]) == (y["pool_rows"], y["picks"])
        assert [d["id"] for d in x["documents"]] == [d["id"] for d in y["documents"]]
        assert [d["score"] for d in x["documents"]] == pytest.approx(
            [d["score"] for d in y["documents"]], abs=1e-5)
        assert x["logprob"] == pytest.approx(y["logprob"], abs=1e-4)
    assert len({tuple(r["picks"]) for r in a[0::3]}) > 1
    assert set(a[0]) == {"documents", "logprob", "picks", "pool_rows"}


@pytest.mark.slow
@pytest.mark.parametrize(("sample", "topk", "message"), [
    (5, 3, "'sample' must be an object"),
    ({"pool": 3}, 3, "unknown key(s) ['pool']"),
    ({"pool_size": 41}, 3, "sample.pool_size' = 41; expected 1 <= sample.pool_size <= 40"),
    ({"pool_size": 2}, 3, "'topk' = 3 exceeds sample.pool_size = 2"),
    ({"alpha": 0}, 3, "'sample.alpha' must be a positive number"),
    ({"alpha": "hot"}, 3, "'sample.alpha' must be a positive number"),
    ({"alpha": True}, 3, "'sample.alpha' must be a positive number"),
    ({"seed": -1}, 3, "'sample.seed' = -1"),
    ({"seed": 1.5}, 3, "'sample.seed' must be an integer, got float"),
])
def test_bad_sample_fields_are_400s(server: ServerProcess, sample: Any, topk: int,
                                    message: str) -> None:
    response = post(server, "/retrieve", {"queries": QUERIES[:1], "topk": topk,
                                          "sample": sample})
    assert response.status_code == 400, response.text
    assert message in response.json()["message"]


@pytest.mark.slow
def test_seed_is_reported_when_absent(server: ServerProcess) -> None:
    payload = post(server, "/retrieve", {"queries": QUERIES[:1], "sample": {}}).json()
    seed = payload["sample"]["seed"]
    again = post(server, "/retrieve", {"queries": QUERIES[:1], "sample": {"seed": seed}}).json()
    assert again["sampling"] == payload["sampling"]


@pytest.mark.slow
def test_reload_encoder_changes_scores_and_the_original_restores_them(
        server: ServerProcess, reference: Any, tmp_path: Path) -> None:
    perturbed = perturbed_encoder(Path(reference.encoder.model_path), tmp_path / "perturbed")

    body = {"queries": QUERIES, "topk": 5, "return_scores": True}
    before = post(server, "/retrieve", body).json()["result"]
    unauthorised = requests.post(server.url + "/admin/reload_encoder",
                                 data=json.dumps({"path": str(perturbed)}), timeout=30)
    assert unauthorised.status_code == 401
    client = RetrievalClient(server.url, token=TOKEN)
    try:
        identity = client.reload_encoder(str(perturbed))
        assert identity["path"] == str(perturbed.resolve())
        health = requests.get(server.url + "/health", timeout=10).json()
        assert health["encoder"]["path"] == str(perturbed.resolve())
        assert health["encoder_reloads"] >= 1
        after = post(server, "/retrieve", body).json()["result"]
        changed = [abs(a["score"] - b["score"]) for ra, rb in zip(after, before, strict=True)
                   for a, b in zip(ra, rb, strict=True)]
        assert max(changed) > 1e-3
        with pytest.raises(RetrieverRequestError) as info:
            client.reload_encoder(str(tmp_path / "missing"))
        assert info.value.status == 400 and "missing" in info.value.message
    finally:
        client.reload_encoder(None)  # the index's own encoder
    restored = post(server, "/retrieve", body).json()["result"]
    assert restored == before
