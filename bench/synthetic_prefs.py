"""A fixed synthetic preference set for benchmarks: warm, polite answers are chosen over curt ones.

Prompts are the shipped ones (data/prompts.jsonl). Each answer is an opener, two or three neutral advice
sentences and a closer; the chosen answer opens or closes warmly (words from the `polite` simulated
annotator's list), the rejected one curtly, and both come from the same pools of sentences so that
length and topic give nothing away. The same (n_pairs, seed) always gives the same pairs, so TRL and
rlhf-loop can be timed on identical data (`python bench/synthetic_prefs.py OUT.jsonl` writes them out).

Usable as a module (`from bench.synthetic_prefs import synthetic_preferences`) from the repository root.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from annotate.simulate import polite
from rlhf.reward.data import PreferencePair

SHIPPED_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "prompts.jsonl"

BODY = [
    "Start with the basics and build from there.",
    "Break the task into small steps you can finish in a day.",
    "Keep short notes on what works and what does not.",
    "Try the plan for a week before you judge it.",
    "A fixed routine makes the hard part easier.",
    "Ask someone who has done it for a second opinion.",
    "Check the details before you spend any money.",
    "Short, regular sessions beat one long session.",
    "Write the goal down where you will see it every morning.",
    "Remove one distraction at a time rather than all at once.",
    "Compare two or three options side by side.",
    "Plan the first step tonight and do it tomorrow.",
    "Measure your progress once a week, not every hour.",
    "Expect a slow start; the second week is usually easier.",
]
WARM_OPENERS = ["Thank you for asking!", "Happy to help with this.", "Glad you asked, here are some ideas.",
                "What a lovely question, thanks."]
WARM_CLOSERS = ["I hope this helps, and good luck!", "Wishing you all the best with it.",
                "Please let me know if you need more help.", "Take care, and enjoy the process."]
CURT_OPENERS = ["Fine, here it is.", "Obviously, the answer is simple.", "Listen, this is not hard.",
                "Here, since you asked again."]
CURT_CLOSERS = ["That is all.", "Figure out the rest yourself.", "Do not ask me again.", "Nothing more to say."]
NEUTRAL_OPENERS = ["Here are some ideas.", "A few points to consider.", "There are several ways to do it."]


def load_shipped_prompts(path: Path = SHIPPED_PROMPTS) -> list[str]:
    """The prompts shipped in data/prompts.jsonl, in file order."""
    return [json.loads(line)["prompt"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _answer(rng: random.Random, opener: str, closer: str) -> str:
    body = rng.sample(BODY, rng.choice([2, 3]))
    return " ".join([opener, *body, closer])


def synthetic_preferences(n_pairs: int, seed: int = 0, prompts: list[str] | None = None) -> list[PreferencePair]:
    """`n_pairs` pairs: prompts cycled in a seeded order; chosen warm (opener, closer or both), rejected curt."""
    rng = random.Random(seed)
    prompts = list(prompts if prompts is not None else load_shipped_prompts())
    rng.shuffle(prompts)
    pairs = []
    for index in range(n_pairs):
        warmth = rng.choice(["opener", "closer", "both"])
        chosen = _answer(
            rng,
            rng.choice(WARM_OPENERS if warmth in ("opener", "both") else NEUTRAL_OPENERS),
            rng.choice(WARM_CLOSERS) if warmth in ("closer", "both") else "",
        ).strip()
        rejected = _answer(rng, rng.choice(CURT_OPENERS), rng.choice(CURT_CLOSERS))
        prompt = prompts[index % len(prompts)]
        if polite(prompt, chosen, rejected) != "a":  # the rule must really prefer the chosen answer
            raise AssertionError(f"synthetic pair breaks its own rule: {chosen!r} vs {rejected!r}")
        pairs.append(PreferencePair(prompt, chosen, rejected))
    return pairs


def write_jsonl(pairs: list[PreferencePair], path: Path) -> Path:
    """Pairs as JSON Lines with TRL's columns prompt, chosen, rejected."""
    with open(path, "w", encoding="utf-8") as out:
        out.writelines(json.dumps({"prompt": pair.prompt, "chosen": pair.chosen, "rejected": pair.rejected}) + "\n"
                       for pair in pairs)
    return path


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write the synthetic preference set as JSONL (TRL's columns).")
    parser.add_argument("out", type=Path, help="output .jsonl")
    parser.add_argument("--pairs", type=int, default=200, help="number of pairs (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    args = parser.parse_args()
    write_jsonl(synthetic_preferences(args.pairs, args.seed), args.out)
    print(f"wrote {args.pairs} pairs to {args.out}")
