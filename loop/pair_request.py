"""Pairs for annotation, around the answers: which prompts get pairs next, which answers make a pair worth a vote, and
what a batch of pair making reports. No torch here: `loop.pairs` asks a policy for the answers.

Two kinds of pair (DESIGN "Data model"): `sample`, two answers of the current policy to one prompt (what the reward
model learns from), and `versus`, the current policy against an earlier one on the same prompt (gen_a is always the
newer policy's answer, the store's convention), whose votes measure progress by human judgement.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

from annotate.records import Policy, Prompt

PairsProgress = Callable[[int, int], None]
"""Called as progress(prompts_done, prompts_total) as each prompt's pair is stored or skipped (each prompt gives at
most one pair); the same type counts answers, answers(answers_done, answers_planned), as each answer ends."""


PairChooser = Callable[[list[str], list[list[str]], int, int], tuple[list[tuple[int, int, int]], int]]
"""chooser(prompts, answers_per_prompt, n, seed) -> ([(prompt_index, answer_i, answer_j), ...] in queue order,
how many of them were chosen for uncertainty rather than at random: those come first, the random ones after (each
stored pair records which, pairs.chosen_by); see rlhf.reward.active.choose_pairs."""


PROMPT_SELECTIONS = ("least_used", "random")


@dataclass
class PairsReport:
    """What make_pairs wrote and skipped."""

    written: int = 0
    """Pairs stored."""
    sample: int = 0
    """Of which `sample` pairs (two answers of the current policy)."""
    versus: int = 0
    """Of which `versus` pairs (current policy against an earlier one)."""
    skipped_identical: int = 0
    """Pairs dropped because both answers were the same text (a vote on them teaches nothing)."""
    skipped_empty: int = 0
    """Pairs dropped because an answer was empty."""
    policy_id: int | None = None
    """The current policy that wrote the answers."""
    versus_policy_id: int | None = None
    """The earlier policy of the versus pairs (None when there were none)."""
    stats: dict[str, float] = field(default_factory=dict)
    """Generation figures: gen/tokens_per_s, time/generate_s, gen/answers, gen/finished_share, gen/mean_tokens."""


def earlier_policy(store, policy: Policy) -> Policy | None:
    """The policy a `versus` pair compares `policy` with: its parent, else the latest policy of an earlier round."""
    if policy.parent_id is not None:
        return store.policy(policy.parent_id)
    earlier = [p for p in store.policies() if p.round < policy.round]
    return max(earlier, key=lambda p: (p.round, p.id)) if earlier else None


def select_prompts(store, n: int, how: str, rng: random.Random, exclude: frozenset[str] = frozenset()) -> list[Prompt]:
    """n prompts: those with the fewest pairs first (oldest among equals), or a seeded random draw; none whose text is
    in `exclude`."""
    if how == "least_used":
        return store.prompts_needing_pairs(n, exclude)
    if how == "random":
        prompts = [prompt for prompt in store.prompts() if prompt.text not in exclude]
        return rng.sample(prompts, min(n, len(prompts)))
    raise ValueError(f"prompt_selection must be one of {', '.join(PROMPT_SELECTIONS)}, not {how!r}")


def usable(a, b, report: PairsReport) -> bool:
    """Whether two answers make a pair worth a vote; counts the reason when they do not."""
    if not a.text or not b.text:
        report.skipped_empty += 1
        return False
    if a.text == b.text:
        report.skipped_identical += 1
        return False
    return True


def merge_generation_stats(total: dict[str, float], part: dict[str, float]) -> None:
    """Add one generation call's figures (gen/*, time/generate_s) to a running total, means weighted by answers."""
    answers = total.get("gen/answers", 0.0) + part["gen/answers"]
    for key in ("gen/finished_share", "gen/mean_tokens"):  # answer-weighted means
        total[key] = (total.get(key, 0.0) * total.get("gen/answers", 0.0) + part[key] * part["gen/answers"]) / answers
    tokens = total.get("gen/tokens_per_s", 0.0) * total.get("time/generate_s", 0.0)
    tokens += part["gen/tokens_per_s"] * part["time/generate_s"]
    total["time/generate_s"] = total.get("time/generate_s", 0.0) + part["time/generate_s"]
    total["gen/tokens_per_s"] = tokens / total["time/generate_s"] if total["time/generate_s"] > 0 else 0.0
    total["gen/answers"] = answers


def add_report(total: PairsReport, part: PairsReport) -> None:
    """Add the counts and generation figures of `part` to `total`."""
    total.written += part.written
    total.sample += part.sample
    total.versus += part.versus
    total.skipped_identical += part.skipped_identical
    total.skipped_empty += part.skipped_empty
    if part.stats.get("gen/answers"):
        merge_generation_stats(total.stats, part.stats)
