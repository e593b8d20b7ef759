"""Supervised fine-tuning on demonstrations: the first stage, before the reward model and PPO (docs/design.md, "The
maths").

Cross-entropy on the answer tokens only: prompt tokens and padding carry the label -100, so the model learns to
write answers, not to reproduce prompts. The prompt is encoded exactly as generation encodes it (chat template with
generation prompt, `rlhf.generate.encode_prompt`) and the answer ends with EOS, so the model also learns to stop.
The output folder becomes the reference and the starting actor: the `--sft` command (loop.stages.sft_on_store)
records it as a round-0 policy, and the store's `first_policy()` / `latest_policy()` then return it (the last recorded
policy of round 0).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from rlhf.distributed import make_accelerator
from rlhf.finite import refuse_non_finite
from rlhf.fsdp2 import gathered_state_dict, place_for_engine, prepare_for_engine
from rlhf.folders import written_atomically
from rlhf.generate import encode_prompt, pad_sequences
from rlhf.sft.config import SFTConfig

IGNORE_INDEX = -100
"""Label of positions that carry no loss (prompt and padding), as torch's cross_entropy expects."""

SFTProgress = Callable[[int, int, float], None]
"""Called as on_progress(step, total_steps, loss) after each optimizer step."""


class SFTDataError(ValueError):
    """Demonstration data that cannot be used; the message names the file and line and says what to fix."""


@dataclass
class SFTResult:
    """What an SFT run produced."""

    out_dir: Path
    """Folder holding the fine-tuned model (safetensors) and its tokenizer."""
    steps: int
    """Optimizer steps taken."""
    examples: int
    """Demonstrations trained on."""
    truncated: int
    """Examples cut to max_length."""
    losses: list[float] = field(default_factory=list)
    """Mean answer-token loss of each optimizer step."""
    seconds: float = 0.0
    """Wall time of the training loop and the save."""

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else float("nan")


def sft_examples_from_jsonl(path: str | os.PathLike) -> list[tuple[str, str]]:
    """(prompt, response) pairs from a JSON Lines file with one {"prompt": ..., "response": ...} object a line.

    Blank lines are allowed; anything else that is not such an object raises SFTDataError naming file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise SFTDataError(f"{path}: no such file. Pass a JSONL file of {{\"prompt\": ..., \"response\": ...}} lines.")
    examples = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise SFTDataError(f"{where}: not valid JSON ({error.msg} at column {error.colno}).") from None
            if not isinstance(record, dict):
                raise SFTDataError(f"{where}: expected a JSON object with \"prompt\" and \"response\", got "
                                   f"{type(record).__name__}.")
            for key in ("prompt", "response"):
                value = record.get(key)
                if not isinstance(value, str) or not value.strip():
                    found = ", ".join(sorted(record)) or "no keys"
                    raise SFTDataError(f"{where}: \"{key}\" must be a non-empty string (the object has: {found}).")
            examples.append((record["prompt"], record["response"]))
    if not examples:
        raise SFTDataError(f"{path}: holds no examples. "
                           "Write one {\"prompt\": ..., \"response\": ...} object a line.")
    return examples


def encode_example(tokenizer, prompt: str, response: str, max_length: int) -> tuple[list[int], list[int], bool]:
    """Token ids and labels of one demonstration (labels -100 on the prompt), and whether it was truncated.

    The answer is tokenized on its own and appended, so the prompt's tokens are exactly those generation sees.
    Too long: the prompt keeps its last max_length // 2 tokens at most (its end is what the answer follows),
    then the answer is cut to fit.
    """
    prompt_ids = encode_prompt(tokenizer, prompt)
    answer_ids = tokenizer(response.strip(), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    truncated = len(prompt_ids) + len(answer_ids) > max_length
    if truncated:
        prompt_ids = prompt_ids[-min(len(prompt_ids), max_length // 2):]
        answer_ids = answer_ids[:max_length - len(prompt_ids)]
    return prompt_ids + answer_ids, [IGNORE_INDEX] * len(prompt_ids) + answer_ids, truncated


def collate_right_padded(encoded: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad (ids, labels) lists into input_ids, attention_mask, labels, each (B, L); labels -100 on padding."""
    input_ids, attention_mask = pad_sequences([ids for ids, _ in encoded], pad_id, side="right")  # (B, L) each
    labels, _ = pad_sequences([row_labels for _, row_labels in encoded], IGNORE_INDEX, side="right")  # (B, L)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def answer_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the tokens whose label is not -100; the logits at t predict the token at t + 1."""
    shifted_logits = logits[:, :-1, :].float()  # (B, L-1, V)
    shifted_labels = labels[:, 1:]  # (B, L-1)
    return F.cross_entropy(shifted_logits.reshape(-1, shifted_logits.shape[-1]), shifted_labels.reshape(-1),
                           ignore_index=IGNORE_INDEX)


