"""``mappo_adapter_per_agent``: one LoRA adapter per agent over one frozen base.

Unit tests on the learners' tiny policy (the adapters, the per-agent forward, one PPO update,
a save/load round trip), then runs of the ``mappo`` stage on the tiny model: checkpoints and
the final output hold every agent's adapter, a resume continues exactly, the evaluation loads
the output with each agent on its own adapter, and two DDP processes compute what one does.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mmoa.agent_adapters import (
    MARKER_FILE,
    add_agent_adapters,
    agent_adapters,
    load_agent_adapters,
    use_agent,
    write_marker,
)
from mmoa.train.mappo.learner import PolicyWithValue, PPOConfig, PPOLearner
from mmoa.train.mappo.samples import Sample, collate
from mmoa.train.mappo.value_head import ValueHead
from tests.mappo_fixtures import EOS, tiny_mappo_config, tiny_policy

AGENTS = ("qr", "selector", "generator")
LORA_TARGETS = ["q_proj", "v_proj"]


def _lora(policy: torch.nn.Module) -> torch.nn.Module:
    """The tiny policy as LLaMA-Factory builds a LoRA model: one trainable ``default``
    adapter, frozen base."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(policy, LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS))


def _per_agent(seed: int = 0, perturb: bool = True) -> torch.nn.Module:
    """Per-agent adapters on the tiny policy; ``perturb``: random ``lora_B`` (LoRA starts B at
    zero, so every adapter would equal the base), different for every agent."""
    model = add_agent_adapters(_lora(tiny_policy(seed=1)), AGENTS)
    if perturb:
        torch.manual_seed(seed)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.2)
    return model


def _adapter_state(model: torch.nn.Module, agent: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if f".{agent}." in n}


def _base_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


SAMPLES = [Sample("qr", [2, 5, 6], [7, 8, EOS], 1.0),
           Sample("generator", [2, 5, 6, 7], [3, EOS], -0.5),
           Sample("selector", [2, 9, 10, 11, 4], [9, EOS], 0.5),
           Sample("qr", [2, 12, 13], [4, 4, EOS], 0.0),
           Sample("generator", [2, 3], [11, 12, 13, EOS], 1.0)]


def _single_agent_logprobs(model: torch.nn.Module, sample: Sample) -> torch.Tensor:
    """The log-probs of one sample with PEFT's own ``set_adapter`` (no helper of ours)."""
    from mmoa.train.mappo.learner import response_hidden_and_logits
    from mmoa.train.mappo.ppo_math import logprobs_from_logits

    model.set_adapter(sample.agent)
    batch = collate([sample], pad_id=0)
    _, logits = response_hidden_and_logits(model, batch)
    return logprobs_from_logits(logits, batch.response_ids)[0]


# -- the adapters ------------------------------------------------------------------------------

def test_one_trainable_adapter_per_agent_over_a_frozen_base() -> None:
    model = _per_agent(perturb=False)
    assert agent_adapters(model) == AGENTS
    assert sorted(model.peft_config) == sorted(AGENTS)  # LLaMA-Factory's `default` is gone
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    for agent in AGENTS:  # 2 layers x (q, v) x (A, B)
        assert len([n for n in trainable if f".{agent}." in n]) == 8, agent
    # distinct: every adapter's A is its own random draw (B starts at zero, as LoRA's does)
    a = {agent: torch.cat([p.flatten() for n, p in _adapter_state(model, agent).items()
                           if "lora_A" in n]) for agent in AGENTS}
    assert not torch.equal(a["qr"], a["selector"]) and not torch.equal(a["qr"], a["generator"])
    # the same LoRA config for each (llamafactory's)
    configs = {agent: model.peft_config[agent] for agent in AGENTS}
    assert {(c.r, c.lora_alpha, tuple(sorted(c.target_modules))) for c in configs.values()} \
        == {(4, 8, ("q_proj", "v_proj"))}


