"""The Annotate tab: `AnnotateHandlers` (sign-in, the one vote handler, looking for work) and its page.

The handlers return an `AnnotateView`, which `AnnotateComponents.render` turns into `{component: value}`: every
event of the tab returns such a dict, so what it sets is named, never counted by position. A component an event
lists as an output but leaves out of its dict keeps what it shows (Gradio skips it).
"""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import gradio as gr

from annotate.background import PairJob, RoundStarter
from annotate.store import Store
from annotate.text_limits import answer_problem
from annotate.ui_session import (
    SET_COOKIE_JS, AppConfig, Session, clean_name, escape, render_untrusted, session_cookie, session_ended,
    signed_in_name,
)
from annotate.ui_style import SHOW_NEW_PAIR_JS, render_prompt
from annotate.ui_votes import (
    CHOICE_LABELS, GRADED_CHOICES, SCREEN_CHOICES, VOTE_BUTTONS, VOTE_NOT_SAVED, screen_vote, stored_vote_label,
)


@dataclass(frozen=True)
class AnnotateView:
    """What the annotate tab shows after a handler ran."""

    signed_in: bool
    pair_id: int | None
    prompt_html: str = ""
    left_html: str = ""
    right_html: str = ""
    progress: str = ""
    """Markdown: who is signed in, their votes, pairs left."""
    status: str = ""
    """Markdown: what just happened, or why there is no pair."""
    recorded: bool = False
    """A vote was recorded by this call (the page then clears the better-answer box)."""
    earlier_vote_stands: bool = False
    """This person had already voted on the pair (another tab): nothing was recorded, the page moved on."""

    @property
    def waiting(self) -> bool:
        """Signed in without a pair: the page keeps looking for one."""
        return self.signed_in and self.pair_id is None


