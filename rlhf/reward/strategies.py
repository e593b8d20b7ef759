"""Reward-model strategies for few votes, behind one interface the round and the curve bench choose from.

- "head": the policy's backbone stays frozen; each answer's features (hidden states of one layer, pooled at the
  last token or averaged over the answer) are computed once under inference mode, and a Bradley-Terry head is
  fitted on feature differences with its L2 strength chosen by cross-validation (rlhf.reward.bt_head).
- "ensemble": the same features, the score of the mean of bootstrap heads (a linear head too).
- "lpft": the head, then the feature's last decoder layer fine-tuned under it on the same votes
  (rlhf.reward.lpft: a linear probe, then fine-tuning).
- "full": every weight fine-tuned by rlhf.reward.train.train_reward_model (as TRL does).

Every trained model scores answers, gives P(a preferred to b) and a disagreement per pair (the spread of bootstrap
heads on the frozen features, also for "full", so active selection works whatever scores), and saves a folder that
`RewardModel.from_pretrained` loads for PPO. The exact bridge: a head on "pooling@L" features IS a v_head on the
backbone's layer L with the same pooling (RewardModel's `pooling` and `layer`: the mean of w . h_t over the answer's
tokens equals w . mean_t h_t), so the saved folder scores exactly as the head does, for every feature. A layer
below the last saves only the first L decoder layers, which is also what PPO then runs to score.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from rlhf.finite import refuse_non_finite
from rlhf.losses import graded_terms
from rlhf.reward import bt_head
from rlhf.reward.config import STRATEGIES, StrategyConfig, VotesConfig
from rlhf.reward.features import FeatureExtractor, canonical_feature, parse_feature
from rlhf.reward.data import (
    PairLike,
    PreferencePair,
    heldout_accuracies,
    pad_pair_rows,
    pair_strength,
    pair_weights,
    split_pairs,
    tokenize_pairs,
)
from rlhf.reward.lpft import FinetuneSettings, finetune_top_layers
from rlhf.reward.incremental import pair_key, read_trained_pairs, replay_batch, write_trained_pairs
from rlhf.reward.model import (
    MARKER_FILE,
    RewardModel,
    load_reward_tokenizer,
)
from rlhf.reward.train import train_reward_model

HEADS_FILE = "bt_heads.safetensors"
TUNED_HEADS_FILE = "tuned_heads.safetensors"
"""An LP-FT folder's bootstrap heads on its own fine-tuned features (StrategyConfig.tuned_heads)."""
FINETUNED = ("lpft", "full")
"""Strategies that score with a fine-tuned RewardModel (their bootstrap heads stay on the frozen base features)."""
STRATEGY_FILE = "preference_strategy.json"


def choose_strategy(n_votes: int, config: VotesConfig) -> str:
    """The strategy for a round with `n_votes` preference pairs."""
    if config.strategy != "auto":
        if config.strategy not in STRATEGIES:
            raise ValueError(f"votes.strategy must be auto or one of {', '.join(STRATEGIES)}, not {config.strategy!r}")
        return config.strategy
    if n_votes >= config.full_from_votes:
        return "full"
    if n_votes >= config.ensemble_from_votes:
        return "ensemble"
    return "lpft" if n_votes >= config.lpft_from_votes else "head"


def _texts(pairs: Sequence[PairLike]) -> tuple[list[str], list[str], list[str]]:
    return [p.prompt for p in pairs], [p.chosen for p in pairs], [p.rejected for p in pairs]