def test_use_agent_switches_adapters_and_keeps_every_one_trainable() -> None:
    model = _per_agent()
    sample = SAMPLES[0]
    batch = collate([sample], pad_id=0)
    from mmoa.train.mappo.learner import response_hidden_and_logits

    outputs = {}
    for agent in (*AGENTS, "not_optimised"):
        with torch.no_grad(), use_agent(model, agent):
            outputs[agent] = response_hidden_and_logits(model, batch)[1]
    # PEFT's set_adapter / disable_adapter turned requires_grad off on the others: put back
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)
    with torch.no_grad(), model.disable_adapter():
        base = response_hidden_and_logits(model, batch)[1]
    assert torch.equal(outputs["not_optimised"], base)  # an agent without adapter: the base
    for agent in AGENTS:
        assert not torch.allclose(outputs[agent], base, atol=1e-4), agent
    assert not torch.allclose(outputs["qr"], outputs["generator"], atol=1e-4)


def test_an_ordinary_model_is_left_as_it_is() -> None:
    model = _lora(tiny_policy(seed=1))
    assert agent_adapters(model) == ()
    with use_agent(model, "qr"):
        assert model.active_adapter == "default"


# -- scoring and the update --------------------------------------------------------------------

def test_each_row_is_scored_with_its_agents_adapter() -> None:
    model = _per_agent()
    wrapped = PolicyWithValue(model, ValueHead(32))
    batch = collate(SAMPLES, pad_id=0)
    logprobs, values, _ = wrapped(batch)
    assert values is not None and values.shape == logprobs.shape
    for row, sample in enumerate(SAMPLES):
        expected = _single_agent_logprobs(model, sample)
        n = len(sample.response_ids)
        assert torch.allclose(logprobs[row, :n], expected, atol=1e-5), row
    model.base_model.set_requires_grad(list(AGENTS), True)  # PEFT's set_adapter above
    # the reference: the base with every adapter disabled, for every agent
    ref = wrapped.reference_logprobs(batch)
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)
    for row, sample in enumerate(SAMPLES):
        with torch.no_grad(), model.disable_adapter():
            base = _single_agent_logprobs(model, sample)
        assert torch.allclose(ref[row, :len(sample.response_ids)], base, atol=1e-6), row
        assert not torch.allclose(ref[row, :len(sample.response_ids)],
                                  logprobs[row, :len(sample.response_ids)], atol=1e-4), row


def test_gradients_reach_each_adapter_from_its_own_samples_only() -> None:
    """The gradient of a pooled loss on each adapter equals the gradient of its agent's rows
    alone scored with PEFT's set_adapter; an agent without rows gets a zero gradient (not
    none: DDP needs one for every trainable parameter)."""
    model = _per_agent()
    wrapped = PolicyWithValue(model, None)
    samples = [s for s in SAMPLES if s.agent != "selector"]
    batch = collate(samples, pad_id=0)
    logprobs, _, _ = wrapped(batch)
    (logprobs * batch.response_mask).sum().backward()
    pooled = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    assert all(g is not None for g in pooled.values())
    for name, grad in pooled.items():
        if ".selector." in name:
            assert torch.count_nonzero(grad) == 0, name
    model.zero_grad(set_to_none=True)
    for agent in ("qr", "generator"):
        for sample in samples:
            if sample.agent == agent:
                _single_agent_logprobs(model, sample).sum().backward()
        model.base_model.set_requires_grad(list(AGENTS), True)
    for name, param in model.named_parameters():
        if ".qr." in name or ".generator." in name:
            assert param.grad is not None, name
            assert torch.allclose(pooled[name], param.grad, atol=1e-5), name
            if "lora_B" in name:
                assert torch.count_nonzero(param.grad) > 0, name


