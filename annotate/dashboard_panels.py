"""What the Dashboard shows of the rounds, as data: the headline of the last round, one panel per quantity across
rounds, the last round's steps, and the rounds table. Pure functions of the store's rows; every metric is read through
the one vocabulary (annotate.metrics), so no name is guessed.

Honest numbers: held-out accuracy is the random sample pairs' (the estimate of how the reward model ranks what the
policy writes), with its Wilson interval on its own n; training accuracy is shown beside it and called so; the bar
below which PPO is refused is a line on its panel. The human win rate of a policy is over the votes on its versus
pairs, with its interval and the counts behind it. The judge's figures exist only where a simulated annotator judged
(the demo loop).
"""

from __future__ import annotations

from datetime import datetime

from annotate.metrics import (DEMO_ANNOTATOR, DEMO_JUDGE_SCORE, DEMO_WIN_RATE, DEMO_WIN_RATE_HIGH, DEMO_WIN_RATE_LOW,
                              HISTORY, PPO_KL, PPO_POLICY_LOSS, PPO_REWARD, PPO_STEP, PPO_VALUE_LOSS,
                              RM_HELDOUT_ACCURACY, RM_HELDOUT_HIGH, RM_HELDOUT_LOW, RM_HELDOUT_N, RM_TRAIN_ACCURACY,
                              ROUND_MIN_ACCURACY, ROUND_PAIRS_USED, ROUND_VOTES, Metric)
from annotate.plots import Panel, Series
from annotate.promotion import PromotionDecision
from annotate.records import Policy, Round, WinRate, current_policy_of, newest_policy

NO_ROUNDS = "No rounds yet: each finished round adds a point here."
NO_STEPS = "No rounds yet: the last round's per-step curves appear here."
NO_HISTORY = "No round has kept a per-step history yet."
NO_VERSUS_VOTES = "No votes on versus pairs yet: each round queues some that put its policy against the one before."
ROUND_COLUMNS = ["round", "status", "started", "votes", "preference pairs", "held-out accuracy (95%, n)",
                 "training accuracy", "mean reward", "KL", "duration", "error"]
WIN_RATE_COLUMNS = ["policy", "against", "wins", "losses", "ties", "both bad", "win rate (95%)"]


def win_rate_text(win_rate: WinRate) -> str:
    """"62% (51%-72%)", or "" without votes."""
    interval = win_rate.interval()
    if interval is None:
        return ""
    return f"{win_rate.win_rate:.0%} ({interval[0]:.0%}-{interval[1]:.0%})"


def accuracy_text(metrics: dict) -> str:
    """Held-out accuracy on the random sample pairs with its interval and n: "72.0% (61%-81%, n=80)"."""
    accuracy = RM_HELDOUT_ACCURACY.of(metrics)
    if accuracy is None:
        return ""
    low, high, n = RM_HELDOUT_LOW.of(metrics), RM_HELDOUT_HIGH.of(metrics), RM_HELDOUT_N.of(metrics)
    if low is None or high is None or n is None:
        return RM_HELDOUT_ACCURACY.text(accuracy)
    return f"{RM_HELDOUT_ACCURACY.text(accuracy)} ({low:.0%}-{high:.0%}, n={n:.0f})"


