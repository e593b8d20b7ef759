"""Simulated teams: careful rule annotators beside members who fail as real people do, voting as one team would.

A team spec is a comma-separated list of members, `ANNOTATOR[*COUNT][=SHARE]`:

- ANNOTATOR is a careful rule of annotate.simulate (courteous, polite, structured, example, formal, concise, longer,
  shorter, contains:WORD, module:function) or one of the careless kinds: `random` (clicks a or b at random, a tie
  one time in ten), `left` (always takes the answer shown on the left, whichever generation the store put there:
  `Showing.a_on_left`), `hasty` (a or b at random, in under a second). `longer` is the one who prefers the longer
  answer whatever the team's rule: a rule member like any other.
- `*COUNT` makes COUNT members of that kind (`courteous*3`: three courteous people, each with their own flips).
- `=SHARE` is the share of all the team's votes the item casts (`random=0.2`: a fifth); with `*COUNT` it is the
  group's, split equally (`courteous*3=0.6`: 0.2 each). Items without a share split what the shares leave equally,
  member by member; when every item has one, they must add up to 1. `=`, not `:`, because `contains:WORD` and
  `module:function` already hold colons.

Names: `sim:ANNOTATOR` for a kind that appears once in the team, `sim:ANNOTATOR-1`, `sim:ANNOTATOR-2` ... in the
order written for one that appears more than once (`courteous*3,random,left` -> sim:courteous-1, sim:courteous-2,
sim:courteous-3, sim:random, sim:left).

Each next pair goes to a member drawn by share (`simulate_team_votes`), as a real team's members each take the next
pair when they are free; a member with nothing left to vote on (every open pair already theirs, with overlap) drops
out of the draw. Rule members flip a share `noise` of their a/b votes (annotate.simulate.noisy). Every vote records
plausible seconds: careful members annotate.simulate.careful_seconds (median 12 s), random and left clickers
lognormal around 2.5 s (never under a second), hasty ones 0.3 to 0.9 s.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from annotate.annotators import score_scale
from annotate.simulate import (
    BUILT_IN_RULES,
    SCALE_ANSWERS,
    AnnotatorSpecError,
    Judge,
    SimulationResult,
    careful_seconds,
    cast_vote,
    noisy,
    resolve_judge,
    resolve_score,
)

CARELESS_KINDS = ("random", "left", "hasty")
"""Members who do not read: what people.py's left picks and median seconds, and annotate.reliability, should catch."""
TEAM_ANNOTATOR = "team"
"""`--simulate team`: vote with the team of [simulate] team (--team SPEC) rather than one annotator."""
RANDOM_TIE_SHARE = 0.1
"""How often the random clicker presses tie."""
CLICKER_MEDIAN_SECONDS = 2.5
"""A random or left clicker's median seconds on a pair: long enough to click, too short to read two answers."""
_ITEM = re.compile(r"^(?P<annotator>[^*=]+?)\s*(?:\*\s*(?P<count>\d+))?\s*(?:=\s*(?P<share>[0-9.]+))?$")
SPEC_HELP = ("a team is comma-separated ANNOTATOR[*COUNT][=SHARE] items, for example \"courteous*3,random,left\" or "
             "\"courteous*3,random=0.2,left=0.2\"; ANNOTATOR is a rule (" + ", ".join(BUILT_IN_RULES) +
             ", contains:WORD, module:function) or " + ", ".join(CARELESS_KINDS))


class TeamSpecError(AnnotatorSpecError):
    """A team spec that does not parse: the message says what was wrong and what is accepted."""


@dataclass(frozen=True)
class MemberSpec:
    """One member of a team as the spec names them."""

    name: str
    """The name their votes are cast under: sim:ANNOTATOR, or sim:ANNOTATOR-I when the kind appears more than once."""
    annotator: str
    """What votes: a rule spec (resolve_judge) or a CARELESS_KINDS kind."""
    share: float
    """Their share of the team's votes; the team's shares add up to 1."""

    @property
    def careful(self) -> bool:
        """A rule member: reads both answers and judges them (`longer` too, whatever the team's rule)."""
        return self.annotator not in CARELESS_KINDS


