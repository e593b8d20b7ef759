"""A round's report, as data and as one HTML page a team can read and mail: the same prompts answered by the policy
before the round and after it, side by side, with the reward model's score of each answer; people's votes on the new
policy's versus pairs; the round's headline figures, its settings and its seconds by stage.

loop.report makes it (it loads the models); the store keeps it as JSON (`to_dict` / `from_dict`); the Dashboard and
`--report` show it. Pure data and text, no torch. The page is self-contained: inline CSS, no script, nothing fetched.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from html import escape

from annotate.metrics import (
    HISTORY, PPO_KL, PPO_REWARD, RM_HELDOUT_ACCURACY, RM_HELDOUT_HIGH, RM_HELDOUT_LOW, RM_HELDOUT_N, RM_N_TRAIN,
    RM_TRAIN_ACCURACY, ROUND_NORMALIZE_REWARDS, ROUND_PPO_LAM, ROUND_PPO_REWARD, ROUND_PPO_SEED, ROUND_PROMOTION,
    ROUND_REFERENCE, ROUND_REWARD_MODEL_PATH, ROUND_RM_STRATEGY, ROUND_SECONDS, STAGES, Metric, stage_seconds,
)
from annotate.records import WinRate
from annotate.statistics import wilson_interval

SCORE_FMT = "{:.3f}"
"""How a reward-model score is written (the unit of ppo/score)."""
NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class ReportAnswer:
    """One prompt answered by both policies, each answer with the round's reward-model score (None: not scored)."""

    prompt: str
    before: str
    after: str
    before_score: float | None = None
    after_score: float | None = None


@dataclass(frozen=True)
class ReportFigure:
    """A number of the round as people read it: its metric's name and label, its value and how it is written, and
    its 95% interval and the n it was measured on (with the unit of n) where it has them."""

    name: str
    label: str
    value: float | None
    fmt: str = "{:.4g}"
    low: float | None = None
    high: float | None = None
    n: int | None = None
    unit: str = ""
    """What n counts: "pairs", "steps"."""

    @classmethod
    def of(cls, metric: Metric, metrics: dict, low: float | None = None, high: float | None = None,
           n: float | None = None, unit: str = "") -> "ReportFigure":
        return cls(metric.name, metric.label, metric.of(metrics), metric.fmt, low, high,
                   None if n is None else int(n), unit)

    def text(self) -> str:
        return "" if self.value is None else self.fmt.format(self.value)

    def interval_text(self) -> str:
        return "" if self.low is None or self.high is None else \
            f"{self.fmt.format(self.low)} to {self.fmt.format(self.high)}"

    def n_text(self) -> str:
        """"20 pairs", "1 step"; "" without an n."""
        unit = self.unit[:-1] if self.n == 1 and self.unit.endswith("s") else self.unit
        return "" if self.n is None else f"{self.n} {unit}".strip()


@dataclass(frozen=True)
class VersusVotes(WinRate):
    """People's votes on the versus pairs of the new policy (each pair's gen_a) against the round's actor (gen_b), as
    counted at `counted_at`."""

    counted_at: str = ""


@dataclass(frozen=True)
class RoundReport:
    """What the report of one round shows; `to_dict` is what the store keeps."""

    round_id: int
    before_policy_id: int
    """The round's actor: the policy PPO started from."""
    after_policy_id: int
    """The policy the round saved."""
    answers: tuple[ReportAnswer, ...]
    versus: VersusVotes
    figures: tuple[ReportFigure, ...]
    settings: tuple[tuple[str, str], ...]
    """(what, its value as text), in the order shown."""
    seconds: tuple[ReportFigure, ...]
    prompts_from: str = ""
    """Where the prompts came from and how they were answered, in a sentence."""
    unscored: str = ""
    """Why the answers carry no reward-model scores; "" when they carry them."""
    made_at: str = ""
    finished_at: str | None = None
    """When the round finished (None: it had not when the report was made)."""
    promotion: str = ""
    """The new policy's promotion decision at the round's end, in a sentence (`promotion_text`); "" when none."""

    def mean_scores(self) -> tuple[float | None, float | None]:
        """The mean reward-model score of the answers before and after (None where none was scored)."""
        before = [a.before_score for a in self.answers if a.before_score is not None]
        after = [a.after_score for a in self.answers if a.after_score is not None]
        return (sum(before) / len(before) if before else None, sum(after) / len(after) if after else None)

    def higher_after(self) -> int:
        """Prompts whose answer after the round scores above the one before."""
        return sum(1 for a in self.answers if a.before_score is not None and a.after_score is not None
                   and a.after_score > a.before_score)

    def to_dict(self) -> dict:
        """Plain JSON-able values (tuples as lists): what Store.save_round_report keeps."""
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def from_dict(cls, data: dict) -> "RoundReport":
        """The report `to_dict` gave, back from the store's JSON."""
        return cls(**{
            **data,
            "answers": tuple(ReportAnswer(**answer) for answer in data.get("answers", ())),
            "versus": VersusVotes(**data["versus"]),
            "figures": tuple(ReportFigure(**figure) for figure in data.get("figures", ())),
            "settings": tuple((str(what), str(value)) for what, value in data.get("settings", ())),
            "seconds": tuple(ReportFigure(**figure) for figure in data.get("seconds", ())),
        })


