"""`python app.py --policies` and `python app.py --promotion POLICY ACTION`: every policy of a database with its
promotion decision (annotate.promotion), and an admin's override of one."""

from __future__ import annotations

import sys

from annotate.promotion import OVERRIDES, PromotionDecision, decide_for, refresh_promotions
from annotate.records import Policy
from commands.data import existing_store
from loop.config import LoopConfig

ACTIONS = (*OVERRIDES, "auto")
"""What --promotion does to a policy: promote or reject it whatever the evidence, or let the evidence decide again."""


def policy_line(policy: Policy, current_id: int) -> str:
    """One policy: its id, round, parent, state and the reason of its last decision."""
    decision = PromotionDecision.from_json(policy.promotion)
    if policy.round == 0:
        state = "base"
    else:
        state = "promoted" if policy.is_promoted else "candidate"
    why = f"; {decision.rule}: {decision.reason}" if decision is not None and policy.round > 0 else ""
    override = f" (override: {policy.promotion_override})" if policy.promotion_override else ""
    return (f"{'*' if policy.id == current_id else ' '} policy {policy.id}, round {policy.round}, from "
            f"{policy.parent_id if policy.parent_id is not None else '-'}: {state}{override}"
            f"{' (folder pruned)' if policy.pruned else ''}{why}")


def list_policies(args, config: LoopConfig) -> int:
    """Every policy with its decision taken again on the votes in now; the current one starred. Exit 2 without a
    database."""
    with existing_store(config.app.db) as store:
        refresh_promotions(store, config.promotion, config.votes.weighting)
        current = store.current_policy()
        policies = store.policies()
    if not policies:
        print("No policy yet: the first round records the base model.")
        return 0
    print("\n".join(policy_line(policy, current.id) for policy in policies))
    print(f"* the current policy (promotion.rule = {config.promotion.rule!r}): it writes the pairs and the next round "
          "starts from it.")
    return 0


def promotion(args, config: LoopConfig) -> int:
    """Set an admin's override of policy POLICY (promote, reject) or clear it (auto), then decide again and say what
    is current. Exit 2 on a bad policy id or action, or without a database."""
    policy_text, action = args.promotion
    if action not in ACTIONS or not policy_text.isdigit():
        print(f"error: --promotion POLICY ACTION takes a policy id and one of {', '.join(ACTIONS)} (got "
              f"{policy_text!r} {action!r}); python app.py --policies lists the policies.", file=sys.stderr)
        return 2
    with existing_store(config.app.db) as store:
        try:
            policy = store.policy(int(policy_text))
        except KeyError:
            print(f"error: {config.app.db} has no policy {policy_text}; python app.py --policies lists them.",
                  file=sys.stderr)
            return 2
        if policy.round == 0:
            print("error: the base policy (round 0) is always promoted: it has nothing to decide.", file=sys.stderr)
            return 2
        store.set_promotion_override(policy.id, None if action == "auto" else action)
        decision = decide_for(store, store.policy(policy.id), config.promotion, weighting=config.votes.weighting)
        current = store.current_policy()
    print(f"Policy {policy.id}: {'promoted' if decision.promoted else 'a candidate'} ({decision.rule}: "
          f"{decision.reason}). The current policy is {current.id} (round {current.round}).")
    return 0