def _one_update(model: torch.nn.Module, samples: list[Sample]) -> dict[str, float]:
    wrapped = PolicyWithValue(model, ValueHead(32))
    params = [p for p in wrapped.parameters() if p.requires_grad]
    learner = PPOLearner(wrapped, torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0),
                         PPOConfig(mini_batch_size=2, ppo_epochs=1),
                         pad_id=0, generator=torch.Generator().manual_seed(0))
    stats = learner.update(learner.prepare(samples))
    return stats


def test_an_update_moves_only_the_adapters_of_the_agents_it_saw() -> None:
    model = _per_agent()
    before = {agent: _adapter_state(model, agent) for agent in AGENTS}
    base = _base_state(model)
    stats = _one_update(model, [s for s in SAMPLES if s.agent == "generator"])
    assert stats["skipped_updates"] == 0
    after = {agent: _adapter_state(model, agent) for agent in AGENTS}
    for agent in ("qr", "selector"):
        for name in before[agent]:
            assert torch.equal(before[agent][name], after[agent][name]), name
    moved = [n for n in before["generator"]
             if not torch.equal(before["generator"][n], after["generator"][n])]
    assert len(moved) == len(before["generator"])
    for name, value in _base_state(model).items():
        assert torch.equal(base[name], value), name


def test_an_update_of_every_agent_moves_every_adapter_and_no_base_weight() -> None:
    model = _per_agent()
    before = {agent: _adapter_state(model, agent) for agent in AGENTS}
    base = _base_state(model)
    _one_update(model, SAMPLES)
    for agent in AGENTS:
        after = _adapter_state(model, agent)
        assert all(not torch.equal(before[agent][n], after[n]) for n in after), agent
    assert all(torch.equal(base[n], v) for n, v in _base_state(model).items())


# -- save and load ----------------------------------------------------------------------------

def test_save_and_load_give_the_same_logprobs_per_agent(tmp_path: Path) -> None:
    model = _per_agent(seed=3)
    model.save_pretrained(tmp_path, safe_serialization=True)
    write_marker(tmp_path, model)
    assert json.loads((tmp_path / MARKER_FILE).read_text()) == {"agents": list(AGENTS)}
    for agent in AGENTS:
        assert (tmp_path / agent / "adapter_model.safetensors").is_file()
    loaded = load_agent_adapters(tiny_policy(seed=1), tmp_path)
    assert agent_adapters(loaded) == AGENTS
    from mmoa.train.mappo.learner import response_hidden_and_logits

    batch = collate(SAMPLES[:1], pad_id=0)
    per_agent = {}
    for agent in AGENTS:
        with torch.no_grad(), use_agent(model, agent):
            ours = response_hidden_and_logits(model, batch)[1]
        with torch.no_grad(), use_agent(loaded, agent):
            theirs = response_hidden_and_logits(loaded, batch)[1]
        assert torch.equal(ours, theirs), agent
        per_agent[agent] = theirs
    assert not torch.equal(per_agent["qr"], per_agent["selector"])


def test_checkpoint_weights_load_into_a_fresh_model(tmp_path: Path) -> None:
    from mmoa.train.mappo.trainer import load_policy_weights

    model = _per_agent(seed=4)
    model.save_pretrained(tmp_path, safe_serialization=True)
    write_marker(tmp_path, model)
    fresh = _per_agent(seed=5)
    load_policy_weights(fresh, tmp_path)
    for agent in AGENTS:
        ours, theirs = _adapter_state(model, agent), _adapter_state(fresh, agent)
        assert all(torch.equal(ours[n], theirs[n]) for n in ours), agent
    # a checkpoint of per-agent adapters cannot resume a run with one shared adapter
    with pytest.raises(ValueError, match="mappo_adapter_per_agent: true"):
        load_policy_weights(_lora(tiny_policy(seed=1)), tmp_path)
    with pytest.raises(ValueError, match="this run has adapters for qr, generator"):
        load_policy_weights(add_agent_adapters(_lora(tiny_policy(seed=1)),
                                               ("qr", "generator")), tmp_path)


