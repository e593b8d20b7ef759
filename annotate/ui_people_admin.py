"""Admin tab, "People and gold pairs": exclude or include an annotator and mark a pair's right answer from the browser,
as `python app.py --exclude NAME`, `--include NAME` and `--gold PAIR SIDE` do in the terminal (commands/annotators.py).

The handlers are a mixin of AdminHandlers (annotate/ui_admin.py), so they start with the same `refusal()` check: the
role is looked up in the store at the time of the call, whatever the page shows. Status lines are markdown in which
every name and every piece of prompt or answer text goes through `escape`.
"""

from __future__ import annotations

from typing import Callable

import gradio as gr

import pandas as pd

from annotate.people import store_gold_proposals
from annotate.records import Pair
from annotate.store import Store
from annotate.ui_session import PRIVATE_EVENT, AppConfig, Session, clean_name, escape

GOLD_SIDES = ("a", "b", "none")
PROPOSAL_COLUMNS = ["pair", "prompt", "right answer", "careful voters"]
SNIPPET_CHARS = 60


def snippet(text: str) -> str:
    """The start of a prompt or an answer on one line, escaped, to quote inside a status sentence."""
    line = " ".join(text.split())
    return escape(line if len(line) <= SNIPPET_CHARS else line[:SNIPPET_CHARS - 1] + "…")


class PeopleAdmin:
    """Exclusion and gold pairs; mixed into AdminHandlers, whose store, config and refusal() these use."""

    store: Store
    config: AppConfig
    refusal: Callable[..., str | None]
    """AdminHandlers.refusal: None when the caller is an admin now, else why not."""

    def annotator_choices(self, session: Session | None,
                          request: gr.Request | None = None) -> list[tuple[str, str]]:
        """(label, name) of everyone the store knows, the excluded marked so; none for a non-admin."""
        if self.refusal(session, request):
            return []
        return [(f"{a.name} (excluded)" if a.excluded_at else a.name, a.name) for a in self.store.annotators()]

    def set_excluded(self, raw_name: str | None, excluded: bool, session: Session | None,
                     request: gr.Request | None = None) -> str:
        """Exclude (excluded=True) or include again one annotator; the status line for the page."""
        if refused := self.refusal(session, request):
            return refused
        if not (raw_name or "").strip():
            return "Choose an annotator first."
        name, problem = clean_name(raw_name)
        if name is None:
            return problem
        known = {a.name: a for a in self.store.annotators()}
        if name not in known:
            return (f"No annotator named {escape(name)}: choose a name from the list (everyone who has signed in is "
                    "there).")
        votes = self.store.votes_by(name)
        since = known[name].excluded_at
        if excluded and since:
            return (f"Nothing changed: {escape(name)} is already excluded (since {since[:16].replace('T', ' ')}); "
                    f"their {votes} votes stay left out.")
        if not excluded and not since:
            return f"Nothing changed: {escape(name)} is not excluded; their {votes} votes count."
        self.store.set_excluded(name, excluded)
        if excluded:
            return (f"Excluded {escape(name)}: their {votes} votes stay in the database, left out of the next rounds "
                    "and of promotion.")
        return f"Included {escape(name)} again: their {votes} votes count again in the next rounds and in promotion."

    def mark_gold(self, pair_id: float | None, side: str | None, session: Session | None,
                  request: gr.Request | None = None) -> str:
        """Mark pair `pair_id`'s right answer ("a", "b") or make it an ordinary pair again ("none")."""
        if refused := self.refusal(session, request):
            return refused
        if pair_id is None or pair_id != int(pair_id) or pair_id < 1:
            return "Type a pair id first: a whole number from 1."
        if side not in GOLD_SIDES:
            return f"The right answer is one of {', '.join(GOLD_SIDES)}."
        pair_id = int(pair_id)
        try:
            pair = self.store.pair(pair_id)
        except KeyError:
            return (f"No pair with id {pair_id}: this database holds pairs 1 to {self.store.count_pairs()}. Check "
                    "the id and press Mark gold again.")
        gold = None if side == "none" else side
        prompt = snippet(self.store.prompt(pair.prompt_id).text)
        if pair.gold == gold:
            what = "not a gold pair" if gold is None else f"already a gold pair, answer {gold} right"
            return f"Pair {pair_id} (“{prompt}”) is {what}: nothing changed."
        self.store.set_gold(pair_id, gold)
        return self._gold_status(pair_id, prompt, gold, pair)

    def proposals_frame(self, session: Session | None, request: gr.Request | None = None) -> pd.DataFrame:
        """The proposed gold pairs, one row each (none for a non-admin)."""
        if self.refusal(session, request):
            return pd.DataFrame(columns=PROPOSAL_COLUMNS)
        rows = [[p.pair_id, " ".join(self.store.prompt(self.store.pair(p.pair_id).prompt_id).text.split())[:80],
                 p.side, p.voters] for p in store_gold_proposals(self.store)]
        return pd.DataFrame(rows, columns=PROPOSAL_COLUMNS)

    def accept_proposals(self, session: Session | None, request: gr.Request | None = None) -> str:
        """Mark every proposed pair gold on the side its careful voters agree on; the status line."""
        if refused := self.refusal(session, request):
            return refused
        proposals = store_gold_proposals(self.store)
        for proposal in proposals:
            self.store.set_gold(proposal.pair_id, proposal.side)
        if not proposals:
            return ("No pair to propose: none has two or more careful annotators (not excluded, not flagged) who "
                    "all picked the same answer. Raise [app] overlap so that pairs get several votes.")
        return (f"Marked {len(proposals)} proposed pairs gold; {len(self.store.gold_pair_ids())} gold pairs in all.")

    def _gold_status(self, pair_id: int, prompt: str, gold: str | None, pair: Pair) -> str:
        marked = len(self.store.gold_pair_ids())
        if gold is None:
            return f"Pair {pair_id} (“{prompt}”) is an ordinary pair again; {marked} gold pairs in all."
        answer = snippet(self.store.generation(pair.gen_a if gold == "a" else pair.gen_b).text)
        shown = (f"with [app] gold_share = {self.config.gold_share:g} that share of each annotator's next pairs "
                 "are gold pairs they have not voted on" if self.config.gold_share > 0
                 else "[app] gold_share is 0, so no one is shown gold pairs yet")
        return (f"Pair {pair_id} (“{prompt}”) is a gold pair, answer {gold} right (“{answer}”); {marked} gold pairs "
                f"in all; {shown}.")