@dataclass
class TrainedPreferenceModel:
    """A strategy's trained model: scores, P(a > b), disagreement, held-out accuracy, saving for PPO."""

    strategy: str
    extractor: FeatureExtractor
    feature: str
    weight: torch.Tensor | None
    """(D,) the linear head on `feature` (None for FINETUNED strategies, which score with `reward_model`)."""
    heads: torch.Tensor
    """(H, D) bootstrap heads on `feature`: the disagreement."""
    metrics: dict = field(default_factory=dict)
    """rm/strategy, rm/heldout_accuracy (random sample pairs), rm/heldout_accuracy_versus, rm/heldout_accuracy_chosen,
    rm/n_train, rm/n_heldout (and rm/n_heldout_<source>), rm/lambda, rm/accuracy, ..."""
    reward_model: RewardModel | None = None
    """The fine-tuned model of "full" and "lpft"."""
    trained_pairs: list[str] = field(default_factory=list)
    """Keys (rlhf.reward.incremental.pair_key) of the votes it trained on: where the next round's incremental LP-FT
    starts counting new votes."""
    tuned_heads: torch.Tensor | None = None
    """(H, D) "lpft" only, when asked (StrategyConfig.tuned_heads): bootstrap heads on `reward_model`'s own features,
    those it scores with, for PPO (`score_heads`); `heads` stay on the frozen base features (pair choice)."""

    @property
    def heldout_accuracy(self) -> float | None:
        return self.metrics.get("rm/heldout_accuracy")

    def score(self, prompts: Sequence[str], answers: Sequence[str]) -> torch.Tensor:
        """(N,) reward of each answer to its prompt."""
        if self.reward_model is not None:
            return score_with_reward_model(self.reward_model, self.extractor.tokenizer, prompts, answers)
        return (self.extractor.features(prompts, answers, self.feature).double() @ self.weight).float()  # (N,)

    def prob_prefers(self, prompts: Sequence[str], answers_a: Sequence[str], answers_b: Sequence[str]) -> torch.Tensor:
        """(N,) P(a preferred to b) = sigmoid(score(a) - score(b))."""
        return torch.sigmoid(self.score(prompts, answers_a) - self.score(prompts, answers_b))

    def disagreement(self, prompts: Sequence[str], answers_a: Sequence[str], answers_b: Sequence[str]) -> torch.Tensor:
        """(N,) spread (std) of the bootstrap heads' P(a > b): how little the votes so far pin this pair down."""
        fa = self.extractor.features(prompts, answers_a, self.feature)  # (N, D)
        fb = self.extractor.features(prompts, answers_b, self.feature)  # (N, D)
        return bt_head.ensemble_disagreement(self.heads, fa, fb).float()

    def ranks_right(self, pairs: Sequence[PairLike]) -> list[bool]:
        """For each pair, whether its chosen answer scores strictly higher."""
        prompts, chosen, rejected = _texts(pairs)
        return (self.score(prompts, chosen) > self.score(prompts, rejected)).tolist()

    def refuse_non_finite(self) -> None:
        """Raise rlhf.finite.NotFinite when a metric, the head, a bootstrap head or a fine-tuned weight is not
        finite."""
        tensors = ([("head", self.weight)] if self.weight is not None else []) + [("bootstrap heads", self.heads)]
        if self.tuned_heads is not None:
            tensors.append(("bootstrap heads on the fine-tuned features", self.tuned_heads))
        if self.reward_model is not None:
            tensors += list(self.reward_model.named_parameters())
        refuse_non_finite(f"the {self.strategy} reward model", self.metrics, tensors)

    def save(self, path: str | Path) -> Path:
        """A RewardModel folder (for PPO and RewardModel.from_pretrained) plus the bootstrap heads and settings;
        refused (NotFinite, nothing written) when anything in it is not finite.

        A head strategy's folder is the frozen backbone (its first L layers for a feature of layer L) with the head
        as v_head and the feature's pooling: it scores exactly as `score` does.
        """
        self.refuse_non_finite()
        model = self.reward_model if self.reward_model is not None else self.as_reward_model()
        path = model.save_pretrained(path, tokenizer=self.extractor.tokenizer)
        save_file({"heads": self.heads.float().contiguous()}, str(path / HEADS_FILE))
        if self.tuned_heads is not None:
            save_file({"heads": self.tuned_heads.float().contiguous()}, str(path / TUNED_HEADS_FILE))
        write_trained_pairs(path, self.trained_pairs)
        base = self.extractor.reward_model.info.get("base_model")
        (path / STRATEGY_FILE).write_text(json.dumps({"strategy": self.strategy, "feature": self.feature,
                                                      "base_model": base, "metrics": self.metrics},
                                                     indent=2, default=str))
        return path

    def as_reward_model(self) -> RewardModel:
        """The head strategy as a RewardModel: v_head = the head on the feature's layer and pooling (shared weights)."""
        backbone = self.extractor.reward_model.backbone
        pooling, layer = parse_feature(canonical_feature(self.feature, backbone.config.num_hidden_layers))
        v_head = nn.Linear(self.weight.shape[0], 1, bias=False)
        with torch.no_grad():
            v_head.weight.copy_(self.weight.reshape(1, -1).to(v_head.weight.dtype))
        return RewardModel(backbone, v_head, info={**self.extractor.reward_model.info, "strategy": self.strategy,
                                                   "feature": self.feature}, pooling=pooling, layer=layer)

    @classmethod
    def load(cls, path: str | Path, batch_size: int = 16, max_length: int = 512) -> "TrainedPreferenceModel":
        """Read a folder written by `save`; a head strategy scores with the folder's v_head (the same numbers)."""
        path = Path(path)
        saved = json.loads((path / STRATEGY_FILE).read_text())
        reward_model = RewardModel.from_pretrained(path)
        extractor = FeatureExtractor(reward_model, load_reward_tokenizer(None, path), batch_size, max_length)
        heads = load_file(str(path / HEADS_FILE))["heads"].double()
        if saved["strategy"] in FINETUNED:  # the heads were fitted on the frozen base model's features
            base = FeatureExtractor.from_model(saved["base_model"], batch_size, max_length)
            return cls("full", base, saved["feature"], None, heads, saved["metrics"], reward_model)
        weight = reward_model.v_head.weight.detach().double().reshape(-1)  # (D,)
        return cls(saved["strategy"], extractor, saved["feature"], weight, heads, saved["metrics"])


