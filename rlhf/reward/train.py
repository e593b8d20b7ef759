"""Training the reward model on preference pairs, and the `--train-reward` command.

One `accelerate.Accelerator` runs everything, so the same loop works on CPU (fp32), one GPU (bf16 mixed
precision) and under `accelerate launch` / `torchrun` (data parallel; only the main process saves). With
`engine = "fsdp2"` the model is sharded by torch's FSDP2 instead (rlhf.fsdp2) and accelerate keeps the loaders, the
optimiser, the autocast and the reductions.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from rlhf.distributed import make_accelerator
from rlhf.finite import refuse_non_finite
from rlhf.fsdp2 import gathered_state_dict, place_for_engine, prepare_for_engine
from rlhf.losses import PairSide, pairwise_loss
from rlhf.reward.config import RewardTrainConfig
from rlhf.reward.model import RewardModel, load_reward_model, load_reward_tokenizer
from rlhf.reward.data import (
    PAIR_SOURCES,
    PairCollator,
    PairLike,
    PreferenceDataError,
    pair_source,
    split_pairs,
    tokenize_pairs,
)

DEFAULT_CHECKPOINT_DIR = Path("data/checkpoints")


@dataclass
class RewardTrainResult:
    """What a training run produced."""

    metrics: dict[str, float]
    """Namespaced metrics: rm/loss, rm/accuracy, rm/chosen_mean, rm/rejected_mean (last epoch, training pairs),
    rm/heldout_accuracy, rm/heldout_loss, ... (held-out random sample pairs: pairs without a source count as such),
    rm/heldout_accuracy_versus and _chosen, rm/n_train, rm/n_heldout (and rm/n_heldout_<source>), rm/steps,
    rm/pairs_per_s."""
    heldout_accuracy: float | None
    """Share of held-out sample pairs whose chosen answer scores strictly higher; None when none was held out."""
    path: Path | None
    """Folder the model was saved to (None when `out_dir` was None)."""
    model: RewardModel | None = field(default=None, repr=False)
    """The trained model, unwrapped from accelerate, on the training device."""


def default_out_dir() -> Path:
    """data/checkpoints/reward-<timestamp>."""
    return DEFAULT_CHECKPOINT_DIR / f"reward-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def pair_metrics(loss: torch.Tensor, chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """[loss x B, correct pairs, sum of chosen scores, sum of rejected scores, B]: sums that add over batches."""
    n = chosen.shape[0]
    return torch.stack([
        loss.detach().float() * n,
        (chosen > rejected).float().sum(),
        chosen.detach().float().sum(),
        rejected.detach().float().sum(),
        torch.tensor(float(n), device=chosen.device),
    ])  # (5,)


def sums_to_metrics(sums: torch.Tensor, prefix: str) -> dict[str, float]:
    """The summed [loss x B, correct, chosen, rejected, B] as means: loss, accuracy, chosen_mean, rejected_mean."""
    loss_sum, correct, chosen_sum, rejected_sum, n = (float(x) for x in sums)
    n = max(n, 1.0)
    return {f"{prefix}loss": loss_sum / n, f"{prefix}accuracy": correct / n,
            f"{prefix}chosen_mean": chosen_sum / n, f"{prefix}rejected_mean": rejected_sum / n}


def batch_loss(model, batch: dict[str, torch.Tensor], config: RewardTrainConfig):
    """One forward pass over the chosen and rejected rows, then the pairwise loss.

    With a shared-prompt batch the values cover the answers only; since both answers of a pair follow the
    same prompt, the divergence span and the last tokens are the same positions as in whole sequences.
    Returns (loss, chosen scores (B,), rejected scores (B,)).
    """
    output = model(**batch)
    n_pairs = batch["input_ids"].shape[0] // 2
    ids, mask, values = batch["input_ids"], batch["attention_mask"], output.values  # (2B, L) each
    chosen = PairSide(values[:n_pairs], ids[:n_pairs], mask[:n_pairs])  # rows [0, B)
    rejected = PairSide(values[n_pairs:], ids[n_pairs:], mask[n_pairs:])  # rows [B, 2B)
    return pairwise_loss(chosen, rejected, form=config.loss_form, margin=config.margin, center_coef=config.center_coef)


def evaluate_by_source(model, loaders: dict, accelerator, config: RewardTrainConfig) -> dict[str, float]:
    """`evaluate` on each source's held-out loader: rm/heldout_* of the sample pairs, rm/heldout_accuracy_<source> of
    the others (see rlhf.reward.data.heldout_accuracies)."""
    metrics = {}
    for source, loader in loaders.items():
        measured = evaluate(model, loader, accelerator, config)
        if source == "sample":
            metrics.update(measured)
        else:
            metrics[f"rm/heldout_accuracy_{source}"] = measured["rm/heldout_accuracy"]
    return metrics


@torch.no_grad()
def evaluate(model, loader, accelerator, config: RewardTrainConfig) -> dict[str, float]:
    """Held-out loss, accuracy and mean scores over `loader`, over all processes."""
    model.eval()
    loss_sums = torch.zeros(2, device=accelerator.device)  # [loss x B, B] of this process
    chosen_all, rejected_all = [], []
    for batch in loader:
        with accelerator.autocast():  # (accelerate's DDP wrapper autocasts too; FSDP2's model is not wrapped)
            loss, chosen, rejected = batch_loss(model, batch, config)
        n = chosen.shape[0]
        loss_sums += torch.stack([loss.detach().float() * n, loss.new_tensor(float(n), dtype=torch.float32)])
        # gather_for_metrics drops the pairs repeated to give every process equal batches
        chosen, rejected = accelerator.gather_for_metrics((chosen.float(), rejected.float()))  # (n,), (n,)
        chosen_all.append(chosen)
        rejected_all.append(rejected)
    model.train()
    chosen, rejected = torch.cat(chosen_all), torch.cat(rejected_all)  # (N,), (N,)
    loss_sum, n_local = accelerator.reduce(loss_sums, reduction="sum")
    return {
        "rm/heldout_loss": float(loss_sum / n_local.clamp(min=1)),
        "rm/heldout_accuracy": float((chosen > rejected).float().mean()),
        "rm/heldout_chosen_mean": float(chosen.mean()),
        "rm/heldout_rejected_mean": float(rejected.mean()),
    }


@dataclass
class PreparedRun:
    """A reward-model training run ready to start (`prepare_run`), and how far it has come."""

    config: RewardTrainConfig
    """The run's settings."""
    accelerator: Any
    """The one accelerate.Accelerator everything went through."""
    model: Any
    """The RewardModel as accelerate prepared it (wrapped under DDP), or sharded by FSDP2 (engine "fsdp2")."""
    tokenizer: Any
    """The tokenizer saved with the model."""
    optimizer: Any
    """AdamW over the trainable weights, prepared."""
    scheduler: Any
    """The learning-rate schedule over `total_steps`."""
    train_loader: DataLoader
    """Batches of training pairs (PairCollator), shuffled with the run's seed, prepared."""
    heldout_loaders: dict[str, DataLoader]
    """One loader of held-out pairs per source that has any (PAIR_SOURCES), prepared."""
    total_steps: int
    """Optimizer steps of the whole run (per process): epochs x steps per epoch, at most max_steps."""
    step: int = 0
    """Optimizer steps taken so far."""
    pairs_seen: int = 0
    """Training pairs this process has run forward so far."""
    train_seconds: float = 0.0
    """Time spent in the optimizer steps' windows so far (not in held-out evaluation)."""


