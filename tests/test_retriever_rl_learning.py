"""The retriever_rl update learns: on a tiny task whose best answer is known (one rewarded
passage per question, ranked outside the greedy top-k at the start), GRPO on the Plackett-Luce
log-probabilities of sampled retrievals raises the reward and brings the rewarded passage into
the greedy top-k. Rollouts use the server's own sampling (``sample_pool``); the update is the
stage's ``grpo_update``; only the encoder is a toy (an embedding table), so it runs in a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from mmoa.retrieval.sampling import query_rng, sample_pool
from mmoa.train.retriever_rl.args import parse_retriever_rl_args
from mmoa.train.retriever_rl.learner import RetrievalGroups, grpo_update

N_DOCS, DIM, POOL, K, G, ALPHA = 12, 16, 8, 2, 8, 0.1
QUESTIONS = ["q0", "q1", "q2", "q3"]


class TableEncoder(torch.nn.Module):
    """A query encoder with one free unit vector per question."""

    def __init__(self, init: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(init.clone())

    def embed(self, queries: Sequence[str]) -> torch.Tensor:
        rows = torch.tensor([QUESTIONS.index(q) for q in queries])
        return torch.nn.functional.normalize(self.table[rows], dim=-1)


def _setup() -> tuple[np.ndarray, TableEncoder, list[int]]:
    gen = torch.Generator().manual_seed(0)
    docs = torch.nn.functional.normalize(torch.randn(N_DOCS, DIM, generator=gen), dim=-1)
    encoder = TableEncoder(torch.randn(len(QUESTIONS), DIM, generator=gen))
    with torch.no_grad():
        scores = encoder.embed(QUESTIONS) @ docs.T
    # the rewarded passage: rank 4 (0-based 3) of each question's initial ranking: in the pool,
    # outside the greedy top-2
    targets = [int(torch.argsort(row, descending=True)[3]) for row in scores]
    return docs.numpy(), encoder, targets


def _greedy_hits(encoder: TableEncoder, docs: np.ndarray, targets: list[int]) -> float:
    with torch.no_grad():
        scores = encoder.embed(QUESTIONS).numpy() @ docs.T
    top = np.argsort(-scores, axis=1)[:, :K]
    return float(np.mean([t in row for t, row in zip(targets, top, strict=True)]))


def test_grpo_on_plackett_luce_logprobs_raises_the_reward() -> None:
    docs, encoder, targets = _setup()
    assert _greedy_hits(encoder, docs, targets) == 0.0
    optimizer = torch.optim.Adam(encoder.parameters(), lr=0.05)
    rewards_per_step = []
    for step in range(40):
        queries = [q for q in QUESTIONS for _ in range(G)]
        with torch.no_grad():
            scores = encoder.embed(queries).numpy() @ docs.T
        pools = np.argsort(-scores, axis=1)[:, :POOL]  # what the server's Faiss search returns
        picks, old, rewards = [], [], []
        for i, (row, pool) in enumerate(zip(scores, pools, strict=True)):
            positions, logprob = sample_pool(row[pool], K, ALPHA, query_rng(step, i))
            picks.append(positions)
            old.append(logprob)
            rewards.append(float(targets[i // G] in pool[positions]))
        groups = RetrievalGroups(
            queries=queries, picks=torch.tensor(np.stack(picks)),
            pool_vectors=torch.from_numpy(docs[pools]), valid=torch.ones(len(queries), POOL,
                                                                         dtype=torch.bool),
            old_logprobs=torch.tensor(old, dtype=torch.float64),
            rewards=torch.tensor(rewards).reshape(len(QUESTIONS), G))
        stats = grpo_update(encoder.embed, list(encoder.parameters()), optimizer, groups,
                            alpha=ALPHA, cliprange=0.2)
        # the server's log-probabilities are the trainer's before the update
        assert stats["logprob_gap"] < 1e-4
        rewards_per_step.append(stats["reward"])
    first, last = np.mean(rewards_per_step[:5]), np.mean(rewards_per_step[-5:])
    assert last > first + 0.4, rewards_per_step
    assert _greedy_hits(encoder, docs, targets) == 1.0


def test_no_signal_leaves_the_encoder_unchanged() -> None:
    docs, encoder, _ = _setup()
    before = encoder.table.detach().clone()
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=0.1)
    queries = [q for q in QUESTIONS for _ in range(2)]
    groups = RetrievalGroups(queries=queries, picks=torch.tensor([[0, 1]] * 8),
                             pool_vectors=torch.from_numpy(np.stack([docs[:3]] * 8)),
                             valid=torch.ones(8, 3, dtype=torch.bool),
                             old_logprobs=torch.full((8,), -1.0, dtype=torch.float64),
                             rewards=torch.ones(4, 2))
    stats = grpo_update(encoder.embed, list(encoder.parameters()), optimizer, groups,
                        alpha=ALPHA, cliprange=0.2)
    assert stats["grad_norm"] == 0.0 and stats["grpo/zero_variance_fraction"] == 1.0
    assert torch.equal(encoder.table, before)


def test_config_keys_are_checked_by_name() -> None:
    base = {"stage": "retriever_rl", "model_name_or_path": "m", "template": "smollm2",
            "dataset": "d", "output_dir": "o", "retriever_index": "i"}
    args = parse_retriever_rl_args(base)
    assert (args.retriever_pool_size, args.retriever_top_k, args.retriever_alpha,
            args.retriever_group_size, args.retriever_cliprange) == (30, 3, 0.05, 8, 0.2)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['finetuning_type'\]"):
        parse_retriever_rl_args({**base, "finetuning_type": "lora"})
    with pytest.raises(ValueError, match=r"retriever_top_k \(4\) must not exceed"):
        parse_retriever_rl_args({**base, "retriever_top_k": 4, "retriever_pool_size": 3})
    with pytest.raises(ValueError, match="retriever_alpha must be a positive number"):
        parse_retriever_rl_args({**base, "retriever_alpha": 0})
    with pytest.raises(ValueError, match="retriever_finetuning must be one of"):
        parse_retriever_rl_args({**base, "retriever_finetuning": "qlora"})
    with pytest.raises(ValueError, match=r"required key\(s\) \['template'\]"):
        parse_retriever_rl_args({k: v for k, v in base.items() if k != "template"})


def test_the_demo_example_parses_with_harrs_settings() -> None:
    import yaml

    path = (Path(__file__).resolve().parents[1] / "LLaMA-Factory" / "examples" / "demo"
            / "smollm2_retriever_rl.yaml")
    args = parse_retriever_rl_args(yaml.safe_load(path.read_text(encoding="utf-8")))
    assert (args.retriever_pool_size, args.retriever_top_k, args.retriever_alpha,
            args.retriever_group_size, args.retriever_finetuning, args.retriever_lora_rank) \
        == (30, 3, 0.05, 8, "lora", 32)
