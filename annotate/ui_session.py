"""What every tab of the app shares: its configuration, the per-browser session, who is signed in, safe rendering.

Identity is always decided on the server: with an auth file it is the name Gradio's login verified
(`request.username`); without one it is the name this browser session signed in with, kept in server-side state,
or after a reload or a restart the name in the browser's session cookie, which the server signed (annotate.identity).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from markdown_it import MarkdownIt

from annotate.identity import SessionTokens, clean_name
from annotate.promotion import PromotionSettings
from annotate.records import Showing
from annotate.text_limits import MAX_ANSWER_CHARS, MAX_PROMPT_CHARS


@dataclass
class AppConfig:
    """How the annotation app behaves; `annotate.serve` fills it from the command line."""

    guidelines_path: Path = Path("data/guidelines.md")
    """Markdown shown in the collapsible guidelines panel (shipped, editable)."""
    admins: tuple[str, ...] = ()
    """Names made admin at start; when empty, the first person ever to sign in becomes admin."""
    require_auth: bool = False
    """True when Gradio's login (an auth file) verified who people are: names then come from the login."""
    overlap: int = 1
    """How many people vote on each pair (more than 1 measures agreement)."""
    gold_share: float = 0.0
    """Share of each person's next pairs drawn from the gold pairs they have not voted on ([app] gold_share)."""
    first_batch_pairs: int = 0
    """When the store has no pairs at start, generate this many in the background (0: do not)."""
    versus_share: float = 0.2
    """Default share of `versus` pairs (current policy against an earlier one) when an admin generates pairs."""
    waiting_poll_s: float = 2.0
    """While someone has no pair (queue empty, first batch generating), look for one this often."""
    refresh_s: float = 5.0
    """Dashboard and admin pages refresh this often while they are open."""
    max_prompt_chars: int = MAX_PROMPT_CHARS
    """Longest prompt the Admin tab imports, in characters ([app] max_prompt_chars)."""
    max_answer_chars: int = MAX_ANSWER_CHARS
    """Longest better answer an annotator may write, in characters ([app] max_answer_chars)."""
    promotion: PromotionSettings | None = None
    """[promotion] (loop.config.PromotionConfig): the Dashboard takes each policy's promotion decision again on the
    votes in when it refreshes; None: it shows the decisions as last taken."""
    weighting: str = "majority"
    """[votes] weighting: with "reliability" the Dashboard's promotion decisions weigh each versus vote as training
    does (annotate.promotion.store_win_rates)."""
    checkpoints_dir: Path | None = None
    """The database's checkpoint folder (<round.checkpoints_dir>/<db name>), whose size the Dashboard shows; None: the
    database's size alone."""
    sessions: SessionTokens | None = None
    """Signs the cookie that keeps a browser signed in without an auth file; build_app makes one beside the database
    when None."""


@dataclass
class Session:
    """One browser tab's state, kept on the server (gr.State): never trusted from the client."""

    name: str | None = None
    """Who signed in here (without an auth file)."""
    showing: Showing | None = None
    """The pair on screen, with the side gen_a was drawn to."""
    shown_at: float = 0.0
    """time.monotonic() when it was shown: the vote records the seconds spent."""
    notes: list[str] = field(default_factory=list)
    """One-off messages for the next render (e.g. "you are the admin")."""


def signed_in_name(session: Session | None, request, config: AppConfig) -> str | None:
    """The name of whoever sends this request, or None when nobody signed in.

    With an auth file: the login's name (Gradio keeps it as typed, so it is normalised here). Without: the name this
    tab signed in with, else the one in the browser's signed session cookie (after a reload or a server restart).
    """
    if config.require_auth:
        return clean_name(getattr(request, "username", None) if request is not None else None)[0]
    if session is not None and session.name:
        return session.name
    return config.sessions.from_request(request)[0] if config.sessions is not None else None


# The session cookie is written by the page (Gradio sets no cookies of its own for an app without auth); Secure on
# https, where a browser would otherwise send it in the clear after a redirect to http.
PRIVATE_EVENT = {"api_visibility": "private", "concurrency_limit": None}
"""How the page's own events run: kept out of the public API, and not queued behind the votes."""

SET_COOKIE_JS = """
(cookie) => { if (cookie) document.cookie = cookie + (location.protocol === 'https:' ? '; Secure' : ''); }
"""


def session_cookie(session: Session, config: AppConfig, ended: str = "") -> str:
    """What the page writes to document.cookie (SET_COOKIE_JS): a fresh token for whoever signed in here (a session
    lasts `lifetime_s` from the last sign-in or page load), a clearing cookie when the old one ended, else nothing."""
    sessions = config.sessions
    if sessions is None or config.require_auth:
        return ""
    if session.name:
        return sessions.cookie(sessions.issue(session.name))
    return sessions.clearing_cookie() if ended else ""


def session_ended(request, config: AppConfig) -> str:
    """Why this browser's session cookie no longer signs it in ("" when there is none, or it still does)."""
    if config.require_auth or config.sessions is None:
        return ""
    return config.sessions.from_request(request)[1]


@functools.cache
def _untrusted_markdown() -> MarkdownIt:
    # html=False: raw HTML in the text is escaped and shown as text (markdown-it's documented safe mode; its link
    # validator also drops javascript:, vbscript: and file: URLs). Images are off, so text cannot make the
    # browser fetch anything. Built once: rendering keeps no state in the instance, so threads can share it.
    return MarkdownIt("commonmark", {"html": False, "breaks": True}).enable("table").disable("image")


def render_untrusted(text: str) -> str:
    """Model output or a prompt as safe HTML: markdown renders, raw HTML and scripts appear as text."""
    if not text or not text.strip():
        return '<div class="untrusted"><em>(empty)</em></div>'
    return f'<div class="untrusted">{_untrusted_markdown().render(text)}</div>'


# Inline markdown that could change how a name reads (emphasis, code, links: no "[" means no link or image) and
# HTML. Names sit inside a sentence, never at the start of a line, so list and heading markers cannot apply.
MARKDOWN_SPECIALS = set("\\`*_[]<>&|~\"'")


def escape(text: str) -> str:
    """For names and other short untrusted strings placed inside our own HTML or markdown: shown as typed."""
    return "".join(f"&#{ord(c)};" if c in MARKDOWN_SPECIALS else c for c in text)
