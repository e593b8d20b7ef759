"""A team's votes: does weighting by estimated reliability keep careless votes from spoiling careful ones?

Data: the default model's cached answers (bench/curve_data.py, as bench/reward_curve.py), every pair of distinct
answers of a prompt a candidate, a quarter of the prompts held out and labelled without noise by the rule. A team of
three careful members (the rule, `--flip` of their votes flipped) and two careless ones (a random clicker and one who
always takes the answer shown on the left: a coin in a/b terms) votes once on each pair (overlap 1), the careless
casting `--careless-share` of the votes. Each member also answers `--gold` gold pairs (their gold accuracy, the
evidence `voter_accuracies` reads). At the same number of careful votes, the head (mean@2) is fitted on:
- careful_only: the careful members' votes alone;
- majority: every vote, each pair counting once (votes.weighting = "majority");
- weighted: every vote weighted by annotate.reliability.weighted_preferences (votes.weighting = "reliability"),
  each member's accuracy from their gold votes;
- by_agreement: the same without gold, each member's accuracy from their agreement with a head fitted on the other
  members' votes, all their votes cross-fitted (annotate.reliability.agreement_accuracies: what a round with
  weighting "reliability" reads from the round before it at overlap 1 without gold).
Each member's agreement with a head fitted on the other members' votes (rlhf.reward.annotator_agreement, the
people table's "agreement with the reward model") is measured on their first 50 votes: `model_agreement` holds its
mean per kind of member (careful, random, left) over the runs. Flags (annotate.people.careless_reason) are read on
each member's first 50 votes, gold votes and that agreement: flagged (careless members flagged), missed (careless
not flagged) and false_flags (careful members flagged, each with its reason in false_flag_reasons), summed over the
seeds. Both weightings also read each member's side picks over all their votes (annotate.reliability.side_counts):
an always-left member's accuracy is capped at a coin's. Prints a table and ends with one JSON line.

    python bench/team_votes.py --annotators formal,concise --seeds 5 --careful-votes 150,300
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from annotate.people import Person, careless_reason
from annotate.records import Preference, Vote
from annotate.reliability import DawidSkeneFit, side_counts, voter_accuracies, weighted_preferences
from annotate.simulate import resolve_judge
from annotate.statistics import binomial_two_sided_p
from bench.machine import describe_machine, machine_line
from bench.reward_curve import CurveData, accuracy, load_features, pooled_answers, split
from rlhf.reward.annotator_agreement import held_out_agreement
from rlhf.reward.strategies import StrategyConfig, VotesConfig, fit_feature_heads

CAREFUL = ("careful-1", "careful-2", "careful-3")
CARELESS = ("random", "left")
FEATURE = "mean@2"
LABELINGS = ("careful_only", "majority", "weighted", "by_agreement")
"""The labellings compared (the module docstring), each a mean held-out accuracy in the JSON line."""
FIRST_VOTES = 50
"""Flags are read on each member's first this many votes, as the issue asks."""


def team_votes(data: CurveData, order: list[int], n_careful: int, args, rng: random.Random) -> list[tuple]:
    """(candidate, member, says a is better, shown on the left: a) for the pool's pairs in `order`, until the careful
    members have cast `n_careful` votes; each pair one vote, its member drawn by share."""
    votes, careful = [], 0
    for i in order:
        if careful >= n_careful:
            break
        if data.truth[i] == "tie":
            continue
        member = rng.choice(CARELESS) if rng.random() < args.careless_share else rng.choice(CAREFUL)
        a_on_left = rng.random() < 0.5
        if member == "random":
            says_a = rng.random() < 0.5
        elif member == "left":
            says_a = a_on_left
        else:
            says_a = (data.truth[i] == "a") ^ (rng.random() < args.flip)
            careful += 1
        votes.append((i, member, says_a, a_on_left))
    return votes


