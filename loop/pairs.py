"""Making the pairs people vote on from a policy's answers.

One path makes them, for the round, the app's pair-making child and `--generate-pairs`: `queue_pairs`. Once a round
has trained a reward model with bootstrap heads (every strategy saves them) and `votes.oversample` is above 2, sample
pairs come from over-sampled answers: the candidate pairs the heads disagree on most, plus a random share that keeps
the held-out estimate honest (rlhf.reward.active). Versus pairs are made as always. Before the first round, or with
`votes.oversample = 2`, `make_pairs` writes two answers a prompt. Pairs are written as their answers end, so
annotation can start while later ones are still being generated. Everything goes through the Store; this module
writes no SQL.
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import replace
from typing import Callable

from annotate.metrics import ACTIVE_CANDIDATE_ANSWERS, ACTIVE_UNCERTAIN, GEN_ANSWERS
from annotate.records import NewGeneration, NewPair, Prompt
from loop.pair_request import (PairChooser, PairProgress, PairRequest, PairsReport, add_report, earlier_policy,
                               merge_generation_stats, trained_prompts, usable, versus_prompt_ids)
from loop.policies import PolicyModel, policy_model
from rlhf.generate import Answer, AnswerWatch, generate_answers
from rlhf.reward.strategies import VotesConfig

FIRST_CHUNK_PROMPTS = 2
"""Prompts in the first chunk of a batch of pairs (see `chunk_sizes`): on a 2-core CPU the first start's first pair
took 5 minutes when it waited for a whole batch of 16 answers of up to 512 tokens."""

OPPONENT_SEED_OFFSET = 1_000_003
"""Added to the seed for the earlier policy's answers: the same draws for both would make similar policies write
the same text, and identical pairs are dropped."""


def chunk_sizes(n_prompts: int, largest: int, first: int = FIRST_CHUNK_PROMPTS) -> list[int]:
    """How many prompts each chunk of a batch answers: `first`, then twice as many each time, then full chunks of
    `largest`; what does not fill a full chunk joins the last growing one (never the first), so that no small chunk
    trails at the end (a chunk lasts as long as its longest answer, whatever its size). E.g. 2, 6, 8, 8, 8 for 32
    prompts in batches of 16 sequences. The sizes add up to n_prompts."""
    size = max(1, min(first, largest))
    growing: list[int] = []
    while size < largest and sum(growing) + size < n_prompts:
        growing.append(size)
        size *= 2
    full, left = divmod(n_prompts - sum(growing), largest)
    if left and len(growing) > 1 and growing[-1] + left <= largest:
        growing[-1], left = growing[-1] + left, 0
    return growing + [largest] * full + ([left] if left else [])


def _chunk_seed(seed: int | None, chunk_index: int, offset: int = 0) -> int | None:
    """A seed of its own per chunk (a fixed seed would repeat draws across chunks)."""
    return None if seed is None else seed + chunk_index + offset


def _stored(answer: Answer, policy_id: int) -> NewGeneration:
    return NewGeneration(policy_id=policy_id, text=answer.text, n_tokens=answer.n_tokens,
                         finish_reason=answer.finish_reason)


class _PairSink(AnswerWatch):
    """Takes answers as they end and stores each pair as soon as its two sides exist (one write per pair); tells the
    progress of every answer and every prompt done."""

    def __init__(self, store, report: PairsReport, progress: PairProgress, n_prompts: int):
        self.store, self.report, self.progress, self.n_prompts = store, report, progress, n_prompts
        self.sides: dict[int, dict[str, Answer]] = {}
        self.prompts_done = self.answers_done = 0
        self.route: Callable[[int, int], tuple[int, str, int, str]] | None = None
        """(prompt index, sample index) of the call being decoded -> (prompt id, side, policy id, kind)."""

    def answer(self, prompt_index: int, sample_index: int, answer: Answer, done: int, total: int) -> None:
        self.answers_done += 1
        self.progress.answers(self.answers_done, 2 * self.n_prompts)  # a pair takes two answers of either kind
        self.add(*self.route(prompt_index, sample_index), answer)

    def step(self, step: int, most: int) -> None:
        self.progress.step(step, most)

    def add(self, prompt_id: int, side: str, policy_id: int, kind: str, answer: Answer) -> None:
        """Side "a" or "b" of the pair for `prompt_id`; the pair is written (or skipped, see `usable`) with the
        second."""
        sides = self.sides.setdefault(prompt_id, {})
        sides[side] = (answer, policy_id)
        if len(sides) < 2:
            return
        (a, a_policy), (b, b_policy) = sides["a"], sides["b"]
        if usable(a, b, self.report):
            self.store.add_pairs_bulk([NewPair(prompt_id, _stored(a, a_policy), _stored(b, b_policy), kind=kind,
                                               chosen_by="random" if kind == "sample" else None)])
            self.report.written += 1
            self.report.sample += kind == "sample"
            self.report.versus += kind == "versus"
        self.prompts_done += 1
        self.progress.pairs(self.prompts_done, self.n_prompts, self.report.written)


def _opponent(store, request: PairRequest, policy, n_versus: int):
    """The earlier policy of the versus pairs, or None (then every pair is a sample pair)."""
    if not n_versus:
        return None
    opponent = store.policy(request.versus_policy_id) if request.versus_policy_id is not None else \
        earlier_policy(store, policy)
    if opponent is None:
        print(f"No policy earlier than policy {policy.id} (round {policy.round}): making sample pairs only.",
              file=sys.stderr)
    return opponent


def make_pairs(store, request: PairRequest, model: PolicyModel | None = None,
               progress: PairProgress | None = None) -> PairsReport:
    """Generate and store up to request.n_pairs pairs from policy request.policy_id, a share of them `versus` pairs
    against an earlier policy (loaded from its recorded path).

    `model`: the policy's model already loaded (else loaded from the policy's path). Pairs whose answers are identical
    or empty are skipped, so fewer may be written. Both policies must share one tokenizer (they descend from one
    base). Prompts are answered in chunks of FIRST_CHUNK_PROMPTS prompts, then twice as many each chunk up to a full
    generation batch (`chunk_sizes`), and each pair is stored the moment its second answer ends: the first pairs can
    be voted on after about two answers' time rather than a whole batch's.
    """
    rng = random.Random(request.seed)
    policy = store.policy(request.policy_id)
    newer = store.policy(request.versus_newer_id) if request.versus_newer_id is not None else policy
    report = PairsReport(policy_id=policy.id)
    prompts = store.prompts_needing_pairs(request.n_pairs, request.exclude_prompts)
    opponent = _opponent(store, request, newer, round(len(prompts) * request.versus_share))
    wanted = round(len(prompts) * request.versus_share) if opponent is not None else 0
    if not prompts:
        return report
    versus_ids = versus_prompt_ids(rng, prompts, wanted, trained_prompts(store, newer)) if wanted else set()
    if len(versus_ids) < wanted:
        print(f"{len(versus_ids)} versus pairs of {wanted} wanted: only {len(versus_ids)} of these {len(prompts)} "
              f"prompts were not among policy {newer.id}'s PPO prompts.", file=sys.stderr)
    model = policy_model(store, policy.id, model)
    versus_models = [_same_or_loaded(store, model, policy.id, side) for side in (newer, opponent)] \
        if versus_ids else None
    report.versus_policy_id = opponent.id if versus_ids else None
    sink = _PairSink(store, report, progress or PairProgress(), len(prompts))
    start = 0
    largest = max(1, request.batch_size // 2)  # a sample pair takes two sequences of a batch
    for chunk_index, size in enumerate(chunk_sizes(len(prompts), largest)):
        chunk, start = prompts[start:start + size], start + size
        sample_prompts = [p for p in chunk if p.id not in versus_ids]
        first_is_a = [rng.random() < 0.5 for _ in sample_prompts]  # in prompt order, whatever order answers end in
        _sample_pairs(model, sample_prompts, first_is_a, policy.id, request, chunk_index, sink)
        versus_prompts = [p for p in chunk if p.id in versus_ids]
        if versus_prompts:
            _versus_pairs(*versus_models, versus_prompts, (newer.id, opponent.id), request, chunk_index, sink)
    return report


def _same_or_loaded(store, model: PolicyModel, model_policy_id: int, side) -> PolicyModel:
    """`model` (policy `model_policy_id` loaded) when `side` is that policy, else `side` loaded with `model`'s tokenizer
    (the policies descend from one base: one tokenizer)."""
    if side.id == model_policy_id:
        return model
    return PolicyModel(policy_model(store, side.id).model, model.tokenizer)


def _generate(model: PolicyModel, prompts: list[Prompt], n_per_prompt: int, request: PairRequest, seed: int | None,
              sink: _PairSink) -> None:
    result = generate_answers(model.model, model.tokenizer, [p.text for p in prompts], n_per_prompt=n_per_prompt,
                              sampling=request.sampling, seed=seed, batch_size=request.batch_size, watch=sink)
    merge_generation_stats(sink.report.stats, result.stats)


def _sample_pairs(model: PolicyModel, prompts: list[Prompt], first_is_a: list[bool], policy_id: int,
                  request: PairRequest, chunk_index: int, sink: _PairSink) -> None:
    """Two answers of the policy per prompt, the first on side a of prompt i's pair when first_is_a[i]."""
    if not prompts:
        return
    sink.route = lambda i, j: (prompts[i].id, "a" if (j == 0) == first_is_a[i] else "b", policy_id, "sample")
    _generate(model, prompts, 2, request, _chunk_seed(request.seed, chunk_index), sink)


