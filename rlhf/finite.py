"""Nothing that is not a finite number is saved or published: a NaN setting, a reward that overflowed or a learning
rate that blew up would otherwise make a policy of NaN weights, which writes "666666..." for people to vote on.

The trainers call `refuse_non_finite` on their metrics after every step and on the weights before saving, so the
error names the step or the tensor where it happened and nothing is written.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable, Mapping

if TYPE_CHECKING:  # torch is not imported here: app.py catches NotFinite, and the annotation server loads no torch
    import torch


class NotFinite(RuntimeError):
    """Training produced NaN or inf; the message says where (the step, the metric or the tensor). Nothing was saved."""


def non_finite_metric(metrics: Mapping) -> str | None:
    """`"name = value"` of the first metric that is a NaN or infinite number, or None (other values are skipped)."""
    for name, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isfinite(value):
            return f"{name} = {value}"
    return None


def non_finite_tensor(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """The name of the first floating-point tensor holding a NaN or an inf, or None."""
    for name, tensor in named_tensors:
        if tensor.is_floating_point() and not bool(tensor.detach().isfinite().all()):
            return name
    return None


def refuse_non_finite(where: str, metrics: Mapping | None = None,
                      named_tensors: Iterable[tuple[str, torch.Tensor]] = ()) -> None:
    """Raise NotFinite naming `where` ("PPO step 3 of 8", "the reward model") and the first metric or tensor that is
    not finite; return quietly when all are."""
    if metrics is not None and (bad := non_finite_metric(metrics)) is not None:
        raise NotFinite(f"{where}: {bad}, which is not a finite number; nothing was saved. Check the learning "
                        "rates, ppo.kl_ctl and the reward (a reward function returning NaN or inf).")
    if (name := non_finite_tensor(named_tensors)) is not None:
        raise NotFinite(f"{where}: the weight {name} holds NaN or inf; nothing was saved. Lower the learning rate, "
                        "or check the reward and the settings.")
