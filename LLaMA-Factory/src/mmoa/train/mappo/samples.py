"""PPO samples of all optimised agents, pooled, and their batched tensors.

Every agent call of a rollout becomes one sample: the agent's prompt ids, its response ids and
its scalar score (shared answer reward + that agent's penalty), and under GRPO its advantage.
Samples of different agents are pooled into one batch, as parameter sharing means one policy
learns from all of them.

For the forward passes a sample is laid out as ``prompt + response``, right-padded. The response
token ``t`` is predicted from position ``len(prompt) + t - 1``, and the value of the state before
it is read from the same position, so both come out as ``[batch, max_response_len]`` tensors
aligned with a response mask: prompt and padding tokens never enter a loss, and neither do the
response tokens a sample's ``loss_mask`` marks 0 (text the model read but did not write).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class Sample:
    agent: str
    prompt_ids: list[int]
    response_ids: list[int]
    score: float
    #: Log-probs of the response tokens under the distribution they were sampled from (only when
    #: the rollout recorded them; see :func:`mmoa.train.mappo.learner.behaviour_ratio_stats`).
    sampling_logprobs: list[float] | None = None
    #: GRPO only: the sample's advantage, set at rollout time from its group
    #: (:func:`mmoa.train.mappo.ppo_math.grpo_advantages`) and repeated on every response
    #: token; ``None`` under PPO, whose advantages come from the value head and GAE.
    advantage: float | None = None
    #: One 0/1 flag per response token: 1 where the model wrote the token, 0 where the pipeline
    #: appended it (the search agent's retrieved ``<information>``). Masked tokens stay in the
    #: forward pass as context but enter no loss, KL, value or advantage. ``None``: all 1.
    loss_mask: list[int] | None = None
    #: The token ids the sampler's logits mask allowed at each response position (the
    #: Selector's grammar, recorded under ``mappo_masked_scoring``): the tokens are then scored
    #: over these ids only. ``None``: over the whole vocabulary.
    support: list[list[int]] | None = None
    #: Grouped algorithms: the index of the sample's group (its question) among the groups of
    #: the :func:`~mmoa.train.mappo.grpo.group_samples` call that made it, and whether that
    #: group's rewards were all equal for its agent (no group signal): DAPO's refill counts
    #: the groups that were not flat.
    group: int | None = None
    group_flat: bool = False


@dataclass
class SampleBatch:
    """Right-padded model inputs and the response-aligned gather positions."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    response_ids: torch.Tensor  # [B, T] (pad where mask is 0)
    response_mask: torch.Tensor  # [B, T] float
    positions: torch.Tensor  # [B, T] index into L of the logits predicting each response token
    #: Each row's agent: with one adapter per agent, the forward pass scores each agent's rows
    #: with its own adapter (:mod:`mmoa.agent_adapters`); each row is scored at its agent's
    #: rollout temperature (``mappo_agent_temperature``).
    agents: tuple[str, ...] = ()
    #: ``[B, T, A]`` the allowed token ids of each response position, ``-1``-padded; a position
    #: whose entries are all ``-1`` is unconstrained. ``None`` when no sample has a support.
    support_ids: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> SampleBatch:
        return SampleBatch(*(t.to(device) for t in (
            self.input_ids, self.attention_mask, self.response_ids, self.response_mask,
            self.positions)), agents=self.agents,
            support_ids=None if self.support_ids is None else self.support_ids.to(device))

    def select(self, rows: list[int]) -> SampleBatch:
        """The batch of ``rows`` only (same widths: positions stay valid)."""
        index = torch.tensor(rows, device=self.input_ids.device)
        return SampleBatch(*(t[index] for t in (
            self.input_ids, self.attention_mask, self.response_ids, self.response_mask,
            self.positions)), agents=tuple(self.agents[r] for r in rows) if self.agents else (),
            support_ids=None if self.support_ids is None else self.support_ids[index])


