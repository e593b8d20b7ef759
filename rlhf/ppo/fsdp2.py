"""PPO's trained models under FSDP2 (`torch.distributed.fsdp.fully_shard`, ppo.engine = "fsdp2"), on GPUs or on CPU
processes over gloo, straight from torch: accelerate prepares one model per Accelerator under FSDP and turns FSDP on
for GPU-like devices only, and PPO trains two.

Each decoder layer is its own FSDP unit and the model the root one, so a forward or backward pass gathers one layer
at a time; gradients are reduce-scattered (averaged over the processes, as DDP averages them) and each process keeps
the optimiser state of its shard. Generation runs on a plain copy of the actor, taken before sharding and refreshed
from the shards once per rollout (`GatheredCopy`): decoding calls the model once per token and stops when its own rows
end, which sharded layers could not do without every process stepping together. The same copy is what rank 0 saves.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from rlhf.model_shape import decoder_layers


def device_mesh(device: torch.device):
    """A one-dimensional mesh over every process (torchrun's or accelerate's group; gloo on CPU)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        raise ValueError("ppo.engine = fsdp2 needs the processes a launcher starts (torchrun --nproc_per_node N, or "
                         "accelerate launch): no process group is set up")
    return init_device_mesh(device.type, (dist.get_world_size(),))


def shard(model: nn.Module, mesh) -> nn.Module:
    """`model` sharded in place: every decoder layer, then the rest (embeddings, final norm, heads) as the root. A value
    model's `forward_value` (what PPO calls in place of forward) gathers the root's weights as forward does."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if hasattr(model, "forward_value"):
        register_fsdp_forward_method(model, "forward_value")
    return model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The sharded `model`'s whole weights on every process (a collective: every process must call it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def shard_models(actor: nn.Module, critic: nn.Module, frozen: tuple, device: torch.device):
    """(sharded actor, sharded critic, the `frozen` models sharded (None stays None), a GatheredCopy of the actor taken
    before sharding), all on `device`, over one mesh."""
    mesh = device_mesh(device)  # refused first without a launcher's processes
    actor, critic = actor.to(device), critic.to(device)
    gathered = GatheredCopy(actor)
    return (shard(actor, mesh), shard(critic, mesh), tuple(None if m is None else shard(m, mesh) for m in frozen),
            gathered)


class GatheredCopy:
    """A plain (unsharded) copy of a model, refreshed from the sharded original's weights on request."""

    def __init__(self, model: nn.Module):
        self.model = copy.deepcopy(model).eval().requires_grad_(False)  # before `shard`: a plain module

    def refreshed_from(self, sharded: nn.Module) -> nn.Module:
        """The copy with `sharded`'s current weights (every process must call it: the gather is collective)."""
        self.model.load_state_dict(full_state_dict(sharded))
        return self.model