# what the report takes from the round's metrics and the store's counts ----------------------------------------------

def headline_figures(metrics: dict) -> tuple[ReportFigure, ...]:
    """Held-out accuracy with its 95% interval and n (Wilson, from the accuracy and n where the round recorded no
    interval), training accuracy with its n, PPO's mean reward and KL with the steps they are means over."""
    accuracy, n_heldout = RM_HELDOUT_ACCURACY.of(metrics), RM_HELDOUT_N.of(metrics)
    low, high = RM_HELDOUT_LOW.of(metrics), RM_HELDOUT_HIGH.of(metrics)
    if (low is None or high is None) and accuracy is not None and n_heldout:
        low, high = wilson_interval(accuracy, int(n_heldout))
    history = metrics.get(HISTORY)
    steps = len(history) if isinstance(history, list) and history else None
    return (
        ReportFigure.of(RM_HELDOUT_ACCURACY, metrics, low, high, n_heldout, "pairs"),
        ReportFigure.of(RM_TRAIN_ACCURACY, metrics, n=RM_N_TRAIN.of(metrics), unit="pairs"),
        ReportFigure.of(PPO_REWARD, metrics, n=steps, unit="steps"),
        ReportFigure.of(PPO_KL, metrics, n=steps, unit="steps"),
    )


def _setting_text(value) -> str:
    if value is None:
        return NOT_RECORDED
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def round_settings(metrics: dict, before: str, after: str) -> tuple[tuple[str, str], ...]:
    """What the round recorded of how it trained; `before` and `after` say which policies it went from and to."""
    rows = (
        ("reward-model strategy", metrics.get(ROUND_RM_STRATEGY)),
        ("PPO's reward", metrics.get(ROUND_PPO_REWARD)),
        ("PPO seed", metrics.get(ROUND_PPO_SEED)),
        ("GAE lambda", metrics.get(ROUND_PPO_LAM)),
        ("rewards normalised", metrics.get(ROUND_NORMALIZE_REWARDS)),
        ("actor (before the round)", before),
        ("new policy (after it)", after),
        ("reference (frozen)", metrics.get(ROUND_REFERENCE)),
        ("reward model", metrics.get(ROUND_REWARD_MODEL_PATH)),
    )
    return tuple((what, _setting_text(value)) for what, value in rows)


def round_seconds(metrics: dict) -> tuple[ReportFigure, ...]:
    """The seconds of each stage the round timed (annotate.metrics.STAGES), then the whole round's."""
    timed = [stage_seconds(stage) for stage in STAGES] + [ROUND_SECONDS]
    return tuple(ReportFigure.of(metric, metrics) for metric in timed if metric.of(metrics) is not None)


def promotion_text(metrics: dict) -> str:
    """The round-end promotion decision (round/promotion, annotate.promotion) in a sentence; "" without one."""
    decision = metrics.get(ROUND_PROMOTION)
    if not decision:
        return ""
    state = "promoted: it is the current policy" if decision["promoted"] else "kept a candidate, not promoted"
    return (f"At the round's end the new policy was {state} ({decision['rule']}: {decision['reason']}). People's "
            "votes on its versus pairs decide again at the next round's start (python app.py --policies).")


def versus_votes(win_rates: list[WinRate], policy_id: int, opponent_id: int, counted_at: str = "") -> VersusVotes:
    """The store's counts (Store.versus_win_rates) for `policy_id` against `opponent_id`; zeros without such votes."""
    for rate in win_rates:
        if (rate.policy_id, rate.opponent_id) == (policy_id, opponent_id):
            return VersusVotes(**asdict(rate), counted_at=counted_at)
    return VersusVotes(policy_id, opponent_id, counted_at=counted_at)


def with_votes_now(report: RoundReport, win_rates: list[WinRate], counted_at: str) -> RoundReport:
    """The report with its versus votes counted again: votes on the round's versus pairs arrive after it ends."""
    return replace(report, versus=versus_votes(win_rates, report.after_policy_id, report.before_policy_id,
                                               counted_at))


# the page ------------------------------------------------------------------------------------------------------------