def gold_results(args, rng: random.Random) -> dict[str, tuple[int, int]]:
    """Each member's (right, judged) on `args.gold` gold pairs: careful at 1 - flip, the careless at a coin."""
    accuracy_of = {**{m: 1 - args.flip for m in CAREFUL}, **{m: 0.5 for m in CARELESS}}
    return {m: (sum(rng.random() < p for _ in range(args.gold)), args.gold) for m, p in accuracy_of.items()}


def weights_of(votes: list[tuple], gold: dict, agreement: dict | None = None) -> list[float]:
    """annotate.reliability's weight of each single-vote pair, given the members' gold results, agreement and side
    picks (as a round reads them: over every vote)."""
    preferences = [Preference(i, "", "chosen", "rejected", 1, "sample") for i, *_ in votes]
    cast = [Vote(k, i, member, "a" if says_a else "b", a_on_left, None, "")
            for k, (i, member, says_a, a_on_left) in enumerate(votes)]
    accuracies = voter_accuracies(DawidSkeneFit({}, {}, 0, True), gold, agreement, side_counts(cast))
    return [p.weight for p in weighted_preferences(preferences, cast, accuracies)]


def fit_accuracy(data: CurveData, votes: list[tuple], weights: list[float] | None, evaluation: list[int],
                 seed: int) -> float:
    chosen, rejected = data.diffs(FEATURE, [v[0] for v in votes], [v[2] for v in votes])
    pair_weight = None if weights is None else torch.tensor(weights, dtype=torch.float64)
    weight, _, _ = fit_feature_heads(chosen, rejected, "head", StrategyConfig(votes=VotesConfig(n_heads=0), seed=seed),
                                     pair_weight=pair_weight)
    return accuracy(data, f"head:{FEATURE}", weight, evaluation)


def model_agreement(data: CurveData, votes: list[tuple], seed: int,
                    first: int | None = FIRST_VOTES) -> dict[str, tuple[int, int]]:
    """Each member's (agreeing, judged) on their `first` votes (None: all), the head fitted on every other member's
    votes (the round's leave-one-annotator-out measure)."""
    config = StrategyConfig(votes=VotesConfig(n_heads=0), seed=seed)

    def fit(chosen, rejected):
        return fit_feature_heads(chosen, rejected, "head", config)[0]

    if first is None:
        chosen, rejected = data.diffs(FEATURE, [v[0] for v in votes], [v[2] for v in votes])
        return held_out_agreement(chosen, rejected, [v[1] for v in votes], fit)
    measured = {}
    for member in (*CAREFUL, *CARELESS):
        own = [v for v in votes if v[1] == member][:first]
        rows = [v for v in votes if v[1] != member] + own
        chosen, rejected = data.diffs(FEATURE, [v[0] for v in rows], [v[2] for v in rows])
        measured[member] = held_out_agreement(chosen, rejected, [v[1] for v in rows], fit).get(member, (0, 0))
    return measured


def flags(votes: list[tuple], gold: dict, agreement: dict[str, tuple[int, int]]) -> dict[str, str]:
    """careless_reason of each member on their first FIRST_VOTES votes, their gold votes and their `agreement`."""
    reasons = {}
    for member in (*CAREFUL, *CARELESS):
        own = [v for v in votes if v[1] == member][:FIRST_VOTES]
        left = sum(says_a == a_on_left for _, _, says_a, a_on_left in own)
        right, judged = gold[member]
        person = Person(member, len(own), len(own), left, binomial_two_sided_p(left, len(own)), 0, None, 10.0, None,
                        right, judged, *agreement[member])
        reasons[member] = careless_reason(person)
    return reasons


