"""Promotion by evidence: whether a round's policy becomes the current one (it writes the pairs people vote on and the
next round starts from it) or stays a candidate, kept with its votes but not built on.

The rule ([promotion], loop.config.PromotionConfig), for a policy against the policy it started from (its parent):
1. An admin's override ("promote" or "reject", `python app.py --promotion ID ...`) wins.
2. With rule = "always" every policy is promoted (the loop before this rule).
3. The KL budget: a policy PPO moved more than `max_kl` (mean KL to the reference, the round-0 policy, so the drift of
   every round since) is not promoted, whatever the votes say: people's verdict on ~80 noisy votes let through
   answers gamed at KL 18.8 and 21.9 and a policy worse than its parent at 10.6 (docs/few-votes.md). 0: no budget.
4. People, once `min_votes` judged votes (wins, losses, ties) are in on its versus pairs against its parent: promoted
   when its win rate (ties half) is at least `min_win_rate`. The point estimate decides, its 95% interval is shown:
   with few votes the verdict is noisy either way, and a policy wrongly kept back costs a round, not the loop. With
   `[votes] weighting = "reliability"` each vote weighs what it does in training (annotate.reliability
   .weighted_win_rates: a coin's votes nothing) and the judged votes are their effective number.
5. Before that, the reward model: promoted when its held-out interval lies above chance; an unmeasured reward model
   (no held-out pair) promotes nothing.

The decision of each policy is recorded in the store (policies.promoted, policies.promotion as JSON) whenever it is
taken again: at the start and end of a round, when pairs are made, on an override; the Dashboard shows it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Protocol

from annotate.metrics import PPO_KL, RM_HELDOUT_ACCURACY, RM_HELDOUT_LOW, RM_HELDOUT_N
from annotate.records import Policy, Round, WinRate, round_that_made
from annotate.reliability import store_voter_accuracies, weighted_win_rates

OVERRIDES = ("promote", "reject")


class PromotionSettings(Protocol):
    """What the rule reads: loop.config.PromotionConfig ([promotion])."""

    rule: str
    min_votes: int
    min_win_rate: float
    max_kl: float


@dataclass(frozen=True)
class PromotionEvidence:
    """What is known of a policy against the one it started from."""

    versus: WinRate | None = None
    """People's votes on its versus pairs against its parent; None: none yet."""
    rm_accuracy: float | None = None
    """The reward model's held-out accuracy on random sample pairs, of the round that made the policy."""
    rm_low: float | None = None
    """The lower end of that accuracy's 95% interval."""
    rm_n: int = 0
    """Held-out pairs it was measured on."""
    kl: float | None = None
    """PPO's mean KL to the reference over the round's steps."""


@dataclass(frozen=True)
class PromotionDecision:
    """Whether the policy is promoted, by which part of the rule, why (one line) and on which numbers."""

    promoted: bool
    rule: str
    """"admin", "always", "KL budget", "people" or "reward model"."""
    reason: str
    numbers: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | None) -> PromotionDecision | None:
        return None if not text else cls(**json.loads(text))


def decide(evidence: PromotionEvidence, settings: PromotionSettings, override: str | None = None) -> PromotionDecision:
    """The rule of the module's docstring, on `evidence`."""
    if override in OVERRIDES:
        return PromotionDecision(override == "promote", "admin", f"an admin chose to {override} it", {})
    if settings.rule == "always":
        return PromotionDecision(True, "always", "promotion.rule = \"always\": every round's policy is promoted", {})
    versus = evidence.versus
    people = versus is not None and versus.judged >= settings.min_votes
    verdict = people_verdict(versus, settings.min_win_rate) if people else reward_model_verdict(evidence, settings)
    if settings.max_kl > 0 and evidence.kl is not None and evidence.kl > settings.max_kl:
        return kl_budget_verdict(evidence.kl, settings.max_kl, verdict)
    return verdict


def kl_budget_verdict(kl: float, max_kl: float, verdict: PromotionDecision) -> PromotionDecision:
    """Held back: PPO's KL is above `max_kl`; `verdict`, what the votes or the reward model would have decided, is
    kept in the reason and the numbers."""
    without = f"without it: {'promoted' if verdict.promoted else 'not promoted'} by {verdict.rule}, {verdict.reason}"
    return PromotionDecision(False, "KL budget", f"PPO's KL {kl:.1f} is above promotion.max_kl = {max_kl:g}; {without}",
                             {**verdict.numbers, "kl": kl, "max_kl": max_kl})