def build_people_admin(handlers: PeopleAdmin, session: gr.State) -> None:
    """Lay out the "People and gold pairs" accordion inside the admin tab and wire its buttons."""
    with gr.Accordion("People and gold pairs", open=False, elem_id="people-admin") as accordion:
        gr.Markdown("Excluding someone keeps their votes in the database but leaves them out of the next rounds "
                    "and of promotion until they are included again. A gold pair's right answer measures each "
                    "person's gold accuracy (the people table on the Dashboard).")
        with gr.Row():
            person = gr.Dropdown([], label="Annotator", allow_custom_value=True, interactive=True,
                                 elem_id="exclude-name")
            exclude_button = gr.Button("Exclude", elem_id="exclude-button")
            include_button = gr.Button("Include", elem_id="include-button")
        exclusion_message = gr.Markdown(elem_id="exclusion-message")
        with gr.Row():
            pair_id = gr.Number(None, precision=0, minimum=1, label="Pair id", elem_id="gold-pair-id")
            side = gr.Radio(list(GOLD_SIDES), value="a", label="Right answer (none: an ordinary pair again)")
            gold_button = gr.Button("Mark gold", elem_id="gold-button")
        gold_message = gr.Markdown(elem_id="gold-message")
        proposed = gr.Dataframe(pd.DataFrame(columns=PROPOSAL_COLUMNS), interactive=False, wrap=True,
                                label="Proposed gold pairs: two or more careful annotators (not excluded, not flagged) "
                                      "picked the same answer", elem_id="gold-proposals")
        accept_button = gr.Button("Mark the proposed pairs gold", elem_id="accept-proposals")
        accept_message = gr.Markdown(elem_id="accept-message")

    def choices(state: Session, request: gr.Request):
        return gr.Dropdown(choices=handlers.annotator_choices(state, request))

    def exclusion(excluded: bool):
        def event(name, state: Session, request: gr.Request):
            return handlers.set_excluded(name, excluded, state, request), choices(state, request)
        return event

    def accept(state: Session, request: gr.Request):
        return handlers.accept_proposals(state, request), handlers.proposals_frame(state, request)

    accordion.expand(choices, [session], person, **PRIVATE_EVENT)
    accordion.expand(handlers.proposals_frame, [session], proposed, **PRIVATE_EVENT)
    accept_button.click(accept, [session], [accept_message, proposed], **PRIVATE_EVENT)
    gold_button.click(handlers.proposals_frame, [session], proposed, **PRIVATE_EVENT)
    exclude_button.click(exclusion(True), [person, session], [exclusion_message, person], **PRIVATE_EVENT)
    include_button.click(exclusion(False), [person, session], [exclusion_message, person], **PRIVATE_EVENT)
    gold_button.click(handlers.mark_gold, [pair_id, side, session], gold_message, **PRIVATE_EVENT)
