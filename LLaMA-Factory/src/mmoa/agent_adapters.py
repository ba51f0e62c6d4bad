"""One LoRA adapter per agent over one frozen base model (``mappo_adapter_per_agent``).

The paper's agents share one policy. With this option each optimised agent gets its own LoRA
adapter, named after the agent (``qr``, ``selector``, ``generator``), on the same PEFT model: the
base weights are loaded once and stay frozen, and the base with every adapter disabled is the KL
reference of every agent (as it is for the one shared adapter). An agent that is not optimised
has no adapter and acts with the base model.

This module is the one place that knows which adapter is active. Everything else asks it:

* :func:`use_agent` - a context in which ``model`` is agent ``agent`` (its adapter, or the base);
  a plain model or an ordinary single-adapter LoRA model is left as it is, so callers need no
  branch of their own (the rollout's and the evaluation's ``generate``, the learner's forward);
* :func:`adapters_disabled` - the base model (the KL reference);
* :func:`add_agent_adapters` / :func:`load_agent_adapters` - make them for training, load a saved
  output for evaluation; :data:`MARKER_FILE` in a saved folder lists them.

Why the care with ``requires_grad``: PEFT's ``set_adapter`` and ``disable_adapter`` set
``requires_grad=False`` on every adapter but the active one. The optimiser, DDP and DeepSpeed
were built over a fixed set of trainable parameters, and autograd does not accumulate a gradient
into a leaf whose ``requires_grad`` is off at backward time, so every switch here puts the
trainable flags back as they were.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

#: The file in a saved model or checkpoint folder that lists its agents' adapters; each adapter
#: is in the sub-folder of its name (PEFT's layout for adapters not named ``default``).
MARKER_FILE = "agent_adapters.json"
#: Why the option is refused under DeepSpeed ZeRO-3 (by the workflow before the model loads, and
#: by the trainer, which knows the engine's stage for certain).
ZERO3_REFUSAL = ("mappo_adapter_per_agent is not supported under DeepSpeed ZeRO-3: each process "
                 "makes one forward pass per agent in its micro-batch, and ZeRO-3's passes "
                 "all-gather the weights together, so every process must make the same passes; "
                 "use ZeRO-2 or DDP (one LoRA adapter per agent fits where the base does)")
#: The attribute of a PEFT model that holds its agents' adapter names (set by this module only).
_ATTRIBUTE = "mmoa_agent_adapters"


def agent_adapters(model: Any) -> tuple[str, ...]:
    """The agents that have their own adapter on ``model`` (empty: not a per-agent model).
    ``model`` may be a wrapper that forwards attributes (the rollout's watched policy)."""
    return tuple(getattr(model, _ATTRIBUTE, ()) or ())


def _trainable(model: Any) -> list[Any]:
    return [p for p in model.parameters() if p.requires_grad]


@contextlib.contextmanager
def _keeping_trainable(model: Any) -> Iterator[None]:
    """Puts back the ``requires_grad`` flags PEFT's adapter switches turn off."""
    trainable = _trainable(model)
    try:
        yield
    finally:
        for param in trainable:
            param.requires_grad_(True)


@contextlib.contextmanager
def use_agent(model: Any, agent: str | None) -> Iterator[None]:
    """Within the context ``model`` runs as ``agent``: that agent's adapter is the active one,
    or every adapter is disabled when the agent has none (it is not optimised: it acts with the
    base). A model without per-agent adapters, or ``agent=None``, is left as it is."""
    agents = agent_adapters(model)
    if not agents or agent is None:
        yield
        return
    with _keeping_trainable(model):
        if agent in agents:
            model.set_adapter(agent)
            yield
        else:
            with model.disable_adapter():
                yield


@contextlib.contextmanager
def adapters_disabled(model: Any) -> Iterator[None]:
    """The base model: every adapter of a PEFT model disabled (the KL reference), with the
    trainable flags kept."""
    with _keeping_trainable(model), model.disable_adapter():
        yield


def adapter_parameters(model: Any) -> list[Any]:
    """Every agent adapter's trainable parameters (empty for other models)."""
    agents = agent_adapters(model)
    if not agents:
        return []
    return [p for name, p in model.named_parameters()
            if p.requires_grad and any(f".{agent}." in name for agent in agents)]


def rows_by_agent(model: Any, agents: Sequence[str]) -> list[tuple[str | None, list[int]]]:
    """``[(agent, rows), ...]``: the rows of a batch (``agents[i]`` is row ``i``'s agent) that
    one forward pass each can score, in a fixed order of agents. One part ``(None, every row)``
    for a model without per-agent adapters (or a batch that does not name its agents)."""
    if not agent_adapters(model) or not agents:
        return [(None, list(range(len(agents))))]
    parts: dict[str, list[int]] = {}
    for row, agent in enumerate(agents):
        parts.setdefault(agent, []).append(row)
    return sorted(parts.items())


def zero_touch(params: Sequence[Any]) -> Any:
    """``0 * sum(params)``, or ``None`` for no ``params``: added to a forward's output so that
    every adapter parameter (:func:`adapter_parameters`, listed once by the caller) gets a
    gradient, zero for an agent with no row in the batch. DDP expects a gradient for every
    trainable parameter on every process, and a micro-batch holds any mix of agents; the zero
    gradient also keeps one and several processes computing the same update."""
    import torch

    if not params or not torch.is_grad_enabled():
        return None
    return sum(p.sum() for p in params) * 0.0


def add_agent_adapters(model: Any, agents: Sequence[str]) -> Any:
    """Replaces the ``default`` adapter LLaMA-Factory built by one adapter per agent with the
    same LoRA configuration and dtype (LLaMA-Factory may have upcast it to fp32), all trainable;
    marks ``model`` as a per-agent model and returns it."""
    from peft import PeftModel

    if not isinstance(model, PeftModel) or "default" not in model.peft_config:
        raise ValueError("mappo_adapter_per_agent needs the LoRA model LLaMA-Factory builds "
                         "(finetuning_type: lora), with its `default` adapter")
    agents = tuple(dict.fromkeys(agents))
    config = model.peft_config["default"]
    if config.init_lora_weights not in (True, False, "gaussian"):
        # PiSSA, OLoRA, CorDA, EVA, LoftQ: the initialisation rewrites the base weights around
        # the adapter; one per agent would rewrite the shared base once per agent
        raise ValueError(f"mappo_adapter_per_agent needs LoRA's default initialisation (one "
                         f"frozen base for every agent); init_lora_weights="
                         f"{config.init_lora_weights!r} rewrites the base weights (pissa_init)")
    dtypes = {name: p.dtype for name, p in model.named_parameters() if ".default." in name}
    for agent in agents:
        model.add_adapter(agent, copy.deepcopy(config))
    model.set_adapter(agents[0])
    model.delete_adapter("default")
    for name, param in model.named_parameters():
        for agent in agents:
            if f".{agent}." in name:
                dtype = dtypes.get(name.replace(f".{agent}.", ".default."))
                if dtype is not None and param.dtype != dtype:
                    param.data = param.data.to(dtype)
    model.base_model.set_requires_grad(list(agents), True)
    setattr(model, _ATTRIBUTE, agents)
    return model


def write_marker(folder: Path, model: Any) -> None:
    """Writes :data:`MARKER_FILE` beside the adapters PEFT's ``save_pretrained`` wrote (one
    sub-folder per agent); nothing for other models."""
    agents = agent_adapters(model)
    if agents:
        (Path(folder) / MARKER_FILE).write_text(
            json.dumps({"agents": list(agents)}, indent=2) + "\n", encoding="utf-8")


def saved_agents(folder: str | Path) -> tuple[str, ...]:
    """The agents whose adapters ``folder`` holds (empty: not a per-agent output)."""
    marker = Path(folder) / MARKER_FILE
    if not marker.is_file():
        return ()
    agents = json.loads(marker.read_text(encoding="utf-8")).get("agents")
    if not isinstance(agents, list) or not agents or not all(isinstance(a, str) for a in agents):
        raise ValueError(f"{marker}: expected {{\"agents\": [names]}}, got {agents!r}")
    for agent in agents:
        if not (Path(folder) / agent / "adapter_config.json").is_file():
            raise FileNotFoundError(f"{marker} lists agent {agent!r}, but {Path(folder) / agent}"
                                    " holds no adapter_config.json")
    return tuple(agents)


def load_agent_adapters(base: Any, folder: str | Path) -> Any:
    """The base model with every agent adapter of ``folder`` (a per-agent output), frozen, for
    inference; marked so that :func:`use_agent` runs each agent with its own."""
    from peft import PeftModel

    agents = saved_agents(folder)
    if not agents:
        raise FileNotFoundError(f"{folder}: no {MARKER_FILE} (not a per-agent output)")
    model = PeftModel.from_pretrained(base, str(Path(folder) / agents[0]), adapter_name=agents[0])
    for agent in agents[1:]:
        model.load_adapter(str(Path(folder) / agent), adapter_name=agent)
    model.set_adapter(agents[0])
    setattr(model, _ATTRIBUTE, agents)
    return model


def load_agent_weights(model: Any, folder: str | Path) -> None:
    """Loads the adapters of a checkpoint ``folder`` into the per-agent ``model`` (a resume);
    the checkpoint must hold exactly the model's agents."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    saved, ours = saved_agents(folder), agent_adapters(model)
    if saved and not ours:
        raise ValueError(f"{folder}: holds one adapter per agent ({', '.join(saved)}); resume "
                         f"it with mappo_adapter_per_agent: true")
    if set(saved) != set(ours):
        raise ValueError(f"{folder}: holds adapters for {', '.join(saved) or 'no agent'}; this "
                         f"run has adapters for {', '.join(ours)} (mappo_agents)")
    for agent in ours:
        weights = Path(folder) / agent / "adapter_model.safetensors"
        result = set_peft_model_state_dict(model, load_file(str(weights)), adapter_name=agent)
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"{weights}: unexpected keys {result.unexpected_keys[:5]}")
