"""The annotation app: `build_app(store, generator, config) -> gr.Blocks`.

Handlers are plain methods of `AnnotateHandlers` (and `AdminHandlers`, `DashboardHandlers`) taking the session and
the request, so tests call them without a browser; `build_app` only lays out components and wires events. Every
handler goes through the store: no SQL, no files here. No module-level state: everything lives in the objects
`build_app` creates, so two apps (tests) never share anything.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import gradio as gr

from annotate.background import PairJob, RoundStarter
from annotate.store import Store
from annotate.ui_admin import AdminHandlers, build_admin_tab
from annotate.ui_dashboard import DashboardHandlers, build_dashboard_tab
from annotate.ui_style import CSS, SHOW_NEW_PAIR_JS, keyboard_js, render_prompt
from annotate.identity import SessionTokens
from annotate.ui_session import (
    SET_COOKIE_JS, AppConfig, Session, clean_name, escape, render_untrusted, session_cookie, session_ended,
    signed_in_name,
)
from annotate.ui_votes import (
    CHOICE_LABELS, GRADED_CHOICES, KEYS, SCREEN_CHOICES, VOTE_BUTTONS, screen_vote, stored_vote_label,
)

# Keys 1-7 click the vote buttons (annotate/ui_votes.py: graded choices, screen sides, strengths).
KEYBOARD_JS = keyboard_js(KEYS)


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
        seconds = round(time.monotonic() - session.shown_at, 3)
        side, strength = screen_vote(choice)
        outcome = self.store.submit_vote(showing.pair_id, name, showing.stored_choice(side), showing.a_on_left,
                                         seconds, better_answer, strength=strength)
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
        showing = self.store.next_pair(name, overlap=self.config.overlap)
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


def build_app(store: Store, job: PairJob, runner: RoundStarter, config: AppConfig | None = None) -> gr.Blocks:
    """The whole app. `job` makes pairs in the background (a child process in the app, loop.children; a fake
    generator in tests), `runner` starts training rounds as child processes; on a first start with prompts and no
    pairs the job makes config.first_batch_pairs."""
    config = config or AppConfig()
    if config.sessions is None and not config.require_auth:
        config = replace(config, sessions=SessionTokens.beside(store.path))
    for admin in config.admins:
        store.set_role(admin, "admin")
    if config.first_batch_pairs > 0 and store.count_pairs() == 0 and store.count_prompts() > 0:
        job.start(config.first_batch_pairs, versus_share=0.0, started_by="first start")
    annotate = AnnotateHandlers(store, config, job, runner)
    admin = AdminHandlers(store, config, job, runner)
    dashboard = DashboardHandlers(store, config)

    with gr.Blocks(title="rlhf-loop", analytics_enabled=False) as demo:
        session = gr.State(Session())
        gr.HTML(f"<style>{CSS}</style>", container=False, js_on_load=None)
        with gr.Tabs():
            with gr.Tab("Annotate", id="annotate") as annotate_tab_block:
                annotate_tab = _build_annotate_tab(annotate, config, session)
            with gr.Tab("Dashboard", id="dashboard") as dashboard_tab_block:
                dashboard_timer, dashboard_outputs = build_dashboard_tab(dashboard, config)
            with gr.Tab("Admin", id="admin", visible=False) as admin_tab_block:  # shown to admins on sign-in
                admin_timer, admin_outputs = build_admin_tab(admin, session, config)

        # Dashboard and admin pages refresh on a timer only while they are open, so twenty annotators on the
        # Annotate tab cost no polling.
        def open_dashboard():
            return gr.Timer(active=True), gr.Timer(active=False), *dashboard.refresh()

        def open_admin(state: Session, request: gr.Request):
            return gr.Timer(active=False), gr.Timer(active=True), *admin.overview(state, request)

        private = {"api_visibility": "private", "concurrency_limit": None}
        annotate_tab_block.select(lambda: (gr.Timer(active=False), gr.Timer(active=False)), None,
                                  [dashboard_timer, admin_timer], **private)
        dashboard_tab_block.select(open_dashboard, None, [dashboard_timer, admin_timer, *dashboard_outputs],
                                   **private)
        admin_tab_block.select(open_admin, [session], [dashboard_timer, admin_timer, *admin_outputs], **private)
        demo.load(None, js=KEYBOARD_JS)
        # With an auth file the login already named this person; without one the session cookie may: sign them in.
        loaded = demo.load(annotate_tab.on_load, [session], annotate_tab.sign_in_outputs, api_visibility="private",
                           concurrency_limit=None)
        loaded.then(None, [annotate_tab.cookie], None, js=SET_COOKIE_JS)

        def show_admin_tab(state: Session, request: gr.Request):
            return gr.Tab(visible=admin.tab_visible(state, request))

        for signed_in in (loaded, *annotate_tab.sign_in_events):
            signed_in.then(show_admin_tab, [session], [admin_tab_block], **private)
    return demo


@dataclass
class _AnnotateComponents:
    sign_in_events: list
    on_load: Callable
    sign_in_outputs: list
    cookie: gr.Textbox


def _render(view: AnnotateView, after_vote: bool = False) -> tuple:
    """AnnotateView -> values for the pair outputs (see _build_annotate_tab).

    After a vote the pair panel is already visible and the waiting timer off: unless the queue just ran dry, those
    two are skipped rather than sent again, which keeps the busiest event of the app cheap.
    """
    has_pair = view.pair_id is not None
    unchanged = after_vote and has_pair
    return (
        gr.skip() if unchanged else gr.update(visible=has_pair),
        view.pair_id if has_pair else -1,
        view.prompt_html, view.left_html, view.right_html,
        view.progress, view.status,
        gr.skip() if unchanged else gr.Timer(active=view.waiting),
    )


def _render_layout(view: AnnotateView, after_vote: bool = False) -> tuple:
    """Sign-in form or the work area. A vote only changes them when the server no longer knows who votes (a session
    that ended): then the sign-in form comes back, and _sign_in_message says why."""
    if after_vote and view.signed_in:
        return gr.skip(), gr.skip()
    return gr.update(visible=not view.signed_in), gr.update(visible=view.signed_in)


def _sign_in_message(view: AnnotateView) -> str | dict:
    """The line under the sign-in form: why someone is (back) there; cleared once they are signed in."""
    return "" if view.signed_in else view.status


def _build_annotate_tab(handlers: AnnotateHandlers, config: AppConfig, session: gr.State) -> _AnnotateComponents:
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
    with gr.Column(visible=False) as work_column:
        progress = gr.Markdown(elem_id="progress")
        status = gr.Markdown(elem_id="status")
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
                buttons = {
                    choice: gr.Button(f"{label}  [{key}]", elem_id=f"vote-{choice}",
                                      variant="primary" if choice in GRADED_CHOICES else "secondary")
                    for choice, label, key in VOTE_BUTTONS
                }
            better_answer = gr.Textbox(label="Optional: write a better answer (saved with your vote as an example "
                                             "for training)", lines=3, elem_id="better-answer")
        with gr.Accordion("Guidelines", open=False):
            gr.Markdown(read_guidelines(config.guidelines_path))
    # The pair on screen: sent back with the vote so a double submit cannot count against the next pair.
    shown_pair_id = gr.Number(value=-1, precision=0, visible=False, elem_id="shown-pair-id")
    # The vote API for scripts (bench/annotate_load.py): the same handler, the choice as a parameter.
    api_choice = gr.Textbox(visible=False)
    api_vote = gr.Button(visible=False)
    waiting_timer = gr.Timer(config.waiting_poll_s, active=False)
    # The signed session token, on its way to document.cookie (SET_COOKIE_JS): the page never reads it back.
    cookie = gr.Textbox(visible=False)

    layout_outputs = [sign_in_column, work_column]
    pair_outputs = [pair_column, shown_pair_id, prompt_html, left_html, right_html, progress, status, waiting_timer]

    # Event functions are closures, not functools.partial: Gradio finds the gr.Request parameter by its type hint,
    # which a partial hides.
    def sign_in(raw_name: str, state: Session, request: gr.Request):
        state, view, message = handlers.sign_in(raw_name, state, request)
        view = view if view.signed_in else replace(view, status=message)
        return state, _sign_in_message(view), *_render_layout(view), *_render(view), session_cookie(state, config)

    def on_load(state: Session, request: gr.Request):
        if config.require_auth:
            return sign_in("", state, request)
        state, view, ended = handlers.resume(state, request)
        view = view if view.signed_in else replace(view, status=ended)
        return state, _sign_in_message(view), *_render_layout(view), *_render(view), \
            session_cookie(state, config, ended)

    def after_vote(state: Session, view: AnnotateView, better: str) -> tuple:
        # The better-answer box is cleared once the vote (and the answer with it) went through, or lost to another tab.
        return state, "" if view.recorded or view.earlier_vote_stands else better, \
            *_render_layout(view, after_vote=True), \
            *_render(view, after_vote=True)

    def vote(choice: str, pair_id, better: str, state: Session, request: gr.Request):
        return after_vote(*handlers.vote(choice, pair_id, better, state, request), better)

    def vote_for(choice: str):
        def vote_button(pair_id, better: str, state: Session, request: gr.Request):
            state, view = handlers.vote(choice, pair_id, better, state, request)
            # A person (not the API) sees the sign-in form come back when their session ended: say why there.
            return *after_vote(state, view, better), gr.skip() if view.signed_in else _sign_in_message(view)

        return vote_button

    def look_for_pair(state: Session, request: gr.Request):
        state, view = handlers.look_for_pair(state, request)
        return state, *_render_layout(view), *_render(view)

    fast = {"concurrency_limit": None, "show_progress": "hidden"}
    sign_in_outputs = [session, sign_in_message, *layout_outputs, *pair_outputs, cookie]
    sign_in_events = [
        sign_in_button.click(sign_in, [name_box, session], sign_in_outputs, api_name="sign_in", **fast),
        name_box.submit(sign_in, [name_box, session], sign_in_outputs, api_visibility="private", **fast),
    ]
    for sign_in_event in sign_in_events:
        sign_in_event.then(None, [cookie], None, js=SET_COOKIE_JS)
    vote_outputs = [session, better_answer, *layout_outputs, *pair_outputs]
    for choice, button in buttons.items():
        button.click(vote_for(choice), [shown_pair_id, better_answer, session], [*vote_outputs, sign_in_message],
                     api_visibility="private", **fast).then(None, js=SHOW_NEW_PAIR_JS)
    api_vote.click(vote, [api_choice, shown_pair_id, better_answer, session], vote_outputs, api_name="vote", **fast)
    waiting_timer.tick(look_for_pair, [session], [session, *layout_outputs, *pair_outputs], api_visibility="private",
                       **fast)
    return _AnnotateComponents(sign_in_events=sign_in_events, on_load=on_load, sign_in_outputs=sign_in_outputs,
                               cookie=cookie)
