"""The one decoding loop: pairs shown to people, PPO's rollouts, the demo's evaluation and the benches all sample here,
with one `Sampling` and nothing from the model's own generation config. Where transformers' `generate` spent its
time, and what this loop saves of it: docs/benchmarks.md, "Where a decoding step's time goes". This loop:

- samples exactly the distribution transformers would (its processors, in its order: `next_token_logits`), but
  finds the nucleus among the top candidates (`torch.topk`, widened until it holds top_p of the mass) instead of
  sorting 49,152 logits, and draws with an exponential race (`probs / Exp(1)`, argmax: exact, as vLLM samples)
  instead of `multinomial`;
- computes a prompt's KV once for its several answers (`n_per_prompt`: the cache rows are repeated after prefill);
- projects only the last prompt position onto the vocabulary at prefill (`logits_to_keep=1`);
- drops a row from the batch, cache included, as soon as it writes EOS, so later steps compute only live rows.

A `torch.compile`d step with a static cache was slower on CPU (docs/benchmarks.md) and is not used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from transformers import DynamicCache

from rlhf.models import cache_argument
from rlhf.sampling import Sampling
from rlhf.warping import candidate_logits, repetition_penalised

Tensor = torch.Tensor
RowEndCallback = Callable[[int, Tensor], None]
"""Called as on_row_end(row, tokens) when row `row` writes its first EOS, with its (T,) tokens before the EOS."""
StepCallback = Callable[[int], None]
"""Called as on_step(step) after each decoding step (1 after the first new token)."""


@dataclass(frozen=True)
class EndTokens:
    """Which tokens end an answer and what fills a row after its end (rlhf.generate.end_tokens finds them)."""

    eos_ids: tuple[int, ...]
    """Every id that ends an answer."""
    pad_id: int
    """Written after a row's EOS."""


@dataclass(frozen=True)
class DecodeHooks:
    """What `decode` calls as it goes; both optional, neither changes what is sampled."""

    row_end: RowEndCallback | None = None
    """row_end(row, tokens) when row `row` writes its first EOS, with its (T,) tokens before the EOS."""
    step: StepCallback | None = None
    """step(n) after each decoding step (1 after the first new token)."""


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions 0, 1, 2, ... counted over real tokens only, so a padded row gets the positions it has unpadded
    (left padding does not shift RoPE). Padding gets 1, as transformers' `generate` gives it: any valid index
    works, padded keys are masked out of attention.  (B, L) -> (B, L)
    """
    position_ids = attention_mask.long().cumsum(-1) - 1  # (B, L)
    return position_ids.masked_fill(attention_mask == 0, 1)  # (B, L)


def penalise_repeats(logits: Tensor, answer_tokens: Tensor, penalty: float) -> Tensor:
    """CTRL's repetition penalty as transformers applies it: each token already in the answer has its logit divided by
    `penalty` when positive, multiplied when negative (once, however often it occurred).
    (B, V) logits, (B, t) tokens written so far -> (B, V)."""
    if penalty == 1.0 or answer_tokens.shape[1] == 0:
        return logits
    seen = repetition_penalised(torch.gather(logits, 1, answer_tokens), penalty)  # (B, t)
    return logits.scatter(1, answer_tokens, seen)  # (B, V)


def next_token_logits(logits: Tensor, answer_tokens: Tensor, sampling: Sampling, eos_ids: tuple[int, ...]) -> Tensor:
    """The step's logits after the processors that come before the warpers: EOS to -inf while fewer than
    min_new_tokens are written, then the repetition penalty.  (B, V) fp32, (B, t) -> (B, V)"""
    if answer_tokens.shape[1] < sampling.min_new_tokens and eos_ids:
        logits = logits.clone()
        logits[:, list(eos_ids)] = float("-inf")
    return penalise_repeats(logits, answer_tokens, sampling.repetition_penalty)


def race(probs: Tensor) -> Tensor:
    """One draw per row from unnormalised probabilities: argmax of probs / E with E ~ Exp(1) independent (the
    exponential race; P(i wins) = p_i / sum p). E is kept above 0: a draw of exactly 0 (one in 2^24) would make a
    removed token's 0 / 0 a NaN, which argmax takes for the largest. (B, K) -> (B,)"""
    waits = torch.empty_like(probs).exponential_().clamp_min_(torch.finfo(probs.dtype).tiny)  # (B, K)
    return (probs / waits).argmax(dim=-1)


