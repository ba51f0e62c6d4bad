"""Loading a local model (and an optional LoRA adapter) through llamafactory for inference.

Evaluation, the playground and the SFT smoke checks all load models the way LLaMA-Factory does,
so an adapter trained with ``run_sft.sh`` or ``run_mappo.sh`` loads exactly as LLaMA-Factory
would load it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mmoa.agent_adapters import MARKER_FILE, load_agent_adapters, saved_agents
from mmoa.precision import inference_weights_dtype, resolve_precision

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def inference_args(model_dir: Path, template: str, precision: str, on_gpu: bool
                   ) -> dict[str, object]:
    """LLaMA-Factory's inference arguments of a local model: its weights' dtype from the one
    precision rule (:func:`mmoa.precision.inference_weights_dtype`)."""
    return {
        "model_name_or_path": str(model_dir),
        "template": template,
        "infer_backend": "huggingface",
        "finetuning_type": "lora",
        "infer_dtype": inference_weights_dtype(resolve_precision(precision), on_gpu),
    }


def load_for_inference(
    model_name_or_path: str | Path,
    template: str,
    adapter_name_or_path: str | Path | None = None,
    precision: str = "auto",
    use_cpu: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` in eval mode with left padding, on the GPU when there is one and
    ``use_cpu`` is not set (bf16 weights there at ``precision`` bf16; fp32 weights on a CPU).

    ``adapter_name_or_path`` may be an output of ``mappo_adapter_per_agent`` (a folder with
    ``agent_adapters.json``): each agent then runs with its own adapter."""
    import torch
    from llamafactory.hparams import get_infer_args
    from llamafactory.model import load_model, load_tokenizer

    model_dir = Path(model_name_or_path)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"{model_dir}: not a local model directory (no config.json); models are never "
            "downloaded, give the path of a saved model"
        )
    on_gpu = torch.cuda.is_available() and not use_cpu
    args = inference_args(model_dir, template, precision, on_gpu)
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
    # llamafactory 0.9.5 loads the checkpoint's own dtype (``torch_dtype="auto"``) whatever
    # ``infer_dtype`` says, so the rule's dtype is applied here
    wanted = getattr(torch, str(args["infer_dtype"]))
    if next(model.parameters()).dtype != wanted:
        model.to(wanted)
    if not on_gpu and next(model.parameters()).device.type != "cpu":
        model.to("cpu")  # llamafactory places a model on the current accelerator
    model.eval()
    return model, tokenizer