def _item(text: str, spec: str) -> tuple[str, int, float | None]:
    """(annotator, count, share or None) of one item of a team spec."""
    match = _ITEM.match(text.strip())
    if match is None:
        raise TeamSpecError(f"cannot read team member {text.strip()!r} in {spec!r}: {SPEC_HELP}")
    annotator, count, share = match["annotator"].strip(), int(match["count"] or 1), match["share"]
    known = annotator in BUILT_IN_RULES or annotator in CARELESS_KINDS or \
        (annotator.startswith("contains:") and len(annotator) > len("contains:")) or \
        re.fullmatch(r"[\w.]+:\w+", annotator) is not None
    if not known:
        raise TeamSpecError(f"unknown team member {annotator!r} in {spec!r}: {SPEC_HELP}")
    if count < 1:
        raise TeamSpecError(f"{text.strip()!r}: a count is at least 1")
    if share is None:
        return annotator, count, None
    try:
        value = float(share)
    except ValueError:
        raise TeamSpecError(f"{text.strip()!r}: the share {share!r} is not a number between 0 and 1") from None
    if not 0 < value <= 1:
        raise TeamSpecError(f"{text.strip()!r}: a share is more than 0 and at most 1, as 0.2 for a fifth of the votes")
    return annotator, count, value


def _shares(items: list[tuple[str, int, float | None]], spec: str) -> list[float]:
    """Each member's share: an item's share split over its count, the rest left split over the members without."""
    given = sum(share for _annotator, _count, share in items if share is not None)
    unshared = sum(count for _annotator, count, share in items if share is None)
    if given > 1 + 1e-9:
        raise TeamSpecError(f"the shares of {spec!r} add up to {given:g}, more than all the votes (1)")
    if unshared == 0 and abs(given - 1) > 1e-6:
        raise TeamSpecError(f"every member of {spec!r} has a share and they add up to {given:g}: they must add up to "
                            "1, or leave a member without a share to take what is left")
    if unshared and given > 1 - 1e-9:
        raise TeamSpecError(f"the shares of {spec!r} add up to 1 and leave nothing for the members without one")
    rest = (1 - given) / unshared if unshared else 0.0
    return [share / count if share is not None else rest
            for _annotator, count, share in items for _copy in range(count)]


def parse_team(spec: str) -> list[MemberSpec]:
    """The members of a team spec (the module docstring), in the order written; TeamSpecError says what is wrong.

    Only the syntax and the annotator kinds are checked: a module:function member is imported when the team is built
    (build_team).
    """
    if not spec or not spec.strip():
        raise TeamSpecError(f"the team is empty: {SPEC_HELP}")
    items = [_item(text, spec) for text in spec.split(",")]
    kinds = [annotator for annotator, count, _share in items for _copy in range(count)]
    seen: dict[str, int] = {}
    names = []
    for annotator in kinds:
        seen[annotator] = seen.get(annotator, 0) + 1
        names.append(f"sim:{annotator}" if kinds.count(annotator) == 1 else f"sim:{annotator}-{seen[annotator]}")
    return [MemberSpec(name, annotator, share) for name, annotator, share in zip(names, kinds, _shares(items, spec))]


def team_judge(members: list[MemberSpec]) -> str | None:
    """The annotator spec of the team's first careful (rule) member: the demo loop's judge of the win rate; None for
    a team of careless members only."""
    return next((member.annotator for member in members if member.careful), None)


@dataclass
class TeamMember:
    """A member ready to vote."""

    spec: MemberSpec
    judge: Judge
    """judge(prompt, left, right) -> "a" (the left answer) | "b" | "tie" | "both_bad", flips included."""
    seconds: Callable[[random.Random], float]
    """Seconds this member takes on a pair."""
    score: Callable[[str], float] | None = None
    """A rule member's score, which grades their a/b votes (annotate.simulate.graded); None: ungraded."""

    @property
    def name(self) -> str:
        return self.spec.name


