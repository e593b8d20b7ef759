"""Typed rows the store returns and takes (no SQL here; annotate/store.py is the only module with SQL)."""

from __future__ import annotations

from dataclasses import dataclass, field

from annotate.metrics import ROUND_POLICY_ID
from annotate.statistics import wilson_interval

CHOICES = ("a", "b", "tie", "both_bad", "skip")
"""Vote choices, always about the pair's gen_a / gen_b whatever side the screen showed them on."""
PAIR_KINDS = ("sample", "versus")
STRENGTHS = {1: "slightly", 2: "much"}
"""How much better an a/b vote says the chosen answer is; a vote without one (older, or ungraded) reads as 1."""
CHOSEN_BY = ("random", "uncertain")
"""How a sample pair's two answers were picked: at random, or for the reward model's disagreement (active choice)."""
ROLES = ("annotator", "admin")
ROUND_STATUSES = ("running", "done", "failed")


@dataclass(frozen=True)
class ImportResult:
    """Outcome of adding prompts."""

    added: int
    """New prompts written."""
    skipped: int
    """Prompts already present (or repeated within the batch), not written again."""


@dataclass(frozen=True)
class Prompt:
    """One row of `prompts`."""

    id: int
    text: str
    source: str
    created_at: str


@dataclass(frozen=True)
class Policy:
    """One actor checkpoint; round 0 is the base (or SFT) model."""

    id: int
    round: int
    path: str
    parent_id: int | None
    created_at: str
    pruned_at: str | None = None
    """When its folder was deleted to bound the disk (round.keep_policies); None while it is there to load."""
    promoted: int | None = None
    """1 when the evidence says it is not worse than the policy it started from (loop.promotion): it writes the pairs
    and starts the next round; 0 a candidate, kept but not current; None for a row older than promotion (current)."""
    promotion: str | None = None
    """The last promotion decision as JSON (loop.promotion.PromotionDecision): its rule, reason and numbers."""
    promotion_override: str | None = None
    """An admin's "promote" or "reject", which wins over the evidence; None: the evidence decides."""

    @property
    def pruned(self) -> bool:
        return self.pruned_at is not None

    @property
    def is_promoted(self) -> bool:
        """Whether it may be the current policy: the base (round 0), a promoted one, or one from before promotion."""
        return self.round == 0 or self.promoted is None or bool(self.promoted)

    def pruned_sentence(self) -> str:
        """Why this pruned policy cannot be loaded, in a sentence that says what to do instead."""
        return (f"policy {self.id} (round {self.round}) was pruned at {self.pruned_at} to bound the disk "
                f"(round.keep_policies): its folder {self.path} is gone. Use a policy that is kept (python app.py "
                "--prune --dry-run lists them), or raise round.keep_policies to keep more from now on.")


def newest_policy(policies) -> Policy | None:
    """The policy of the highest round (the last recorded among equals); None for none."""
    return max(policies, key=lambda p: (p.round, p.id), default=None)


def current_policy_of(policies) -> Policy | None:
    """The newest promoted policy (Policy.is_promoted): it writes the pairs and the next round starts from it."""
    return newest_policy([p for p in policies if p.is_promoted])


@dataclass(frozen=True)
class Generation:
    """One answer written by a policy."""

    id: int
    prompt_id: int
    policy_id: int
    text: str
    n_tokens: int
    finish_reason: str
    created_at: str


@dataclass(frozen=True)
class NewGeneration:
    """A generated answer not yet stored (input of `Store.add_pairs_bulk`)."""

    policy_id: int
    text: str
    n_tokens: int
    finish_reason: str


@dataclass(frozen=True)
class NewPair:
    """Two answers to one prompt to be stored as generations and a pair (for versus: `a` is the newer policy's)."""

    prompt_id: int
    a: NewGeneration
    b: NewGeneration
    kind: str = "sample"
    chosen_by: str | None = None
    """For a sample pair, one of CHOSEN_BY; None for a versus pair."""


@dataclass(frozen=True)
class Pair:
    """One row of `pairs`."""

    id: int
    prompt_id: int
    gen_a: int
    gen_b: int
    kind: str
    created_at: str
    n_votes: int
    """Votes of any choice so far."""
    chosen_by: str | None = None
    """For a sample pair, one of CHOSEN_BY; None for a versus pair and for pairs stored before it was recorded."""
    gold: str | None = None
    """The right answer an admin marked ("a": gen_a, "b": gen_b); None: not a gold pair."""


@dataclass(frozen=True)
class Showing:
    """A pair as handed to one annotator: which generation appears on the left was drawn for this showing."""

    pair_id: int
    prompt_id: int
    prompt: str
    text_a: str
    text_b: str
    a_on_left: bool
    kind: str

    @property
    def left(self) -> str:
        return self.text_a if self.a_on_left else self.text_b

    @property
    def right(self) -> str:
        return self.text_b if self.a_on_left else self.text_a

    def stored_choice(self, screen_choice: str) -> str:
        """Translate a choice about screen sides (`left`/`right`, or tie/both_bad/skip) into one about gen_a/gen_b."""
        if screen_choice == "left":
            return "a" if self.a_on_left else "b"
        if screen_choice == "right":
            return "b" if self.a_on_left else "a"
        if screen_choice in ("tie", "both_bad", "skip"):
            return screen_choice
        raise ValueError(f"screen choice must be left, right, tie, both_bad or skip, not {screen_choice!r}")

    def screen_choice(self, stored_choice: str) -> str:
        """The inverse of stored_choice: a choice about gen_a/gen_b as the sides of this showing."""
        if stored_choice in ("a", "b"):
            return "left" if (stored_choice == "a") == self.a_on_left else "right"
        if stored_choice in ("tie", "both_bad", "skip"):
            return stored_choice
        raise ValueError(f"stored choice must be one of {', '.join(CHOICES)}, not {stored_choice!r}")


