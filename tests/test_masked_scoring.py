"""Scoring a grammar-constrained agent under its mask (``mappo_masked_scoring``): the masked
log-probs and entropy against hand-computed values, the gradient outside the support, the
batched supports, and where the option is refused. The end-to-end check (behaviour ratio 1 for
the sampled Selector) is in ``test_pipeline_integration.py``."""

from __future__ import annotations

import math

import pytest
import torch

from mmoa.train.mappo.args import split_mappo_args
from mmoa.train.mappo.ppo_math import (
    entropy_from_logits,
    logprobs_from_logits,
    restrict_to_support,
)
from mmoa.train.mappo.samples import Sample, collate


def test_a_masked_position_is_renormalised_over_its_support() -> None:
    """Logits [1, 2, 3, 4]; support {1, 3}; token 3: 4 - log(e^2 + e^4) = -log(1 + e^-2)
    = -0.126928 (whole vocabulary: 4 - log(e + e^2 + e^3 + e^4) = -0.440190). The entropy
    of the two-token distribution (p = 0.880797, 0.119203) is 0.365334 nats."""
    logits = torch.tensor([[[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]]])
    support = torch.tensor([[[1, 3], [-1, -1]]])  # second position unconstrained
    labels = torch.tensor([[3, 3]])
    masked = restrict_to_support(logits, support)
    logp = logprobs_from_logits(masked, labels)
    torch.testing.assert_close(logp, torch.tensor([[-0.126928, -0.440190]]), atol=1e-6,
                               rtol=0)
    assert logp[0, 0].item() == pytest.approx(-math.log1p(math.exp(-2.0)), abs=1e-6)
    entropy = entropy_from_logits(masked)
    p = 1 / (1 + math.exp(-2.0))
    assert entropy[0, 0].item() == pytest.approx(-(p * math.log(p) + (1 - p) * math.log(1 - p)),
                                                 abs=1e-6)
    assert entropy[0, 0].item() == pytest.approx(0.365334, abs=1e-6)
    torch.testing.assert_close(entropy[0, 1], entropy_from_logits(logits)[0, 1])
    assert restrict_to_support(logits, None) is logits


def test_rows_without_a_support_are_left_alone() -> None:
    logits = torch.randn(3, 2, 5)
    support = torch.full((3, 2, 2), -1, dtype=torch.long)
    support[1, 0] = torch.tensor([0, 4])
    masked = restrict_to_support(logits, support)
    torch.testing.assert_close(masked[[0, 2]], logits[[0, 2]])
    torch.testing.assert_close(masked[1, 1], logits[1, 1])
    assert torch.isinf(masked[1, 0, 1:4]).all() and torch.isfinite(masked[1, 0, [0, 4]]).all()
    assert not torch.isinf(logits).any(), "out of place"


def test_no_gradient_reaches_the_tokens_outside_the_support() -> None:
    """d/dlogits of log p(token 3) under support {1, 3}: 1 - p3 on token 3, -p1 on token 1,
    0 on the masked tokens (p1 = 0.119203)."""
    logits = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]], requires_grad=True)
    logp = logprobs_from_logits(restrict_to_support(logits, torch.tensor([[[1, 3]]])),
                                torch.tensor([[3]]))
    logp.sum().backward()
    assert logits.grad is not None
    p1 = 1 / (1 + math.exp(2.0))
    torch.testing.assert_close(logits.grad[0, 0], torch.tensor([0.0, -p1, 0.0, p1]),
                               atol=1e-6, rtol=0)


def test_bad_supports_are_refused() -> None:
    logits = torch.zeros(1, 2, 4)
    with pytest.raises(ValueError, match="does not match"):
        restrict_to_support(logits, torch.zeros(1, 3, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        restrict_to_support(logits, torch.tensor([[[4], [0]]]))


def test_collate_lays_the_supports_out_padded() -> None:
    selector = Sample("selector", [7, 8], [1, 3, 2], 0.0, support=[[1, 2], [3], [0, 1, 2]])
    generator = Sample("generator", [7], [5, 6], 0.0)
    batch = collate([generator, selector], pad_id=0)
    assert batch.support_ids is not None and batch.support_ids.shape == (2, 3, 3)
    assert (batch.support_ids[0] == -1).all()
    assert batch.support_ids[1].tolist() == [[1, 2, -1], [3, -1, -1], [0, 1, 2]]
    assert batch.select([1]).support_ids.tolist() == [batch.support_ids[1].tolist()]
    assert collate([generator], pad_id=0).support_ids is None
    with pytest.raises(ValueError, match="outside its support"):
        collate([Sample("selector", [7], [4], 0.0, support=[[1, 2]])], pad_id=0)
    with pytest.raises(ValueError, match="1 positions for 2 response tokens"):
        collate([Sample("selector", [7], [1, 2], 0.0, support=[[1, 2]])], pad_id=0)


def test_the_option_needs_the_constrained_qr_s_g_selector() -> None:
    args, _ = split_mappo_args({"mappo_masked_scoring": True})
    assert args.mappo_masked_scoring
    for other in ({"mappo_pipeline": "search_agent"}, {"mappo_constrained_selector": False}):
        with pytest.raises(ValueError, match="mappo_masked_scoring"):
            split_mappo_args({"mappo_masked_scoring": True, **other})
