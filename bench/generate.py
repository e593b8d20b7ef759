"""Tokens per second of our generation path against plain `model.generate`, side by side in one run.

    python bench/generate.py                     # batch 1, 8, 16 x 64, 256 new tokens x fp32, bf16; one thread
    python bench/generate.py --quick             # batch 16, 64 new tokens, fp32 only
    python bench/generate.py --quick --per-prompt 2 --ppo   # as pairs are made (2 answers a prompt), and PPO's rollouts
    python bench/generate.py --batch-sizes 16 --new-tokens 64 --dtypes fp32 bf16 --threads 2 --repeats 3

Ours is `rlhf.generate.generate_answers` (one answer a prompt, the whole batch in one call), whatever is inside it
today. Plain is what that path did before rlhf.decode: one call of transformers' `generate` with our sampling settings
only (`plain_generate`) on the same left-padded prompts, with the same sampling ([sampling]'s defaults: temperature 0.7,
top-p 0.95, repetition penalty 1.1 on the answer's tokens) and the same seed. Both count the generated tokens up to
and including each answer's first EOS, over the wall time of the call. Prompts are bench/bench_prompts.py's, the
default model's chat template applied.

Each cell of the grid runs once on each side to warm up, then --repeats measured calls a side (alternating which
side goes first), and keeps each side's best. bf16 is the model cast with `.to(torch.bfloat16)`; where the hardware
would emulate bf16 (bench/machine.py) the default grid leaves it out and says why, `--dtypes bf16` is refused, and
`--allow-emulated-bf16` runs it anyway. Prints the machine, one table row per cell, then ONE JSON line with every
cell, the machine and `speedup_b16_t64`: ours over plain at batch 16, 64 new tokens, the default precision
(`rlhf.models.default_dtype`: bf16 on a GPU or a CPU with bf16 arithmetic, else fp32; when that precision is not in
the grid, the fp32 cell, as `speedup_b16_t64_dtype` says).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere: the repository root first

import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from bench.bench_prompts import PROMPTS
from bench.machine import add_bf16_flag, check_bf16, describe_machine, machine_line
from rlhf.generate import (
    encode_prompt,
    end_tokens,
    eos_token_ids,
    generate_answers,
    pad_sequences,
    response_mask_until_eos,
)
from rlhf.models import (
    default_dtype,
    load_causal_lm,
    load_tokenizer,
    resolve_model_path,
)
from rlhf.ppo.config import PPOConfig
from rlhf.ppo.experience import generate_responses
from rlhf.sampling import Sampling

DTYPE_NAMES = ("fp32", "bf16")


def plain_generate(model, ids, mask, processors=None, **settings):
    """transformers' own `generate` with these settings and nothing from the model's generation_config.json (blanked
    for the call, since transformers fills every unset field from it), top-k off unless given."""
    from transformers import GenerationConfig

    shipped, model.generation_config = model.generation_config, GenerationConfig()
    try:
        return model.generate(input_ids=ids, attention_mask=mask, logits_processor=processors,
                              generation_config=GenerationConfig(**{"top_k": 0, **settings}))
    finally:
        model.generation_config = shipped


def cell_figures(batch_size: int, new_tokens: int, dtype: str, ours: tuple[int, float], plain: tuple[int, float]) -> dict:
    """One cell of the grid from (tokens, seconds) of each side: tokens/s of each and the speed-up ours/plain."""
    ours_rate = ours[0] / ours[1] if ours[1] > 0 else 0.0
    plain_rate = plain[0] / plain[1] if plain[1] > 0 else 0.0
    return {
        "batch_size": batch_size, "new_tokens": new_tokens, "dtype": dtype,
        "ours_tokens": ours[0], "ours_s": round(ours[1], 3), "ours_tokens_per_s": round(ours_rate, 2),
        "plain_tokens": plain[0], "plain_s": round(plain[1], 3), "plain_tokens_per_s": round(plain_rate, 2),
        "speedup": round(ours_rate / plain_rate, 3) if plain_rate > 0 else None,
    }


TABLE_HEADER = f"{'batch':>5} {'new tok':>7} {'dtype':>5} {'ours tok/s':>11} {'plain tok/s':>12} {'speed-up':>9}"


def table_row(cell: dict) -> str:
    speedup = "-" if cell["speedup"] is None else f"{cell['speedup']:.2f}x"
    return (f"{cell['batch_size']:>5} {cell['new_tokens']:>7} {cell['dtype']:>5} {cell['ours_tokens_per_s']:>11.1f} "
            f"{cell['plain_tokens_per_s']:>12.1f} {speedup:>9}")


def headline(cells: list[dict], default_dtype: str) -> tuple[float | None, str | None]:
    """ours/plain at batch 16 and 64 new tokens in the default precision (the fp32 cell when that is not measured),
    and the precision it comes from."""
    at = {cell["dtype"]: cell for cell in cells if (cell["batch_size"], cell["new_tokens"]) == (16, 64)}
    for dtype in (default_dtype, "fp32"):
        if dtype in at:
            return at[dtype]["speedup"], dtype
    return None, None


def summarize(cells: list[dict], machine: dict, default_dtype: str, settings: dict, skipped: list[str]) -> dict:
    """The final JSON line."""
    speedup, dtype = headline(cells, default_dtype)
    return {"bench": "generate", **settings, "default_dtype": default_dtype, "speedup_b16_t64": speedup,
            "speedup_b16_t64_dtype": dtype, "cells": cells, "skipped": skipped, "machine": machine}


def prompts_for(batch_size: int, per_prompt: int = 1) -> list[str]:
    """batch_size rows: batch_size // per_prompt prompts, each `per_prompt` times in a row."""
    return [PROMPTS[(i // per_prompt) % len(PROMPTS)] for i in range(batch_size)]


def run_ours(model, tokenizer, prompts: list[str], new_tokens: int, seed: int, per_prompt: int = 1) -> tuple[int, float]:
    """(tokens up to and including each first EOS, seconds) of one `generate_answers` call; with per_prompt > 1,
    `per_prompt` answers to each distinct prompt (as pairs are made), not the repeated rows."""
    sampling = Sampling(max_new_tokens=new_tokens)
    distinct = prompts[::per_prompt]
    started = time.perf_counter()
    result = generate_answers(model, tokenizer, distinct, n_per_prompt=per_prompt, sampling=sampling, seed=seed,
                              batch_size=len(prompts))
    seconds = time.perf_counter() - started
    # n_tokens leaves the EOS out; a "stop" answer wrote one more token
    return sum(a.n_tokens + (a.finish_reason == "stop") for row in result.answers for a in row), seconds


def run_plain(model, tokenizer, prompts: list[str], new_tokens: int, seed: int, per_prompt: int = 1) -> tuple[int, float]:
    """(tokens up to and including each first EOS, seconds) of one plain `generate` call: our path before rlhf.decode."""
    sampling = Sampling()
    eos_ids = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    device = next(model.parameters()).device
    ids, mask = pad_sequences([encode_prompt(tokenizer, p) for p in prompts], pad_id)  # (B, P) left-padded
    ids, mask = ids.to(device), mask.to(device)
    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(sampling.repetition_penalty,
                                                                       prompt_ignore_length=ids.shape[1])])
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices), torch.inference_mode():
        torch.manual_seed(seed)
        started = time.perf_counter()
        output = plain_generate(model, ids, mask, processors, do_sample=True, temperature=sampling.temperature,
                                top_p=sampling.top_p, max_new_tokens=new_tokens, eos_token_id=eos_ids,
                                pad_token_id=pad_id)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    response_mask, _ = response_mask_until_eos(output[:, ids.shape[1]:], eos_ids)  # (B, T)
    return int(response_mask.sum()), seconds


