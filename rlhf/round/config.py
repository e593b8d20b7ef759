"""The settings a round reads ([round], [reward], [ppo], [sampling], [votes]) and the settings derived from them.

Every derived setting is computed here, once, for every path that needs it: the round, `--train-ppo` and
`--train-reward` call the same functions, so a head reward model trains the same PPO from the command line as in a
round.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rlhf.ppo.config import PPOConfig
from rlhf.reward.config import RewardTrainConfig, StrategyConfig, VotesConfig
from rlhf.sampling import AnswerSampling


@dataclass
class RoundConfig:
    """What a round does around the trainers."""

    min_new_pairs: int = 16
    """Refuse a round with fewer new preference pairs than this since the last finished round."""
    min_accuracy: float = 0.55
    """Refuse PPO when the reward model's held-out accuracy is below this."""
    ppo_prompts: int = 64
    """Prompts PPO trains on per round (sampled from the store, seeded)."""
    next_pairs: int = 32
    """Pairs generated for annotation from the new policy at the end of the round."""
    versus_share: float = 0.25
    """Share of the next pairs that put the new policy against an earlier one."""
    adapt_ppo_to_head: bool = True
    """PPO on a head or ensemble reward model (the few-vote strategies) normalises its scores by their running mean and
    std (ppo.normalize_rewards) and takes GAE's lambda as 1 (ppo.lam). Cross-validation on few votes picks a strong L2,
    so raw head scores move by hundredths, little beside the KL penalty; and a mean-pooled head is no value function
    for the critic it initialises, so lambda 0.95 leaves a 64-token answer's first tokens 0.95^63 = 4% of the reward.
    Measured (docs/few-votes.md): 32 steps from the default model raised the share of answers with a courtesy word
    from 10% to 19% with lambda 1 and left it at 11% with 0.95. A "full" reward model (scored at the last token,
    DeepSpeed-Chat's critic init) keeps [ppo] as set. `--train-ppo` follows it too."""
    checkpoints_dir: str = "data/checkpoints"
    """Where reward models and policies of each round are saved, in a folder per database: <dir>/<db name>/round-N."""
    seed: int = 0
    """Seed for prompt choice, pair making and training: round N seeds its reward model, its PPO ([ppo].seed is
    for --train-ppo) and its next pairs with seed + N. The held-out split follows the prompts, not the seed."""


@dataclass
class TrainingConfig:
    """The stages' settings, one dataclass per section of rlhf-loop.toml."""

    round: RoundConfig = field(default_factory=RoundConfig)
    reward: RewardTrainConfig = field(default_factory=RewardTrainConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    sampling: AnswerSampling = field(default_factory=AnswerSampling)
    votes: VotesConfig = field(default_factory=VotesConfig)
    """Reward-model strategy by vote count and active choice of the next pairs (rlhf.reward.strategies)."""


def ppo_settings(config: TrainingConfig, reward_model_path: str, round_id: int | None = None) -> PPOConfig:
    """config.ppo, with normalised rewards and GAE lambda 1 when round.adapt_ppo_to_head asks for them and the reward
    model is a head or ensemble (RoundConfig.adapt_ppo_to_head says why); in round `round_id`, seeded with
    round.seed + round_id like the round's other stages, so that rounds do not repeat one another's draws
    (`--train-ppo` passes no round and keeps [ppo].seed)."""
    from rlhf.reward.strategies import saved_strategy  # torch: only when a round or --train-ppo runs

    settings = config.ppo
    if config.round.adapt_ppo_to_head and saved_strategy(reward_model_path) in ("head", "ensemble", "lpft"):
        settings = replace(settings, normalize_rewards=True, lam=1.0)
    if round_id is not None:
        settings = replace(settings, seed=config.round.seed + round_id)
    return settings


def function_ppo_settings(settings: PPOConfig) -> PPOConfig:
    """The round's PPO settings for a reward function in place of the reward model (the demo's oracle, a simulated
    annotator's own score): the same settings (steps, lambda, seed, KL), with the scores normalised by their running
    mean and std (ppo.normalize_rewards), whatever the reward model's strategy.

    A rule's score comes in its own units: `courteous`' share of courtesy words moves by hundredths, `longer`'s word
    count by tens, `contains:WORD` is 0 or 1. Raw, the first would weigh nothing beside the KL penalty and the second
    would sit at clip_reward_value; standardised, every rule reaches PPO at the scale a head reward model's scores do
    in a round (unit spread over the answers PPO samples, RoundConfig.adapt_ppo_to_head), so an oracle round buys
    what a perfect reward model would at the same KL price.
    """
    return replace(settings, normalize_rewards=True)


def strategy_settings(config: TrainingConfig, seed: int, warm_start: str | None) -> StrategyConfig:
    """How the round trains its reward model: [votes] for the heads, [reward] for the split and the "full" strategy,
    with this round's seed and warm start."""
    reward = replace(config.reward, warm_start=warm_start, seed=seed, show_progress=True)
    return StrategyConfig(votes=config.votes, reward=reward, seed=seed)
