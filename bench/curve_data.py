"""Answers and features the reward curve bench reuses: generated once per settings, cached under data/cache/.

Answers: `n_per_prompt` samples of the model for every shipped prompt, appended to a JSONL cache batch by batch, so
an interrupted run resumes where it stopped. Features: pooled hidden states of each (prompt, answer), one tensor
file per model and pooling, computed under inference mode (see rlhf.reward.features.FeatureExtractor).

    python bench/curve_data.py --per-prompt 4 --max-new-tokens 96
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from rlhf.generate import generate_answers
from rlhf.sampling import Sampling
from rlhf.models import load_causal_lm, load_tokenizer, resolve_model_path

CACHE_DIR = Path("data/cache")


def answers_cache_path(per_prompt: int, max_new_tokens: int, seed: int) -> Path:
    return CACHE_DIR / f"curve-answers-n{per_prompt}-t{max_new_tokens}-s{seed}.jsonl"


def read_prompts(path: str | Path) -> list[str]:
    return [json.loads(line)["prompt"] for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def read_answers(path: Path) -> list[dict]:
    """Rows {prompt, answers: [text, ...]} of the cache and of its `-rev` half (one row per prompt)."""
    rows = {}
    for part in (path, path.with_name(path.stem + "-rev.jsonl")):
        if part.is_file():
            for line in part.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    row = json.loads(line)
                    rows.setdefault(row["prompt"], row)
    return list(rows.values())


def generate_cache(model_name: str, prompts_file: str, per_prompt: int, max_new_tokens: int, seed: int,
                   prompts_per_batch: int = 4, reverse: bool = False) -> Path:
    """Fill the answer cache for every prompt of `prompts_file`, resuming after the prompts already there.

    `reverse` works from the last prompt into a `-rev` file, so a second process can share the work.
    """
    cache = answers_cache_path(per_prompt, max_new_tokens, seed)
    path = cache.with_name(cache.stem + "-rev.jsonl") if reverse else cache
    path.parent.mkdir(parents=True, exist_ok=True)
    done = {row["prompt"] for row in read_answers(cache)}
    todo = [p for p in read_prompts(prompts_file) if p not in done]
    todo = todo[::-1] if reverse else todo
    if not todo:
        return path
    model_path = resolve_model_path(model_name)
    model, tokenizer = load_causal_lm(model_path), load_tokenizer(model_path)
    started = time.perf_counter()
    for index, start in enumerate(range(0, len(todo), prompts_per_batch)):
        chunk = [p for p in todo[start:start + prompts_per_batch] if p not in {r["prompt"] for r in read_answers(cache)}]
        if not chunk:  # the other half got here first
            break
        result = generate_answers(model, tokenizer, chunk, n_per_prompt=per_prompt,
                                  sampling=Sampling(max_new_tokens=max_new_tokens),
                                  seed=seed * 100_003 + read_prompts(prompts_file).index(chunk[0]),
                                  batch_size=prompts_per_batch * per_prompt)
        with path.open("a", encoding="utf-8") as handle:
            for prompt, answers in zip(chunk, result.answers):
                handle.write(json.dumps({"prompt": prompt, "answers": [a.text for a in answers]}) + "\n")
        print(f"{start + len(chunk)}/{len(todo)} prompts, {time.perf_counter() - started:.0f} s", file=sys.stderr,
              flush=True)
    return cache


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--prompts", default="data/prompts.jsonl")
    parser.add_argument("--per-prompt", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reverse", action="store_true", help="work from the last prompt (a second process)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 suits a shared, busy machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(generate_cache(args.model, args.prompts, args.per_prompt, args.max_new_tokens, args.seed,
                         reverse=args.reverse))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