class AnnotateHandlers:
    """Sign-in, the one vote handler, and looking for work while the queue is empty."""

    def __init__(self, store: Store, config: AppConfig, job: PairJob, runner: RoundStarter):
        self.store, self.config, self.job, self.runner = store, config, job, runner
        self._first_admin_lock = threading.Lock()

    def user(self, session: Session | None, request: gr.Request | None = None) -> str | None:
        return signed_in_name(session, request, self.config)

    def sign_in(self, raw_name: str, session: Session,
                request: gr.Request | None = None) -> tuple[Session, AnnotateView, str]:
        """Sign in (the name comes from the login when an auth file is used); returns (session, view, message)."""
        if self.config.require_auth:
            name, problem = self.user(session, request), "Sign in through the login page first."
        else:
            name, problem = clean_name(raw_name)
        if name is None:
            return session, AnnotateView(signed_in=False, pair_id=None), problem
        session, view = self._sign_in_as(session, name)
        return session, view, ""

    def resume(self, session: Session, request: gr.Request | None = None) -> tuple[Session, AnnotateView, str]:
        """On page load: sign back in whoever the browser's session cookie names (a reload, a server restart);
        returns (session, view, why the session ended: "" when it did not, or when there was none)."""
        name = self.user(session, request)
        if name is None:
            return session, AnnotateView(signed_in=False, pair_id=None), session_ended(request, self.config)
        session, view = self._sign_in_as(session, name)
        return session, view, ""

    def _sign_in_as(self, session: Session, name: str) -> tuple[Session, AnnotateView]:
        session = replace(session, name=name, showing=None, notes=[])
        with self._first_admin_lock:
            if not self.config.admins and not any(a.role == "admin" for a in self.store.annotators()):
                self.store.set_role(name, "admin")
                session.notes.append("You are the first person to sign in, so you are the **admin** (start the app "
                                     "with `--admin NAME` to choose admins instead).")
            else:
                self.store.add_annotator(name)
        session = self._show_next(session, name)
        return session, self.view(session, name, "Signed in.")

    def vote(self, choice: str, shown_pair_id: int | float | None, better_answer: str | None,
             session: Session, request: gr.Request | None = None) -> tuple[Session, AnnotateView]:
        """The one vote handler for all seven buttons and keys: record the choice, show the next pair at once.

        `shown_pair_id` is the pair the page displayed; a second submit of it (a double click, a retried request)
        finds the session already moved on and records nothing more (the store ignores a repeat as well).
        """
        name = self.user(session, request)
        if name is None:
            return session, AnnotateView(signed_in=False, pair_id=None,
                                         status=session_ended(request, self.config) or "Sign in first.")
        if session.name is None and not self.config.require_auth:
            # The server forgot this tab (it restarted) and the session cookie named the person again; which side
            # they saw each answer on went with the old server, so the vote cannot be read: show the pair again.
            session, view = self._sign_in_as(session, name)
            return session, replace(view, status="The app restarted, so that vote was not recorded: please vote "
                                                 "again.")
        if choice not in SCREEN_CHOICES:
            return session, self.view(session, name, f"Unknown choice {escape(str(choice))}: use one of "
                                                     f"{', '.join(SCREEN_CHOICES)}.")
        showing = session.showing
        if showing is None or shown_pair_id is None or int(shown_pair_id) != showing.pair_id:
            return session, self.view(session, name, "That vote was already recorded.")
        if problem := answer_problem(better_answer or "", self.config.max_answer_chars):
            # the same pair stays, and the box keeps the text (the view records nothing), so it can be shortened
            return session, self.view(session, name, f"{problem} Nothing was recorded yet; your answer is still in "
                                                     "the box.")
        seconds = round(time.monotonic() - session.shown_at, 3)
        side, strength = screen_vote(choice)
        try:
            outcome = self.store.submit_vote(showing.pair_id, name, showing.stored_choice(side), showing.a_on_left,
                                             seconds, better_answer, strength, self.config.max_answer_chars)
        except sqlite3.OperationalError as error:  # disk full, database locked or read-only: the admin reads why
            print(f"app: the vote of {name} on pair {showing.pair_id} was not saved: {error}", file=sys.stderr)
            return session, self.view(session, name, VOTE_NOT_SAVED)  # the same pair stays, the better answer too
        if outcome.recorded:
            notes = [f"Recorded: {CHOICE_LABELS[choice]}."]
            if outcome.demonstration_id is not None:
                notes.append("Your better answer was saved.")
            if self.runner.maybe_auto_start():
                notes.append("A training round started automatically.")
        else:  # another tab of this person (or a parallel submit) voted on this pair first
            earlier = stored_vote_label(showing.screen_choice(outcome.choice), outcome.strength)
            notes = [f"Your earlier vote ({earlier}) stands; this one "
                     f"was not recorded{' (nor its better answer)' if (better_answer or '').strip() else ''}."]
        session = self._show_next(session, name)
        view = self.view(session, name, " ".join(notes))
        return session, replace(view, recorded=outcome.recorded, earlier_vote_stands=not outcome.recorded)

    def look_for_pair(self, session: Session, request: gr.Request | None = None) -> tuple[Session, AnnotateView]:
        """While waiting (empty queue, first batch generating): show a pair as soon as one exists."""
        name = self.user(session, request)
        if name is None:
            return session, AnnotateView(signed_in=False, pair_id=None)
        if session.name != name:  # with an auth file the session learns the name from the login
            session = replace(session, name=name)
        if session.showing is None:
            session = self._show_next(session, name)
        return session, self.view(session, name, "")

    def _show_next(self, session: Session, name: str) -> Session:
        showing = self.store.next_pair(name, overlap=self.config.overlap, gold_share=self.config.gold_share)
        return replace(session, showing=showing, shown_at=time.monotonic())

    def view(self, session: Session, name: str, status: str) -> AnnotateView:
        showing = session.showing
        left = self.store.pairs_waiting(annotator=name, overlap=self.config.overlap)
        role = self.store.role_of(name) or "annotator"
        progress = (f"Signed in as **{escape(name)}** ({role}) · your votes: {self.store.votes_by(name)} · "
                    f"pairs left: {left}")
        notes = " ".join(session.notes)
        session.notes.clear()
        if showing is None:
            waiting = ["**No pairs are waiting for you right now.**"]
            job_status = self.job.status_text()
            if self.job.running():
                waiting.append(f"{job_status} New pairs appear here as soon as they are ready.")
            else:
                waiting.append("An admin can generate more in the Admin tab; this page picks them up by itself.")
            status = " ".join(part for part in [notes, status, *waiting] if part)
            return AnnotateView(signed_in=True, pair_id=None, progress=progress, status=status)
        if role == "admin":  # the id --gold and the Admin tab's "Mark gold" take; annotators see no ids
            progress += f" · pair {showing.pair_id}"
        return AnnotateView(
            signed_in=True, pair_id=showing.pair_id, prompt_html=render_prompt(showing.prompt),
            left_html=render_untrusted(showing.left), right_html=render_untrusted(showing.right),
            progress=progress, status=" ".join(part for part in [notes, status] if part),
        )


