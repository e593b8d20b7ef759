"""`python app.py --plan [--model NAME] [--gpus N] [--gpu-memory GB] [--json]`: the memory per GPU of a round's PPO
under each engine, from the model's config alone (no weights load), with the engine to run (loop.memory)."""

from __future__ import annotations

import json
import sys

from loop.config import LoopConfig

GB = 1024 ** 3
NOTES = {"ddp": "every GPU holds the four models whole", "lora": "DDP with LoRA: each base held once",
         "fsdp2": "actor and critic sharded over the GPUs (ppo.engine = fsdp2)",
         "fsdp2-lora": "LoRA's adapters and bases sharded so (ppo.engine = fsdp2, ppo.use_lora)"}


def plan_lines(plan) -> list[str]:
    """The plan as a table, a line on what it assumed before it and the recommendation after it."""
    s, shape = plan.settings, plan.shape
    lines = [f"Memory plan for {shape.name}: {shape.parameters / 1e6:,.1f}M parameters, {shape.layers} layers, hidden "
             f"{shape.hidden}, vocabulary {shape.vocab}.",
             f"PPO: batch {s.batch_size} (mini-batch {s.mini_batch_size}), prompts of {s.prompt_tokens} + answers of "
             f"{s.answer_tokens} tokens, reward model and critic on {s.reward_layers} layers, "
             f"{'bf16 autocast' if s.bf16 else 'fp32'}, LoRA rank {s.lora_rank}; {s.gpus} "
             f"{'GPU' if plan.memory.gpu else 'process'}{'es' if s.gpus > 1 and not plan.memory.gpu else ''}"
             f"{'s' if s.gpus > 1 and plan.memory.gpu else ''}: {plan.memory.label}.",
             "",
             f"{'engine':<11}{'actor':>8}{'critic':>8}{'ref.':>8}{'reward':>8}{'copy':>8}{'generate':>10}{'train':>8}"
             f"{'per GPU':>9}  {'fits':<5}{'largest batch':>14}  note"]
    for name, engine in plan.plans.items():
        parts = {m.role: m.total for m in engine.models}
        cells = "".join(f"{parts[role] / GB:>8.2f}" if role in parts else f"{'-':>8}"
                        for role in ("actor", "critic", "reference", "reward", "actor copy"))
        lines.append(f"{name:<11}{cells}{engine.generation / GB:>10.2f}{engine.training / GB:>8.2f}"
                     f"{engine.peak / GB:>9.2f}  {'yes' if engine.fits(plan.memory.bytes) else 'no':<5}"
                     f"{plan.largest_batch[name]:>14}  {NOTES[name]}")
    lines += ["", "GB per GPU; a plan fits when it needs at most 90% of the memory; the largest batch keeps "
                  "mini_batch_size equal to it.",
              f"Recommended: {plan.recommended or 'none'} ({plan.why})."]
    return lines


def plan(args, config: LoopConfig) -> int:
    """Print the plan (or one JSON line with --json). Exit 0, or 2 when the model's config cannot be read."""
    from loop.memory import plan_round_memory
    from rlhf.models import ModelNotFoundError, ModelSetupError

    gpus, gpu_memory = getattr(args, "gpus", None), getattr(args, "gpu_memory", None)
    if (gpus is not None and gpus < 1) or (gpu_memory is not None and gpu_memory <= 0):
        print("app.py --plan: --gpus must be at least 1 and --gpu-memory above 0 (GB per GPU).", file=sys.stderr)
        return 2
    try:
        memory_plan = plan_round_memory(config, gpus=gpus, gpu_memory_gb=gpu_memory)
    except (ModelNotFoundError, ModelSetupError) as error:
        print(f"app.py --plan: cannot read the config of {config.app.model}: {error}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as error:
        print(f"app.py --plan: cannot read the config of {config.app.model}: {error}. Give --model a folder with "
              "config.json, a model name the Hugging Face hub knows, or default.", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        print(json.dumps(memory_plan.to_json()))
    else:
        print("\n".join(plan_lines(memory_plan)))
    return 0