def linear_warmup_decay(step: int, total: int, warmup: int) -> float:
    """Learning-rate factor: 0 -> 1 over `warmup` steps, then 1 -> 0 linearly at `total`."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    return max(0.0, (total - step) / max(1, total - warmup))


def save_model_atomically(model, tokenizer, out_dir: Path, state_dict: dict | None = None) -> None:
    """save_pretrained (safetensors) + tokenizer into `out_dir` through a staging folder (rlhf.folders): no
    half-written folder under its name."""
    with written_atomically(out_dir) as staging:
        model.save_pretrained(staging, safe_serialization=True, state_dict=state_dict)
        tokenizer.save_pretrained(staging)


@dataclass
class SFTRun:
    """An SFT run ready to start (`prepare_sft_run`)."""

    accelerator: Any
    """The one accelerate.Accelerator everything went through."""
    model: Any
    """The causal LM as accelerate prepared it, its KV cache off while training."""
    tokenizer: Any
    """The model's tokenizer, saved with it."""
    optimizer: Any
    """AdamW over every weight, prepared."""
    scheduler: Any
    """Linear warmup then decay, stepped once per optimizer step (not prepared: see `prepare_sft_run`)."""
    loader: Any
    """Shuffled batches of encoded demonstrations, prepared."""
    total_steps: int
    """Optimizer steps of the whole run."""
    truncated: int
    """Demonstrations cut to the maximum length."""
    engine: str = "ddp"
    """SFTConfig.engine: "fsdp2" when the model is sharded (rlhf.fsdp2), not prepared by accelerate."""


def prepare_sft_run(model_path: str | os.PathLike, examples: list[tuple[str, str]], config: SFTConfig) -> SFTRun:
    """Seed, load the model and tokenizer, encode the demonstrations (cut to the model's context if it is shorter
    than max_length), and build the loader, the optimizer and the schedule, all through accelerate."""
    from accelerate.utils import set_seed

    from rlhf.models import context_length, load_causal_lm, load_tokenizer, tell_once

    accelerator = make_accelerator("auto", gradient_accumulation_steps=config.gradient_accumulation_steps)
    set_seed(config.seed)
    tokenizer = load_tokenizer(model_path)
    model = load_causal_lm(model_path, tokenizer=tokenizer)
    model.config.use_cache = False  # no KV cache while training; restored before saving
    max_length = min(config.max_length, context_length(model.config) or config.max_length)
    if max_length < config.max_length:
        tell_once(f"SFT: examples are cut to the model's context of {max_length} tokens, not max_length = "
                  f"{config.max_length}.")

    encoded = [encode_example(tokenizer, p, r, max_length) for p, r in examples]
    truncated = sum(cut for _, _, cut in encoded)
    if truncated:
        accelerator.print(f"SFT: {truncated} of {len(encoded)} examples cut to max_length={max_length} tokens.")
    loader = torch.utils.data.DataLoader(
        [(ids, labels) for ids, labels, _ in encoded], batch_size=config.batch_size, shuffle=True,
        collate_fn=lambda items: collate_right_padded(items, tokenizer.pad_token_id),
        generator=torch.Generator().manual_seed(config.seed),
    )
    model = place_for_engine(model, config.engine, accelerator.device)  # FSDP2: sharded, before the optimiser
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    steps_per_epoch = math.ceil(len(loader) / accelerator.num_processes / config.gradient_accumulation_steps)
    total_steps = max(1, steps_per_epoch * config.epochs)
    warmup = int(config.warmup_ratio * total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: linear_warmup_decay(s, total_steps, warmup))
    # The scheduler stays unprepared and steps once per optimizer step: accelerate's wrapper would step it once
    # per process, for schedules counted in single-process steps.
    model, optimizer, loader = prepare_for_engine(accelerator, config.engine, model, optimizer, loader)
    return SFTRun(accelerator=accelerator, model=model, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler,
                  loader=loader, total_steps=total_steps, truncated=truncated, engine=config.engine)