def load_starting_model(config: RewardTrainConfig) -> tuple[RewardModel, Any]:
    """(model, tokenizer) a run starts from (the warm start, else `config.model`), set up for training: frozen
    backbone and gradient checkpointing as the config says, and the provenance the saved folder records."""
    tokenizer = load_reward_tokenizer(config.warm_start, config.model)
    model = load_reward_model(config.warm_start, config.model)
    model.info.setdefault("base_model", config.model)
    model.info["warm_start"] = config.warm_start
    if config.freeze_backbone:
        model.freeze_backbone()
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model, tokenizer


def pair_loaders(tokenizer, train_pairs: Sequence[PairLike], heldout_groups: dict[str, list],
                 config: RewardTrainConfig) -> tuple[DataLoader, dict[str, DataLoader]]:
    """The shuffled loader of training pairs and one held-out loader per source with pairs, tokenised and
    batched alike (each prompt once for both answers with share_prompt, which gradient checkpointing and FSDP2 turn
    off)."""
    # checkpointing drops the cache; FSDP2 frees a layer's gathered weights after its backward, which the prompt's
    # pass through the same layer still needs ("setStorage ... out of bounds for storage of size 0")
    share_prompt = config.share_prompt and not config.gradient_checkpointing and config.engine != "fsdp2"
    collate = PairCollator(tokenizer.pad_token_id, share_prompt=share_prompt)
    train_loader = DataLoader(
        tokenize_pairs(tokenizer, train_pairs, config.max_length), batch_size=config.batch_size, shuffle=True,
        collate_fn=collate, generator=torch.Generator().manual_seed(config.seed),
    )
    heldout_loaders = {
        source: DataLoader(tokenize_pairs(tokenizer, group, config.max_length), batch_size=config.eval_batch_size,
                           shuffle=False, collate_fn=collate)
        for source, group in heldout_groups.items() if group
    }
    return train_loader, heldout_loaders