def collate(samples: Sequence[Sample], pad_id: int) -> SampleBatch:
    if not samples:
        raise ValueError("collate needs at least one sample")
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    width = max(lengths)
    max_response = max(len(s.response_ids) for s in samples)
    n = len(samples)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    response_ids = torch.full((n, max_response), pad_id, dtype=torch.long)
    response_mask = torch.zeros((n, max_response), dtype=torch.float32)
    positions = torch.zeros((n, max_response), dtype=torch.long)
    for row, sample in enumerate(samples):
        if not sample.response_ids:
            raise ValueError(f"sample {row} ({sample.agent}) has an empty response")
        sequence = sample.prompt_ids + sample.response_ids
        input_ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
        attention[row, : len(sequence)] = 1
        r = len(sample.response_ids)
        response_ids[row, :r] = torch.tensor(sample.response_ids, dtype=torch.long)
        if sample.loss_mask is None:
            response_mask[row, :r] = 1.0
        else:
            if len(sample.loss_mask) != r:
                raise ValueError(f"sample {row} ({sample.agent}): loss_mask has "
                                 f"{len(sample.loss_mask)} flags for {r} response tokens")
            response_mask[row, :r] = torch.tensor(sample.loss_mask, dtype=torch.float32)
        start = len(sample.prompt_ids) - 1
        positions[row, :r] = torch.arange(start, start + r)
        positions[row, r:] = start + r - 1  # any valid index; masked out
    return SampleBatch(input_ids, attention, response_ids, response_mask, positions,
                       agents=tuple(s.agent for s in samples),
                       support_ids=_support_ids(samples, max_response))


def _support_ids(samples: Sequence[Sample], max_response: int) -> torch.Tensor | None:
    """``[B, T, A]`` the samples' supports, ``-1``-padded (see ``SampleBatch.support_ids``)."""
    if all(s.support is None for s in samples):
        return None
    width = max(len(ids) for s in samples if s.support is not None for ids in s.support)
    out = torch.full((len(samples), max_response, max(width, 1)), -1, dtype=torch.long)
    for row, sample in enumerate(samples):
        if sample.support is None:
            continue
        if len(sample.support) != len(sample.response_ids):
            raise ValueError(f"sample {row} ({sample.agent}): support has "
                             f"{len(sample.support)} positions for "
                             f"{len(sample.response_ids)} response tokens")
        for t, ids in enumerate(sample.support):
            if sample.response_ids[t] not in ids:
                raise ValueError(f"sample {row} ({sample.agent}): response token {t} "
                                 f"({sample.response_ids[t]}) is outside its support")
            out[row, t, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


def gather_positions(tensor: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``tensor[b, positions[b, t], ...]`` for a ``[B, L, ...]`` tensor."""
    if tensor.dim() == 2:
        return torch.gather(tensor, 1, positions)
    index = positions.unsqueeze(-1).expand(-1, -1, tensor.shape[-1])
    return torch.gather(tensor, 1, index)


def minibatches(n: int, size: int, generator: torch.Generator | None = None,
                shuffle: bool = True) -> list[list[int]]:
    """Index lists covering ``range(n)`` in chunks of ``size`` (shuffled when asked)."""
    order = torch.randperm(n, generator=generator).tolist() if shuffle else list(range(n))
    return [order[i: i + size] for i in range(0, n, size)]


def length_groups(lengths: Sequence[int], max_ratio: float = 1.3
                  ) -> list[tuple[list[int], int]]:
    """Rows grouped by length for padding-free-ish forward passes: ``[(rows, width), ...]``.

    Rows are sorted by length and a new group starts when a row is more than ``max_ratio`` times
    as long as the shortest row of the current group, so no row of a group is padded by more
    than that factor; ``width`` is the group's longest row. Pooled agent samples fall into a few
    groups (short Query Rewriter prompts, longer Generator and Selector prompts), and padding a
    short prompt to a prompt with K documents wasted most of a mixed batch's compute.
    """
    if max_ratio < 1.0:
        raise ValueError(f"max_ratio must be >= 1, got {max_ratio}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[tuple[list[int], int]] = []
    rows: list[int] = []
    for i in order:
        if rows and lengths[i] > max_ratio * lengths[rows[0]]:
            groups.append((rows, int(lengths[rows[-1]])))
            rows = []
        rows.append(i)
    if rows:
        groups.append((rows, int(lengths[rows[-1]])))
    return groups