def train_sft_epochs(run: SFTRun, config: SFTConfig, on_progress: SFTProgress | None = None,
                     show_bar: bool = True) -> list[float]:
    """Every epoch over the demonstrations, gradients accumulated over gradient_accumulation_steps batches; the mean
    answer-token loss of each optimizer step (over all processes), which `on_progress` gets after each step."""
    accelerator, model, optimizer = run.accelerator, run.model, run.optimizer
    losses: list[float] = []
    window: list[float] = []  # losses of the micro-batches of the current optimizer step
    bar = tqdm(total=run.total_steps, desc="SFT", unit="step", disable=not (show_bar and accelerator.is_main_process))
    model.train()
    for _epoch in range(config.epochs):
        for batch in run.loader:
            with accelerator.accumulate(model):
                with accelerator.autocast():  # (accelerate's DDP wrapper autocasts too; FSDP2's model is not wrapped)
                    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                    loss = answer_token_loss(logits, batch["labels"])  # (B, L, V) logits -> scalar
                accelerator.backward(loss)
                window.append(accelerator.reduce(loss.detach(), reduction="mean").item())
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                run.scheduler.step()
                losses.append(sum(window) / len(window))
                window.clear()
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
                if on_progress is not None:
                    on_progress(len(losses), run.total_steps, losses[-1])
    bar.close()
    return losses


def save_sft_model(run: SFTRun, out_dir: Path) -> None:
    """The trained model, its KV cache back on, and the tokenizer saved to `out_dir` by the main process (every
    process takes part in gathering the weights)."""
    accelerator, engine = run.accelerator, run.engine
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(run.model)
    unwrapped.config.use_cache = True
    state_dict = gathered_state_dict(accelerator, engine, run.model)  # every process: ZeRO-3 / FSDP gather the shards
    if engine == "fsdp2":  # save_pretrained drops a tied lm_head only when it is the embedding's own tensor
        from rlhf.fsdp2 import tied_aliases

        state_dict = {key: value for key, value in state_dict.items() if key not in tied_aliases(unwrapped)}
    # on every process, so that none saves
    refuse_non_finite("the SFT model", named_tensors=state_dict.items() if engine == "fsdp2" else
                      unwrapped.named_parameters())
    if accelerator.is_main_process:
        save_model_atomically(unwrapped, run.tokenizer, out_dir, state_dict=state_dict)
    accelerator.wait_for_everyone()


def train_sft(
    model_path: str | os.PathLike,
    examples: list[tuple[str, str]],
    config: SFTConfig | None = None,
    out_dir: str | os.PathLike = "data/checkpoints/sft",
    on_progress: SFTProgress | None = None,
    show_bar: bool = True,
) -> SFTResult:
    """Fine-tune the causal LM at `model_path` on (prompt, response) pairs and save it to `out_dir`.

    Runs through one accelerate.Accelerator (bf16 autocast where the hardware has it, else fp32), so it works the same
    under `accelerate launch` or `torchrun`; only the main process writes the folder.
    """
    config = config or SFTConfig()
    if not examples:
        raise SFTDataError("no demonstrations to train on")
    started = time.perf_counter()
    run = prepare_sft_run(model_path, examples, config)
    losses = train_sft_epochs(run, config, on_progress, show_bar)
    out_dir = Path(out_dir)
    save_sft_model(run, out_dir)
    return SFTResult(out_dir=out_dir, steps=len(losses), examples=len(examples), truncated=run.truncated,
                     losses=losses, seconds=time.perf_counter() - started)
