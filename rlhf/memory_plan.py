"""Memory per GPU of four-model PPO (actor and critic trained, reference and reward model frozen) before anything loads.

Pure arithmetic on ModelShape (rlhf.model_shape) and the PPO settings; bytes throughout. The figures, per process:

- weights: 4 bytes a parameter, trained and frozen models alike (fp32; bf16 is autocast only, rlhf.ppo.train);
- a trained parameter adds 4 (its gradient) and 8 (AdamW's two moments); under DDP on several GPUs the reducer's
  buckets hold another copy of the gradients (4);
- LoRA trains r x (in + out) parameters per linear layer of the decoder; the reference is the actor with its adapters
  off and the reward model the critic with its adapters off, so each base is held once;
- the reward model and the critic that starts from it run the first `reward_layers` decoder layers (votes.feature's
  layer for the head strategies, every layer for "full");
- activations kept for the backward pass, per token and decoder layer: 6 hidden-wide tensors (the layer's input, two
  norms' outputs, the query, the attention output, the residual), keys and values, 4 MLP-wide ones (gate, up, their
  activation and product); PyTorch's SDPA keeps no L x L attention matrix. Actor and critic keep theirs at once
  (rlhf.ppo.trainer.trainable_forward) with 3 fp32 copies of the answer's logits (the logits, the warped logits, the
  log-softmax), while the reference takes its log-probs beside them (3 more: the first update reuses that forward),
  and the actor's gradients in its backward pass (counted with them: a plan errs on the side of more);
- generation: the KV cache of the batch at its full length;
- FSDP2 (ppo.engine = "fsdp2", rlhf/ppo/fsdp2.py) shards the trained models' weights, gradients and optimiser state
  over the GPUs, the frozen models' weights too, and gathers two layers at a time for every forward and backward pass;
  a plain copy of the actor, whole on every GPU, generates and is saved (refreshed from the shards once per rollout);
- "fsdp2-lora" (ppo.engine = "fsdp2" with ppo.use_lora) is LoRA's two models sharded so, with the same copy.

Checked against measured peaks on CPU (bench/memory_plan.py, docs/multi-gpu.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rlhf.model_shape import ModelShape

ENGINES = ("ddp", "lora", "fsdp2", "fsdp2-lora")
"""The plan's engines: ppo.engine ddp or fsdp2, each with full fine-tuning or LoRA (ppo.use_lora)."""
HEADROOM = 0.9
"""A plan fits when it needs at most this share of the memory: the allocator's fragmentation and the CUDA context
take the rest."""
ACTIVATIONS_HIDDEN, ACTIVATIONS_MLP, LOGIT_COPIES = 6, 4, 6
GB = 1024 ** 3


@dataclass(frozen=True)
class PlanSettings:
    """What the plan depends on besides the model: PPO's batch and lengths, LoRA's rank, precision, GPUs."""

    batch_size: int
    """Prompts per rollout, per process (ppo.batch_size)."""
    mini_batch_size: int
    """Sequences per optimiser step (ppo.mini_batch_size, at most batch_size)."""
    prompt_tokens: int
    """Longest prompt (ppo.max_prompt_length, fitted to the context)."""
    answer_tokens: int
    """Longest answer ([ppo.sampling] max_new_tokens)."""
    reward_layers: int
    """Decoder layers the reward model and the critic run."""
    lora_rank: int = 16
    bf16: bool = False
    """bf16 autocast (a GPU with bf16): activations in 2 bytes, a bf16 copy of each trained weight while it runs."""
    gpus: int = 1


@dataclass(frozen=True)
class ModelMemory:
    """Bytes one of the four models holds for the whole run."""

    role: str
    parameters: int
    weights: int
    gradients: int = 0
    """A trained model's gradients, when they are held between steps (DDP's buckets); those of a step are in
    EnginePlan.training."""
    optimizer: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer


@dataclass(frozen=True)
class EnginePlan:
    """The memory of one process (one GPU) under one engine."""

    engine: str
    models: tuple[ModelMemory, ...]
    generation: int
    """Phase 1's peak above the models: the KV cache (and, under FSDP2, the gathered actor)."""
    training: int
    """Phases 2 to 6's peak above the models: both models' activations, the logits, the actor's gradients,
    autocast's copies."""
    settings: PlanSettings = field(repr=False)

    @property
    def resident(self) -> int:
        return sum(model.total for model in self.models)

    @property
    def peak(self) -> int:
        return self.resident + max(self.generation, self.training)

    def fits(self, memory: int) -> bool:
        return self.peak <= HEADROOM * memory


def activation_bytes(shape: ModelShape, layers: int, tokens: int, element: int) -> int:
    """Activations a forward pass with gradients keeps for `tokens` tokens through `layers` decoder layers."""
    per_layer = ACTIVATIONS_HIDDEN * shape.hidden + 2 * shape.kv_width + ACTIVATIONS_MLP * shape.intermediate
    return tokens * (layers * per_layer + 3 * shape.hidden) * element  # + embedding output and the final norm's


def is_lora(engine: str) -> bool:
    return engine.endswith("lora")


def is_sharded(engine: str) -> bool:
    return engine.startswith("fsdp2")


def shard_count(settings: PlanSettings, engine: str) -> int:
    """GPUs each tensor is split over: all of them under FSDP2, none (1) under DDP."""
    return settings.gpus if is_sharded(engine) else 1


def trained_parameters(shape: ModelShape, settings: PlanSettings, layers: int, lora: bool, actor: bool) -> int:
    """Parameters the actor (actor=True) or the critic trains: all, or LoRA's adapters (and the critic's value head)."""
    if not lora:
        return shape.parameters if actor else shape.backbone_parameters(layers) + shape.hidden
    return settings.lora_rank * shape.lora_per_rank * layers + (0 if actor else shape.hidden)