# -- refusals ---------------------------------------------------------------------------------

def test_refused_where_it_cannot_work() -> None:
    from mmoa.train.mappo.args import MappoArguments
    from mmoa.train.mappo.workflow import check_adapter_per_agent

    args = MappoArguments(mappo_adapter_per_agent=True)
    lora = SimpleNamespace(finetuning_type="lora")
    no_checkpointing = SimpleNamespace(disable_gradient_checkpointing=True)
    check_adapter_per_agent(args, no_checkpointing, None, lora)
    with pytest.raises(ValueError, match="needs finetuning_type: lora"):
        check_adapter_per_agent(args, no_checkpointing, None,
                                SimpleNamespace(finetuning_type="full"))
    zero3 = SimpleNamespace(hf_deepspeed_config=SimpleNamespace(is_zero3=lambda: True))
    with pytest.raises(ValueError, match="not supported under DeepSpeed ZeRO-3"):
        check_adapter_per_agent(args, no_checkpointing, zero3, lora)
    zero2 = SimpleNamespace(hf_deepspeed_config=SimpleNamespace(is_zero3=lambda: False))
    check_adapter_per_agent(args, no_checkpointing, zero2, lora)
    with pytest.raises(ValueError, match="disable_gradient_checkpointing: true"):
        check_adapter_per_agent(args, SimpleNamespace(disable_gradient_checkpointing=False),
                                None, lora)
    check_adapter_per_agent(MappoArguments(), SimpleNamespace(
        disable_gradient_checkpointing=False), None, SimpleNamespace(finetuning_type="full"))
    with pytest.raises(ValueError, match="mappo_pipeline: search_agent has one agent"):
        MappoArguments(mappo_adapter_per_agent=True, mappo_pipeline="search_agent")
    with pytest.raises(ValueError, match="finetuning_type: lora"):
        add_agent_adapters(tiny_policy(), AGENTS)
    from peft import LoraConfig, get_peft_model

    olora = get_peft_model(tiny_policy(), LoraConfig(r=4, target_modules=LORA_TARGETS,
                                                     init_lora_weights="olora"))
    with pytest.raises(ValueError, match="rewrites the base weights"):
        add_agent_adapters(olora, AGENTS)
    # a grouped algorithm works as ppo does: each sample still names its agent
    MappoArguments(mappo_adapter_per_agent=True, mappo_algorithm="grpo")


# -- the mappo stage on the tiny model ---------------------------------------------------------

def _stage_config(model: Path, data: Path, url: str, out: Path, **extra) -> dict:
    """Two steps of the tiny model with one LoRA adapter per agent, a checkpoint every step."""
    return tiny_mappo_config(model, data, url, out, finetuning_type="lora", lora_target="all",
                             lora_rank=4, lora_alpha=8, mappo_adapter_per_agent=True,
                             learning_rate=1e-3, max_steps=2, plot_loss=False, **extra)


def _saved(folder: Path, agent: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / agent / "adapter_model.safetensors"))


def _history(folder: Path) -> list[dict]:
    state = json.loads((folder / "trainer_state.json").read_text())
    return [entry for entry in state["log_history"] if "policy_loss" in entry]


@pytest.fixture(scope="module")
def stage_run(tiny_model_dir: Path, tiny_mappo_data_dir: Path, tiny_server_url: str,
              tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mmoa.train.mappo.workflow import run_mappo

    out = tmp_path_factory.mktemp("per_agent") / "run"
    run_mappo(_stage_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out))
    return out