def run_rollout(model, tokenizer, prompts: list[str], new_tokens: int, seed: int, ours: bool,
                autocast: bool) -> tuple[int, float]:
    """(tokens, seconds) of one PPO rollout at [ppo.sampling]'s defaults (temperature 0.7, top-k and top-p off), as
    the trainer's phase 1 runs it: the fp32 actor under no_grad, in bf16 autocast where `auto` picks it. Ours is
    `generate_responses` (rlhf.decode); plain is `generate` with the same settings, the path before ours."""
    settings = replace(PPOConfig().sampling, max_new_tokens=new_tokens)
    ends = end_tokens(model, tokenizer)
    eos_ids = list(ends.eos_ids)
    device = next(model.parameters()).device
    ids, mask = pad_sequences([encode_prompt(tokenizer, p) for p in prompts], tokenizer.pad_token_id)
    ids, mask = ids.to(device), mask.to(device)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices), torch.no_grad(), \
            torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        torch.manual_seed(seed)
        started = time.perf_counter()
        if ours:
            _, _, action_mask, _ = generate_responses(model, ids, mask, settings, ends)
        else:
            output = plain_generate(model, ids, mask, do_sample=True, temperature=settings.temperature, top_p=1.0,
                                    max_new_tokens=new_tokens, eos_token_id=eos_ids,
                                    pad_token_id=tokenizer.pad_token_id)
            action_mask, _ = response_mask_until_eos(output[:, ids.shape[1]:], eos_ids)
        seconds = time.perf_counter() - started
    return int(action_mask.sum()), seconds


def measure_rollout(model, tokenizer, batch_size: int, new_tokens: int, repeats: int, seed: int,
                    autocast: bool) -> dict:
    """PPO's generate phase, ours against plain: a warm-up each, then the best of `repeats` a side."""
    prompts = prompts_for(batch_size)
    best: dict[bool, tuple[int, float]] = {}
    for repeat in range(repeats + 1):
        for ours in ((True, False) if repeat % 2 == 0 else (False, True)):
            tokens, seconds = run_rollout(model, tokenizer, prompts, new_tokens, seed, ours, autocast)
            if repeat and (ours not in best or tokens / seconds > best[ours][0] / best[ours][1]):
                best[ours] = (tokens, seconds)
    cell = cell_figures(batch_size, new_tokens, "bf16-autocast" if autocast else "fp32", best[True], best[False])
    return {"phase": "ppo generate", **cell}


