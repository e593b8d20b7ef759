"""How the simulated annotators behave on the default model's real answers: ties, score spread, length confound.

Reads the answers bench/curve_data.py cached (4 samples a prompt, every shipped prompt); for each annotator with a
score, over every pair of distinct answers of a prompt (the reward curve's candidates): the share of ties, the
score's mean, standard deviation and 10/50/90th percentiles over answers, the grading scale
(annotate.annotators.score_scale: the median gap between two answers' scores) and how often its decided verdicts
agree with `longer` (50% = independent of length). Text only: seconds, no model.

    python bench/curve_data.py --max-new-tokens 64                 # once
    python bench/annotator_stats.py --annotators courteous,polite,structured,example,formal,concise
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from annotate.annotators import score_scale
from annotate.simulate import RULE_SCORES, resolve_score
from bench.curve_data import answers_cache_path, read_answers


def describe(score, answers_per_prompt: list[list[str]]) -> dict:
    """Ties, spread, scale and agreement with length of one score over the candidate pairs of the answers."""
    length = RULE_SCORES["longer"]
    pairs = ties = decided = with_length = 0
    values = []
    for answers in answers_per_prompt:
        scores = [score(answer) for answer in answers]
        values += scores
        for a, b in itertools.combinations(range(len(answers)), 2):
            if not answers[a] or not answers[b] or answers[a] == answers[b]:
                continue
            pairs += 1
            ties += scores[a] == scores[b]
            longer = length(answers[a]) - length(answers[b])
            if scores[a] != scores[b] and longer:
                decided += 1
                with_length += (scores[a] > scores[b]) == (longer > 0)
    deciles = statistics.quantiles(values, n=10)
    return {"pairs": pairs, "tie_share": round(ties / pairs, 4), "mean": round(statistics.fmean(values), 4),
            "std": round(statistics.pstdev(values), 4), "p10": round(deciles[0], 4), "p50": round(deciles[4], 4),
            "p90": round(deciles[8], 4),
            "scale": round(score_scale(score, [a for answers in answers_per_prompt for a in answers]), 4),
            "agrees_with_longer": round(with_length / decided, 4) if decided else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--annotators", default="courteous,polite,structured,example,formal,concise")
    parser.add_argument("--per-prompt", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--answer-seed", type=int, default=0)
    args = parser.parse_args()
    rows = read_answers(answers_cache_path(args.per_prompt, args.max_new_tokens, args.answer_seed))
    if not rows:
        print("No cached answers: run python bench/curve_data.py first.", file=sys.stderr)
        return 2
    answers = [list(dict.fromkeys(row["answers"])) for row in rows]  # as the reward curve pools them
    print(f"{len(rows)} prompts x {statistics.fmean(len(a) for a in answers):.1f} answers "
          f"({args.max_new_tokens} new tokens, answer seed {args.answer_seed})")
    print(f"{'annotator':<12}{'pairs':>7}{'ties':>8}{'mean':>9}{'std':>9}{'p10':>9}{'p50':>9}{'p90':>9}"
          f"{'scale':>9}{'~longer':>9}")
    results = {}
    for name in args.annotators.split(","):
        score = resolve_score(name)
        if score is None:
            print(f"{name:<12} has no score", file=sys.stderr)
            continue
        r = results[name] = describe(score, answers)
        agrees = f"{r['agrees_with_longer']:.0%}" if r["agrees_with_longer"] is not None else "-"
        print(f"{name:<12}{r['pairs']:>7}{r['tie_share']:>8.1%}{r['mean']:>9.3f}{r['std']:>9.3f}{r['p10']:>9.3f}"
              f"{r['p50']:>9.3f}{r['p90']:>9.3f}{r['scale']:>9.3f}{agrees:>9}")
    print(json.dumps({"bench": "annotator_stats", "prompts": len(rows), "annotators": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
