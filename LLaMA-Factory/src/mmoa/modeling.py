"""Loading a local model (and an optional LoRA adapter) through llamafactory for inference.

Evaluation, the playground and the SFT smoke checks all load models the way LLaMA-Factory does,
so an adapter trained with ``run_sft.sh`` or ``run_mappo.sh`` loads exactly as LLaMA-Factory
would load it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mmoa.agent_adapters import MARKER_FILE, load_agent_adapters, saved_agents

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def load_for_inference(
    model_name_or_path: str | Path,
    template: str,
    adapter_name_or_path: str | Path | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` in eval mode with left padding, on the GPU when there is one.

    ``adapter_name_or_path`` may be an output of ``mappo_adapter_per_agent`` (a folder with
    ``agent_adapters.json``): each agent then runs with its own adapter."""
    from llamafactory.hparams import get_infer_args
    from llamafactory.model import load_model, load_tokenizer

    model_dir = Path(model_name_or_path)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"{model_dir}: not a local model directory (no config.json); models are never "
            "downloaded, give the path of a saved model"
        )
    args: dict[str, object] = {
        "model_name_or_path": str(model_dir),
        "template": template,
        "infer_backend": "huggingface",
        "finetuning_type": "lora",
    }
    per_agent = None
    if adapter_name_or_path and (Path(adapter_name_or_path) / MARKER_FILE).is_file():
        # one adapter per agent (mappo_adapter_per_agent): the base loads as LLaMA-Factory
        # loads it, then every agent's adapter over it; use_agent switches between them
        per_agent = Path(adapter_name_or_path)
        saved_agents(per_agent)  # a broken marker fails before the model loads
    elif adapter_name_or_path:
        adapter = Path(adapter_name_or_path)
        if not (adapter / "adapter_config.json").is_file():
            raise FileNotFoundError(f"{adapter}: not a LoRA adapter (no adapter_config.json)")
        args["adapter_name_or_path"] = str(adapter)
    model_args, _, finetuning_args, _ = get_infer_args(args)
    tokenizer = load_tokenizer(model_args)["tokenizer"]
    tokenizer.padding_side = "left"
    model = load_model(tokenizer, model_args, finetuning_args, is_trainable=False)
    if per_agent is not None:
        model = load_agent_adapters(model, per_agent)
    model.eval()
    return model, tokenizer