def test_checkpoints_and_output_hold_every_agents_adapter(stage_run: Path) -> None:
    for folder in (stage_run, stage_run / "checkpoint-1", stage_run / "checkpoint-2"):
        assert json.loads((folder / MARKER_FILE).read_text()) == {"agents": list(AGENTS)}
        assert (folder / "value_head.safetensors").is_file(), folder  # one shared value head
        assert not (folder / "adapter_model.safetensors").exists()  # no shared adapter
        for agent in AGENTS:
            assert (folder / agent / "adapter_config.json").is_file(), (folder, agent)
    final = {agent: _saved(stage_run, agent) for agent in AGENTS}
    first = {agent: _saved(stage_run / "checkpoint-1", agent) for agent in AGENTS}
    for agent in AGENTS:
        assert final[agent].keys() == _saved(stage_run / "checkpoint-2", agent).keys()
        assert all(torch.equal(final[agent][k], _saved(stage_run / "checkpoint-2", agent)[k])
                   for k in final[agent])
        # step 2 trained every agent's adapter (each had samples): its B moved
        moved = [k for k in final[agent] if "lora_B" in k
                 and not torch.equal(final[agent][k], first[agent][k])]
        assert moved, agent
    b = {agent: torch.cat([v.flatten() for k, v in final[agent].items() if "lora_B" in k])
         for agent in AGENTS}
    assert not torch.equal(b["qr"], b["generator"]) and not torch.equal(b["qr"], b["selector"])
    steps = _history(stage_run)
    assert [e["step"] for e in steps] == [1, 2]
    assert all(e["kl"] == e["kl"] for e in steps)  # a number: the base is the reference


def test_resume_from_a_checkpoint_continues_exactly(stage_run: Path, tiny_model_dir: Path,
                                                    tiny_mappo_data_dir: Path,
                                                    tiny_server_url: str,
                                                    tmp_path: Path) -> None:
    from mmoa.train.mappo.workflow import run_mappo

    out = tmp_path / "resumed"
    shutil.copytree(stage_run, out, ignore=shutil.ignore_patterns("checkpoint-2"))
    run_mappo(_stage_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                            resume_from_checkpoint=str(out / "checkpoint-1")))
    last, reference = _history(out)[-1], _history(stage_run)[-1]
    assert last["step"] == reference["step"] == 2
    for key in ("reward", "loss", "policy_loss", "value_loss", "kl", "grad_norm"):
        assert last[key] == pytest.approx(reference[key], rel=1e-5, abs=1e-7), key
    for agent in AGENTS:
        ours, theirs = _saved(out, agent), _saved(stage_run, agent)
        assert all(torch.allclose(ours[k], theirs[k], atol=1e-7) for k in ours), agent


def test_resuming_it_without_the_option_is_refused(stage_run: Path, tiny_model_dir: Path,
                                                   tiny_mappo_data_dir: Path,
                                                   tiny_server_url: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from mmoa.train.mappo.workflow import run_mappo_from_config

    out = tmp_path / "shared"
    shutil.copytree(stage_run / "checkpoint-1", out / "checkpoint-1")
    config = _stage_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                           resume_from_checkpoint=str(out / "checkpoint-1"))
    config["mappo_adapter_per_agent"] = False
    assert run_mappo_from_config(config) == 1
    assert "resume it with mappo_adapter_per_agent: true" in capsys.readouterr().err