def people_verdict(versus: WinRate, min_win_rate: float) -> PromotionDecision:
    """Promoted when people's win rate against the parent (ties half) is at least `min_win_rate`."""
    low, high = versus.interval()
    numbers = {"win_rate": versus.win_rate, "low": low, "high": high, "judged": versus.judged, "wins": versus.wins,
               "losses": versus.losses, "ties": versus.ties, "against": versus.opponent_id,
               "min_win_rate": min_win_rate}
    promoted = versus.win_rate >= min_win_rate
    said = (f"people's votes: {versus.win_rate:.0%} ({low:.0%}-{high:.0%}) over {versus.judged_text()} against "
            f"policy {versus.opponent_id}")
    return PromotionDecision(promoted, "people", f"{said}, {'at least' if promoted else 'below'} "
                             f"{min_win_rate:.0%}", numbers)


def reward_model_verdict(evidence: PromotionEvidence, settings: PromotionSettings) -> PromotionDecision:
    """Promoted when the reward model's held-out interval lies above chance (the KL budget is `decide`'s)."""
    judged = evidence.versus.judged if evidence.versus is not None else 0
    numbers = {"rm_accuracy": evidence.rm_accuracy, "rm_low": evidence.rm_low, "rm_n": evidence.rm_n,
               "kl": evidence.kl, "max_kl": settings.max_kl, "judged": judged, "min_votes": settings.min_votes}
    waiting = f"{judged} of {settings.min_votes} votes on its versus pairs so far; "
    if evidence.rm_accuracy is None or evidence.rm_low is None:
        return PromotionDecision(False, "reward model", waiting + "the reward model was not measured on held-out "
                                 "pairs", numbers)
    accuracy = f"the reward model's held-out accuracy {evidence.rm_accuracy:.0%} ({evidence.rm_low:.0%} or more, " \
               f"n={evidence.rm_n})"
    if evidence.rm_low <= 0.5:
        return PromotionDecision(False, "reward model", waiting + accuracy + " cannot be told from chance", numbers)
    kl = "" if evidence.kl is None else f" and KL {evidence.kl:.1f}"
    return PromotionDecision(True, "reward model", waiting + accuracy + f" clears chance{kl}", numbers)


def evidence_for(policy: Policy, rounds: list[Round], win_rates: list[WinRate]) -> PromotionEvidence:
    """The evidence on `policy` among the store's rounds and versus tallies (store.rounds(), store.versus_win_rates()):
    its versus votes against its parent, the reward model and KL of the round that made it."""
    versus = next((w for w in win_rates if w.policy_id == policy.id and w.opponent_id == policy.parent_id), None)
    made = round_that_made(rounds, policy.id)
    metrics = made.metrics if made is not None else {}
    return PromotionEvidence(versus, RM_HELDOUT_ACCURACY.of(metrics), RM_HELDOUT_LOW.of(metrics),
                             int(RM_HELDOUT_N.of(metrics) or 0), PPO_KL.of(metrics))


def store_win_rates(store, weighting: str = "majority") -> list[WinRate]:
    """People's verdicts on the versus pairs as promotion reads them: the store's tallies, or with weighting
    "reliability" each vote weighed by its voter's accuracy as a round's training weighs it."""
    if weighting != "reliability":
        return store.versus_win_rates()
    return weighted_win_rates(store.versus_votes(), store_voter_accuracies(store))


Known = tuple[list[Round], list[WinRate]]
"""The store's rounds and versus verdicts, when a caller has read them."""


def decide_for(store, policy: Policy, settings: PromotionSettings, known: Known | None = None,
               weighting: str = "majority") -> PromotionDecision:
    """The decision on `policy` now, recorded in the store when it differs from the one recorded; `known`: the store's
    rounds and versus verdicts (store_win_rates) when the caller has read them; `weighting`: [votes] weighting."""
    rounds, win_rates = known if known is not None else (store.rounds(), store_win_rates(store, weighting))
    decision = decide(evidence_for(policy, rounds, win_rates), settings, policy.promotion_override)
    if decision.to_json() != policy.promotion or policy.promoted != int(decision.promoted):
        store.set_promotion(policy.id, decision.promoted, decision.to_json())
    return decision


def refresh_promotions(store, settings: PromotionSettings,
                       weighting: str = "majority") -> list[tuple[Policy, PromotionDecision]]:
    """Take the decision again for every policy made under promotion (past round 0, `promoted` recorded), on what the
    store holds now (`weighting`: [votes] weighting); the ones whose verdict changed, with their new decision."""
    known = (store.rounds(), store_win_rates(store, weighting))
    changed = []
    for policy in store.policies():
        if policy.round == 0 or policy.promoted is None:
            continue
        decision = decide_for(store, policy, settings, known)
        if decision.promoted != bool(policy.promoted):
            changed.append((policy, decision))
    return changed
