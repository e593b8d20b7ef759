"""Dashboard tab: counts, agreement, rounds and their metrics, human win rates of policies.

Round metrics are whatever the round recorded (a JSON object): the functions here read the names the round writes
(`rm/accuracy`, `ppo/reward`, `ppo/kl`, ...) and tolerate missing keys, so a running or failed round shows what it has.
A per-step history, when a round keeps one, is `metrics["history"]`: a list of {"step": n, "<metric>": value}
(the PPO trainer's per-step dicts, keyed `ppo/step`, fit as they are) or {"<metric>": [values]}.
"""

from __future__ import annotations

import math
from datetime import datetime

import gradio as gr
import pandas as pd

from annotate.records import Round
from annotate.statistics import wilson_interval
from annotate.store import Store
from annotate.ui_session import AppConfig

ACCURACY_KEYS = ("rm/accuracy", "rm/heldout_accuracy", "rm/eval_accuracy")
HELDOUT_SIZE_KEYS = ("rm/heldout_pairs", "rm/held_out_pairs", "rm/eval_pairs", "rm/n_heldout")
PAIRS_USED_KEYS = ("pairs_used", "data/preferences", "rm/pairs")
TRAIN_HELDOUT_KEYS = ("rm/n_train", "rm/n_heldout")
"""What rlhf/reward/train.py records: pairs used = trained on + held out."""
STEP_KEYS = ("step", "ppo/step", "rm/step")
REWARD_KEYS = ("ppo/reward", "ppo/mean_reward", "ppo/reward_mean")
KL_KEYS = ("ppo/kl", "ppo/mean_kl")
PLOTTED_ACROSS_ROUNDS = (("rm held-out accuracy", ACCURACY_KEYS), ("mean reward", REWARD_KEYS), ("KL", KL_KEYS))
ROUND_COLUMNS = ["round", "status", "started", "pairs used", "rm held-out accuracy", "mean reward", "KL",
                 "duration", "error"]
WIN_RATE_COLUMNS = ["policy", "against", "wins", "losses", "ties", "both bad", "win rate"]
AGREEMENT_COLUMNS = ["annotator 1", "annotator 2", "pairs", "agreement", "kappa"]
NO_ROUNDS_ACROSS = "No rounds yet: each finished round adds a point here."
NO_ROUNDS_WITHIN = "No rounds yet: the last round's per-step curves appear here."