STYLE = """
*{box-sizing:border-box}
body{margin:0;background:#f6f7f9;color:#1c1e21;font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
main{max-width:76rem;margin:0 auto;padding:1rem}
h1{font-size:1.6rem;margin:.5rem 0}h2{font-size:1.25rem;margin:1.8rem 0 .6rem}h3{font-size:1rem;margin:0 0 .5rem}
h4{font-size:.95rem;margin:0 0 .4rem}
nav{font-size:.9rem}nav a{color:#1a56a8;margin-right:.9rem}
.lead,.note{color:#4a4f57}.note{font-size:.9rem}
table{border-collapse:collapse;width:100%;background:#fff;font-size:.95rem}
th,td{text-align:left;vertical-align:top;padding:.4rem .6rem;border-bottom:1px solid #e2e5e9;overflow-wrap:break-word}
th{font-weight:600;background:#eef1f4}
td.num{font-variant-numeric:tabular-nums;white-space:nowrap}td.long{overflow-wrap:anywhere}#votes table{max-width:40rem}
.figures{display:grid;grid-template-columns:repeat(auto-fill,minmax(16rem,1fr));gap:.7rem}
.figure{background:#fff;border:1px solid #dde1e6;border-radius:8px;padding:.6rem .8rem}
.figure .label{font-size:.85rem;color:#4a4f57}.figure .value{font-size:1.5rem;font-weight:600}
.figure .detail{font-size:.85rem;color:#4a4f57;font-variant-numeric:tabular-nums}
.grid2{display:grid;grid-template-columns:1fr;gap:1rem}
.answer{background:#fff;border:1px solid #dde1e6;border-radius:8px;padding:.8rem;margin:0 0 1rem}
.text{white-space:pre-wrap;overflow-wrap:anywhere;margin:0;font-size:.95rem}
.prompt{background:#f1f3f5;border-radius:6px;padding:.5rem .6rem;margin-bottom:.7rem}
.sides{display:grid;grid-template-columns:1fr;gap:.7rem}
.side{border-left:4px solid #9aa3ad;padding:.1rem 0 .1rem .7rem;min-width:0}
.side.after{border-left-color:#2f6fd0}
.score{font-size:.85rem;color:#4a4f57;margin:0 0 .3rem;font-variant-numeric:tabular-nums}
.empty{font-style:italic;color:#6b7280}
@media (min-width:760px){.sides,.grid2{grid-template-columns:1fr 1fr}main{padding:1.5rem 2rem}}
@media print{body{background:#fff}nav{display:none}.answer{break-inside:avoid}}
"""


