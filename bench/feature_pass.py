"""Seconds of the reward stage's feature pass: an inner-layer feature (the round's mean@2) computed through the first
layers only (rlhf.reward.features.FeatureExtractor.backbone_through) against the whole backbone's forward, on the same
texts in one run, alternating, with the largest difference between the two features' values.

Texts: bench/curve_data.py's cached answers of the default model. Ends with one JSON line.

    python bench/feature_pass.py --texts 64 --threads 1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from bench.curve_data import answers_cache_path, read_answers
from bench.machine import describe_machine, machine_line
from rlhf.reward.config import DEFAULT_FEATURE
from rlhf.reward.features import FeatureExtractor


def timed(extractor: FeatureExtractor, prompts: list[str], answers: list[str], feature: str) -> tuple[float, object]:
    started = time.perf_counter()
    values = extractor.compute(prompts, answers, [feature])[feature]
    return time.perf_counter() - started, values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--feature", default=DEFAULT_FEATURE)
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_line(describe_machine()), flush=True)
    rows = read_answers(answers_cache_path(4, 64, 0))
    if not rows:
        print("No cached answers: run python bench/curve_data.py --max-new-tokens 64 first.", file=sys.stderr)
        return 2
    texts = [(r["prompt"], a) for r in rows for a in r["answers"]][:args.texts]
    prompts, answers = [p for p, _ in texts], [a for _, a in texts]
    extractor = FeatureExtractor.from_model(args.model)
    whole_pass = extractor.backbone_through  # the method under test, and the whole backbone in its place
    seconds = {"truncated": [], "whole": []}
    for _ in range(args.repeats):
        extractor.backbone_through = whole_pass
        elapsed, truncated = timed(extractor, prompts, answers, args.feature)
        seconds["truncated"].append(elapsed)
        extractor.backbone_through = lambda layer: (extractor.reward_model.backbone, -1)
        elapsed, whole = timed(extractor, prompts, answers, args.feature)
        seconds["whole"].append(elapsed)
    difference = float((truncated - whole).abs().max())
    best = {arm: min(values) for arm, values in seconds.items()}
    print(f"{args.feature} of {len(texts)} texts: first layers {best['truncated']:.1f} s, whole backbone "
          f"{best['whole']:.1f} s ({best['whole'] / best['truncated']:.1f}x); largest difference {difference:.2e}")
    print(json.dumps({"bench": "feature_pass", "feature": args.feature, "texts": len(texts), "seconds": best,
                      "speedup": best["whole"] / best["truncated"], "max_abs_difference": difference,
                      "machine": describe_machine()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
