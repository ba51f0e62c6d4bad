"""The warnings a MAPPO run logs at its start for valid but misleading settings
(``MappoArguments.startup_warnings``): both concern the grammar-constrained Selector scored over
the whole vocabulary."""

from __future__ import annotations

from mmoa.train.mappo.args import MappoArguments


def test_the_demo_settings_warn_of_nothing() -> None:
    assert MappoArguments().startup_warnings() == []
    assert MappoArguments(mappo_masked_scoring=True, mappo_tis_cap=2.0,
                          mappo_agent_kl_scale="selector=4").startup_warnings() == []


def test_a_scaled_selector_kl_on_unmasked_scores_warns_of_the_bonus() -> None:
    [warning] = MappoArguments(mappo_agent_kl_scale="selector=4").startup_warnings()
    assert warning.startswith("mappo_agent_kl_scale: selector=4 with the grammar-constrained")
    assert "set mappo_masked_scoring: true" in warning
    # k3 is never negative, a scale of 1 is the demo's, the other agents are not masked
    assert MappoArguments(mappo_agent_kl_scale="selector=4",
                          mappo_kl_estimator="low_var_kl").startup_warnings() == []
    assert MappoArguments(mappo_agent_kl_scale="selector=1").startup_warnings() == []
    assert MappoArguments(mappo_agent_kl_scale="qr=4").startup_warnings() == []
    # a Selector that is not optimised, or not constrained, has no such tokens
    assert MappoArguments(mappo_agent_kl_scale="selector=4",
                          mappo_agents="qr,generator").startup_warnings() == []
    assert MappoArguments(mappo_agent_kl_scale="selector=4",
                          mappo_constrained_selector=False).startup_warnings() == []


def test_truncated_importance_sampling_on_unmasked_scores_warns() -> None:
    [warning] = MappoArguments(mappo_tis_cap=2.0).startup_warnings()
    assert warning.startswith("mappo_tis_cap with the grammar-constrained Selector")
    both = MappoArguments(mappo_tis_cap=2.0, mappo_agent_kl_scale="selector=4").startup_warnings()
    assert len(both) == 2
