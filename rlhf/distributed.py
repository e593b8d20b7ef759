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
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or has_accelerator():
        return
    from accelerate.state import PartialState

    PartialState(cpu=True)


def has_accelerator() -> bool:
    """A GPU (or other torch accelerator) is present."""
    import torch

    return torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()


def native_bf16() -> bool:
    """bf16 matmuls run in hardware: a CUDA GPU that supports bf16 or, without a GPU, a CPU with AVX512-BF16 or
    AMX. Elsewhere bf16 is emulated and slower than fp32. On this project's CPU bench it made a PPO step 1.6x
    faster with the policy gradient at cosine 0.9994 of fp32's (bench/bf16_accuracy.py, README)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return not has_accelerator() and cpu_has_bf16()


def cpu_has_bf16() -> bool:
    """The CPU has bf16 instructions (AVX512-BF16 or AMX), which oneDNN uses for bf16 matmuls."""
    import torch

    cpu = getattr(torch, "cpu", None)
    return bool(cpu and (getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()
                         or getattr(cpu, "_is_amx_tile_supported", lambda: False)()))


def make_accelerator(mixed_precision: str = "auto", **kwargs):
    """The one Accelerator factory of every trainer.

    auto: bf16 autocast where the hardware has bf16 arithmetic (`native_bf16`), fp32 otherwise; the trained
    weights and their optimiser state stay fp32 either way. `accelerate launch`'s own precision setting wins.
    Without a GPU, `cpu=True` is what makes the processes that torchrun starts join over gloo instead of each
    training alone.
    """
    from accelerate import Accelerator

    precision: str | None = mixed_precision
    if precision == "auto":
        if "ACCELERATE_MIXED_PRECISION" in os.environ:
            precision = None  # chosen by `accelerate launch` / its config file
        elif native_bf16():
            precision = "bf16"
        else:
            precision = "no"
    _forget_other_precision(precision)
    return Accelerator(mixed_precision=precision, cpu=not has_accelerator(), **kwargs)


def _forget_other_precision(precision: str | None) -> None:
    """Let one process train in one precision and then in another (a round: the reward model, then PPO).

    accelerate keeps one process-wide AcceleratorState and refuses an Accelerator whose precision differs
    from the first one's. Only the precision part is dropped: the process group (PartialState) stays.
    """
    from accelerate.state import AcceleratorState

    state = AcceleratorState._shared_state
    if precision is not None and state and state.get("_mixed_precision") != precision:
        AcceleratorState._reset_state(reset_partial_state=False)


def is_main_process() -> bool:
    """Whether this is the process that talks to the user and writes files and the database: the lone process, or
    rank 0 of the processes `accelerate launch` / `torchrun` started (after `join_launched_processes`)."""
    from accelerate.state import PartialState

    return PartialState().is_main_process


def wait_for_everyone() -> None:
    """Block until every launched process gets here (returns at once in a single process)."""
    from accelerate.state import PartialState

    PartialState().wait_for_everyone()


def broadcast_from_main(value):
    """The main process's `value` (any picklable object) on every process; `value` itself in a single process."""
    from accelerate.state import PartialState
    from accelerate.utils import broadcast_object_list

    if PartialState().num_processes == 1:
        return value
    box = [value]
    broadcast_object_list(box, from_process=0)
    return box[0]

