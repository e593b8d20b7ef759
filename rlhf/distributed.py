"""Joining the processes a launcher started (`torchrun`, `accelerate launch`), with or without a GPU."""

from __future__ import annotations

import os


def join_launched_processes() -> None:
    """Under a launcher (WORLD_SIZE > 1) on a machine without an accelerator, start accelerate's shared state on CPU.

    accelerate joins CPU processes into one gloo group only when asked with `cpu=True`; without it each
    `torchrun` process would see itself alone, train on its own and race the others on the checkpoints and
    the database. The state is shared, so every later `Accelerator()` / `PartialState()` sees all processes.
    On GPUs (or a single process) there is nothing to do: accelerate finds the launcher's processes itself.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    import torch

    has_accelerator = torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()
    if has_accelerator:
        return
    from accelerate.state import PartialState

    PartialState(cpu=True)