def _versus_pairs(model: PolicyModel, versus_model: PolicyModel, prompts: list[Prompt], policy_ids: tuple[int, int],
                  request: PairRequest, chunk_index: int, sink: _PairSink) -> None:
    """The newer policy's answer (side a) and the earlier one's (side b) per prompt; policy_ids (newer, earlier)."""
    for side, side_model, policy_id, offset in (("a", model, policy_ids[0], 0),
                                                ("b", versus_model, policy_ids[1], OPPONENT_SEED_OFFSET)):
        sink.route = lambda i, j, side=side, policy_id=policy_id: (prompts[i].id, side, policy_id, "versus")
        _generate(side_model, prompts, 1, request, _chunk_seed(request.seed, chunk_index, offset), sink)


class _ActiveWatch(AnswerWatch):
    """Over-sampled answers' progress as pair making tells it: prompts by their answers, answers as they end."""

    def __init__(self, progress: PairProgress, per_prompt: int, n_prompts: int):
        self.progress, self.per_prompt, self.n_prompts = progress, per_prompt, n_prompts

    def answer(self, prompt_index: int, sample_index: int, answer: Answer, done: int, total: int) -> None:
        self.progress.pairs(done // self.per_prompt, self.n_prompts, 0)
        self.progress.answers(done, total)

    def step(self, step: int, most: int) -> None:
        self.progress.step(step, most)


def make_active_pairs(store, request: PairRequest, chooser: PairChooser, votes: VotesConfig,
                      model: PolicyModel | None = None, progress: PairProgress | None = None) -> PairsReport:
    """Over-sample votes.oversample answers for ceil(n_pairs * votes.prompts_per_pair) least-used prompts; store as
    `sample` pairs the ones `chooser` picks (the reward model's most uncertain, plus a random share).

    Only the chosen pairs' answers are stored. report.stats["active/uncertain"] counts the pairs chosen for
    uncertainty (before any were dropped as identical or empty). request.seed fixes the prompts, the choice, the
    sides and the sampling, as in `make_pairs`.
    """
    rng = random.Random(request.seed)
    policy = store.policy(request.policy_id)
    report = PairsReport(policy_id=policy.id)
    n_prompts = math.ceil(request.n_pairs * votes.prompts_per_pair)
    prompts = store.prompts_needing_pairs(n_prompts, request.exclude_prompts) if request.n_pairs > 0 else []
    if not prompts:
        return report
    model = policy_model(store, policy.id, model)
    watch = _ActiveWatch(progress or PairProgress(), votes.oversample, len(prompts))
    result = generate_answers(model.model, model.tokenizer, [p.text for p in prompts], n_per_prompt=votes.oversample,
                              sampling=request.sampling, seed=request.seed, batch_size=request.batch_size,
                              watch=watch)
    merge_generation_stats(report.stats, result.stats)
    texts = [[answer.text for answer in answers] for answers in result.answers]
    picked, n_uncertain = chooser([p.text for p in prompts], texts, request.n_pairs, rng.randrange(2**31))
    new_pairs = []
    for rank, (prompt_index, i, j) in enumerate(picked):
        first, second = result.answers[prompt_index][i], result.answers[prompt_index][j]
        if not usable(first, second, report):
            continue
        a, b = (first, second) if rng.random() < 0.5 else (second, first)
        new_pairs.append(NewPair(prompts[prompt_index].id, _stored(a, policy.id), _stored(b, policy.id), kind="sample",
                                 chosen_by="uncertain" if rank < n_uncertain else "random"))
    store.add_pairs_bulk(new_pairs)
    report.written = report.sample = len(new_pairs)
    report.stats[ACTIVE_UNCERTAIN] = float(n_uncertain)
    return report


class _Part(PairProgress):
    """One part of a batch made in two calls: its pairs a share of the whole batch's, its answers after `offset`."""

    def __init__(self, whole: PairProgress, first_pair: int, n_pairs: int, total_pairs: int, offset: int, planned: int):
        self.whole, self.first_pair, self.n_pairs, self.total_pairs = whole, first_pair, n_pairs, total_pairs
        self.offset, self.planned = offset, planned

    def stage(self, text: str) -> None:
        self.whole.stage(text)

    def pairs(self, done: int, total: int, written: int) -> None:
        self.whole.pairs(self.first_pair + round(done / max(total, 1) * self.n_pairs), self.total_pairs, written)

    def answers(self, done: int, planned: int) -> None:
        self.whole.answers(self.offset + done, self.planned)

    def step(self, step: int, most: int) -> None:
        self.whole.step(step, most)


def _versus_only(store, request: PairRequest, n_versus: int) -> PairRequest:
    """The request for a batch of `n_versus` versus pairs: besides the request's own prompts it leaves out the newer
    policy's PPO prompts, unless that would leave none (`versus_prompt_ids`, the same rule within a mixed batch); says
    when fewer prompts are left than pairs wanted."""
    newer = store.policy(request.versus_newer_id if request.versus_newer_id is not None else request.policy_id)
    excluded = request.exclude_prompts | trained_prompts(store, newer)
    held_out = len(store.prompts_needing_pairs(n_versus, excluded))
    if not held_out:
        excluded = request.exclude_prompts
    elif held_out < n_versus:
        print(f"{held_out} versus pairs of {n_versus} wanted: only {held_out} prompts are outside the newer "
              "policy's PPO prompts.", file=sys.stderr)
    return replace(request, n_pairs=n_versus, versus_share=1.0, exclude_prompts=excluded)


def queue_pairs(store, request: PairRequest, votes: VotesConfig, judge=None, model: PolicyModel | None = None,
                progress: PairProgress | None = None) -> PairsReport:
    """Store up to request.n_pairs pairs (a share against an earlier policy) and report them; the sample pairs are
    chosen by `judge` (a TrainedPreferenceModel) when there is one and votes.oversample > 2, else drawn at random.
    report.stats["active/uncertain"] counts the pairs chosen for the judge's disagreement. `model`: the policy's
    model already loaded (else loaded once from its path)."""
    model = policy_model(store, request.policy_id, model)
    progress = progress or PairProgress()
    if judge is None or votes.oversample <= 2:
        return make_pairs(store, request, model, progress)
    from rlhf.reward.active import choose_pairs

    n_pairs = request.n_pairs
    n_versus = round(n_pairs * request.versus_share)
    report = PairsReport(policy_id=request.policy_id)
    planned = 2 * n_versus + votes.oversample * math.ceil((n_pairs - n_versus) * votes.prompts_per_pair)
    if n_versus:
        versus = make_pairs(store, _versus_only(store, request, n_versus), model,
                            _Part(progress, 0, n_versus, n_pairs, 0, planned))
        add_report(report, versus)
        report.versus_policy_id = versus.versus_policy_id

    def chooser(prompts, answers, n, choice_seed):
        candidates, selection = choose_pairs(judge, prompts, answers, n, votes.random_share, choice_seed)
        return [(candidates[i].prompt_index, candidates[i].a, candidates[i].b) for i in selection.all], \
            len(selection.uncertain)

    active = make_active_pairs(store, replace(request, n_pairs=n_pairs - n_versus, versus_share=0.0), chooser, votes,
                               model, _Part(progress, n_versus, n_pairs - n_versus, n_pairs, 2 * n_versus, planned))
    add_report(report, active)
    report.stats[ACTIVE_UNCERTAIN] = active.stats.get(ACTIVE_UNCERTAIN, 0.0)
    report.stats[ACTIVE_CANDIDATE_ANSWERS] = active.stats.get(GEN_ANSWERS, 0.0)
    return report
