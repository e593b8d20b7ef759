"""Does PPO move the policy where a fixed reward model points? The simulated annotator judges the answers.

PPO from a policy (default: the default model) against one trained reward model (a round's `reward` folder), for a
number of steps, then K sampled answers to each of N held-out prompts from the new policy and from the start:
the rule's mean score (for `courteous`, the share of courtesy words), the share of answers it scores above zero,
and its head-to-head win rate against the start (ties half). Held-out prompts are a seeded sample of the prompts
file; PPO trains on the rest. Settings come as --set section.key=value, as in app.py. Ends with one JSON line.

    python bench/ppo_judge.py --reward-model data/checkpoints/demo-c2/round-5/reward --annotator courteous \\
        --steps 32 --set ppo.sampling.max_new_tokens=64 --set ppo.normalize_rewards=true --set ppo.lam=1.0

About 6 minutes on a 2-core CPU for 32 steps and 192 answers of 64 tokens each way.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from annotate.importers import read_prompts
from loop.policies import policy_answers
from annotate.simulate import resolve_judge, resolve_score
from bench.machine import add_bf16_flag, check_bf16, describe_machine, machine_line
from loop.config_files import load_config
from annotate.statistics import mean_and_standard_error
from loop.judging import judged, oracle_reward, repeat_each
from rlhf.models import resolve_model_path
from rlhf.ppo.train import train_ppo
from loop.config import function_ppo_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reward-model", required=True,
                        help="a reward model folder (a round's `reward`): PPO's reward, and the critic's start")
    parser.add_argument("--oracle", action="store_true",
                        help="reward PPO with the annotator's own score (normalised) instead of the reward model: "
                             "what these PPO settings buy with a perfect reward (the critic still starts from "
                             "--reward-model)")
    parser.add_argument("--policy", default="default", help="PPO's start and reference (default: the default model)")
    parser.add_argument("--annotator", default="courteous", help="a built-in rule with a score (default courteous)")
    parser.add_argument("--prompts", default="data/prompts.jsonl")
    parser.add_argument("--eval-prompts", type=int, default=64, help="held-out prompts judged (default 64)")
    parser.add_argument("--eval-answers", type=int, default=4, help="answers to each judged prompt (default 4)")
    parser.add_argument("--steps", type=int, default=32, help="PPO steps (default 32)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", default="data/cache/ppo-judge-policy", help="where the new policy is saved")
    add_bf16_flag(parser)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    score = resolve_score(args.annotator)
    if score is None:
        parser.error(f"{args.annotator!r} has no per-answer score; use a built-in rule such as courteous")
    judge = resolve_judge(args.annotator)
    config = load_config(None, args.set)
    ppo = replace(config.ppo, steps=args.steps)
    if args.oracle:
        ppo = function_ppo_settings(ppo)
    machine = describe_machine()
    print(machine_line(machine), flush=True)
    check_bf16(ppo.mixed_precision == "bf16", args.allow_emulated_bf16, machine,
               fp32_hint="--set ppo.mixed_precision=no")
    sampling = replace(config.sampling, max_new_tokens=ppo.sampling.max_new_tokens)

    prompts = read_prompts(args.prompts)
    held_out = random.Random(args.seed).sample(prompts, min(args.eval_prompts, len(prompts) - 1))
    held_out_set = set(held_out)
    train = [p for p in prompts if p not in held_out_set]
    start = resolve_model_path(args.policy)
    started = time.perf_counter()
    first = policy_answers(start, held_out, sampling, args.eval_answers, seed=args.seed)
    result = train_ppo(start, args.reward_model, train, ppo, args.out, reference_path=start,
                       reward_function=oracle_reward(score, args.annotator) if args.oracle else None)
    new = policy_answers(args.out, held_out, sampling, args.eval_answers, seed=args.seed)
    history = result.history
    prompts_each = repeat_each(held_out, args.eval_answers)
    verdicts = judged(judge, score, prompts_each, new, first, args.eval_answers)
    first_score, first_score_se = mean_and_standard_error([score(answer) for answer in first], args.eval_answers)
    windows = [history[i:i + 8] for i in range(0, len(history), 8)]
    row = {
        "annotator": args.annotator, "reward": "oracle" if args.oracle else args.reward_model, "steps": args.steps,
        "ppo_epochs": ppo.ppo_epochs, "mini_batch_size": ppo.mini_batch_size, "kl_ctl": ppo.kl_ctl, "lam": ppo.lam, "actor_lr": ppo.actor_lr,
        "normalize_rewards": ppo.normalize_rewards, "whiten_advantages": ppo.whiten_advantages,
        "first_score": first_score, "first_score_se": first_score_se,
        "score": verdicts["judge_score"], "score_se": verdicts["judge_score_se"],
        "first_scored": sum(score(a) > 0 for a in first) / len(first), "scored": sum(score(a) > 0 for a in new) / len(new),
        **{key: value for key, value in verdicts.items() if not key.startswith("judge_score")},
        "rm_score_by_8_steps": [round(sum(m["ppo/score"] for m in w) / len(w), 4) for w in windows],
        "kl_last_4": sum(m["ppo/kl"] for m in history[-4:]) / len(history[-4:]),
        "seconds": round(time.perf_counter() - started, 1),
        "machine": machine,
    }
    print(f"{args.annotator} score {row['first_score']:.4f} -> {row['score']:.4f}; answers scored above 0 "
          f"{row['first_scored']:.1%} -> {row['scored']:.1%}; win rate {row['win_rate']:.1%} (95% CI {row['win_rate_low']:.1%}-{row['win_rate_high']:.1%}; {row['wins']} / "
          f"{row['losses']} / {row['ties']}); KL {row['kl_last_4']:.2f}")
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