def pad_answers(tokenizer, prompts: Sequence[str], answers: Sequence[str], max_length: int = 512,
                side: str = "right") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, answer_mask), each (N, L): prompt + answer + EOS tokenised as the reward
    model's training data is, padded on `side`; answer_mask is 1 on the answer's tokens (EOS included)."""
    tokenized = tokenize_pairs(tokenizer, [PreferencePair(p, a, a) for p, a in zip(prompts, answers)], max_length)
    return pad_pair_rows(tokenized, tokenizer.pad_token_id, side, answers=("chosen",))


@torch.inference_mode()
def score_with_reward_model(model: RewardModel, tokenizer, prompts: Sequence[str], answers: Sequence[str],
                            batch_size: int = 16, max_length: int = 512) -> torch.Tensor:
    """(N,) RewardModel scores of prompt + answer + EOS, tokenised as the reward model's training data is."""
    model.eval()
    device = next(model.parameters()).device
    scores = []
    for start in range(0, len(prompts), batch_size):
        ids, mask, answer_mask = pad_answers(tokenizer, prompts[start:start + batch_size],
                                             answers[start:start + batch_size], max_length)  # (n, L) each
        output = model.forward_value(ids.to(device), mask.to(device), answer_mask.to(device))
        scores.append(output.scores.float().cpu())  # (n,)
    return torch.cat(scores)  # (N,)


