"""`--sft`, `--train-reward` and `--train-ppo`: one stage at a time, with the settings of the one configuration.

Each command reads its stage's section ([sft], [reward], [ppo]) and [app] (database, model); its own flags
(`--data`, `--reward-model`, `--prompts`, `--reference`, `--out`) say what to train on and where to save.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

from commands.data import require_database
from loop.config import LoopConfig
from rlhf.distributed import is_main_process

CHECKPOINTS = Path("data/checkpoints")


def _fail(command: str, message: str) -> int:
    print(f"app.py {command}: {message}", file=sys.stderr)
    return 2


def _out_dir(args, kind: str) -> Path:
    """--out, else data/checkpoints/<kind>-<timestamp>."""
    return Path(args.out or CHECKPOINTS / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}")


def sft(args, config: LoopConfig) -> int:
    """`python app.py --sft [FILE]`: fine-tune the model on FILE, or on the annotators' demonstrations, and record it
    as the round-0 policy the next rounds start from (loop.stages.sft_on_store)."""
    from loop.stages import StageInputError, sft_on_store
    from rlhf.models import ModelNotFoundError
    from rlhf.sft.train import SFTDataError

    if not args.sft:
        require_database(config.app.db)  # the demonstrations are there: a mistyped --db has none
    try:
        outcome = sft_on_store(config, args.sft or None, _out_dir(args, "sft"))
    except (StageInputError, SFTDataError, ModelNotFoundError) as error:
        return _fail("--sft", str(error))
    if outcome.policy_id is None:
        return 0
    result = outcome.result
    print(f"SFT done: {result.steps} steps in {result.seconds:.0f} s, loss {result.losses[0]:.3f} -> "
          f"{result.final_loss:.3f}. Saved to {result.out_dir}, recorded as policy {outcome.policy_id} (round 0): "
          "it is now the reference and the starting actor.")
    return 0


def train_reward(args, config: LoopConfig) -> int:
    """`python app.py --train-reward`: train on the votes (or --data), save, print the held-out accuracy."""
    from loop.stages import preference_pairs
    from rlhf.models import ModelNotFoundError
    from rlhf.reward.data import PreferenceDataError
    from rlhf.reward.train import train_reward_model

    reward = replace(config.reward, model=config.app.model, out_dir=str(_out_dir(args, "reward")))
    try:
        pairs = preference_pairs(args.data, config.app.db)
        if is_main_process():
            print(f"Training the reward model on {len(pairs)} preference pairs from {args.data or config.app.db} ...",
                  file=sys.stderr)
        result = train_reward_model(pairs, reward)
    except (PreferenceDataError, ModelNotFoundError) as error:
        return _fail("--train-reward", str(error))
    if not is_main_process():
        return 0
    print(heldout_text(result.metrics))
    print(f"Reward model saved to {result.path}")
    return 0


def heldout_text(metrics: dict) -> str:
    """What `--train-reward` says of its model: held-out accuracy on the random sample pairs with their n, the training
    accuracy beside it, and the other sources' apart (votes from the store: pairs of other kinds)."""
    from annotate.metrics import (PAIR_SOURCES_MEASURED, RM_HELDOUT_ACCURACY, RM_HELDOUT_N, RM_N_HELDOUT, RM_N_TRAIN,
                                  RM_TRAIN_ACCURACY, heldout_accuracy_of, n_heldout_of)

    accuracy = RM_HELDOUT_ACCURACY.of(metrics)
    if accuracy is None:
        lines = [f"Held-out accuracy: not measured (no random sample pair held out; "
                 f"{RM_N_HELDOUT.text(RM_N_HELDOUT.of(metrics) or 0)} in all)."]
    else:
        lines = [f"Held-out accuracy: {accuracy:.1%} on {RM_HELDOUT_N.text(RM_HELDOUT_N.of(metrics))} pairs "
                 f"(trained on {RM_N_TRAIN.text(RM_N_TRAIN.of(metrics))}; training accuracy "
                 f"{RM_TRAIN_ACCURACY.text(RM_TRAIN_ACCURACY.of(metrics))})."]
    for source in PAIR_SOURCES_MEASURED:
        if (value := heldout_accuracy_of(source).of(metrics)) is not None:
            count = n_heldout_of(source)
            lines.append(f"  on {source} pairs: {value:.1%} of {count.text(count.of(metrics))}")
    return "\n".join(lines)


def train_ppo(args, config: LoopConfig) -> int:
    """`--train-ppo --reward-model DIR [--prompts FILE] [--out DIR] [--reference DIR]`: PPO alone, with [ppo] as the
    round would run it on that reward model (loop.config.ppo_settings)."""
    from loop.config import ppo_settings
    from loop.memory import with_engine
    from loop.stages import StageInputError, ppo_prompts, train_ppo_with_card
    from rlhf.models import ModelNotFoundError
    from rlhf.ppo.config import NeedsHeads
    from rlhf.reward.model import is_reward_model_dir

    if not args.reward_model:
        return _fail("--train-ppo", "needs --reward-model DIR, a folder saved by --train-reward or a round")
    if not is_reward_model_dir(args.reward_model):
        return _fail("--train-ppo", f"{args.reward_model} is not a reward model folder (no reward_model.json "
                     "there); train one with --train-reward")
    try:
        prompts = ppo_prompts(args.prompts, config.app.db)
    except StageInputError as error:
        return _fail("--train-ppo", str(error))
    ppo = with_engine(ppo_settings(config, args.reward_model), config)
    adapted = (ppo.normalize_rewards, ppo.lam) != (config.ppo.normalize_rewards, config.ppo.lam)
    if adapted and is_main_process():
        print("Head reward model: scores normalised, GAE lambda 1 (round.adapt_ppo_to_head).", file=sys.stderr)
    try:
        result = train_ppo_with_card(config, args.reward_model, prompts, ppo, _out_dir(args, "ppo"), args.reference)
    except (ModelNotFoundError, NeedsHeads) as error:
        return _fail("--train-ppo", str(error))
    if not is_main_process():
        return 0
    from annotate.metrics import PPO_KL, PPO_SCORE

    last = result.history[-1]
    print(f"PPO: {len(result.history)} steps on {len(prompts)} prompts; last step score "
          f"{PPO_SCORE.text(PPO_SCORE.of(last))}, KL {PPO_KL.text(PPO_KL.of(last))}. Actor saved to "
          f"{result.saved_path}.")
    return 0