def prepare_run(train_pairs: Sequence[PairLike], heldout_groups: dict[str, list],
                config: RewardTrainConfig) -> PreparedRun:
    """Seed, load the starting model, build the loaders, the optimizer and the schedule, all through accelerate."""
    from accelerate.utils import set_seed
    from transformers import get_scheduler

    accelerator = make_accelerator(config.mixed_precision)
    set_seed(config.seed)
    model, tokenizer = load_starting_model(config)
    train_loader, heldout_loaders = pair_loaders(tokenizer, train_pairs, heldout_groups, config)
    model = place_for_engine(model, config.engine, accelerator.device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    # the fused kernel: one pass over the weights per step (on CPU about 10x faster than foreach, no big temporaries);
    # FSDP2's shards are DTensors, which it does not take
    optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=config.weight_decay,
                                  fused=accelerator.device.type in ("cpu", "cuda") and config.engine != "fsdp2")
    model, optimizer, train_loader, *prepared = prepare_for_engine(
        accelerator, config.engine, model, optimizer, train_loader, *heldout_loaders.values())
    # derived step counts, in one place: optimizer steps per epoch and over the run (per process)
    steps_per_epoch = math.ceil(len(train_loader) / config.grad_accum)
    total_steps = steps_per_epoch * config.epochs
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    scheduler = get_scheduler(
        "constant_with_warmup" if config.lr_schedule == "constant" else config.lr_schedule,
        optimizer, num_warmup_steps=int(config.warmup_ratio * total_steps), num_training_steps=total_steps,
    )
    return PreparedRun(config=config, accelerator=accelerator, model=model, tokenizer=tokenizer, optimizer=optimizer,
                       scheduler=scheduler, train_loader=train_loader,
                       heldout_loaders=dict(zip(heldout_loaders, prepared)), total_steps=total_steps)


def train_epoch(run: PreparedRun, epoch: int, metrics: dict[str, float], bar,
                report: Callable[[dict[str, float]], None]) -> dict[str, float]:
    """One pass over the training pairs, an optimizer step every grad_accum batches (and at the epoch's end),
    stopping at run.total_steps. Returns the metrics of the last step (rm/loss, rm/accuracy, ... over the epoch so
    far; `metrics` unchanged when no step was taken), which `report` gets after every step."""
    config, accelerator, model = run.config, run.accelerator, run.model
    epoch_sums = torch.zeros(5, device=accelerator.device)
    window_start = time.perf_counter()
    for micro_step, batch in enumerate(run.train_loader):
        window = micro_step // config.grad_accum
        window_size = min(config.grad_accum, len(run.train_loader) - window * config.grad_accum)
        is_update = (micro_step + 1) % config.grad_accum == 0 or micro_step + 1 == len(run.train_loader)
        # gradients of the passes before the last one of a window stay local (no all-reduce)
        sync = contextlib.nullcontext() if is_update else accelerator.no_sync(model)
        with sync:
            with accelerator.autocast():
                loss, chosen, rejected = batch_loss(model, batch, config)
            accelerator.backward(loss / window_size)
        epoch_sums += pair_metrics(loss, chosen, rejected)
        run.pairs_seen += chosen.shape[0]
        if not is_update:
            continue
        if config.max_grad_norm > 0:
            accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        run.step += 1
        metrics = sums_to_metrics(accelerator.reduce(epoch_sums, reduction="sum"), "rm/")
        run.train_seconds += time.perf_counter() - window_start
        window_start = time.perf_counter()
        metrics.update({"rm/step": run.step, "rm/total_steps": run.total_steps, "rm/epoch": epoch + 1,
                        "rm/lr": run.scheduler.get_last_lr()[0]})
        bar.update(1)
        bar.set_postfix(loss=f"{metrics['rm/loss']:.3f}", acc=f"{metrics['rm/accuracy']:.2f}")
        report(metrics)
        if run.step >= run.total_steps:
            break
    return metrics


def train_epochs(run: PreparedRun, report: Callable[[dict[str, float]], None]) -> dict[str, float]:
    """Every epoch (`train_epoch`), each followed by the held-out evaluation; the last metrics."""
    config, accelerator = run.config, run.accelerator
    metrics: dict[str, float] = {}
    bar = tqdm(total=run.total_steps, desc="reward model", unit="step", dynamic_ncols=True,
               disable=not (config.show_progress and accelerator.is_local_main_process))
    run.model.train()
    for epoch in range(config.epochs):
        if run.step >= run.total_steps:
            break
        metrics = train_epoch(run, epoch, metrics, bar, report)
        if run.heldout_loaders:
            metrics.update(evaluate_by_source(run.model, run.heldout_loaders, accelerator, config))
            report(metrics)
    bar.close()
    return metrics


