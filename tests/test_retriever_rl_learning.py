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
    # a config shared with the LLM stages: their precision keys mean nothing to the encoder
    # (fp32), use_cpu keeps both models on the CPU
    shared = parse_retriever_rl_args({**base, "bf16": True, "pure_bf16": False, "use_cpu": True})
    assert shared.use_cpu is True and args.use_cpu is False
    with pytest.raises(ValueError, match=r"retriever_top_k \(4\) must not exceed"):
        parse_retriever_rl_args({**base, "retriever_top_k": 4, "retriever_pool_size": 3})
    with pytest.raises(ValueError, match="retriever_alpha must be a finite number > 0"):
        parse_retriever_rl_args({**base, "retriever_alpha": 0})
    with pytest.raises(ValueError, match="retriever_history: true needs retriever_queries"):
        parse_retriever_rl_args({**base, "retriever_history": True})
    with pytest.raises(ValueError, match="save_total_limit must be a non-negative integer"):
        parse_retriever_rl_args({**base, "save_total_limit": -1})
    assert parse_retriever_rl_args({**base, "save_total_limit": 2}).save_total_limit == 2
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


def test_history_aware_state_puts_the_current_sub_query_first() -> None:
    from mmoa.data.records import QARecord
    from mmoa.train.retriever_rl.state import observation, state_text, sub_queries

    record = QARecord(id="b", question="In which country was X born?", answers=["Y"],
                      decomposition=["Where was X born?", "Which country is X's birthplace in?"])
    assert sub_queries(record, "decomposition") == record.decomposition
    assert sub_queries(record, "question") == [record.question]
    plain = QARecord(id="p", question="Who is X?", answers=["Z"])
    assert sub_queries(plain, "decomposition") == ["Who is X?"]
    seen = observation(["X\nX was born in  Lurn, a city.", "Lurn\n" + "long " * 100])
    assert seen.startswith("X X was born in Lurn, a city. | Lurn long")
    assert len(seen.split(" | ")[1]) == 200
    assert state_text("Which country?", []) == "Which country?"
    assert state_text("Which country?", [("Where was X born?", seen)]).split("\n") == [
        "Which country?", f"Where was X born?: {seen}"]


def test_several_retrievals_per_sample_are_its_tokens() -> None:
    """Samples 0 and 2 retrieve twice, 1 and 3 once: the [N, H] layout, and a loss whose
    gradient reaches every retrieval (each carries its sample's advantage)."""
    docs, encoder, _ = _setup()
    # (a question whose retrievals carry opposite advantages with the same picks would get
    # cancelling gradients: each question here keeps one sign)
    queries = ["q0", "q1", "q2", "q3", "q1", "q2"]
    sample_of = torch.tensor([0, 0, 1, 2, 2, 3])
    groups = RetrievalGroups(
        queries=queries, picks=torch.tensor([[0, 1]] * 6),
        pool_vectors=torch.from_numpy(np.stack([docs[:4]] * 6)),
        valid=torch.ones(6, 4, dtype=torch.bool),
        old_logprobs=torch.full((6,), -2.0, dtype=torch.float64),
        rewards=torch.tensor([[1.0, 0.0], [1.0, 0.0]]), sample_of=sample_of)
    sample, hop, mask = groups.layout()
    assert sample.tolist() == sample_of.tolist() and hop.tolist() == [0, 1, 0, 0, 1, 0]
    assert mask.tolist() == [[True, True], [True, False], [True, True], [True, False]]
    before = encoder.table.detach().clone()
    stats = grpo_update(encoder.embed, list(encoder.parameters()),
                        torch.optim.SGD(encoder.parameters(), lr=0.1), groups, alpha=ALPHA,
                        cliprange=10.0)
    assert stats["grad_norm"] > 0
    moved = (encoder.table.detach() - before).abs().sum(dim=1)
    assert bool((moved > 0).all())  # every question's state got a gradient
    with pytest.raises(ValueError, match="non-decreasing"):
        RetrievalGroups(queries=queries[:2], picks=torch.tensor([[0, 1]] * 2),
                        pool_vectors=torch.zeros(2, 4, DIM), valid=torch.ones(2, 4,
                                                                             dtype=torch.bool),
                        old_logprobs=torch.zeros(2, dtype=torch.float64),
                        rewards=torch.zeros(1, 2), sample_of=torch.tensor([1, 0]))
