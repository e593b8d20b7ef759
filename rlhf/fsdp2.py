"""Models sharded with FSDP2 (`torch.distributed.fsdp.fully_shard`) over the processes of torchrun or accelerate
launch, on GPUs or on CPU processes over gloo, straight from torch: accelerate prepares one model per Accelerator
under FSDP and turns FSDP on for GPU-like devices only. Used by PPO (rlhf.ppo.fsdp2: four models), the reward model
and SFT (`engine = "fsdp2"` of [reward] and [sft]).

Each decoder layer is its own FSDP unit and the model the root one, so a forward or backward pass gathers one layer
at a time; gradients are reduce-scattered (averaged over the processes, as DDP averages them) and each process keeps
the optimiser state of its shard. The optimisers are unfused: the weights are DTensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the configs import TRAINING_ENGINES without torch
    import torch
    from torch import nn

TRAINING_ENGINES = ("ddp", "fsdp2")
"""engine of [reward] and [sft]: each process holds the model whole (accelerate's DDP, or what `accelerate launch`
was configured with), or FSDP2 shards it per decoder layer."""


def device_mesh(device: torch.device):
    """A one-dimensional mesh over every process (torchrun's or accelerate's group; gloo on CPU)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        raise ValueError("engine = fsdp2 needs the processes a launcher starts (torchrun --nproc_per_node N, or "
                         "accelerate launch): no process group is set up")
    return init_device_mesh(device.type, (dist.get_world_size(),))


def shard(model: nn.Module, mesh) -> nn.Module:
    """`model` sharded in place: every decoder layer, then the rest (embeddings, final norm, heads) as the root. A value
    model's `forward_value` (what PPO calls in place of forward) gathers the root's weights as forward does."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    from rlhf.model_shape import decoder_layers

    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if hasattr(model, "forward_value"):
        register_fsdp_forward_method(model, "forward_value")
    return model


def shard_for_training(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` moved to `device` and sharded over every process (`shard`); build its optimiser afterwards, on the
    sharded parameters."""
    mesh = device_mesh(device)  # refused first without a launcher's processes
    return shard(model.to(device), mesh)


def full_state_dict(model: nn.Module, trained_only: bool = False) -> dict[str, torch.Tensor]:
    """The sharded `model`'s whole weights on every process (a collective: every process must call it); with
    `trained_only` those that require grad alone (LoRA: the adapters, not the frozen base)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, ignore_frozen_params=trained_only)
    return get_model_state_dict(model, options=options)


def tied_aliases(model: nn.Module) -> set[str]:
    """Names of parameters that are another name's parameter (a tied lm_head is the input embedding): the whole
    state dict holds both, and a saved folder needs only the first, as save_pretrained writes it unsharded."""
    first: dict[int, str] = {}
    aliases = set()
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if first.setdefault(id(parameter), name) != name:
            aliases.add(name)
    return aliases


def place_for_engine(model, engine: str, device):
    """`model` on `device`: whole ("ddp": accelerate's prepare wraps it later) or sharded over every process ("fsdp2",
    `shard_for_training`). Build the optimiser on the result: FSDP2 replaces the parameters with their shards."""
    if engine == "fsdp2":
        return shard_for_training(model, device)
    return model.to(device)


def prepare_for_engine(accelerator, engine: str, model, *objects) -> tuple:
    """(model, *objects) through `accelerator.prepare`; under "fsdp2" the model (sharded by `place_for_engine`) stays
    out of it and only `objects` (optimiser, loaders) are prepared, since accelerate's wrappers would replicate it."""
    if engine != "fsdp2":
        return tuple(accelerator.prepare(model, *objects))
    prepared = accelerator.prepare(*objects)
    return (model, *(prepared if len(objects) > 1 else (prepared,)))


def gathered_state_dict(accelerator, engine: str, model) -> dict:
    """The trained `model`'s whole weights (a collective: every process must call it): FSDP2's shards gathered
    (`full_state_dict`), or accelerate's state dict, which gathers ZeRO-3's and FSDP's under `accelerate launch`."""
    if engine == "fsdp2":
        return full_state_dict(model)
    return accelerator.get_state_dict(model)