def choose_tokens(logits: Tensor, sampling: Sampling, with_log_probs: bool = False) -> tuple[Tensor, Tensor | None]:
    """The next token of every row, greedy or drawn from the tempered top-k / top-p distribution, and, when asked,
    its log-prob under that distribution (0 when greedy: nothing is drawn). (B, V) -> (B,), (B,) or None"""
    if sampling.greedy:
        tokens = logits.argmax(dim=-1)
        return tokens, torch.zeros(tokens.shape, device=logits.device) if with_log_probs else None
    values, ids = candidate_logits(logits / sampling.temperature, sampling.top_k, sampling.top_p)  # (B, K) each
    probs = (values - values.amax(dim=-1, keepdim=True)).exp()  # (B, K), 0 where removed
    pick = race(probs).unsqueeze(1)  # (B, 1) index among the candidates
    log_probs = values.log_softmax(dim=-1).gather(1, pick).squeeze(1) if with_log_probs else None
    return ids.gather(1, pick).squeeze(1), log_probs


def _forward(model, tokens: Tensor, mask: Tensor, positions: Tensor, cache: dict, start: int) -> Tensor:
    """Last-position logits (B, V) in fp32 of `tokens` (B, L) appended at `start` to the cache ({argument name: it})."""
    cache_position = torch.arange(start, start + tokens.shape[1], device=tokens.device)
    out = model(input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=True,
                cache_position=cache_position, logits_to_keep=1, **cache)
    return out.logits[:, -1].float()


@dataclass
class Decoded:
    """What `decode` wrote: B rows, T the longest answer."""

    response: Tensor
    """(B, T) token ids, each row padded with `pad_id` after its first EOS (the EOS included)."""
    ended: Tensor
    """(B,) bool: the row ended with EOS (False: cut at max_new_tokens)."""
    log_probs: Tensor | None = None
    """(B, T) when asked: each token's log-prob under the distribution it was drawn from, 0 after the EOS."""


@torch.no_grad()
def decode(model, prompt_ids: Tensor, prompt_mask: Tensor, sampling: Sampling, ends: EndTokens,
           n_per_prompt: int = 1, hooks: DecodeHooks = DecodeHooks(), with_log_probs: bool = False) -> Decoded:
    """Sample `n_per_prompt` answers to every left-padded (Bp, P) prompt with `sampling` and nothing else; B =
    Bp * n_per_prompt rows, rows i*n ... i*n + n-1 answer prompt i. Uses the caller's random state; the model is not
    switched to eval mode here (callers do). `with_log_probs` records each drawn token's log-prob (what the tests
    compare PPO's with).
    """
    device = prompt_ids.device
    width = prompt_ids.shape[1]
    cache = DynamicCache(config=model.config)
    cache_kwarg = {cache_argument(model): cache}  # the argument's name, looked up once
    logits = _forward(model, prompt_ids, prompt_mask, position_ids_from_mask(prompt_mask), cache_kwarg, 0)  # (Bp, V)
    mask = prompt_mask.long()
    next_position = mask.sum(dim=1)  # (Bp,) real tokens so far = the next token's position
    if n_per_prompt > 1:  # the prompt's KV once, its rows repeated for each answer
        cache.batch_repeat_interleave(n_per_prompt)
        logits, mask, next_position = (t.repeat_interleave(n_per_prompt, dim=0) for t in (logits, mask, next_position))
    n_rows = logits.shape[0]
    response = torch.full((n_rows, sampling.max_new_tokens), ends.pad_id, dtype=torch.long, device=device)
    ended = torch.zeros(n_rows, dtype=torch.bool, device=device)
    drawn_log_probs = torch.zeros(response.shape, device=device) if with_log_probs else None  # (B, max_new_tokens)
    eos = torch.tensor(ends.eos_ids, dtype=torch.long, device=device)
    live = torch.arange(n_rows, device=device)  # the original row of each row still in the batch
    steps = 0
    for step in range(sampling.max_new_tokens):
        tokens, log_probs = choose_tokens(next_token_logits(logits, response[live, :step], sampling, ends.eos_ids),
                                          sampling, with_log_probs)  # (b,), (b,) or None
        response[live, step] = tokens
        if drawn_log_probs is not None:
            drawn_log_probs[live, step] = log_probs
        steps = step + 1
        finished = torch.isin(tokens, eos)  # (b,)
        if hooks.step is not None:
            hooks.step(steps)
        if bool(finished.any()):
            for row in live[finished].tolist():
                ended[row] = True
                if hooks.row_end is not None:
                    hooks.row_end(row, response[row, :step])
            if bool(finished.all()):
                break
            keep = (~finished).nonzero().squeeze(1)  # (b',)
            cache.batch_select_indices(keep)
            live, tokens, mask, next_position = live[keep], tokens[keep], mask[keep], next_position[keep]
        if steps == sampling.max_new_tokens:
            break
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)  # (b, P + steps)
        logits = _forward(model, tokens.unsqueeze(1), mask, next_position.unsqueeze(1), cache_kwarg, width + step)
        next_position = next_position + 1
    return Decoded(response[:, :steps], ended, None if drawn_log_probs is None else drawn_log_probs[:, :steps])
