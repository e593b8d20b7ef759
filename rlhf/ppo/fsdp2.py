"""PPO's four models under FSDP2 (ppo.engine = "fsdp2"; how each model is sharded: rlhf.fsdp2).

Generation runs on a plain copy of the actor, taken before sharding and refreshed from the shards once per rollout
(`GatheredCopy`): decoding calls the model once per token and stops when its own rows end, which sharded layers could
not do without every process stepping together. The same copy is what rank 0 saves.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from rlhf.fsdp2 import device_mesh, full_state_dict, shard


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
        """The copy with `sharded`'s current weights (every process must call it: the gather is collective). Only the
        trained weights are gathered: the frozen ones (a LoRA actor's base) are the copy's own since it was taken."""
        trained = full_state_dict(sharded, trained_only=True)
        unexpected = self.model.load_state_dict(trained, strict=False).unexpected_keys
        if unexpected:
            raise RuntimeError(f"the actor's copy has no weights named {unexpected[:3]}: it is not the sharded actor's")
        return self.model