def _when(stamp: str | None) -> str:
    """A store timestamp (2024-05-01T12:00:00.000000Z) as people read it: 2024-05-01 12:00 UTC."""
    try:
        return datetime.strptime(stamp or "", "%Y-%m-%dT%H:%M:%S.%fZ").strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return stamp or "at an unknown time"


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]], classes: tuple[str, ...]) -> str:
    """A table of escaped cells, each column's cells of the class named for it in `classes` ("" for none)."""
    header = "".join(f"<th>{escape(cell)}</th>" for cell in head)
    body = "".join("<tr>" + "".join(f"<td class=\"{kind}\">{escape(cell)}</td>" if kind else f"<td>{escape(cell)}</td>"
                                    for kind, cell in zip(classes, row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>"


def _figure_tile(figure: ReportFigure) -> str:
    detail = " · ".join(part for part in (f"95% interval {figure.interval_text()}" if figure.interval_text() else "",
                                         f"n = {figure.n_text()}" if figure.n_text() else "") if part)
    return (f"<div class=\"figure\"><div class=\"label\">{escape(figure.label)}</div>"
            f"<div class=\"value\">{escape(figure.text() or NOT_RECORDED)}</div>"
            f"<div class=\"detail\">{escape(detail)}</div></div>")


def _figures_section(report: RoundReport) -> str:
    return ("<section id=\"figures\"><h2>Headline figures</h2><div class=\"figures\">"
            + "".join(_figure_tile(figure) for figure in report.figures) + "</div>"
            + "<p class=\"note\">Held-out accuracy is measured on random sample pairs of prompts the reward model "
              "never trained on; training accuracy on the pairs it trained on, so it says little about new answers. "
              "Mean reward and KL are PPO's means over its steps.</p></section>")


def _votes_section(report: RoundReport) -> str:
    votes = report.versus
    title = f"People's votes: policy {votes.policy_id} against policy {votes.opponent_id}"
    counted = f" Counted {escape(_when(votes.counted_at))}." if votes.counted_at else ""
    if not votes.judged and not votes.both_bad:
        return (f"<section id=\"votes\"><h2>{escape(title)}</h2><p class=\"lead\">No votes yet on the versus pairs of "
                f"the new policy against the one before it.{counted}</p></section>")
    rows = [(f"wins (policy {votes.policy_id}'s answer preferred)", str(votes.wins)),
            (f"losses (policy {votes.opponent_id}'s answer preferred)", str(votes.losses)),
            ("ties", str(votes.ties)), ("both bad", str(votes.both_bad))]
    rate = "no judged votes"
    if votes.win_rate is not None:
        low, high = votes.interval()
        rate = f"{votes.win_rate:.1%} (95% interval {low:.1%} to {high:.1%}, n = {votes.judged} judged votes)"
    return (f"<section id=\"votes\"><h2>{escape(title)}</h2>" + _table(("vote", "count"), rows, ("", "num"))
            + f"<p class=\"lead\"><strong>Win rate</strong>, ties counting half: {escape(rate)}.</p>"
            + f"<p class=\"note\">Both-bad votes judge neither side and are left out of the rate.{counted}</p>"
              "</section>")


def _score_line(score: float | None, other: float | None) -> str:
    if score is None:
        return "<p class=\"score\">not scored</p>"
    change = "" if other is None else f" (after − before: {score - other:+.3f})"
    return f"<p class=\"score\">reward-model score {SCORE_FMT.format(score)}{change}</p>"


def _answer_text(text: str) -> str:
    return f"<div class=\"text\">{escape(text)}</div>" if text.strip() else "<p class=\"empty\">(empty answer)</p>"


def _answer(index: int, total: int, answer: ReportAnswer, report: RoundReport) -> str:
    before = _score_line(answer.before_score, None)
    after = _score_line(answer.after_score, answer.before_score)
    return (f"<article class=\"answer\" id=\"prompt-{index}\"><h3>Prompt {index} of {total}</h3>"
            f"<div class=\"text prompt\">{escape(answer.prompt)}</div><div class=\"sides\">"
            f"<section class=\"side before\"><h4>Before: policy {report.before_policy_id}</h4>{before}"
            f"{_answer_text(answer.before)}</section>"
            f"<section class=\"side after\"><h4>After: policy {report.after_policy_id}</h4>{after}"
            f"{_answer_text(answer.after)}</section></div></article>")


def _answers_section(report: RoundReport) -> str:
    total = len(report.answers)
    intro = [escape(report.prompts_from)] if report.prompts_from else []
    before, after = report.mean_scores()
    if report.unscored:
        intro.append(f"Not scored: {escape(report.unscored)}")
    elif before is not None and after is not None:
        intro.append(f"Mean reward-model score: before {SCORE_FMT.format(before)}, after {SCORE_FMT.format(after)} "
                     f"(n = {total} prompts); the answer after scores higher on {report.higher_after()} of {total}.")
    items = "".join(_answer(i, total, answer, report) for i, answer in enumerate(report.answers, start=1))
    if not total:
        items = "<p class=\"lead\">No answers in this report.</p>"
    return (f"<section id=\"answers\"><h2>Answers before and after the round ({total} prompts)</h2>"
            + "".join(f"<p class=\"lead\">{line}</p>" for line in intro) + items + "</section>")


def report_html(report: RoundReport) -> str:
    """The report as one self-contained HTML page: inline CSS only, no script, no request of any kind; every text
    escaped; answers side by side on a wide screen and stacked on a narrow one."""
    finished = f"finished {_when(report.finished_at)}" if report.finished_at else "not finished when this was made"
    lead = (f"Policy {report.before_policy_id} before the round, policy {report.after_policy_id} after it. Round "
            f"{finished}; report made {_when(report.made_at)}.")
    seconds = _table(("stage", "seconds"), [(figure.label.removeprefix("seconds: "), figure.text())
                                            for figure in report.seconds], ("", "num")) if report.seconds else \
        "<p class=\"note\">The round recorded no timings.</p>"
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>Round {report.round_id} report: rlhf-loop</title><style>{STYLE}</style></head><body><main>"
        f"<header><h1>Round {report.round_id} report</h1><p class=\"lead\">{escape(lead)}</p>"
        + (f"<p class=\"lead\">{escape(report.promotion)}</p>" if report.promotion else "") +
        "<nav><a href=\"#figures\">Figures</a><a href=\"#votes\">Votes</a><a href=\"#settings\">Settings</a>"
        "<a href=\"#answers\">Answers</a></nav></header>"
        + _figures_section(report) + _votes_section(report)
        + "<div class=\"grid2\" id=\"settings\"><section><h2>Settings</h2>"
        + _table(("setting", "value"), list(report.settings), ("", "long"))
        + f"</section><section><h2>Seconds by stage</h2>{seconds}</section></div>"
        + _answers_section(report)
        + "<footer><p class=\"note\">Written by rlhf-loop from the round's record in its database.</p></footer>"
        "</main></body></html>\n"
    )
