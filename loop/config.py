"""Every setting of rlhf-loop, one dataclass per section of rlhf-loop.toml (`LoopConfig`), and the settings derived
from them; `loop.config_files` reads and writes them as TOML.

Every derived setting is computed here, once, for every path that needs it: the round, `--train-ppo` and
`--train-reward` call the same functions, so a head reward model trains the same PPO from the command line as in a
round.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, replace
from typing import Any

from annotate.team import parse_team
from annotate.text_limits import MAX_ANSWER_CHARS, MAX_PROMPT_CHARS
from rlhf.ppo.config import PPOConfig
from rlhf.reward.config import RewardTrainConfig, StrategyConfig, VotesConfig
from rlhf.sampling import DEFAULT_BATCH_SIZE, Sampling
from rlhf.settings_range import POSITIVE_COUNT, SEED, SHARE, at_least, between, check_ranges, ranged
from rlhf.sft.config import SFTConfig


@dataclass
class RoundConfig:
    """What a round does around the trainers."""

    min_new_pairs: int = ranged(16, at_least(0, "0: no minimum"))
    """Refuse a round with fewer new preference pairs than this since the last finished round."""
    min_accuracy: float = ranged(0.55, between(0, 1, "an accuracy; 0: no minimum"))
    """Refuse PPO when the reward model's held-out accuracy is below this."""
    ppo_prompts: int = ranged(64, POSITIVE_COUNT)
    """Prompts PPO trains on per round (sampled from the store, seeded)."""
    next_pairs: int = ranged(32, at_least(0, "0: none"))
    """Pairs generated for annotation from the new policy at the end of the round."""
    versus_share: float = ranged(0.25, SHARE)
    """Share of the next pairs that put the new policy against an earlier one, on prompts its PPO did not train on."""
    report_prompts: int = ranged(16, at_least(0, "0: no report"))
    """Prompts the round report answers with the policy before and after the round; 0: no report."""
    adapt_ppo_to_head: bool = True
    """PPO on a head, ensemble or LP-FT reward model (the few-vote strategies) normalises its scores
    (ppo.normalize_rewards) and takes GAE's lambda as 1 (ppo.lam): raw head scores move by hundredths, and lambda 0.95
    leaves an answer's first tokens little of the reward (docs/few-votes.md, "PPO on a head reward model"). A "full"
    reward model keeps [ppo] as set. `--train-ppo` follows it too."""
    checkpoints_dir: str = "data/checkpoints"
    """Where reward models and policies of each round are saved, in a folder per database: <dir>/<db name>/round-N."""
    keep_policies: int = ranged(3, at_least(0, "0: keep every policy"))
    """Policies whose folders a finished round (and `--prune`) keeps beside the ones still needed: the last N, the best
    by people's votes, the current one and its parent, and what the last finished or a resumable round reads
    (loop.retention); the others' folders are deleted. 0: nothing is deleted."""
    seed: int = ranged(0, SEED)
    """Seed for prompt choice, pair making and training: round N seeds its reward model, its PPO ([ppo].seed is
    for --train-ppo) and its next pairs with seed + N. The held-out split follows the prompts, not the seed."""

    def __post_init__(self) -> None:
        check_ranges(self)


PROMOTION_RULES = ("evidence", "always")