def test_evaluation_runs_each_agent_with_its_adapter(stage_run: Path, tiny_model_dir: Path,
                                                     tiny_world_dir: Path, tiny_server_url: str,
                                                     tmp_path: Path, monkeypatch) -> None:
    import mmoa.modeling
    from mmoa.evaluation import EvalConfig, evaluate

    model, _ = mmoa.modeling.load_for_inference(tiny_model_dir, "llama3", stage_run)
    assert agent_adapters(model) == AGENTS
    for agent in AGENTS:  # the trained weights, not a fresh adapter
        saved = _saved(stage_run, agent)
        loaded = {n: p for n, p in model.named_parameters() if f".{agent}." in n}
        assert len(loaded) == len(saved)
        for name, value in saved.items():
            key = name.replace(".weight", f".{agent}.weight")
            assert torch.equal(loaded[key].detach().cpu(), value.to(loaded[key].dtype)), key

    active: list[str] = []
    original = mmoa.modeling.load_for_inference

    def watched(*args, **kwargs):
        loaded_model, tokenizer = original(*args, **kwargs)
        generate = loaded_model.generate

        def spy(*a, **k):
            disabled = loaded_model.base_model.model.model.layers[0].self_attn.q_proj \
                .disable_adapters
            active.append("base" if disabled else loaded_model.active_adapter)
            return generate(*a, **k)

        loaded_model.generate = spy
        return loaded_model, tokenizer

    monkeypatch.setattr(mmoa.modeling, "load_for_inference", watched)
    config = EvalConfig(model_name_or_path=str(tiny_model_dir), template="llama3",
                        adapter_name_or_path=str(stage_run), output_dir=str(tmp_path / "eval"),
                        data_file=str(tiny_world_dir / "dev.jsonl"), max_samples=2,
                        retriever_url=tiny_server_url, batch_size=2, precision="fp32",
                        max_new_tokens_qr=8, max_new_tokens_selector=8,
                        max_new_tokens_generator=6)
    metrics = evaluate(config, progress=False)
    assert metrics["num_questions"] == 2
    assert active == ["qr", "selector", "generator"]  # one batch: each agent on its adapter


# -- two processes: DDP and ZeRO-2 compute the same update -------------------------------------

@pytest.mark.slow
def test_zero2_matches_ddp_with_an_adapter_per_agent(tiny_model_dir: Path,
                                                     tiny_mappo_data_dir: Path,
                                                     unbatched_server_url: str,
                                                     tmp_path: Path) -> None:
    """Two processes under DDP and under DeepSpeed ZeRO-2 (two micro-batches per step, so the
    engine's accumulation boundary is exercised): the same losses and gradient norms, and the
    same weights of every agent's adapter and the value head. A micro-batch holds any mix of
    agents, so this also checks that every adapter gets a gradient on every process."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (MMOA_DEEPSPEED=0)")
    from tests.mappo_fixtures import launch_compared_run

    extra = {"finetuning_type": "lora", "lora_target": "all", "lora_rank": 4,
             "lora_alpha": 8, "mappo_adapter_per_agent": True, "learning_rate": 1e-3}
    ddp = launch_compared_run(tmp_path, "ddp", tiny_model_dir, tiny_mappo_data_dir,
                              unbatched_server_url, **extra)
    zero2 = launch_compared_run(tmp_path, "zero2", tiny_model_dir, tiny_mappo_data_dir,
                                unbatched_server_url, "ds_z2_config.json", **extra)
    ours, theirs = _history(zero2), _history(ddp)
    assert [e["step"] for e in ours] == [e["step"] for e in theirs] == [1, 2]
    for a, b in zip(ours, theirs, strict=True):
        assert a["reward"] == b["reward"]  # the same samples were drawn
        for key in ("loss", "policy_loss", "value_loss", "kl", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-3, abs=1e-5), (a["step"], key)
    from safetensors.torch import load_file

    for name in [f"{agent}/adapter_model.safetensors" for agent in AGENTS] \
            + ["value_head.safetensors"]:
        x, y = load_file(str(zero2 / name)), load_file(str(ddp / name))
        assert x.keys() == y.keys(), name
        for key in x:
            assert (x[key].float() - y[key].float()).abs().max() < 1e-4, (name, key)
    for agent in AGENTS:  # trained, not left at LoRA's zero B
        assert any(torch.count_nonzero(v) for k, v in _saved(ddp, agent).items()
                   if "lora_B" in k), agent


def test_the_eval_preflight_accepts_a_per_agent_output(tmp_path: Path) -> None:
    from mmoa.preflight import model_problem

    assert model_problem(str(tmp_path), "adapter_name_or_path", adapter=True) is not None
    (tmp_path / MARKER_FILE).write_text(json.dumps({"agents": ["qr"]}))
    assert model_problem(str(tmp_path), "adapter_name_or_path", adapter=True) is None
