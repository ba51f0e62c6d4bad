"""Whether a model's weights are all finite: checked by both training stages before they write
a checkpoint or a final model, and by MAPPO after every update.

A probe trained with ``max_grad_norm: .nan``: every gradient was multiplied by NaN, the loss and
the gradient norm (computed before the clipping) stayed finite, so the guards on them let it
through, and the trainer saved a model of 3,950,848 NaN values with exit code 0. Checking the
weights themselves catches that and whatever else writes NaN into them (an overflowing learning
rate, a DeepSpeed engine that stepped on a NaN gradient).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def nonfinite_parameters(named: Iterable[tuple[str, torch.nn.Parameter]], *,
                         trainable_only: bool = False) -> list[str]:
    """The names of the parameters that hold a NaN or an infinity (empty: all finite).

    Cheap: one float32 sum per tensor (NaN and infinities survive a sum; a finite float32 sum
    of real weights cannot overflow 3.4e38, and ``dtype=float32`` keeps an fp16 tensor's sum
    from overflowing 65,504), no copy of a tensor, and a single device synchronisation at the
    end. ``trainable_only``: only the parameters that require a gradient (what an optimiser step
    can change: the LoRA matrices and the value head, or every weight of a full fine-tune).
    Under DeepSpeed ZeRO-3 a parameter is empty on each process and its partition
    (``ds_tensor``) is checked; the caller agrees the answer over the processes."""
    names: list[str] = []
    sums: list[torch.Tensor] = []
    for name, param in named:
        if trainable_only and not param.requires_grad:
            continue
        data = getattr(param, "ds_tensor", None) if param.numel() == 0 else param
        if data is None or data.numel() == 0:
            continue
        total = data.detach().sum(dtype=torch.float32).reshape(1)
        names.append(name)
        sums.append(total if not sums else total.to(sums[0].device))
    if not sums:
        return []
    bad = (~torch.isfinite(torch.cat(sums))).nonzero().flatten().tolist()
    return [names[i] for i in bad]


def describe(names: list[str], shown: int = 3) -> str:
    """``"2 tensors (policy.x, v_head.summary.weight)"``: for a one-line error."""
    listed = ", ".join(names[:shown]) + (f", +{len(names) - shown} more"
                                         if len(names) > shown else "")
    return f"{len(names)} tensor{'s' if len(names) != 1 else ''} ({listed})"