def model_memories(shape: ModelShape, settings: PlanSettings, engine: str) -> tuple[ModelMemory, ...]:
    """The four models' resident bytes under `engine` (a LoRA run holds two: each base once)."""
    lora, shards = is_lora(engine), shard_count(settings, engine)
    buckets = 4 if shards == 1 and settings.gpus > 1 else 0
    reward_params = shape.backbone_parameters(settings.reward_layers) + shape.hidden
    memories = []
    for role, params, layers in (("actor", shape.parameters, shape.layers),
                                 ("critic", reward_params, settings.reward_layers)):
        trained = trained_parameters(shape, settings, layers, lora, actor=role == "actor")
        base = params if lora else 0
        memories.append(ModelMemory(role, params, weights=(4 * base + 4 * trained) // shards,
                                    gradients=buckets * trained, optimizer=8 * trained // shards))
    if not lora:
        memories += [ModelMemory("reference", shape.parameters, weights=4 * shape.parameters // shards),
                     ModelMemory("reward", reward_params, weights=4 * reward_params // shards)]
    if is_sharded(engine):  # FSDP2's plain copy of the actor (a LoRA one with its adapters), to generate and save
        copied = shape.parameters + (trained_parameters(shape, settings, shape.layers, lora, actor=True) if lora else 0)
        memories.append(ModelMemory("actor copy", copied, weights=4 * copied))
    return tuple(memories)


def training_bytes(shape: ModelShape, settings: PlanSettings, engine: str) -> int:
    """Phases 2 to 6's peak above the resident models: a mini-batch through actor and critic with gradients, the
    reference's log-probs beside them, and the actor's gradients of the backward pass (module docstring)."""
    element = 2 if settings.bf16 else 4
    batch, answer = settings.mini_batch_size, settings.answer_tokens
    tokens = batch * (settings.prompt_tokens + answer)
    logits = batch * (answer + 1) * shape.vocab * 4
    shards = shard_count(settings, engine)
    actor_trained = trained_parameters(shape, settings, shape.layers, is_lora(engine), actor=True)
    critic_trained = trained_parameters(shape, settings, settings.reward_layers, is_lora(engine), actor=False)
    autocast_copies = 2 * (actor_trained + critic_trained) if settings.bf16 and not is_sharded(engine) else 0
    gathered = 2 * gathered_layer_bytes(shape, settings) if is_sharded(engine) else 0  # two layers, with gradients
    gradients = 4 * actor_trained // shards
    return (activation_bytes(shape, shape.layers, tokens, element)
            + activation_bytes(shape, settings.reward_layers, tokens, element)
            + LOGIT_COPIES * logits + gradients + autocast_copies + gathered)


def gathered_layer_bytes(shape: ModelShape, settings: PlanSettings) -> int:
    """One decoder layer's weights gathered whole under FSDP2 (bf16 under autocast)."""
    return (2 if settings.bf16 else 4) * shape.layer_parameters


def generation_bytes(shape: ModelShape, settings: PlanSettings, engine: str) -> int:
    """Phase 1's peak above the resident models: the batch's KV cache at full length, its last logits, and autocast's
    bf16 copy of a trained actor (FSDP2 generates with its frozen copy: none)."""
    element = 2 if settings.bf16 else 4
    tokens = settings.batch_size * (settings.prompt_tokens + settings.answer_tokens)
    cache = 2 * shape.layers * tokens * shape.kv_width * element
    autocast_copy = 2 * shape.parameters if settings.bf16 and not is_lora(engine) and not is_sharded(engine) else 0
    return cache + settings.batch_size * shape.vocab * 4 + autocast_copy


def plan_engine(shape: ModelShape, settings: PlanSettings, engine: str) -> EnginePlan:
    """The plan of one process under `engine` ("ddp", "lora" (DDP with LoRA), "fsdp2" or "fsdp2-lora")."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    return EnginePlan(engine, model_memories(shape, settings, engine), generation_bytes(shape, settings, engine),
                      training_bytes(shape, settings, engine), settings)


def largest_batch(shape: ModelShape, settings: PlanSettings, engine: str, memory: int, limit: int = 4096) -> int:
    """The largest ppo.batch_size (with mini_batch_size equal to it) whose plan fits `memory`; 0 when none does."""
    def fits(batch: int) -> bool:
        return plan_engine(shape, replace(settings, batch_size=batch, mini_batch_size=batch), engine).fits(memory)

    low, high = 0, limit
    while low < high:  # the plan grows with the batch: the largest fitting one by bisection
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def recommend(plans: dict[str, EnginePlan], largest: dict[str, int], memory: int,
              use_lora: bool) -> tuple[str | None, str]:
    """(the engine to run or None, why): the configured kind (full or LoRA) under DDP when it fits, else LoRA, else
    on several GPUs FSDP2 (full unless LoRA is configured), else FSDP2 with LoRA, else the engine that fits the
    largest batch, saying which ppo.batch_size and what else to set."""
    batch, several = plans["ddp"].settings.batch_size, plans["ddp"].settings.gpus > 1
    wanted = "lora" if use_lora else "ddp"
    if plans[wanted].fits(memory):
        return wanted, f"{wanted} fits at the configured batch"
    if plans["lora"].fits(memory):
        return "lora", "full fine-tuning does not fit: set ppo.use_lora = true"
    if several and not use_lora and plans["fsdp2"].fits(memory):
        return "fsdp2", "DDP does not fit and LoRA neither: set ppo.engine = fsdp2"
    if several and plans["fsdp2-lora"].fits(memory):
        return "fsdp2-lora", "DDP does not fit, with LoRA or without" + (
            "" if use_lora else ", nor full FSDP2") + ": set ppo.engine = fsdp2" + (
            "" if use_lora else " and ppo.use_lora = true")
    best = max(ENGINES, key=lambda name: largest[name])
    if largest[best]:
        return best, f"batch {batch} does not fit: set ppo.batch_size = {largest[best]} or less" + "".join(
            f" and {setting}" for setting in engine_settings(best, use_lora))
    return None, "no engine fits: shorter prompts or answers, or more memory per GPU"


def engine_settings(engine: str, use_lora: bool) -> list[str]:
    """What to set, beyond the defaults, for PPO to run under the plan's `engine` when ppo.use_lora is `use_lora`."""
    settings = ["ppo.engine = fsdp2"] if engine.startswith("fsdp2") else []
    if engine.endswith("lora") and not use_lora:
        settings.append("ppo.use_lora = true")
    return settings