def run_totals(run: PreparedRun, n_train: int, n_heldout: int, heldout_groups: dict[str, list]) -> dict[str, float]:
    """The run's counts and speed: rm/n_train, rm/n_heldout (and per source), rm/steps, rm/pairs_per_s (over all
    processes), time/rm_train_s."""
    return {
        "rm/n_train": n_train,
        "rm/n_heldout": n_heldout,
        **{f"rm/n_heldout_{source}": len(group) for source, group in heldout_groups.items()},
        "rm/steps": run.step,
        "rm/pairs_per_s": run.pairs_seen * run.accelerator.num_processes / max(run.train_seconds, 1e-9),
        "time/rm_train_s": run.train_seconds,
    }


def unsharded_copy(run: PreparedRun, state_dict: dict[str, torch.Tensor]) -> RewardModel:
    """A plain RewardModel holding `state_dict` (the sharded model's whole weights) and its info, on the training
    device: what a run under FSDP2 returns, so that scoring afterwards needs no collective."""
    model, _ = load_starting_model(run.config)
    model.load_state_dict(state_dict)
    model.info = run.model.info
    return model.to(run.accelerator.device)


def save_trained(run: PreparedRun, metrics: dict) -> tuple[RewardModel, Path | None]:
    """The trained model unwrapped, its settings and metrics recorded in its info, saved to config.out_dir by the
    main process (every process takes part in gathering the weights); (model, folder or None)."""
    config, accelerator = run.config, run.accelerator
    accelerator.wait_for_everyone()
    state_dict = None
    if config.engine == "fsdp2":  # the whole weights on every process, in a model the caller can score with alone
        state_dict = gathered_state_dict(accelerator, config.engine, run.model)
        unwrapped = unsharded_copy(run, state_dict)
    else:
        unwrapped = accelerator.unwrap_model(run.model)
    unwrapped.info["training"] = {"config": asdict(config), "metrics": metrics}
    refuse_non_finite("the reward model", metrics, unwrapped.named_parameters())  # on every process: none saves
    if config.out_dir is None:
        return unwrapped, None
    path = Path(config.out_dir)
    if state_dict is None:  # every process takes part: ZeRO-3 / FSDP under accelerate gather the shards
        state_dict = gathered_state_dict(accelerator, config.engine, run.model)
    if accelerator.is_main_process:
        unwrapped.save_pretrained(path, tokenizer=run.tokenizer, state_dict=state_dict)
    accelerator.wait_for_everyone()
    return unwrapped, path


def train_reward_model(
    pairs: Sequence[PairLike],
    config: RewardTrainConfig,
    on_progress: Callable[[dict[str, float]], None] | None = None,
) -> RewardTrainResult:
    """Split `pairs`, train a reward model on the training part, measure the held-out part, save.

    `on_progress(metrics)` is called on the main process after every optimizer step (rm/loss, rm/accuracy,
    rm/chosen_mean, rm/rejected_mean over the epoch so far, rm/step, rm/total_steps, rm/epoch, rm/lr) and
    after each held-out evaluation. Raises PreferenceDataError when the data cannot be trained on.
    """
    if len(pairs) < config.min_pairs:
        raise PreferenceDataError(
            f"Only {len(pairs)} preference pairs; training the reward model needs at least {config.min_pairs}. "
            "Collect more votes (ties, 'both bad' and skips do not count), or pass a larger --data file."
        )
    train_pairs, heldout_pairs = split_pairs(pairs, config.heldout_fraction)
    heldout_groups = {source: [pair for pair in heldout_pairs if pair_source(pair) == source]
                      for source in PAIR_SOURCES}
    run = prepare_run(train_pairs, heldout_groups, config)

    def report(metrics: dict[str, float]) -> None:
        if on_progress is not None and run.accelerator.is_main_process:
            on_progress(dict(metrics))

    metrics = train_epochs(run, report)
    metrics.update(run_totals(run, len(train_pairs), len(heldout_pairs), heldout_groups))
    for source in PAIR_SOURCES:  # None where nothing of a source was held out, as heldout_accuracies reports it
        metrics.setdefault("rm/heldout_accuracy" if source == "sample" else f"rm/heldout_accuracy_{source}", None)
    model, path = save_trained(run, metrics)
    return RewardTrainResult(metrics=metrics, heldout_accuracy=metrics["rm/heldout_accuracy"], path=path, model=model)