@dataclass(frozen=True)
class Vote:
    """One row of `votes`."""

    id: int
    pair_id: int
    annotator: str
    choice: str
    a_on_left: bool
    seconds: float | None
    created_at: str
    strength: int | None = None
    """For an a/b vote, 1 (slightly better) or 2 (much better); None: not graded (read as 1), or not an a/b vote."""


@dataclass(frozen=True)
class VoteOutcome:
    """What submitting a vote did."""

    recorded: bool
    """True when this call wrote the vote; False when the annotator's earlier vote on the pair stands."""
    choice: str
    """The choice now stored for this annotator and pair: this call's, or the earlier one that stands."""
    demonstration_id: int | None = None
    """The better answer written with this vote, when one was given and stored."""
    strength: int | None = None
    """The strength stored with `choice` (1 slightly, 2 much better; None ungraded or not an a/b vote)."""


@dataclass(frozen=True)
class Annotator:
    """A person (or simulated annotator) and their role, with their vote count."""

    name: str
    role: str
    created_at: str
    votes: int
    excluded_at: str | None = None
    """When an admin excluded them: their votes stay in the database, unused for training and promotion; None:
    included."""


@dataclass(frozen=True)
class NameClash:
    """A stored name kept apart from the normalised name it now reads as: merging would double a vote."""

    name: str
    """The name as it was stored (and still is)."""
    normalised: str
    """The person it reads as now (annotate.identity.clean_name)."""
    pairs: tuple[int, ...]
    """Pairs on which both names voted (or wrote a better answer)."""
    found_at: str


@dataclass(frozen=True)
class Round:
    """One training round."""

    id: int
    status: str
    started_at: str
    finished_at: str | None
    metrics: dict = field(hash=False)
    error: str | None
    pid: int | None


def round_that_made(rounds, policy_id: int) -> Round | None:
    """The round among `rounds` that saved policy `policy_id` (its round/policy_id); None for the base policy or one
    no round made (imported)."""
    return next((r for r in rounds if r.metrics.get(ROUND_POLICY_ID.name) == policy_id), None)


@dataclass(frozen=True)
class Preference:
    """A pair with a strict majority among its a/b votes, in TRL's prompt/chosen/rejected terms."""

    pair_id: int
    prompt: str
    chosen: str
    rejected: str
    votes: int
    """Number of a/b votes on the pair (ties, both_bad and skips are not counted)."""
    kind: str
    source: str = "sample"
    """"sample" (a sample pair drawn at random, or stored before that was recorded), "versus", or "chosen" (a sample
    pair picked for the reward model's disagreement): the round reports held-out accuracy by source."""
    strength: float = 1.0
    """How much better `chosen` is, the mean over the majority's votes: 1 slightly (or ungraded), 2 much."""
    weight: float = 1.0
    """How much the pair counts in the reward model's loss: 1 each with votes.weighting = "majority"; with
    "reliability", how sure the votes are given each voter's estimated accuracy (annotate.reliability)."""


@dataclass(frozen=True)
class VoteTexts:
    """An a/b vote as the texts it chose between: what the voter picked and what they did not."""

    annotator: str
    pair_id: int
    prompt: str
    chosen: str
    rejected: str


@dataclass(frozen=True)
class VersusVote:
    """One counted vote on a `versus` pair: "a" is a win of `policy_id` (the newer policy) over `opponent_id`."""

    policy_id: int
    opponent_id: int
    annotator: str
    choice: str


@dataclass(frozen=True)
class WinRate:
    """Human judgement of a policy against an earlier one, from `versus` pairs: counts of votes (the store's tallies),
    or, weighted by each voter's reliability (annotate.reliability.weighted_win_rates), sums of weights scaled to the
    votes' effective number, so that `judged` is what the interval rests on."""

    policy_id: int
    opponent_id: int
    wins: float = 0
    losses: float = 0
    ties: float = 0
    both_bad: float = 0

    @property
    def judged(self) -> float:
        """Votes that judged one side against the other: wins, losses and ties (both bad judges neither)."""
        return self.wins + self.losses + self.ties

    @property
    def win_rate(self) -> float | None:
        """(wins + ties / 2) / judged; None without such votes."""
        return (self.wins + 0.5 * self.ties) / self.judged if self.judged else None

    def interval(self) -> tuple[float, float] | None:
        """The win rate's 95% Wilson interval over the judged votes; None without such votes."""
        return None if self.win_rate is None else wilson_interval(self.win_rate, self.judged)

    def judged_text(self) -> str:
        """"83 judged votes", or for weighted votes "61.4 judged votes (effective, ...)"."""
        if float(self.judged).is_integer():
            return f"{self.judged:g} judged votes"
        return f"{self.judged:.1f} judged votes (effective, each weighed by its voter's reliability)"