def read_guidelines(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return f"(No guidelines yet: write them in `{path}`.)"


@dataclass(frozen=True)
class AnnotateComponents:
    """The tab's components that its events read or write; `render` keys what they show by these."""

    session: gr.State
    sign_in_column: gr.Column
    """The sign-in form: shown until someone signs in, and again when their session ended."""
    name_box: gr.Textbox
    sign_in_button: gr.Button
    sign_in_message: gr.Markdown
    """Under the sign-in form: why someone is (back) there."""
    work_column: gr.Column
    """Progress, status, the pair and the guidelines: shown once someone signed in."""
    progress: gr.Markdown
    status: gr.Markdown
    pair_column: gr.Column
    """The prompt, both answers, the vote bar and the better-answer box: hidden while there is no pair."""
    prompt_html: gr.HTML
    left_html: gr.HTML
    right_html: gr.HTML
    vote_buttons: dict[str, gr.Button]
    """Screen choice -> its button, in the bar's order (annotate/ui_votes.py)."""
    better_answer: gr.Textbox
    shown_pair_id: gr.Number
    """Hidden: the pair on screen, sent back with the vote so a double submit cannot count against the next pair."""
    api_choice: gr.Textbox
    """Hidden: the vote API's choice (bench/annotate_load.py): the same handler, the choice as a parameter."""
    api_vote: gr.Button
    waiting_timer: gr.Timer
    """Looks for a pair while someone signed in has none."""
    cookie: gr.Textbox
    """Hidden: the signed session token, on its way to document.cookie (SET_COOKIE_JS); the page never reads it."""

    def render(self, view: AnnotateView, after_vote: bool = False) -> dict:
        """The view as {component: value}: the layout, the pair, progress and status.

        After a vote the page already shows the work area, the pair panel and the timer off, so those are left out
        (not sent again, which keeps the busiest event of the app cheap) unless they change: the layout when the
        server no longer knows who votes (a session that ended), the pair panel and the timer when the queue ran dry.
        """
        has_pair = view.pair_id is not None
        shown = {self.shown_pair_id: view.pair_id if has_pair else -1, self.prompt_html: view.prompt_html,
                 self.left_html: view.left_html, self.right_html: view.right_html, self.progress: view.progress,
                 self.status: view.status}
        if not (after_vote and view.signed_in):
            shown |= {self.sign_in_column: gr.update(visible=not view.signed_in),
                      self.work_column: gr.update(visible=view.signed_in)}
        if not (after_vote and has_pair):
            shown |= {self.pair_column: gr.update(visible=has_pair), self.waiting_timer: gr.Timer(active=view.waiting)}
        return shown

    def render_outputs(self) -> list:
        """Every component `render` may set, in the order the API returns them (bench/annotate_load.py reads the
        pair id and the status of /sign_in and /vote by position)."""
        return [self.sign_in_column, self.work_column, self.pair_column, self.shown_pair_id, self.prompt_html,
                self.left_html, self.right_html, self.progress, self.status, self.waiting_timer]

    def sign_in_outputs(self) -> list:
        return [self.session, self.sign_in_message, *self.render_outputs(), self.cookie]

    def vote_outputs(self) -> list:
        """The vote API's outputs; a vote button's add the sign-in message."""
        return [self.session, self.better_answer, *self.render_outputs()]


def _sign_in_message(view: AnnotateView) -> str:
    """The line under the sign-in form: why someone is (back) there; cleared once they are signed in."""
    return "" if view.signed_in else view.status


@dataclass
class AnnotateTab:
    """What build_app wires beyond the tab: the page load signs in, and the admin tab follows every sign-in."""

    sign_in_events: list
    on_load: Callable
    sign_in_outputs: list
    cookie: gr.Textbox


def build_annotate_tab(handlers: AnnotateHandlers, config: AppConfig, session: gr.State) -> AnnotateTab:
    """Lay out the tab (sign-in form, work area, hidden helpers) and wire its events."""
    tab = AnnotateComponents(session=session, **_sign_in_form(config), **_work_column(config),
                             **_hidden_helpers(config))
    on_load, sign_in_events = _wire_sign_in(handlers, config, tab)
    _wire_votes(handlers, tab)
    _wire_waiting(handlers, tab)
    return AnnotateTab(sign_in_events=sign_in_events, on_load=on_load, sign_in_outputs=tab.sign_in_outputs(),
                       cookie=tab.cookie)


def _sign_in_form(config: AppConfig) -> dict:
    """The sign-in column: a note, the name box and the button (without an auth file), the message line."""
    with gr.Column(visible=True) as sign_in_column:
        if config.require_auth:
            gr.Markdown("Signing you in with your login…")
        else:
            gr.Markdown("### Sign in\nType your name: your votes are recorded under it. Names are not checked: anyone "
                        "who can open this page can sign in under any name, admins' included (start the app with "
                        "`--auth FILE` to give people passwords).", elem_id="sign-in-note")
        name_box = gr.Textbox(label="Your name", elem_id="sign-in-name", max_length=64,
                              visible=not config.require_auth)
        sign_in_button = gr.Button("Start annotating", variant="primary", elem_id="sign-in-button",
                                   visible=not config.require_auth)
        sign_in_message = gr.Markdown(elem_id="sign-in-message")
    return dict(sign_in_column=sign_in_column, name_box=name_box, sign_in_button=sign_in_button,
                sign_in_message=sign_in_message)


def _work_column(config: AppConfig) -> dict:
    """The work column, hidden until someone signs in: progress, status, the pair panel, the guidelines."""
    with gr.Column(visible=False) as work_column:
        progress = gr.Markdown(elem_id="progress")
        status = gr.Markdown(elem_id="status")
        pair = _pair_column()
        with gr.Accordion("Guidelines", open=False):
            gr.Markdown(read_guidelines(config.guidelines_path))
    return dict(work_column=work_column, progress=progress, status=status, **pair)


def _pair_column() -> dict:
    """The prompt, answers A and B side by side, the vote bar and the better-answer box."""
    with gr.Column(visible=False) as pair_column:
        gr.Markdown("**Prompt**")
        prompt_html = gr.HTML(elem_id="prompt", js_on_load=None)
        with gr.Row(equal_height=False):
            with gr.Column():
                gr.Markdown("**Answer A**")
                left_html = gr.HTML(elem_id="answer-left", js_on_load=None)
            with gr.Column():
                gr.Markdown("**Answer B**")
                right_html = gr.HTML(elem_id="answer-right", js_on_load=None)
        with gr.Row(elem_id="vote-bar"):  # sticks to the bottom of the screen (ui_style.CSS)
            vote_buttons = {
                choice: gr.Button(f"{label}  [{key}]", elem_id=f"vote-{choice}",
                                  variant="primary" if choice in GRADED_CHOICES else "secondary")
                for choice, label, key in VOTE_BUTTONS
            }
        better_answer = gr.Textbox(label="Optional: write a better answer (saved with your vote as an example "
                                         "for training)", lines=3, elem_id="better-answer")
    return dict(pair_column=pair_column, prompt_html=prompt_html, left_html=left_html, right_html=right_html,
                vote_buttons=vote_buttons, better_answer=better_answer)


def _hidden_helpers(config: AppConfig) -> dict:
    """Components the page never shows (AnnotateComponents says what each is for)."""
    return dict(shown_pair_id=gr.Number(value=-1, precision=0, visible=False, elem_id="shown-pair-id"),
                api_choice=gr.Textbox(visible=False), api_vote=gr.Button(visible=False),
                waiting_timer=gr.Timer(config.waiting_poll_s, active=False), cookie=gr.Textbox(visible=False))


# Event functions are closures, not functools.partial: Gradio finds the gr.Request parameter by its type hint, which
# a partial hides. Every one returns {component: value} (AnnotateComponents.render).
FAST = {"concurrency_limit": None, "show_progress": "hidden"}


def _wire_sign_in(handlers: AnnotateHandlers, config: AppConfig, tab: AnnotateComponents) -> tuple[Callable, list]:
    """The sign-in button and the name box's Enter; returns (the page-load handler, the sign-in events)."""
    def signed_in(state: Session, view: AnnotateView, why_signed_out: str, ended: str = "") -> dict:
        view = view if view.signed_in else replace(view, status=why_signed_out)
        return tab.render(view) | {tab.session: state, tab.sign_in_message: _sign_in_message(view),
                                   tab.cookie: session_cookie(state, config, ended)}

    def sign_in(raw_name: str, state: Session, request: gr.Request):
        return signed_in(*handlers.sign_in(raw_name, state, request))

    def on_load(state: Session, request: gr.Request):
        if config.require_auth:
            return sign_in("", state, request)
        state, view, ended = handlers.resume(state, request)
        if view.signed_in:
            return signed_in(state, view, "")
        # Nobody to sign back in: the page already shows the sign-in form, so the layout and the session are left
        # alone. On a busy server a quick sign-in can answer before this load does, and must not be undone by it.
        kept = {component: gr.skip() for component in tab.sign_in_outputs()}
        if not ended:
            return kept
        return kept | {tab.sign_in_message: ended, tab.cookie: session_cookie(state, config, ended)}  # clears it

    inputs, outputs = [tab.name_box, tab.session], tab.sign_in_outputs()
    sign_in_events = [
        tab.sign_in_button.click(sign_in, inputs, outputs, api_name="sign_in", **FAST),
        tab.name_box.submit(sign_in, inputs, outputs, api_visibility="private", **FAST),
    ]
    for sign_in_event in sign_in_events:
        sign_in_event.then(None, [tab.cookie], None, js=SET_COOKIE_JS)
    return on_load, sign_in_events


def _wire_votes(handlers: AnnotateHandlers, tab: AnnotateComponents) -> None:
    """The seven vote buttons (their keys click them) and the vote API: one handler, the choice as a parameter."""
    def voted(state: Session, view: AnnotateView, better: str) -> dict:
        # The better-answer box is cleared once the vote (and the answer with it) went through, or lost to another tab.
        kept = "" if view.recorded or view.earlier_vote_stands else better
        return tab.render(view, after_vote=True) | {tab.session: state, tab.better_answer: kept}

    def vote(choice: str, pair_id, better: str, state: Session, request: gr.Request):
        return voted(*handlers.vote(choice, pair_id, better, state, request), better)

    def vote_for(choice: str):
        def vote_button(pair_id, better: str, state: Session, request: gr.Request):
            state, view = handlers.vote(choice, pair_id, better, state, request)
            shown = voted(state, view, better)
            if not view.signed_in:  # a person (not the API) sees the sign-in form come back: say why there
                shown[tab.sign_in_message] = _sign_in_message(view)
            return shown

        return vote_button

    inputs = [tab.shown_pair_id, tab.better_answer, tab.session]
    for choice, button in tab.vote_buttons.items():
        button.click(vote_for(choice), inputs, [*tab.vote_outputs(), tab.sign_in_message], api_visibility="private",
                     **FAST).then(None, js=SHOW_NEW_PAIR_JS)
    tab.api_vote.click(vote, [tab.api_choice, *inputs], tab.vote_outputs(), api_name="vote", **FAST)


def _wire_waiting(handlers: AnnotateHandlers, tab: AnnotateComponents) -> None:
    """While someone signed in has no pair, the timer looks for one (and stops once it is shown)."""
    def look_for_pair(state: Session, request: gr.Request):
        state, view = handlers.look_for_pair(state, request)
        return tab.render(view) | {tab.session: state}

    tab.waiting_timer.tick(look_for_pair, [tab.session], [tab.session, *tab.render_outputs()],
                           api_visibility="private", **FAST)
