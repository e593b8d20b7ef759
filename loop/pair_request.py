"""A batch of pairs for annotation, around the answers: what it is asked to be (`PairRequest`), what it tells as it goes
(`PairProgress`), which answers make a pair worth a vote, and what it reports at its end (`PairsReport`). No torch
here: `loop.pairs` asks a policy for the answers.

Two kinds of pair (docs/design.md, "Data model"): `sample`, two answers of the current policy to one prompt (what the
reward model learns from), and `versus`, the newest policy (the current one, or a candidate not promoted yet) against
the one it started from on the same prompt, one its PPO did not train on (`versus_prompt_ids`; gen_a is always the
newer policy's answer, the store's convention), whose votes measure progress by human judgement and decide promotion
(annotate.promotion).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

from tqdm.auto import tqdm

from annotate.metrics import (GEN_ANSWERS, GEN_FINISHED_SHARE, GEN_MEAN_TOKENS, GEN_TOKENS_PER_S, ROUND_PPO_PROMPTS,
                              TIME_GENERATE_S)
from annotate.records import Policy, Prompt, round_that_made
from rlhf.sampling import DEFAULT_BATCH_SIZE, Sampling


@dataclass(frozen=True)
class PairRequest:
    """What a batch of pairs is to be."""

    n_pairs: int
    """Pairs to write at most (fewer when answers are identical or empty, or the store holds fewer prompts: one pair
    a prompt a batch)."""
    policy_id: int
    """The policy that writes the sample pairs (the current one), and side a of the versus pairs unless
    `versus_newer_id` names another."""
    versus_share: float = 0.0
    """Share of the pairs that put a newer policy against an earlier one (the rest are sample pairs: two answers of
    `policy_id`)."""
    versus_policy_id: int | None = None
    """The earlier policy of the versus pairs; None: `earlier_policy` of the newer one."""
    versus_newer_id: int | None = None
    """The newer policy of the versus pairs (side a): a candidate not promoted (annotate.promotion) is judged by
    people while the current policy writes the sample pairs; None: `policy_id`."""
    sampling: Sampling = field(default_factory=Sampling)
    """How each answer is sampled ([sampling])."""
    seed: int | None = None
    """Fixes the choice of versus prompts, the sides and the sampling; None: not seeded."""
    batch_size: int = DEFAULT_BATCH_SIZE
    """Sequences generated together ([pairs] batch_size)."""
    exclude_prompts: frozenset[str] = frozenset()
    """Prompts that get no pair (the demo's evaluation prompts)."""

    def __post_init__(self) -> None:
        if self.n_pairs < 0:
            raise ValueError(f"n_pairs must not be negative, got {self.n_pairs}")
        if not 0.0 <= self.versus_share <= 1.0:
            raise ValueError(f"versus_share must lie between 0 and 1, got {self.versus_share}")


class PairProgress:
    """What pair making tells as it goes; every method does nothing here, and each caller overrides what it shows: a
    terminal bar (`PairBar`), the app child's lines (loop.children.pair_child.ChildLines), a test's record."""

    def stage(self, text: str) -> None:
        """What is being done now ("loading the model", "generating")."""

    def pairs(self, done: int, total: int, written: int) -> None:
        """Prompts done of the batch (each gives at most one pair, stored before it counts), `written` pairs so far."""

    def answers(self, done: int, planned: int) -> None:
        """Answers finished so far: they move long before the first pair is complete."""

    def step(self, step: int, most: int) -> None:
        """The batch being decoded wrote its token `step` of at most `most`."""


class PairBar(PairProgress):
    """A terminal progress bar of the prompts done (tqdm), with the pairs written."""

    def __init__(self) -> None:
        self.bar = None

    def pairs(self, done: int, total: int, written: int) -> None:
        if self.bar is None:
            self.bar = tqdm(total=total, desc="making pairs", unit="prompt")
        self.bar.update(done - self.bar.n)
        self.bar.set_postfix(written=written)
        if done >= total:
            self.bar.close()


PairChooser = Callable[[list[str], list[list[str]], int, int], tuple[list[tuple[int, int, int]], int]]
"""chooser(prompts, answers_per_prompt, n, seed) -> ([(prompt_index, answer_i, answer_j), ...] in queue order,
how many of them were chosen for uncertainty rather than at random: those come first, the random ones after (each
stored pair records which, pairs.chosen_by); see rlhf.reward.active.choose_pairs."""


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
    """The policy a `versus` pair compares `policy` with: its parent, else (no parent, or its folder pruned:
    loop.retention) the latest policy of an earlier round whose folder is kept."""
    if policy.parent_id is not None and not (parent := store.policy(policy.parent_id)).pruned:
        return parent
    earlier = [p for p in store.policies() if p.round < policy.round and not p.pruned]
    return max(earlier, key=lambda p: (p.round, p.id)) if earlier else None


def trained_prompts(store, policy: Policy) -> frozenset[str]:
    """The prompts PPO trained `policy` on: round/ppo_prompts of the round that saved it; none for the base policy or
    one no round made (imported, or saved before rounds recorded their prompts)."""
    made = round_that_made(store.rounds(), policy.id)
    return frozenset(made.metrics.get(ROUND_PPO_PROMPTS) or ()) if made is not None else frozenset()


def versus_prompt_ids(rng: random.Random, prompts: list[Prompt], n_versus: int, trained: frozenset[str]) -> set[int]:
    """Up to `n_versus` of `prompts` (their ids) for the versus pairs, drawn among those PPO did not train the newer
    policy on (`trained`), so people judge what it learnt rather than what it was fitted to, as the judge's held-out
    prompts and a round's report do; fewer when fewer are left. Only when every prompt was trained on are they drawn
    from all (a versus pair on a trained prompt beats none: people's verdict is what promotion waits for)."""
    held_out = [p.id for p in prompts if p.text not in trained] or [p.id for p in prompts]
    return set(rng.sample(held_out, min(n_versus, len(held_out))))


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
    answers = total.get(GEN_ANSWERS, 0.0) + part[GEN_ANSWERS]
    for key in (GEN_FINISHED_SHARE, GEN_MEAN_TOKENS):  # answer-weighted means
        total[key] = (total.get(key, 0.0) * total.get(GEN_ANSWERS, 0.0) + part[key] * part[GEN_ANSWERS]) / answers
    tokens = total.get(GEN_TOKENS_PER_S, 0.0) * total.get(TIME_GENERATE_S, 0.0)
    tokens += part[GEN_TOKENS_PER_S] * part[TIME_GENERATE_S]
    total[TIME_GENERATE_S] = total.get(TIME_GENERATE_S, 0.0) + part[TIME_GENERATE_S]
    total[GEN_TOKENS_PER_S] = tokens / total[TIME_GENERATE_S] if total[TIME_GENERATE_S] > 0 else 0.0
    total[GEN_ANSWERS] = answers


def add_report(total: PairsReport, part: PairsReport) -> None:
    """Add the counts and generation figures of `part` to `total`."""
    total.written += part.written
    total.sample += part.sample
    total.versus += part.versus
    total.skipped_identical += part.skipped_identical
    total.skipped_empty += part.skipped_empty
    if part.stats.get(GEN_ANSWERS):
        merge_generation_stats(total.stats, part.stats)