def first_number(metrics: dict, keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def pairs_used(metrics: dict) -> int | None:
    value = first_number(metrics, PAIRS_USED_KEYS)
    if value is None:
        parts = [first_number(metrics, (key,)) for key in TRAIN_HELDOUT_KEYS]
        value = sum(parts) if None not in parts else None
    return None if value is None else int(value)


def accuracy_text(metrics: dict) -> str:
    """"0.72 (0.61-0.81, n=80)" with the Wilson interval when the held-out size is known."""
    accuracy = first_number(metrics, ACCURACY_KEYS)
    if accuracy is None:
        return ""
    size = first_number(metrics, HELDOUT_SIZE_KEYS)
    if size is None or size < 1:
        return f"{accuracy:.2f}"
    low, high = wilson_interval(accuracy, int(size))
    return f"{accuracy:.2f} ({low:.2f}-{high:.2f}, n={int(size)})"


def _parse_time(stamp: str | None) -> datetime | None:
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def duration_text(started_at: str | None, finished_at: str | None, now: datetime | None = None) -> str:
    start, end = _parse_time(started_at), _parse_time(finished_at) or now
    if start is None or end is None:
        return ""
    seconds = max(0, int((end - start).total_seconds()))
    return f"{seconds // 60}m {seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _number_text(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def rounds_frame(rounds: list[Round], now: datetime | None = None) -> pd.DataFrame:
    rows = []
    for r in reversed(rounds):  # newest first
        pairs = pairs_used(r.metrics)
        rows.append([
            r.id, r.status, (r.started_at or "")[:19].replace("T", " "),
            "" if pairs is None else str(pairs), accuracy_text(r.metrics),
            _number_text(first_number(r.metrics, REWARD_KEYS)), _number_text(first_number(r.metrics, KL_KEYS)),
            duration_text(r.started_at, r.finished_at, now if r.status == "running" else None), r.error or "",
        ])
    return pd.DataFrame(rows, columns=ROUND_COLUMNS)


def metrics_across_rounds(rounds: list[Round]) -> pd.DataFrame:
    """Long format (round, metric, value) for the headline metrics of every round that recorded them."""
    rows = []
    for r in rounds:
        for label, keys in PLOTTED_ACROSS_ROUNDS:
            value = first_number(r.metrics, keys)
            if value is not None:
                rows.append((r.id, label, value))
    return pd.DataFrame(rows, columns=["round", "metric", "value"])


def metrics_within_round(metrics: dict) -> pd.DataFrame:
    """Long format (step, metric, value) from metrics["history"]; empty when the round kept none."""
    history = metrics.get("history")
    rows = []
    if isinstance(history, list):
        for index, entry in enumerate(history):
            if not isinstance(entry, dict):
                continue
            step = next((entry[key] for key in STEP_KEYS if key in entry), index)
            for name, value in entry.items():
                if name not in STEP_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool) \
                        and math.isfinite(value):
                    rows.append((step, name, float(value)))
    elif isinstance(history, dict):
        for name, values in history.items():
            if isinstance(values, list):
                rows.extend((step, name, float(v)) for step, v in enumerate(values)
                            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
    return pd.DataFrame(rows, columns=["step", "metric", "value"])


def chart(frame: pd.DataFrame, empty_note: str) -> dict:
    """A plot's new value; an empty plot says why (a bare box reads as broken)."""
    return gr.update(value=frame, caption=empty_note if frame.empty else "")


def last_round_with_history(rounds: list[Round]) -> Round | None:
    for r in reversed(rounds):
        if not metrics_within_round(r.metrics).empty:
            return r
    return None


class DashboardHandlers:
    """Reads the store and shapes it for the dashboard; no writes."""

    def __init__(self, store: Store, config: AppConfig):
        self.store, self.config = store, config

    def counts_markdown(self, stats: dict) -> str:
        by_choice = stats["votes_by_choice"]
        choices = " · ".join(f"{name.replace('_', ' ')}: {count}" for name, count in by_choice.items())
        return (f"**Prompts** {stats['prompts']} · **pairs** {stats['pairs']} · **waiting** {stats['pairs_waiting']}"
                f" · **votes** {stats['votes']} · **preferences** (trainable pairs) {stats['preferences']}"
                f" · **better answers written** {stats['demonstrations']}\n\nVotes by choice: {choices}")

    def agreement(self) -> tuple[str, pd.DataFrame]:
        report = self.store.agreement()
        rows = [(p.annotator_1, p.annotator_2, p.items, f"{p.percent:.0%}",
                 "" if p.kappa is None else f"{p.kappa:.2f}") for p in report.by_pair]
        frame = pd.DataFrame(rows, columns=AGREEMENT_COLUMNS)
        if report.items == 0:
            return "No pair has two or more votes yet (start the app with overlap above 1 to measure agreement).", frame
        kappa = "undefined (one label only)" if report.kappa is None else f"{report.kappa:.2f}"
        return (f"Agreement over {report.items} pairs with two or more votes: **{report.percent:.0%}**, "
                f"Cohen's kappa **{kappa}**."), frame

    def win_rates(self) -> pd.DataFrame:
        round_of = {p.id: p.round for p in self.store.policies()}
        rows = [
            (f"round {round_of.get(w.policy_id, '?')} (policy {w.policy_id})",
             f"round {round_of.get(w.opponent_id, '?')} (policy {w.opponent_id})",
             w.wins, w.losses, w.ties, w.both_bad, "" if w.win_rate is None else f"{w.win_rate:.0%}")
            for w in self.store.versus_win_rates()
        ]
        return pd.DataFrame(rows, columns=WIN_RATE_COLUMNS)

    def refresh(self) -> tuple:
        """(counts, votes by annotator, agreement text, agreement table, rounds table, across-rounds plot,
        within-round title, within-round plot, win rates)."""
        stats = self.store.stats()
        by_annotator = pd.DataFrame(sorted(stats["votes_by_annotator"].items(), key=lambda item: -item[1]),
                                    columns=["annotator", "votes"])
        agreement_text, agreement_frame = self.agreement()
        rounds = self.store.rounds()
        last = last_round_with_history(rounds)
        no_history = NO_ROUNDS_WITHIN if not rounds else "No round has kept a per-step history yet."
        within_title = f"**Within round {last.id}** ({last.status})" if last else "**Within the last round**"
        return (self.counts_markdown(stats), by_annotator, agreement_text, agreement_frame,
                rounds_frame(rounds, now=datetime.now().astimezone()),
                chart(metrics_across_rounds(rounds), NO_ROUNDS_ACROSS), within_title,
                chart(metrics_within_round(last.metrics if last else {}), no_history), self.win_rates())


def build_dashboard_tab(handlers: DashboardHandlers, config: AppConfig) -> tuple[gr.Timer, list]:
    """Lay out the dashboard inside the current gr.Tab; returns (its refresh timer, the refresh outputs)."""
    refresh_button = gr.Button("Refresh", size="sm")
    counts = gr.Markdown(elem_id="dashboard-counts")
    with gr.Row():
        by_annotator = gr.Dataframe(pd.DataFrame(columns=["annotator", "votes"]), label="Votes by annotator",
                                    interactive=False)
        with gr.Column():
            agreement_text = gr.Markdown()
            agreement = gr.Dataframe(pd.DataFrame(columns=AGREEMENT_COLUMNS), label="Agreement per annotator pair",
                                     interactive=False)
    rounds = gr.Dataframe(pd.DataFrame(columns=ROUND_COLUMNS), label="Rounds (newest first)", interactive=False,
                          elem_id="rounds-table")
    with gr.Row():
        across = gr.LinePlot(pd.DataFrame(columns=["round", "metric", "value"]), x="round", y="value",
                             color="metric", title="Metrics across rounds", caption=NO_ROUNDS_ACROSS)
        with gr.Column():
            within_title = gr.Markdown()
            within = gr.LinePlot(pd.DataFrame(columns=["step", "metric", "value"]), x="step", y="value",
                                 color="metric", title="Metrics within the last round", caption=NO_ROUNDS_WITHIN)
    win_rates = gr.Dataframe(
        pd.DataFrame(columns=WIN_RATE_COLUMNS), interactive=False,
        label="Human win rate of each policy against an earlier one (versus pairs; ties count half)",
    )
    timer = gr.Timer(config.refresh_s, active=False)
    outputs = [counts, by_annotator, agreement_text, agreement, rounds, across, within_title, within, win_rates]
    refresh_button.click(handlers.refresh, None, outputs, api_visibility="private", concurrency_limit=None)
    timer.tick(handlers.refresh, None, outputs, api_visibility="private", concurrency_limit=None,
               show_progress="hidden")
    return timer, outputs
