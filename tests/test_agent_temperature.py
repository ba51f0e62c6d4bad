"""Per-agent rollout temperatures (``mappo_agent_temperature``): the parsed key, where it is
refused, the sampler's temperature by agent, and each row's scoring temperature against
hand-computed log-probs."""

from __future__ import annotations

import math

import pytest
import torch

from mmoa.agents.pipeline import GenerationSettings
from mmoa.train.mappo.args import parse_agent_temperature, split_mappo_args
from mmoa.train.mappo.learner import PolicyWithValue
from mmoa.train.mappo.ppo_math import logprobs_from_logits
from mmoa.train.mappo.samples import SampleBatch


def test_the_key_parses_agent_temperatures() -> None:
    assert parse_agent_temperature("") == {}
    assert parse_agent_temperature(" selector=0.5 , qr=1.2 ") == {"selector": 0.5, "qr": 1.2}


@pytest.mark.parametrize("text", ["selector", "retriever=0.5", "qr=1,qr=2", "qr=0", "qr=-1",
                                  "qr=nan", "qr=abc"])
def test_bad_values_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="mappo_agent_temperature"):
        parse_agent_temperature(text)


def test_the_stage_reads_it_and_refuses_it_for_one_agent_pipelines() -> None:
    args, _ = split_mappo_args({"mappo_agent_temperature": "selector=0.5"})
    assert args.agent_temperatures == {"selector": 0.5}
    with pytest.raises(ValueError, match="mappo_agent_temperature"):
        split_mappo_args({"mappo_agent_temperature": "selector=0"})
    with pytest.raises(ValueError, match="names the agents of the qr_s_g pipeline"):
        split_mappo_args({"mappo_agent_temperature": "selector=0.5",
                          "mappo_pipeline": "search_agent"})


def test_the_sampler_uses_each_agents_temperature() -> None:
    settings = GenerationSettings(do_sample=True, temperature=0.95,
                                  agent_temperatures={"selector": 0.5})
    assert [settings.temperature_for(a) for a in ("qr", "selector", "generator")] == \
        [0.95, 0.5, 0.95]


def _batch(agents: tuple[str, ...]) -> SampleBatch:
    rows = len(agents)
    ids = torch.zeros(rows, 2, dtype=torch.long)
    return SampleBatch(input_ids=ids, attention_mask=torch.ones_like(ids),
                       response_ids=torch.zeros(rows, 1, dtype=torch.long),
                       response_mask=torch.ones(rows, 1, dtype=torch.bool),
                       positions=torch.zeros(rows, 1, dtype=torch.long), agents=agents)


def test_each_row_is_scored_at_its_agents_temperature() -> None:
    """Logits [2, 0] for every row, token 0: at T the log-prob is -log(1 + exp(-2 / T));
    the Selector's row at 0.5 gives -log(1 + e^-4) = -0.018150, the others at 1 give
    -log(1 + e^-2) = -0.126928."""
    policy = PolicyWithValue(torch.nn.Linear(1, 1), None, temperature=1.0,
                             agent_temperatures={"selector": 0.5})
    logits = torch.tensor([[2.0, 0.0]]).repeat(3, 1, 1)
    batch = _batch(("qr", "selector", "generator"))
    assert policy.row_temperatures(batch.agents, 3) == [1.0, 0.5, 1.0]
    logp = logprobs_from_logits(policy.scale_logits(logits, batch), batch.response_ids)
    expected = [-math.log1p(math.exp(-2.0)), -math.log1p(math.exp(-4.0)),
                -math.log1p(math.exp(-2.0))]
    torch.testing.assert_close(logp[:, 0], torch.tensor(expected), atol=1e-6, rtol=0)
    assert expected[1] == pytest.approx(-0.018150, abs=1e-6)
    # without per-agent temperatures (or agent names) every row takes the shared one
    shared = PolicyWithValue(torch.nn.Linear(1, 1), None, temperature=0.5)
    torch.testing.assert_close(shared.scale_logits(logits, _batch(())), logits / 0.5)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        PolicyWithValue(torch.nn.Linear(1, 1), None, agent_temperatures={"qr": 0.0})