def run_seed(data: CurveData, seed: int, n_careful: int, args) -> dict:
    evaluation, _pool, _labels, order = split(data, seed, 0.0)
    rng = random.Random(seed * 1000 + n_careful)
    votes = team_votes(data, order, n_careful, args, rng)
    gold = gold_results(args, rng)
    careful = [v for v in votes if v[1] in CAREFUL]
    agreement = model_agreement(data, votes, seed)
    reasons = flags(votes, gold, agreement)
    share = {m: agreement[m][0] / agreement[m][1] if agreement[m][1] else None for m in agreement}
    return {"careful_only": fit_accuracy(data, careful, None, evaluation, seed),
            "majority": fit_accuracy(data, votes, None, evaluation, seed),
            "weighted": fit_accuracy(data, votes, weights_of(votes, gold), evaluation, seed),
            "by_agreement": fit_accuracy(data, votes, weights_of(votes, {}, model_agreement(data, votes, seed, None)),
                                         evaluation, seed),
            "votes": len(votes), "flagged": sum(bool(reasons[m]) for m in CARELESS),
            "missed": sum(not reasons[m] for m in CARELESS), "false_flags": sum(bool(reasons[m]) for m in CAREFUL),
            "false_flag_reasons": [f"seed {seed}, {m}: {reasons[m]}" for m in CAREFUL if reasons[m]],
            "agreement": {"careful": [share[m] for m in CAREFUL if share[m] is not None],
                          "random": [share["random"]] if share["random"] is not None else [],
                          "left": [share["left"]] if share["left"] is not None else []}}


def mean_and_se(values: list[float]) -> tuple[float, float]:
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return statistics.fmean(values), se


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--annotators", default="formal,concise", help="rules not tuned on (docs/annotators.md)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--careful-votes", default="150,300")
    parser.add_argument("--careless-share", type=float, default=0.4)
    parser.add_argument("--flip", type=float, default=0.25)
    parser.add_argument("--gold", type=int, default=20, help="gold votes each member casts")
    parser.add_argument("--model", default="default")
    args = parser.parse_args()
    print(machine_line(describe_machine()), flush=True)
    rows = pooled_answers(4, 64, [0, 1])
    index, features = load_features(rows, args.model, "n4-t64-s0,1", features=(FEATURE,))
    result = {**{key: [] for key in LABELINGS}, "flagged": 0, "missed": 0, "false_flags": 0, "false_flag_reasons": []}
    agreement = {"careful": [], "random": [], "left": []}
    for annotator in args.annotators.split(","):
        data = CurveData(rows, index, features, resolve_judge(annotator))
        for n in (int(v) for v in args.careful_votes.split(",")):
            runs = [run_seed(data, seed, n, args) for seed in range(args.seeds)]
            cells = {key: mean_and_se([r[key] for r in runs]) for key in LABELINGS}
            print(f"{annotator} {n} careful votes ({statistics.fmean(r['votes'] for r in runs):.0f} in all): "
                  + ", ".join(f"{key} {m:.1%} (se {se:.1%})" for key, (m, se) in cells.items()), flush=True)
            for key in LABELINGS:
                result[key].extend(r[key] for r in runs)
            for key in ("flagged", "missed", "false_flags"):
                result[key] += sum(r[key] for r in runs)
            for reason in (reason for r in runs for reason in r["false_flag_reasons"]):
                print(f"  careful member flagged ({annotator}, {n} careful votes): {reason}", flush=True)
                result["false_flag_reasons"].append(f"{annotator} {n}, {reason}")
            for kind in agreement:
                agreement[kind].extend(share for r in runs for share in r["agreement"][kind])
            print("  agreement with a head fitted on the others' votes, first 50 votes: " + ", ".join(
                f"{kind} {statistics.fmean(s for r in runs for s in r['agreement'][kind]):.1%}" for kind in agreement))
    summary = {key: statistics.fmean(result[key]) for key in LABELINGS}
    print(json.dumps({**summary, **{k: result[k] for k in ("flagged", "missed", "false_flags", "false_flag_reasons")},
                      "model_agreement": {kind: statistics.fmean(shares) for kind, shares in agreement.items()},
                      "annotators": args.annotators, "seeds": args.seeds, "careful_votes": args.careful_votes,
                      "careless_share": args.careless_share, "gold": args.gold}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