def fit_feature_heads(train_chosen: torch.Tensor, train_rejected: torch.Tensor, strategy: str,
                      config: StrategyConfig, strengths: torch.Tensor | None = None,
                      pair_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(weight (D,), bootstrap heads (H, D), metrics) of a head strategy on training features (N, D) each;
    `strengths` (N,) of the votes (1 slightly, 2 much better; None: all 1) enter as votes.graded says, and each pair's
    loss is multiplied by `pair_weight` (N,) (votes.weighting; None: 1 each)."""
    diffs = train_chosen - train_rejected  # (N, D)
    if strengths is None:
        strengths = torch.ones(diffs.shape[0], dtype=torch.float64)
    margins, weights = graded_terms(strengths, config.votes.graded, config.votes.much_margin,
                                    config.votes.much_weight)  # (N,) each
    if pair_weight is not None:
        weights = weights * pair_weight.to(weights.dtype)  # (N,)
    fit = bt_head.fit_head(diffs, k=config.votes.cv_folds, seed=config.seed, weights=weights, margins=margins)
    if config.votes.n_heads > 0:
        heads = bt_head.fit_bootstrap_heads(diffs, fit.lam, config.votes.n_heads, seed=config.seed,
                                            weights=weights, margins=margins)  # (H, D)
    else:  # no disagreement wanted (the curve bench's single heads): the one head alone
        heads = fit.weight[None, :]  # (1, D)
    weight = heads.mean(0) if strategy == "ensemble" else fit.weight  # (D,)
    metrics = {"rm/lambda": fit.lam, "rm/accuracy": bt_head.pair_accuracy(weight, train_chosen, train_rejected)}
    return weight, heads, metrics


def vote_terms(strengths: torch.Tensor, pairs: Sequence[PairLike],
               config: StrategyConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(margins, weights), (N,) each, of the votes `pairs` in the Bradley-Terry loss: their strengths as votes.graded
    says (rlhf.losses.graded_terms), the weights times votes.weighting's per pair (1 each by majority)."""
    margins, weights = graded_terms(strengths, config.votes.graded, config.votes.much_margin,
                                    config.votes.much_weight)  # (N,) each
    return margins, weights * pair_weights(pairs).to(weights.dtype)


def fit_tuned_heads(reward_model: RewardModel, extractor: FeatureExtractor, train: Sequence[PairLike],
                    strengths: torch.Tensor, config: StrategyConfig, lam: float) -> torch.Tensor:
    """(H, D) bootstrap heads on the fine-tuned `reward_model`'s own pooled features of the votes `train` (what it
    scores with), with the probe's lambda, graded margins and pair weights (StrategyConfig.tuned_heads)."""
    own = FeatureExtractor(reward_model, extractor.tokenizer, extractor.batch_size, extractor.max_length)
    feature = f"{reward_model.pooling}@-1"  # its last layer's output: what its v_head reads
    prompts, chosen, rejected = _texts(train)
    diffs = own.features(prompts, chosen, feature) - own.features(prompts, rejected, feature)  # (N, D)
    margins, weights = vote_terms(strengths, train, config)
    return bt_head.fit_bootstrap_heads(diffs, lam, config.votes.n_heads, seed=config.seed, weights=weights,
                                       margins=margins)  # (H, D)


def finetune_under_head(extractor: FeatureExtractor, feature: str, weight: torch.Tensor, pairs: Sequence[PairLike],
                        strengths: torch.Tensor, config: StrategyConfig,
                        on_epoch: Callable[[int, float, RewardModel], None] | None = None) -> RewardModel:
    """LP-FT's second half: the head `weight` (D,) on `feature` exported as a RewardModel, then its top
    votes.finetune_layers decoder layers fine-tuned on the votes `pairs` (strengths (N,) entering as votes.graded
    says) with votes.finetune_lr and votes.finetune_epochs (rlhf.reward.lpft.finetune_top_layers)."""
    probe = TrainedPreferenceModel("head", extractor, feature, weight, weight[None, :]).as_reward_model()
    margins, weights = vote_terms(strengths, pairs, config)
    return finetune_top_layers(probe, extractor.tokenizer, pairs, margins, weights,
                               FinetuneSettings.from_config(config), on_epoch=on_epoch)


def incremental_start(config: StrategyConfig, base_model: str | None, feature: str) -> str | None:
    """The last round's LP-FT folder (config.reward.warm_start) to continue from, or None: votes.incremental off, no
    warm start, or one of another strategy, feature or base model, or saved without its trained pairs."""
    warm_start = config.reward.warm_start
    if not (config.votes.incremental and warm_start) or saved_strategy(warm_start) != "lpft":
        return None
    saved = json.loads((Path(warm_start) / STRATEGY_FILE).read_text(encoding="utf-8"))
    if saved.get("feature") != feature or str(saved.get("base_model")) != str(base_model):
        return None
    return warm_start if read_trained_pairs(warm_start) is not None else None


def continue_finetuning(warm_start: str, extractor: FeatureExtractor, train: Sequence[PairLike],
                        strengths: torch.Tensor, config: StrategyConfig,
                        on_epoch: Callable[[int, float, RewardModel], None] | None = None) -> tuple[RewardModel, dict]:
    """Incremental LP-FT: the LP-FT model at `warm_start` fine-tuned further (its top votes.finetune_layers layers,
    its head kept) on the votes of `train` it has not trained on plus a replay share of the others
    (rlhf.reward.incremental.replay_batch), votes.incremental_epochs passes. Returns the model and its metrics:
    rm/incremental, rm/n_new, rm/n_replay, rm/finetune_pairs (pairs x passes: the stage's cost)."""
    batch = replay_batch(train, read_trained_pairs(warm_start), config.votes.replay_share, config.seed)
    counts = {"rm/incremental": True, "rm/n_new": len(batch.new), "rm/n_replay": len(batch.replay),
              "rm/incremental_from": warm_start}
    warm = RewardModel.from_pretrained(warm_start)
    if not batch.new:  # nothing new to learn from: the last round's model as it is
        return warm.float().eval().requires_grad_(False), {**counts, "rm/finetune_pairs": 0}
    margins, weights = vote_terms(strengths[batch.positions], [train[i] for i in batch.positions], config)
    settings = replace(FinetuneSettings.from_config(config), epochs=config.votes.incremental_epochs)
    tuned = finetune_top_layers(warm, extractor.tokenizer, [train[i] for i in batch.positions], margins, weights,
                                settings, on_epoch=on_epoch)
    return tuned, {**counts, "rm/finetune_pairs": len(batch.positions) * settings.epochs}


def saved_strategy(path: str | Path) -> str | None:
    """The strategy that trained the reward model folder at `path` (one of STRATEGIES); None when the folder
    was not written by TrainedPreferenceModel.save (a reward model trained by `--train-reward`, say)."""
    strategy_file = Path(path) / STRATEGY_FILE
    if not strategy_file.is_file():
        return None
    return json.loads(strategy_file.read_text(encoding="utf-8")).get("strategy")


def score_heads(path: str | Path) -> tuple[torch.Tensor | None, str]:
    """(the bootstrap heads (H, D) float32 that score on the features the reward model folder at `path` scores with,
    "") or (None, why there are none): a "head" or "ensemble" folder's heads read its v_head's features, an "lpft"
    folder's tuned heads its fine-tuned ones (a "full" one's, and an "lpft" one's other heads, read the frozen base
    model's), and one head (votes.n_heads 0 or 1) has no spread."""
    strategy = saved_strategy(path)
    if strategy is None:
        return None, "no head strategy trained it (it holds no preference_strategy.json)"
    heads_file = Path(path) / (TUNED_HEADS_FILE if strategy == "lpft" else HEADS_FILE)
    if strategy in FINETUNED and not (strategy == "lpft" and heads_file.is_file()):
        hint = " (an lpft round fits heads on its own features when [ppo] reads them)" if strategy == "lpft" else ""
        return None, (f'its strategy "{strategy}" fine-tuned the decoder, and its bootstrap heads score the frozen '
                      f"base model's features, not those it scores with{hint}")
    if not heads_file.is_file():
        return None, f"it holds no {heads_file.name}"
    heads = load_file(str(heads_file))["heads"].float()  # (H, D)
    if heads.shape[0] < 2:
        return None, f"it holds {heads.shape[0]} head (votes.n_heads was 0 or 1)"
    return heads, ""


def scores_last_token(path: str | Path | None) -> bool:
    """Whether `path` is a reward model folder scoring the last token of the final output (what "full" trains:
    a head strategy's mean@L folder is no starting point for it)."""
    if not path or not (Path(path) / MARKER_FILE).is_file():
        return False
    marker = json.loads((Path(path) / MARKER_FILE).read_text(encoding="utf-8"))
    return marker.get("pooling", "last") == "last" and int(marker.get("layer", -1)) == -1


def train_strategy(name: str, pairs: Sequence[PairLike], base_model: str, config: StrategyConfig | None = None,
                   extractor: FeatureExtractor | None = None, on_progress: Callable[[dict], None] | None = None,
                   feature_cache: str | Path | None = None) -> TrainedPreferenceModel:
    """Train strategy `name` on the votes `pairs` from the frozen/initial model `base_model`; accuracy held out.

    `extractor` reuses an already loaded backbone (and its feature cache) across calls; `feature_cache`, a folder,
    keeps the features between runs (a round's: only new answers are computed); `on_progress` gets
    train_reward_model's metrics ("full") or each LP-FT epoch's mean loss ("lpft"). The metrics count the texts
    whose features were computed (rm/features_computed) and read from the folder (rm/features_reused).
    """
    config = config or StrategyConfig()
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, not {name!r}")
    train, heldout = split_pairs(pairs, config.reward.heldout_fraction)
    extractor = extractor or FeatureExtractor.from_model(base_model, config.batch_size, config.reward.max_length,
                                                         cache_folder=feature_cache)
    feature = canonical_feature(config.votes.feature, extractor.reward_model.backbone.config.num_hidden_layers)
    prompts, chosen, rejected = _texts(train)
    fc = extractor.features(prompts, chosen, feature)  # (N, D)
    fr = extractor.features(prompts, rejected, feature)  # (N, D)
    strengths = torch.tensor([pair_strength(p) for p in train], dtype=torch.float64)  # (N,)
    weight, heads, metrics = fit_feature_heads(fc, fr, name, config, strengths, pair_weights(train))
    reward_model = tuned_heads = None
    if name == "lpft":
        def report(epoch: int, loss: float, _) -> None:
            if on_progress is not None:
                on_progress({"rm/finetune_epoch": epoch, "rm/finetune_loss": loss})

        warm_start = incremental_start(config, extractor.reward_model.info.get("base_model"), feature)
        if warm_start is None:
            reward_model = finetune_under_head(extractor, feature, weight, train, strengths, config, on_epoch=report)
            metrics["rm/finetune_pairs"] = len(train) * config.votes.finetune_epochs
        else:
            reward_model, continued = continue_finetuning(warm_start, extractor, train, strengths, config, report)
            metrics.update(continued)
        weight = None
        if config.tuned_heads and config.votes.n_heads >= 2:
            tuned_heads = fit_tuned_heads(reward_model, extractor, train, strengths, config, metrics["rm/lambda"])
    if name == "full":
        warm_start = config.reward.warm_start if scores_last_token(config.reward.warm_start) else None
        reward_config = replace(config.reward, model=base_model, out_dir=None, heldout_fraction=0.0,
                                warm_start=warm_start)
        result = train_reward_model(list(train), reward_config, on_progress=on_progress)
        reward_model, weight = result.model, None
        metrics = {**result.metrics, "rm/lambda": metrics["rm/lambda"]}
    model = TrainedPreferenceModel(name, extractor, feature, weight, heads, reward_model=reward_model,
                                   trained_pairs=[pair_key(pair) for pair in train], tuned_heads=tuned_heads)
    model.metrics = {**metrics, "rm/strategy": name, "rm/feature": feature, "rm/n_train": len(train),
                     **heldout_accuracies(heldout, model.ranks_right(heldout) if heldout else [])}
    if heldout:
        prompts, chosen, rejected = _texts(heldout)
        model.metrics["rm/heldout_disagreement"] = float(model.disagreement(prompts, chosen, rejected).mean())
    model.metrics.update({"rm/features_computed": extractor.computed, "rm/features_reused": extractor.reused})
    return model
