"""The MAPPO run configuration the integration tests share: the tiny model, a few questions
per step, short generations, checkpoints every step."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[1]
DS_CONFIGS = ROOT / "LLaMA-Factory" / "examples" / "deepspeed"

#: The vocabulary and end token of :func:`tiny_policy` (the learners' unit tests).
VOCAB, EOS = 16, 1


def tiny_policy(seed: int = 0) -> LlamaForCausalLM:
    """A two-layer Llama of 16 tokens, random weights from ``seed``: the policy of the PPO and
    GRPO learners' unit and learning tests (fast, and the same for both algorithms)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=64, eos_token_id=EOS, pad_token_id=0,
                         bos_token_id=2)
    return LlamaForCausalLM(config)


def three_agent_learner(config: Any) -> tuple[Any, list[Any]]:
    """A PPO learner with ``config`` (a :class:`PPOConfig`) over :func:`tiny_policy` (seed 5),
    its copy as the KL reference and a value head, and one sample per qr_s_g agent (scores 1, 0,
    0.5): for tests of the KL reward of each agent's tokens."""
    from mmoa.train.mappo.learner import PolicyWithValue, PPOLearner
    from mmoa.train.mappo.samples import Sample
    from mmoa.train.mappo.value_head import ValueHead

    policy = tiny_policy(seed=5)
    model = PolicyWithValue(policy, ValueHead(32), ref_model=copy.deepcopy(policy).eval())
    samples = [Sample("qr", [2, 3], [5, 6, EOS], 1.0),
               Sample("selector", [2, 3], [7, 8, EOS], 0.0),
               Sample("generator", [2, 4], [6, EOS], 0.5)]
    return PPOLearner(model, torch.optim.Adam(model.parameters(), lr=1e-2), config,
                      pad_id=0), samples


def sample_responses(model: Any, prompt: list[int], n: int, length: int,
                     generator: torch.Generator) -> list[list[int]]:
    """Samples ``length`` tokens for ``n`` copies of the prompt at once (ancestral sampling from
    ``model.policy``, a :class:`PolicyWithValue`): the rollouts of the learning tests."""
    ids = torch.tensor([prompt] * n)
    with torch.no_grad():
        for _ in range(length):
            logits = model.policy(input_ids=ids).logits[:, -1]
            token = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
            ids = torch.cat([ids, token], dim=1)
    return ids[:, len(prompt):].tolist()


#: The learning tests' toy task: two "questions" (prompts) of two agents on one tiny policy,
#: each rewarded 1 for its own target token. Best mean reward 1.0; untrained below 0.25.
TOY_TASKS: dict[str, tuple[list[int], int]] = {"qr": ([2, 10, 11], 7),
                                               "generator": ([2, 12, 13], 9)}

#: ``(agent, prompt, responses, scores) -> samples``: how an algorithm turns one question's
#: group of rollouts into PPO samples.
MakeSamples = Callable[[str, list[int], list[list[int]], list[float]], list[Any]]


class ToyTask:
    """A learner on :func:`tiny_policy` (seed 1, a frozen copy as the reference, Adam lr 3e-3,
    seeded mini-batch order) and the rollouts of :data:`TOY_TASKS`, ``group`` responses of two
    tokens per question: the scaffold every learning test of the learners shares."""

    def __init__(self, config: Any, group: int = 16) -> None:
        from mmoa.train.mappo.learner import PolicyWithValue, PPOLearner

        torch.manual_seed(0)
        policy = tiny_policy(seed=1)
        self.model = PolicyWithValue(policy, None, ref_model=copy.deepcopy(policy).eval())
        self.learner = PPOLearner(self.model, torch.optim.Adam(self.model.parameters(), lr=3e-3),
                                  config, pad_id=0, generator=torch.Generator().manual_seed(0))
        self.sampler = torch.Generator().manual_seed(0)
        self.group = group

    def rollout(self, make_samples: MakeSamples) -> tuple[list[Any], float]:
        """One step's samples and the mean reward of its rollouts."""
        samples: list[Any] = []
        rewards: list[float] = []
        for agent, (prompt, target) in TOY_TASKS.items():
            responses = sample_responses(self.model, prompt, self.group, 2, self.sampler)
            scores = [float(response[0] == target) for response in responses]
            rewards += scores
            samples += make_samples(agent, prompt, responses, scores)
        return samples, sum(rewards) / len(rewards)


def tiny_mappo_config(model: Path, data: Path, url: str, output: Path,
                      **extra: Any) -> dict[str, Any]:
    """A ``stage: mappo`` config over the ``tiny_mappo`` prompt set; ``extra`` overrides."""
    config: dict[str, Any] = {
        "stage": "mappo", "do_train": True, "model_name_or_path": str(model),
        "finetuning_type": "full", "template": "llama3", "dataset": "tiny_mappo",
        "dataset_dir": str(data), "output_dir": str(output), "overwrite_output_dir": True,
        "disable_gradient_checkpointing": True, "report_to": "none", "plot_loss": True,
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
        "learning_rate": 1e-4, "max_steps": 3, "logging_steps": 1, "save_steps": 1,
        "ppo_epochs": 1, "seed": 7, "lr_scheduler_type": "constant", "bf16": False,
        "mappo_retriever_url": url, "mappo_questions_per_rollout": 4,
        "mappo_rollout_batch_size": 4, "mappo_max_new_tokens_qr": 16,
        "mappo_max_new_tokens_selector": 12, "mappo_max_new_tokens_generator": 8,
    }
    config.update(extra)
    return config


def start_two_processes(config: dict[str, Any], yaml_path: Path) -> subprocess.Popen[str]:
    """``mmoa-cli train`` of ``config`` (written to ``yaml_path``) with ``FORCE_TORCHRUN=1`` and
    two processes (gloo on CPU); stdout and stderr are piped."""
    yaml_path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2"}
    return subprocess.Popen([sys.executable, "-m", "mmoa.cli", "train", str(yaml_path)],
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def run_two_processes(config: dict[str, Any], yaml_path: Path,
                      timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """:func:`start_two_processes` to the end; ``returncode``, ``stdout`` and ``stderr``."""
    proc = start_two_processes(config, yaml_path)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def launch_compared_run(root: Path, name: str, model: Path, data: Path, url: str,
                        deepspeed: str | None = None, **extra: Any) -> Path:
    """Two processes for 2 steps of two micro-batches each (the engine's accumulation
    boundary is exercised), under DDP or the DeepSpeed config ``deepspeed`` (a file in
    ``examples/deepspeed``): the run the DDP / ZeRO comparisons share. Returns its output
    folder; the launcher's output is kept in ``root/NAME.log``; a failed run fails the test
    with the error lines of that log."""
    out = root / name
    config = tiny_mappo_config(model, data, url, out, plot_loss=False,
                               gradient_accumulation_steps=2, max_steps=2)
    if deepspeed:
        config["deepspeed"] = str(DS_CONFIGS / deepspeed)
    config.update(extra)
    result = run_two_processes(config, root / f"{name}.yaml")
    log = root / f"{name}.log"
    log.write_text(f"{result.stdout}\n--- stderr ---\n{result.stderr}")
    if result.returncode != 0:  # the whole output is in the log: pytest cuts long messages
        clues = [line for line in result.stderr.splitlines()
                 if any(word in line for word in ("Error", "error", "Signal", "Abort"))]
        pytest.fail(f"{name} run exited with {result.returncode}; whole output in {log}\n"
                    + "\n".join(clues[-20:]))
    return out
