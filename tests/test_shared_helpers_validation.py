"""The shared lower-bound check (``mmoa.config_values.check_at_least``) and the ``mappo_*`` keys
that now go through it and through ``check_range``: the messages are the ones the keys gave
before the checks were shared."""

from __future__ import annotations

import re

import pytest

from mmoa.config_values import check_at_least
from mmoa.train.mappo.args import split_mappo_args


def test_check_at_least_passes_none_and_values_at_the_bound() -> None:
    assert check_at_least("k", None) is None
    assert check_at_least("k", 1) == 1
    assert check_at_least("rounds", 0, 0) == 0


@pytest.mark.parametrize(("value", "minimum", "message"), [
    (0, 1, "k must be at least 1, got 0"),
    (-1, 0, "k must be at least 0, got -1"),
])
def test_check_at_least_names_the_key_and_the_bound(value: int, minimum: int,
                                                    message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_at_least("k", value, minimum)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("mappo_rollout_batch_size", 0, "mappo_rollout_batch_size must be at least 1, got 0"),
    ("mappo_forward_batch_size", 0, "mappo_forward_batch_size must be at least 1, got 0"),
    ("mappo_search_top_k", 0, "mappo_search_top_k must be at least 1, got 0"),
    ("mappo_decision_max_searches", -1, "mappo_decision_max_searches must be at least 0, got -1"),
    ("mappo_dapo_max_rounds", -1, "mappo_dapo_max_rounds must be at least 0, got -1"),
    ("mappo_loss_norm_length", 0, "mappo_loss_norm_length must be at least 1, got 0"),
    ("mappo_kl_loss_coef", -1, "mappo_kl_loss_coef must be a finite number >= 0, got -1.0"),
    ("mappo_decision_retrieval_cost", float("nan"),
     "mappo_decision_retrieval_cost must be a finite number >= 0 (it is subtracted from the "
     "reward), got nan"),
    ("mappo_qr_retrieval_reward", -0.5,
     "mappo_qr_retrieval_reward must be a finite number >= 0 (a reward added to the Query "
     "Rewriter's score), got -0.5"),
    ("mappo_overlong_penalty_factor", -2,
     "mappo_overlong_penalty_factor must be a finite number >= 0, got -2.0"),
])
def test_mappo_keys_keep_their_messages(key: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        split_mappo_args({key: value})


def test_an_unset_forward_batch_size_is_the_default() -> None:
    assert split_mappo_args({"mappo_forward_batch_size": None})[0] \
        .mappo_forward_batch_size is None