def _parse_time(stamp: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None
    except ValueError:
        return None


def duration_text(started_at: str | None, finished_at: str | None, now: datetime | None = None) -> str:
    start, end = _parse_time(started_at), _parse_time(finished_at) or now
    if start is None or end is None:
        return ""
    seconds = max(0, int((end - start).total_seconds()))
    return f"{seconds // 60}m {seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def rounds_rows(rounds: list[Round], now: datetime | None = None) -> list[list]:
    """The rounds table, newest first; a figure a round did not record is left blank."""
    rows = []
    for r in reversed(rounds):
        m = r.metrics
        rows.append([r.id, r.status, (r.started_at or "")[:19].replace("T", " "), ROUND_VOTES.text(ROUND_VOTES.of(m)),
                     ROUND_PAIRS_USED.text(ROUND_PAIRS_USED.of(m)), accuracy_text(m),
                     RM_TRAIN_ACCURACY.text(RM_TRAIN_ACCURACY.of(m)), PPO_REWARD.text(PPO_REWARD.of(m)),
                     PPO_KL.text(PPO_KL.of(m)), duration_text(r.started_at, r.finished_at,
                                                              now if r.status == "running" else None), r.error or ""])
    return rows


def win_rate_rows(win_rates: list[WinRate], policies: list[Policy]) -> list[list]:
    round_of = {p.id: p.round for p in policies}
    return [[f"round {round_of.get(w.policy_id, '?')} (policy {w.policy_id})",
             f"round {round_of.get(w.opponent_id, '?')} (policy {w.opponent_id})",
             w.wins, w.losses, w.ties, w.both_bad, win_rate_text(w)] for w in win_rates]


def _series(rounds: list[Round], metric: Metric, label: str | None = None, low: Metric | None = None,
            high: Metric | None = None) -> Series:
    """A metric across rounds (x: the round's id), with its interval where the round recorded one."""
    points, band = [], []
    for r in rounds:
        value = metric.of(r.metrics)
        if value is None:
            continue
        points.append((r.id, value))
        if low is not None and high is not None and None not in (low.of(r.metrics), high.of(r.metrics)):
            band.append((r.id, low.of(r.metrics), high.of(r.metrics)))
    return Series(label or metric.label, points, band)


def _bar(rounds: list[Round]) -> list[tuple[float, str]]:
    bars = [ROUND_MIN_ACCURACY.of(r.metrics) for r in rounds if ROUND_MIN_ACCURACY.of(r.metrics)]
    return [(bars[-1], f"bar {bars[-1]:.0%}")] if bars else []


def human_win_rate_series(win_rates: list[WinRate], policies: list[Policy]) -> Series:
    """Each policy's win rate against the one its versus pairs put it against, by the policy's round."""
    round_of = {p.id: p.round for p in policies}
    points, band = [], []
    for w in sorted(win_rates, key=lambda w: round_of.get(w.policy_id, 0)):
        interval = w.interval()
        if interval is None or w.policy_id not in round_of:
            continue
        points.append((round_of[w.policy_id], w.win_rate))
        band.append((round_of[w.policy_id], *interval))
    return Series("people's votes on versus pairs", points, band)


def across_rounds(rounds: list[Round], win_rates: list[WinRate], policies: list[Policy]) -> list[Panel]:
    """One panel per quantity across rounds; the judge's only where a simulated annotator judged."""
    finished = [r for r in rounds if r.status != "failed" or RM_HELDOUT_ACCURACY.of(r.metrics) is not None]
    panels = [
        Panel("Reward model: held-out accuracy (random sample pairs)",
              [_series(finished, RM_HELDOUT_ACCURACY, "held-out, 95% interval", RM_HELDOUT_LOW, RM_HELDOUT_HIGH),
               _series(finished, RM_TRAIN_ACCURACY, "training accuracy (pairs trained on)")],
              percent=True, references=[(0.5, "chance")] + _bar(rounds), empty_note=NO_ROUNDS),
        Panel("People's win rate of each policy against the one before", [human_win_rate_series(win_rates, policies)],
              x_label="policy's round", percent=True, references=[(0.5, "even")], empty_note=NO_VERSUS_VOTES),
        Panel("PPO: mean reward (score - KL)", [_series(finished, PPO_REWARD)], empty_note=NO_ROUNDS),
        Panel("PPO: KL to the reference (nats an answer)", [_series(finished, PPO_KL)], empty_note=NO_ROUNDS),
        Panel("Votes and preference pairs", [_series(rounds, ROUND_VOTES, "votes"),
                                             _series(rounds, ROUND_PAIRS_USED, "preference pairs")],
              empty_note=NO_ROUNDS),
    ]
    judged = _series(finished, DEMO_WIN_RATE, "judge, 95% interval", DEMO_WIN_RATE_LOW, DEMO_WIN_RATE_HIGH)
    if judged.points:
        annotator = next(r.metrics.get(DEMO_ANNOTATOR) for r in reversed(finished)
                         if DEMO_WIN_RATE.of(r.metrics) is not None)
        panels.append(Panel(f"Judge ({annotator}, simulated): win rate against the first policy", [judged],
                            percent=True, references=[(0.5, "even")]))
    return panels


def last_round_with_history(rounds: list[Round]) -> Round | None:
    return next((r for r in reversed(rounds) if isinstance(r.metrics.get(HISTORY), list) and r.metrics[HISTORY]),
                None)


def within_round(rounds: list[Round]) -> tuple[str, list[Panel]]:
    """(title, panels) of the last round that kept PPO's steps: reward and KL in one, the losses in another."""
    last = last_round_with_history(rounds)
    note = NO_STEPS if not rounds else NO_HISTORY
    history = last.metrics[HISTORY] if last else []

    def by_step(metric: Metric) -> Series:
        return Series(metric.label, [(PPO_STEP.of(step), metric.of(step)) for step in history
                                     if PPO_STEP.of(step) is not None and metric.of(step) is not None])

    title = f"**Within round {last.id}** ({last.status}): PPO step by step" if last else "**Within the last round**"
    return title, [Panel("PPO: reward and KL by step", [by_step(PPO_REWARD), by_step(PPO_KL)], x_label="step",
                         empty_note=note),
                   Panel("PPO: losses by step", [by_step(PPO_POLICY_LOSS), by_step(PPO_VALUE_LOSS)], x_label="step",
                         empty_note=note)]


def headline(rounds: list[Round], win_rates: list[WinRate], policies: list[Policy]) -> str:
    """Markdown: did the last finished round help? Its reward model's held-out accuracy (interval, n, the bar), its
    training accuracy labelled as such, people's votes on the newest policy, the judge where there is one."""
    done = [r for r in rounds if r.status == "done"]
    if not done:
        return "**No rounds yet.** A round trains a reward model on the votes, then PPO; its figures appear here."
    last, m = done[-1], done[-1].metrics
    lines = [f"**Round {last.id}** ({last.status})"]
    if (accuracy := accuracy_text(m)):
        bar = ROUND_MIN_ACCURACY.of(m)
        lines.append(f"- Reward model, held-out accuracy on random sample pairs it never trained on: **{accuracy}**"
                     + (f"; the bar for PPO is {bar:.0%}" if bar else "") + ".")
    if (trained := RM_TRAIN_ACCURACY.of(m)) is not None:
        lines.append(f"- Training accuracy (on the pairs it trained on; not a measure of what it learned): "
                     f"{RM_TRAIN_ACCURACY.text(trained)}.")
    lines.append(_newest_votes_line(win_rates, policies))
    if (promotion := promotion_line(policies)):
        lines.append(promotion)
    if (judge := DEMO_WIN_RATE.of(m)) is not None:
        lines.append(f"- Judge ({m.get(DEMO_ANNOTATOR)}, simulated): win rate against the first policy "
                     f"**{DEMO_WIN_RATE.text(judge)}** ({DEMO_WIN_RATE_LOW.text(DEMO_WIN_RATE_LOW.of(m))}-"
                     f"{DEMO_WIN_RATE_HIGH.text(DEMO_WIN_RATE_HIGH.of(m))}), mean score "
                     f"{DEMO_JUDGE_SCORE.text(DEMO_JUDGE_SCORE.of(m))}.")
    return "\n".join(lines)


def _newest_votes_line(win_rates: list[WinRate], policies: list[Policy]) -> str:
    round_of = {p.id: p.round for p in policies}
    voted = [w for w in win_rates if w.win_rate is not None and w.policy_id in round_of]
    if not voted:
        return f"- {NO_VERSUS_VOTES}"
    newest = max(voted, key=lambda w: (round_of[w.policy_id], w.policy_id))
    return (f"- People's votes on versus pairs: policy {newest.policy_id} (round {round_of[newest.policy_id]}) against "
            f"policy {newest.opponent_id}: **{win_rate_text(newest)}** ({newest.wins} wins, {newest.losses} losses, "
            f"{newest.ties} ties, {newest.both_bad} both bad; ties count half).")


def promotion_line(policies: list[Policy]) -> str:
    """Markdown: whether the newest policy is promoted (the current one) or a candidate, and why; "" before any round's
    policy (annotate.promotion)."""
    if not policies or (newest := newest_policy(policies)).round == 0:
        return ""
    current = current_policy_of(policies)
    decision = PromotionDecision.from_json(newest.promotion)
    state = "promoted: the current policy, which writes the pairs and starts the next round" \
        if newest.id == current.id else \
        f"a candidate, not promoted: policy {current.id} (round {current.round}) stays the current one"
    why = f" ({decision.rule}: {decision.reason})" if decision is not None else ""
    return (f"- Policy {newest.id} (round {newest.round}) is **{state}**{why}. An admin overrides with "
            f"`python app.py --promotion {newest.id} promote`, `reject` or `auto`.")