def clicker_seconds(rng: random.Random) -> float:
    """A random or left clicker's seconds: lognormal around CLICKER_MEDIAN_SECONDS, at least one second."""
    return round(max(1.0, rng.lognormvariate(math.log(CLICKER_MEDIAN_SECONDS), 0.4)), 2)


def hasty_seconds(rng: random.Random) -> float:
    """A hasty voter's seconds: 0.3 to 0.9."""
    return round(rng.uniform(0.3, 0.9), 2)


def careless_judge(kind: str, rng: random.Random) -> Judge:
    """The verdicts of a careless kind, about the screen's sides ("a": left): random, left or hasty."""
    def random_clicker(prompt: str, left: str, right: str) -> str:
        return "tie" if rng.random() < RANDOM_TIE_SHARE else rng.choice("ab")

    def left_picker(prompt: str, left: str, right: str) -> str:
        return "a"

    def hasty(prompt: str, left: str, right: str) -> str:
        return rng.choice("ab")

    return {"random": random_clicker, "left": left_picker, "hasty": hasty}[kind]


def build_team(members: list[MemberSpec], noise: float = 0.0, seed: int = 0) -> list[TeamMember]:
    """Members ready to vote. Each draws from their own stream, seeded by `seed` and their name, so adding a member
    changes no one else's flips or clicks; rule members flip a share `noise` of their a/b votes. Raises
    AnnotatorSpecError for a rule that does not resolve (a module:function that does not import)."""
    team = []
    for member in members:
        rng = random.Random(f"{seed}:{member.name}")
        if member.careful:
            judge = resolve_judge(member.annotator)
            team.append(TeamMember(member, noisy(judge, noise, rng) if noise else judge, careful_seconds,
                                   resolve_score(member.annotator)))
        else:
            seconds = hasty_seconds if member.annotator == "hasty" else clicker_seconds
            team.append(TeamMember(member, careless_judge(member.annotator, rng), seconds))
    return team


@dataclass
class TeamResult:
    """What a simulated team did."""

    members: dict[str, SimulationResult] = field(default_factory=dict)
    """Each member's votes, by name, in the team's order."""
    queue_empty: bool = False
    """Every member ran out of pairs before the votes were cast."""

    @property
    def votes(self) -> int:
        return sum(result.votes for result in self.members.values())


def simulate_team_votes(store, team: list[TeamMember], n_votes: int, overlap: int = 1, seed: int = 0,
                        gold_share: float = 0.0) -> TeamResult:
    """Cast up to `n_votes` votes as the team, through store.next_pair (with `gold_share` of gold pairs) and
    store.record_vote (cast_vote), each next pair going to a member drawn by share among those with pairs left; seeded
    by `seed` (which member, the sides shown, the seconds). Rule members with a score grade their votes on a scale
    from the store's SCALE_ANSWERS latest answers, as simulate_votes does."""
    pick_rng, sides_rng, seconds_rng = (random.Random(f"{seed}:{stream}") for stream in ("pick", "sides", "seconds"))
    answers = store.latest_answer_texts(SCALE_ANSWERS) if any(member.score for member in team) else []
    scores = {member.spec.annotator: member.score for member in team if member.score is not None}
    scales = {annotator: score_scale(score, answers) for annotator, score in scores.items()}  # once a rule
    result = TeamResult({member.name: SimulationResult(annotator=member.name) for member in team})
    for member in team:
        store.add_annotator(member.name)
    available = list(team)
    while result.votes < n_votes and available:
        member = pick_rng.choices(available, weights=[m.spec.share for m in available])[0]
        showing = store.next_pair(member.name, overlap=overlap, rng=sides_rng, gold_share=gold_share)
        if showing is None:
            available.remove(member)
            result.members[member.name].queue_empty = True
            continue
        result.members[member.name].add(*cast_vote(store, showing, member.judge, member.name,
                                                   member.seconds(seconds_rng), member.score,
                                                   scales.get(member.spec.annotator)))
    result.queue_empty = not available
    return result
