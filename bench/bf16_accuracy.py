"""What bf16 does to PPO's numbers: the same sampled batch scored and differentiated in fp32 and in bf16.

`ppo.mixed_precision=bf16` runs the matmuls in bf16 (autocast; the trained weights and AdamW stay fp32) and stores
the frozen reference and reward model in bf16. This bench measures the error that costs, on the default model, the
round's reward-model shape (`--reward-feature`, default mean@2) and the TRL comparison's settings (batch 8, 48 new tokens):

- log-prob error per response token, actor and reference, against the fp32 numbers;
- the KL the step sees between an actor and a reference that hold the SAME weights (fp32: exactly 0), against
  the KL a real round's PPO step reaches (0.1-0.2 per answer);
- reward-score and value error;
- the actor's gradient of the policy loss, with the fp32 experience's advantages for both: cosine similarity
  and relative norm error against fp32 (1.0 and 0.0 would be exact).

    python bench/bf16_accuracy.py --threads 1

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere: the repository root first

import torch

from bench.machine import add_bf16_flag, check_bf16, describe_machine, machine_line
from rlhf.losses import actor_loss, masked_mean
from rlhf.models import load_tokenizer, resolve_model_path
from rlhf.ppo.train import build_ppo_trainer
from rlhf.ppo.config import PPOConfig, rollout_sampling
from rlhf.reward.model import RewardModel
from rlhf.reward.features import parse_feature

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_prompts import PROMPTS


def scored(trainer, batch: tuple) -> dict:
    """The experience of `batch` and the actor's policy-loss gradient under `trainer`'s precision, with the
    advantages given in batch[4] (None: the trainer's own)."""
    sequences, attention_mask, action_mask, ended, advantages = batch
    experience, (log_probs, _, _) = trainer.evaluate(sequences, attention_mask, action_mask, ended,
                                                     keep_graph=True)
    advantages = experience.advantages if advantages is None else advantages
    loss, _, _ = actor_loss(log_probs, experience.log_probs, advantages, action_mask, trainer.config.cliprange)
    trainer.actor_optimizer.zero_grad(set_to_none=True)
    trainer.accelerator.backward(loss)
    gradient = torch.cat([p.grad.flatten().double() for p in trainer.unwrapped_actor().parameters()
                          if p.grad is not None])  # (N,) in fp64: 135M terms summed
    trainer.actor_optimizer.zero_grad(set_to_none=True)
    return {"experience": experience, "gradient": gradient}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default", help="actor, reference and reward backbone (default: embedded)")
    parser.add_argument("--reward-feature", default="mean@2", help="reward model and critic score definition")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    add_bf16_flag(parser)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = describe_machine()
    print(machine_line(machine), flush=True)
    check_bf16(True, args.allow_emulated_bf16, machine)  # its bf16 half
    actor_path = resolve_model_path(args.model)
    prompts = PROMPTS[:args.batch_size]
    results = {}
    with tempfile.TemporaryDirectory(prefix="bf16-bench-rm-") as reward_dir:
        pooling, layer = parse_feature(args.reward_feature)
        RewardModel(RewardModel.from_causal_lm(actor_path).backbone, pooling=pooling, layer=layer).save_pretrained(
            reward_dir, tokenizer=load_tokenizer(actor_path))
        batch = None
        for precision in ("no", "bf16"):
            config = PPOConfig(batch_size=args.batch_size, mini_batch_size=args.batch_size, ppo_epochs=1,
                               seed=args.seed, mixed_precision=precision,
                               sampling=rollout_sampling(max_new_tokens=args.max_new_tokens,
                                                         min_new_tokens=args.max_new_tokens))
            trainer = build_ppo_trainer(actor_path, reward_dir, config)
            if batch is None:  # sampled once, in fp32: both precisions score the same tokens
                batch = (*trainer.generate(prompts), None)
            results[precision] = scored(trainer, batch)
            if precision == "no":  # bf16 gets the fp32 advantages, so the gradients differ only by precision
                batch = (*batch[:4], results["no"]["experience"].advantages)
            del trainer
    exact, half = results["no"]["experience"], results["bf16"]["experience"]
    mask = exact.action_mask

    def token_error(name: str) -> float:
        return float(masked_mean((getattr(half, name) - getattr(exact, name)).abs(), mask))

    g32, g16 = results["no"]["gradient"], results["bf16"]["gradient"]
    figures = {
        "bench": "bf16_accuracy",
        "model": args.model,
        "reward_feature": args.reward_feature,
        "tokens": int(mask.sum()),
        "logp_mean_fp32": round(float(masked_mean(exact.log_probs, mask)), 4),
        "logp_abs_err": round(token_error("log_probs"), 5),
        "ref_logp_abs_err": round(token_error("ref_log_probs"), 5),
        "value_abs_err": round(token_error("values"), 5),
        "score_abs_err": round(float((half.reward_score - exact.reward_score).abs().mean()), 5),
        "score_std_fp32": round(float(exact.reward_score.std()), 5),
        "kl_same_weights_fp32": round(float(exact.kl.sum(-1).mean()), 5),
        "kl_same_weights_bf16": round(float(half.kl.sum(-1).mean()), 5),
        "grad_cosine": round(float(torch.nn.functional.cosine_similarity(g32, g16, dim=0)), 5),
        "grad_norm_rel_err": round(float((g16.norm() - g32.norm()).abs() / g32.norm()), 5),
        "machine": machine,
    }
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