def measure_cell(model, tokenizer, batch_size: int, new_tokens: int, repeats: int, seed: int,
                 per_prompt: int = 1) -> tuple:
    """One warm-up call a side, then `repeats` measured calls a side, alternating which goes first; each side's
    best (highest tokens/s) (tokens, seconds)."""
    prompts = prompts_for(batch_size, per_prompt)
    sides = {"ours": run_ours, "plain": run_plain}
    for run in sides.values():
        run(model, tokenizer, prompts, new_tokens, seed, per_prompt)
    best: dict[str, tuple[int, float]] = {}
    for repeat in range(repeats):
        for name in (("ours", "plain") if repeat % 2 == 0 else ("plain", "ours")):
            tokens, seconds = sides[name](model, tokenizer, prompts, new_tokens, seed, per_prompt)
            if name not in best or tokens / seconds > best[name][0] / best[name][1]:
                best[name] = (tokens, seconds)
    return best["ours"], best["plain"]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default", help="a model name or folder (default: the default model)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None, help="prompts a call (default 1 8 16)")
    parser.add_argument("--new-tokens", type=int, nargs="+", default=None, help="max new tokens (default 64 256)")
    parser.add_argument("--dtypes", nargs="+", choices=DTYPE_NAMES, default=None,
                        help="model precisions (default fp32 bf16, bf16 left out where the hardware emulates it)")
    parser.add_argument("--quick", action="store_true", help="batch 16, 64 new tokens, fp32 only")
    parser.add_argument("--repeats", type=int, default=1, help="measured calls a side per cell, best kept (default 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of every call (default 0)")
    parser.add_argument("--per-prompt", type=int, default=1,
                        help="answers a prompt, as pair making draws 2 (4 oversampling): a batch of B rows is B / N "
                             "prompts, whose KV ours computes once (default 1)")
    parser.add_argument("--ppo", action="store_true",
                        help="also PPO's generate phase at [ppo]'s defaults (batch 8, 48 new tokens, the precision "
                             "`auto` picks), ours against plain generate")
    add_bf16_flag(parser)
    args = parser.parse_args(argv)
    if args.per_prompt < 1:
        parser.error("--per-prompt must be at least 1")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    quick = ([16], [64], ["fp32"]) if args.quick else (None, None, None)
    batch_sizes = args.batch_sizes or quick[0] or [1, 8, 16]
    new_tokens = args.new_tokens or quick[1] or [64, 256]
    dtypes = list(dict.fromkeys(args.dtypes or quick[2] or DTYPE_NAMES))

    torch.set_num_threads(args.threads)
    machine = describe_machine()
    print(machine_line(machine), flush=True)
    skipped = []
    if "bf16" in dtypes and not machine["bf16_native"]:
        if args.dtypes is None and not args.allow_emulated_bf16:  # the default grid: leave it out, say why
            dtypes.remove("bf16")
            skipped.append("bf16: the hardware would emulate it (pass --allow-emulated-bf16 to measure it anyway)")
            print(f"skipping {skipped[-1]}", flush=True)
        else:
            check_bf16(True, args.allow_emulated_bf16, machine, fp32_hint="--dtypes fp32")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    default = "bf16" if default_dtype(device) == torch.bfloat16 else "fp32"

    path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(path)
    model = load_causal_lm(path, tokenizer=tokenizer).to(device)
    cells = []
    rollout = None
    if args.ppo:  # first, on the fp32 model that PPO trains
        autocast = default == "bf16"
        rollout = measure_rollout(model, tokenizer, 8, 48, args.repeats, args.seed, autocast)
        print(f"PPO generate (batch 8, 48 new tokens, {rollout['dtype']}): ours {rollout['ours_tokens_per_s']:.1f} "
              f"tokens/s, plain {rollout['plain_tokens_per_s']:.1f}, speed-up {rollout['speedup']:.2f}x", flush=True)
    print(TABLE_HEADER, flush=True)
    for dtype in sorted(dtypes, key=DTYPE_NAMES.index):  # fp32 first: the bf16 cast is one way
        if dtype == "bf16":
            model = model.to(torch.bfloat16)
        for batch_size in batch_sizes:
            for tokens in new_tokens:
                ours, plain = measure_cell(model, tokenizer, batch_size, tokens, args.repeats, args.seed,
                                           args.per_prompt)
                cells.append(cell_figures(batch_size, tokens, dtype, ours, plain))
                print(table_row(cells[-1]), flush=True)
    settings = {"model": args.model, "device": str(device), "threads": torch.get_num_threads(),
                "repeats": args.repeats, "seed": args.seed, "per_prompt": args.per_prompt}
    summary = summarize(cells, machine, default, settings, skipped)
    if rollout is not None:
        summary["ppo_generate"] = rollout
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