@dataclass
class PromotionConfig:
    """When a round's policy becomes the current one (loop.promotion): it writes the pairs and the next round starts
    from it. People's votes on its versus pairs decide once `min_votes` are in, until then the reward model's held-out
    interval; never past the KL budget `max_kl`."""

    rule: str = "evidence"
    """"evidence": promoted only when the evidence says it is not worse than the policy it started from; "always":
    every round's policy becomes current (the loop before promotion)."""
    min_votes: int = ranged(16, at_least(1))
    """Judged votes (wins, losses, ties) on a candidate's versus pairs from which people's verdict decides."""
    min_win_rate: float = ranged(0.5, between(0, 1, "a win rate"))
    """People's verdict: promoted when its win rate against the policy it started from (ties half) is at least this."""
    max_kl: float = ranged(10.0, at_least(0, "0: no limit"))
    """The KL budget: a policy whose PPO's mean KL to the reference (the round-0 policy) is above this is not promoted,
    whatever people's votes or the reward model say; an admin can still promote it."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.rule not in PROMOTION_RULES:
            raise ValueError(f"promotion.rule is one of {', '.join(PROMOTION_RULES)}, not {self.rule!r}")


@dataclass
class PairsConfig:
    """How the pairs people vote on are generated (`--generate-pairs`, the app, a round's next pairs); how each answer
    is sampled is [sampling]."""

    batch_size: int = ranged(DEFAULT_BATCH_SIZE, POSITIVE_COUNT)
    """Sequences generated together in one left-padded batch (a prompt's answers share its KV)."""
    seed: int | None = ranged(None, SEED)
    """Seeds the pairs `--generate-pairs` and the app make (prompts' sides, versus prompts, the sampling); unset: not
    seeded. A round seeds its next pairs with round.seed + its id."""

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass
class AppSettings:
    """What every command works on."""

    db: str = "data/rlhf-loop.db"
    """The SQLite database of prompts, pairs, votes, policies and rounds."""
    model: str = "default"
    """Base model: 'default' (the embedded SmolLM2-135M-Instruct), a Hugging Face id or a local folder."""
    overlap: int = ranged(1, POSITIVE_COUNT)
    """How many people vote on each pair (more than 1 measures agreement)."""
    gold_share: float = ranged(0.0, SHARE)
    """Share of each annotator's next pairs drawn from the gold pairs they have not voted on (pairs whose right answer
    an admin marked with --gold), shown as any other pair: each person's gold accuracy; 0: none."""
    max_prompt_chars: int = ranged(MAX_PROMPT_CHARS, POSITIVE_COUNT)
    """Longest prompt accepted, in characters, at import and in the app (one pair of a 50 MB prompt took a minute
    and 7 GB, and every showing sent it whole to the browser)."""
    max_answer_chars: int = ranged(MAX_ANSWER_CHARS, POSITIVE_COUNT)
    """Longest better answer (demonstration) an annotator may write, in characters."""

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass
class ServeSettings:
    """The annotation app in the browser."""

    host: str = "127.0.0.1"
    """Address to listen on; anything but this machine needs an auth file."""
    port: int = ranged(7860, between(1, 65535, "a TCP port"))
    """Port to listen on."""
    share: bool = False
    """Create a public Gradio link (needs an auth file)."""
    auth: str | None = None
    """Auth file of name:scrypt-hash lines (written by --add-user); required off localhost."""
    admins: list = field(default_factory=list)
    """Names made admin at start; when empty, the first person to sign in is admin."""
    first_batch: int = ranged(32, at_least(0, "0: none"))
    """Pairs generated in the background on a first start with no pairs (0: none)."""
    auto_round_every: int = ranged(0, at_least(0, "0: off"))
    """Start a training round after every N new votes (0: off; also set in Admin)."""

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass
class SimulateSettings:
    """Simulated annotators (`--simulate`, `--demo-loop`)."""

    annotator: str = "polite"
    """The demo loop's simulated annotator and judge: a built-in rule or module:function."""
    votes: int = ranged(50, POSITIVE_COUNT)
    """Votes to cast (per round in the demo loop)."""
    noise: float = ranged(0.0, SHARE)
    """Share of a/b votes flipped, like disagreeing people."""
    annotator_name: str | None = None
    """Name the votes are cast under (default sim:RULE)."""
    team: str = ""
    """A simulated team voting in place of the one annotator, for example "courteous*3,random,left" (docs/annotators.md,
    Teams). `--simulate team` votes as its members, named sim:courteous-1 ... sim:left; `--demo-loop` casts each
    round's votes with it and judges the win rate by its first rule member. Empty: the one annotator."""
    seed: int = ranged(0, SEED)
    """Seed of the simulated votes, their flips and the demo's evaluation prompts."""
    rounds: int = ranged(3, POSITIVE_COUNT)
    """Rounds of the demo loop."""
    eval_prompts: int = ranged(64, at_least(1, "the win rate needs answers to judge"))
    """Prompts kept out of PPO on which the demo loop judges each policy: the same ones every round and every run on a
    database (drawn with the seed)."""
    eval_answers: int = ranged(1, at_least(1, "the win rate needs answers to judge"))
    """Answers per evaluation prompt, each judged against the first policy's (more narrow the win rate when the
    judge ties often)."""
    reward: str = "model"
    """PPO's reward in the demo loop: "model" (the reward model trained on the votes) or "oracle" (the simulated
    annotator's own score of each answer). Only annotators with a score have an oracle; the votes are still cast and
    the reward model still trained and measured."""
    oracle: str = "score"
    """What the oracle rewards an answer with (simulate.reward = "oracle" and the ceiling): "score", the rule's own
    score of it, or "win_rate", the share of the first policy's evaluation answers it beats under the rule (ties
    half): the quantity the demo's win rate counts, where PPO on the score climbs the score's mean."""
    oracle_ceiling: bool = False
    """After each demo round, PPO once more from the same policy with the oracle (simulate.oracle) as the reward, judged
    beside it (oracle_win_rate). Same settings and seed; its policy is a folder beside the round's (ceiling-policy),
    not a policy of the loop: the most the round's PPO could buy with a perfect reward model."""
    closing_votes: bool = True
    """After the demo's last round, cast the votes the next round would start with (simulate.votes on pairs from the
    current policy, round.versus_share of them the last round's policy against its parent), so the last round's
    promotion is decided on people's votes, as every earlier round's is, and not by the reward model alone. A demo on
    the same database afterwards counts them as its first round's votes."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.reward not in ("model", "oracle"):
            raise ValueError(f"reward is model or oracle, not {self.reward!r}")
        if self.oracle not in ("score", "win_rate"):
            raise ValueError(f"oracle is score or win_rate, not {self.oracle!r}")
        if self.team:
            parse_team(self.team)  # TeamSpecError (a ValueError) says what is wrong and what is accepted
            if self.annotator_name:
                raise ValueError("annotator_name names the one annotator's votes; a team's members are named after "
                                 "what they are (sim:courteous-1, sim:random ...): leave annotator_name unset")
        if self.reward == "oracle" and self.oracle_ceiling:
            raise ValueError("oracle_ceiling compares the reward model's rounds with the oracle's: it needs "
                             "reward = \"model\" (with reward = \"oracle\" the rounds are the ceiling already)")


@dataclass
class LoopConfig:
    """Every knob of rlhf-loop, one dataclass per section of rlhf-loop.toml."""

    round: RoundConfig = field(default_factory=RoundConfig)
    promotion: PromotionConfig = field(default_factory=PromotionConfig)
    reward: RewardTrainConfig = field(default_factory=RewardTrainConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    sampling: Sampling = field(default_factory=Sampling)
    """How the answers people rank are sampled."""
    pairs: PairsConfig = field(default_factory=PairsConfig)
    votes: VotesConfig = field(default_factory=VotesConfig)
    """Reward-model strategy by vote count and active choice of the next pairs (rlhf.reward.strategies)."""
    app: AppSettings = field(default_factory=AppSettings)
    serve: ServeSettings = field(default_factory=ServeSettings)
    simulate: SimulateSettings = field(default_factory=SimulateSettings)
    sft: SFTConfig = field(default_factory=SFTConfig)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {section.name: _jsonable(dataclasses.asdict(getattr(self, section.name)))
                for section in dataclasses.fields(self)}


def _jsonable(values: dict) -> dict:
    return json.loads(json.dumps(values, default=str))


def ppo_settings(config: LoopConfig, reward_model_path: str, round_id: int | None = None) -> PPOConfig:
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
    what a perfect reward model would at the same KL price. A function has no bootstrap heads: the conservative reward
    and the drift budget (ppo.reward_spread_penalty, ppo.drift_budget) are off for it.
    """
    return replace(settings, normalize_rewards=True, reward_spread_penalty=0.0, drift_budget=0.0)


def strategy_settings(config: LoopConfig, seed: int, warm_start: str | None) -> StrategyConfig:
    """How the round trains its reward model: [votes] for the heads, [reward] for the split and the "full" strategy,
    with this round's seed and warm start."""
    reward = replace(config.reward, warm_start=warm_start, seed=seed, show_progress=True)
    return StrategyConfig(votes=config.votes, reward=reward, seed=seed, tuned_heads=config.ppo.reads_heads)
