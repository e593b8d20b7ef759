"""People's promotion threshold replayed on finished demo loops: how often each rule agrees with the judge.

For every candidate whose promotion has people's numbers (policies.promotion: its versus votes against its parent),
the judge's gap is its win rate against the first policy less its parent's (the first policy's own is 50%), from the
demo's closing JSON line. Each rule (people's point estimate at least t, annotate.promotion.people_verdict; or an
interval rule on the same votes) is scored on agreeing with the gap's sign: how many worse candidates it promotes and
how many better ones it holds back, and the judge's points they add up to. Decisions whose gap is under `--min-gap`
points either way are left out of a second count: the judge measures each policy on 256 answers, so a gap of a few
points is inside its own noise. Text only: seconds, no model.

    python bench/people_threshold.py RUN.log RUN.db [RUN2.log RUN2.db ...] --thresholds 0.45,0.5,0.55
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from annotate.promotion import PromotionDecision, people_verdict
from annotate.records import WinRate
from annotate.store import Store


@dataclass(frozen=True)
class PeopleDecision:
    """One candidate against its parent: people's versus votes and the judge's gap between the two, in points."""

    run: str
    round: int
    versus: WinRate
    judge_gap: float


def demo_summary(log_path: Path) -> dict:
    """The demo's closing JSON line (its last line that parses as a JSON object with `rounds`)."""
    for line in reversed(log_path.read_text(errors="replace").replace("\r", "\n").splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            if "rounds" in data:
                return data
    raise SystemExit(f"{log_path}: no closing JSON line of a demo loop (`python app.py --demo-loop ...` writes one "
                     "as its last line); give the log of a finished demo.")


def read_decisions(log_path: Path, db_path: Path) -> list[PeopleDecision]:
    """Every candidate of one demo run whose promotion carries people's votes, with the judge's gap to its parent."""
    if not db_path.is_file():
        raise SystemExit(f"{db_path}: no such database; give each run as its demo's log, then its `--db` file.")
    summary = demo_summary(log_path)
    judged = {summary["first_policy_id"]: 0.5} | {r["policy_id"]: r["win_rate"] for r in summary["rounds"]}
    with Store(db_path) as store:
        policies = store.policies()
    decisions = []
    for policy in policies:
        decision = PromotionDecision.from_json(policy.promotion)
        numbers = decision.numbers if decision is not None else {}
        parent = numbers.get("against")
        if "wins" not in numbers or policy.id not in judged or parent not in judged:
            continue
        versus = WinRate(policy.id, parent, numbers["wins"], numbers["losses"], numbers["ties"])
        decisions.append(PeopleDecision(log_path.stem, policy.round, versus, 100 * (judged[policy.id] - judged[parent])))
    return decisions


def rules(thresholds: list[float]) -> dict:
    """Name -> whether the rule promotes a candidate on its versus votes."""
    named = {f"people >= {t:.0%}": (lambda w, t=t: people_verdict(w, t).promoted) for t in thresholds}
    named["interval's top >= 50% (not shown worse)"] = lambda w: w.interval()[1] >= 0.5
    named["interval's bottom >= 50% (shown better)"] = lambda w: w.interval()[0] >= 0.5
    return named


def score_rule(promotes, decisions: list[PeopleDecision]) -> dict:
    """Agreement of one rule with the judge's sign over `decisions`, and the judge's points of its two mistakes; a
    level gap (0) is no mistake whatever the rule does."""
    worse = [d for d in decisions if promotes(d.versus) and d.judge_gap < 0]
    held = [d for d in decisions if not promotes(d.versus) and d.judge_gap > 0]
    return {"n": len(decisions), "agree": len(decisions) - len(worse) - len(held), "worse_promoted": len(worse),
            "worse_points": round(sum(d.judge_gap for d in worse), 1), "better_held": len(held),
            "better_points": round(sum(d.judge_gap for d in held), 1)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="pairs of a demo's log and its database: RUN.log RUN.db ...")
    parser.add_argument("--thresholds", default="0.4,0.45,0.5,0.55,0.6", help="people's thresholds to replay")
    parser.add_argument("--min-gap", type=float, default=5.0, help="judge's gap in points for the second count")
    args = parser.parse_args(argv)
    if len(args.runs) % 2:
        parser.error("give each run as its log and its database, in that order")
    decisions = [d for log, db in zip(args.runs[::2], args.runs[1::2]) for d in read_decisions(Path(log), Path(db))]
    for d in decisions:
        low, high = d.versus.interval()
        print(f"{d.run:16s} round {d.round}: people {d.versus.win_rate:.1%} ({low:.0%}-{high:.0%}, "
              f"n={d.versus.judged:g}), judge's gap {d.judge_gap:+.1f} points")
    clear = [d for d in decisions if abs(d.judge_gap) >= args.min_gap]
    results = {}
    headings = {"all": f"All {len(decisions)} decisions", "clear": f"The {len(clear)} decisions whose judge's gap is "
                f"{args.min_gap:g} points or more either way"}
    named = rules([float(t) for t in args.thresholds.split(",")])
    for key, subset in (("all", decisions), ("clear", clear)):
        print(f"\n{headings[key]}; {sum(d.judge_gap > 0 for d in subset)} of them better by the judge:")
        for name, promotes in named.items():
            score = results.setdefault(name, {})[key] = score_rule(promotes, subset)
            print(f"  {name:42s} agrees {score['agree']:2d}/{score['n']}; worse promoted {score['worse_promoted']}"
                  f" ({score['worse_points']:+.1f}), better held back {score['better_held']}"
                  f" ({score['better_points']:+.1f})")
    summary = {"decisions": len(decisions), "better_by_judge": sum(d.judge_gap > 0 for d in decisions),
               "min_gap": args.min_gap, "rules": results}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
