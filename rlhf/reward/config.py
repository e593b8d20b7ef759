"""The reward model's settings ([reward] and [votes] of rlhf-loop.toml), importable without torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlhf.fsdp2 import TRAINING_ENGINES
from rlhf.settings_range import (LEARNING_RATE, POSITIVE_COUNT, SEED, SHARE, above, at_least, between, check_ranges,
                                  ranged)

STRATEGIES = ("head", "ensemble", "lpft", "full")
WEIGHTINGS = ("majority", "reliability")
"""votes.weighting: how votes become the reward model's labels (annotate.reliability.weighted_preferences)."""
GRADED_USES = ("off", "margin", "weight")
"""votes.graded: how a vote's strength enters the head's loss (rlhf.losses.graded_terms checks the same names)."""
DEFAULT_FEATURE = "mean@2"
"""The frozen feature of the head strategies: the answer-mean of layer 2 ranked best at 200 votes, the last token at
chance (docs/few-votes.md, "Held-out accuracy against votes")."""


@dataclass
class RewardTrainConfig:
    """Settings of one reward-model training run (defaults suit a few hundred pairs on a small model)."""

    model: str = "default"
    """Causal LM to start from when there is no warm start: the base model or an SFT policy (name or folder)."""
    warm_start: str | None = None
    """Folder of a previous reward model to continue from (the last round's); None starts from `model`."""
    out_dir: str | None = None
    """Where to save the trained model; None saves nothing (the caller keeps `result.model`)."""
    learning_rate: float = ranged(2e-5, at_least(0, "a learning rate; 0 measures the model as loaded"))
    """Peak learning rate of AdamW (reached after warmup)."""
    weight_decay: float = ranged(0.0, at_least(0))
    """AdamW weight decay."""
    epochs: int = ranged(1, POSITIVE_COUNT)
    """Passes over the training pairs."""
    max_steps: int | None = ranged(None, POSITIVE_COUNT)
    """Stop after this many optimizer steps even before `epochs` are done (benchmarks); None: no limit."""
    batch_size: int = ranged(8, POSITIVE_COUNT)
    """Pairs per forward pass (each pass holds 2 x batch_size sequences: chosen, then rejected)."""
    grad_accum: int = ranged(1, POSITIVE_COUNT)
    """Forward passes whose gradients add up before one optimizer step."""
    max_length: int = ranged(512, POSITIVE_COUNT)
    """Tokens per sequence (prompt + answer + EOS); longer ones lose the prompt's start first."""
    loss_form: Literal["divergence", "last_token"] = "divergence"
    """Pairwise loss: DeepSpeed-Chat's mean over the diverging positions, or TRL's last-token scores."""
    margin: float = ranged(0.0, at_least(0))
    """Margin in -log sigmoid(r_chosen - r_rejected - margin)."""
    center_coef: float = ranged(0.0, at_least(0, "0: off"))
    """Reward centering: adds center_coef * mean((r_chosen + r_rejected)^2) to keep scores near 0."""
    lr_schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """Decay after the warmup: cosine or linear to 0, or constant."""
    warmup_ratio: float = ranged(0.1, SHARE)
    """Share of the optimizer steps spent warming the learning rate up linearly from 0."""
    max_grad_norm: float = ranged(1.0, at_least(0, "0: off"))
    """Clip the global gradient norm to this; 0 turns clipping off."""
    heldout_fraction: float = ranged(0.1, between(0, 1, "a share of prompts", high_open=True))
    """Share of prompts whose pairs are held out to measure accuracy on pairs never trained on: chosen by a hash of the
    prompt's text (rlhf.reward.data.split_pairs), so no prompt is on both sides and a pair held out once stays held
    out in every later round."""
    min_pairs: int = ranged(8, POSITIVE_COUNT)
    """Refuse to train on fewer preference pairs than this."""
    seed: int = ranged(0, SEED)
    """Seeds the head's initialisation and the shuffling (not the held-out split, which follows the prompts)."""
    eval_batch_size: int = ranged(16, POSITIVE_COUNT)
    """Pairs per forward pass when measuring held-out accuracy."""
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    """auto: bf16 autocast where the hardware has bf16 arithmetic (CUDA, CPUs with AVX512-BF16 or AMX), else fp32
    (or what `accelerate launch` was configured with); weights and AdamW stay fp32."""
    freeze_backbone: bool = False
    """Train the value head only, on the frozen decoder's features."""
    share_prompt: bool = True
    """Run each pair's prompt once for both answers (a KV cache feeds both): the same loss and gradients from
    ~20% fewer tokens, so more pairs a second (docs/benchmarks.md, "What makes the difference"). Off under
    gradient checkpointing and engine "fsdp2", which both need one pass per layer."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, about a third more compute (turns share_prompt off)."""
    engine: Literal["ddp", "fsdp2"] = "ddp"
    """How the processes of torchrun / accelerate launch hold the model while it trains: "ddp" (each whole: accelerate,
    or what `accelerate launch` was configured with) or "fsdp2" (torch's fully_shard per decoder layer: weights,
    gradients and optimiser state split, the whole weights gathered once at the end; rlhf.fsdp2)."""
    show_progress: bool = True
    """Show a tqdm bar on the terminal (main process only)."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.engine not in TRAINING_ENGINES:
            raise ValueError(f"engine must be one of {', '.join(TRAINING_ENGINES)}, not {self.engine!r}")
        if self.loss_form not in ("divergence", "last_token"):
            raise ValueError(f"loss_form must be 'divergence' or 'last_token', got {self.loss_form!r}.")


@dataclass
class VotesConfig:
    """The [votes] section of rlhf-loop.toml: which reward-model strategy a round uses and how it picks pairs."""

    strategy: str = "auto"
    """"auto" (by vote count: the head on `feature`, LP-FT from `lpft_from_votes` on), or always "head",
    "ensemble", "lpft" (the head, then the feature's last layer fine-tuned under it) or "full"."""
    full_from_votes: int = ranged(1_000_000, at_least(0, "a vote count"))
    """With "auto": fine-tune all weights from this many votes on. Off: full fine-tuning sat at chance at 89 votes
    and the curve bench could not afford it on CPU (docs/few-votes.md, "A head on frozen features")."""
    ensemble_from_votes: int = ranged(1_000_000, at_least(0, "a vote count"))
    """With "auto": the mean of bootstrap heads from this many votes on. Off: the single cross-validated head was
    ahead (docs/few-votes.md, "Held-out accuracy against votes"); the bootstrap heads are fitted either way."""
    lpft_from_votes: int = ranged(200, at_least(0, "a vote count"))
    """With "auto": LP-FT (rlhf/reward/lpft.py) from this many votes on, the head alone below: at 200 votes it beat
    the head on every annotator measured, for minutes more of CPU (docs/few-votes.md, "LP-FT")."""
    finetune_lr: float = ranged(1e-4, LEARNING_RATE)
    """LP-FT: Adam's step for the fine-tuned decoder layers (larger steps peaked sooner, then overfitted)."""
    finetune_epochs: int = ranged(5, POSITIVE_COUNT)
    """LP-FT: passes over the votes."""
    finetune_layers: int = ranged(1, POSITIVE_COUNT)
    """LP-FT: decoder layers fine-tuned, the last ones the feature reads."""
    incremental: bool = True
    """LP-FT continues from the last round's LP-FT model (same feature and base model) on the votes it has not trained
    on plus `replay_share` as many earlier ones, for `incremental_epochs` passes, so a round costs what its new votes
    cost; false: every round fine-tunes again from the probe on every vote (docs/few-votes.md, "Incremental rounds")."""
    replay_share: float = ranged(1.0, at_least(0))
    """Incremental LP-FT: earlier votes replayed per new vote (drawn at random each round; 0: the new votes alone)."""
    incremental_epochs: int = ranged(3, POSITIVE_COUNT)
    """Incremental LP-FT: passes over the new and replayed votes."""
    feature: str = DEFAULT_FEATURE
    """Frozen feature of the head strategies, "pooling@layer" (every one exports as the RewardModel PPO uses)."""
    n_heads: int = ranged(8, at_least(0, "0: the cross-validated head alone"))
    """Bootstrap heads (disagreement for active selection; the "ensemble" score)."""
    cv_folds: int = ranged(5, at_least(2))
    """Cross-validation folds choosing the head's L2 strength."""
    weighting: str = "majority"
    """How people's votes make the reward model's labels: "majority" (a pair's strict majority of a/b votes, each pair
    counting once) or "reliability" (the same pairs, each weighted, and flipped where the votes say so, by how sure its
    votes are given each voter's estimated accuracy: gold pairs, else Dawid-Skene on overlapping pairs, else the last
    round's agreement with a head fitted on the others' votes, else 0.75, at most what a side bias allows;
    annotate.reliability.weighted_preferences). With "reliability", promotion weighs people's versus votes the same
    way (annotate.reliability.weighted_win_rates)."""
    graded: str = "margin"
    """How a vote's strength (slightly or much better; old votes and file pairs count as slightly) enters the
    head strategies' Bradley-Terry loss: "off", "margin" (Llama 2's -log sigmoid(r_c - r_r - m)) or "weight"
    (rlhf.losses.graded_terms). A margin of 4 was best on the tuning annotators and beat plain votes on the held-out
    ones by about a point (docs/few-votes.md, "Graded votes"); ungraded votes train as with "off"."""
    much_margin: float = ranged(4.0, at_least(0))
    """With graded = "margin": the margin of a "much better" vote in score units (a "slightly better" one has 0)."""
    much_weight: float = ranged(2.0, above(0))
    """With graded = "weight": the weight of a "much better" vote (a "slightly better" one counts 1)."""
    oversample: int = ranged(4, at_least(2, "2: no active choice"))
    """Answers per prompt when choosing the next sample pairs; 2 turns active selection off (one pair a prompt)."""
    prompts_per_pair: float = ranged(1.5, at_least(1))
    """Prompts over-sampled per sample pair wanted (each gives at most one pair): room to choose among prompts."""
    random_share: float = ranged(0.25, SHARE)
    """Share of the actively chosen batch drawn at random instead (keeps the held-out estimate honest)."""
    confidence_z: float = ranged(1.96, at_least(0))
    """z of the interval on held-out accuracy; PPO is refused when its lower end is below chance (0.5)."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"votes.weighting must be one of {', '.join(WEIGHTINGS)}, not {self.weighting!r}")
        if self.graded not in GRADED_USES:
            raise ValueError(f"votes.graded must be one of {', '.join(GRADED_USES)}, not {self.graded!r}")


@dataclass
class StrategyConfig:
    """How a preference model is trained from votes (any strategy); loop.config.strategy_settings builds the
    round's from [votes] and [reward], so no setting is declared twice."""

    votes: VotesConfig = field(default_factory=VotesConfig)
    """feature, n_heads and cv_folds of the head strategies."""
    reward: RewardTrainConfig = field(default_factory=lambda: RewardTrainConfig(show_progress=False))
    """heldout_fraction and max_length of every strategy, and the "full" strategy's training settings (model and
    out_dir are set by train_strategy)."""
    seed: int = ranged(0, SEED)
    """Seeds the folds and the bootstrap."""
    batch_size: int = ranged(16, POSITIVE_COUNT)
    """Answers per forward pass when extracting features."""
    tuned_heads: bool = False
    """LP-FT: fit the bootstrap heads once more on the fine-tuned model's own features of the trained votes (one
    forward pass of them, never cached: the layers change every round), which PPO's conservative reward and drift
    budget read (rlhf.reward.strategies.score_heads); the round asks for them when [ppo] reads heads."""

    def __post_init__(self) -> None:
        check_ranges(self)
