"""Batched generation of whole answers: left-padded prompts, KV cache, stop at EOS, under inference mode.

Two layers: `generate_tokens` returns the token tensors (prompt, response, masks) that PPO's experience phase
needs; `generate_answers` decodes them into `Answer`s (text, n_tokens, finish_reason) for pairs shown to people.
Pairs are whole answers, so [sampling]'s defaults stop at EOS with a generous limit, a moderate temperature and a
repetition penalty on the answer's tokens; the finish rates that chose them are in docs/benchmarks.md ("Whole
answers").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from rlhf.decode import DecodeHooks, EndTokens, decode
from rlhf.models import fit_prompts, format_prompt, prompt_budget
from rlhf.sampling import DEFAULT_BATCH_SIZE, Sampling

@dataclass(frozen=True)
class Answer:
    """One decoded answer."""

    text: str
    """The answer, special tokens removed, surrounding whitespace stripped."""
    n_tokens: int
    """Tokens the model wrote for it, the EOS token not counted (so a "length" answer has exactly max_new_tokens)."""
    finish_reason: str
    """"stop" when the model ended it with EOS, "length" when it hit max_new_tokens."""


@dataclass
class TokenBatch:
    """Prompts and their sampled responses as tensors, one row per sequence (left-padded prompts)."""

    prompt_ids: torch.Tensor
    """(B, P) prompt tokens, left-padded."""
    prompt_mask: torch.Tensor
    """(B, P) 1 on prompt tokens, 0 on padding."""
    response_ids: torch.Tensor
    """(B, T) generated tokens; positions after the first EOS hold padding."""
    response_mask: torch.Tensor
    """(B, T) 1 on generated tokens up to and including the first EOS (the actions taken), 0 after."""
    ended: torch.Tensor
    """(B,) bool: the response ends with EOS (False: cut at max_new_tokens)."""

    @property
    def sequences(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)  # (B, P + T)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)  # (B, P + T)


@dataclass
class GeneratedAnswers:
    """Answers per prompt, in the order of the prompts given, and figures about the run."""

    answers: list[list[Answer]]
    """answers[i][j]: sample j for prompt i."""
    stats: dict[str, float] = field(default_factory=dict)
    """gen/tokens_per_s, time/generate_s, gen/answers, gen/finished_share, gen/mean_tokens."""


class AnswerWatch:
    """What `generate_answers` tells as it goes; every method does nothing here, and a caller overrides what it needs.
    Nothing it is told changes what is sampled."""

    def answer(self, prompt_index: int, sample_index: int, answer: Answer, done: int, total: int) -> None:
        """Sample `sample_index` of prompt `prompt_index` is finished (during decoding when it ends with EOS, at the end
        of its batch when it reaches max_new_tokens): the `done`-th of `total` answers."""

    def step(self, step: int, most: int) -> None:
        """The batch being decoded wrote its token `step` of at most `most` (a batch ends at EOS in every row or at
        max_new_tokens)."""


class AnswerBar(AnswerWatch):
    """A terminal progress bar of finished answers (tqdm)."""

    def __init__(self, desc: str = "generating answers"):
        self.desc, self.bar = desc, None

    def answer(self, prompt_index: int, sample_index: int, answer: Answer, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = tqdm(total=total, desc=self.desc, unit="answer")
        self.bar.update(done - self.bar.n)
        if done == total:
            self.bar.close()


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every token id that ends an answer: the tokenizer's EOS and the model's generation-config EOS (may be a list)."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(configured if isinstance(configured, (list, tuple)) else [configured])
    return sorted(i for i in ids if i is not None)


def end_tokens(model, tokenizer) -> EndTokens:
    """Every id that ends an answer (`eos_token_ids`) and the pad written after it: the tokenizer's, else the first
    EOS."""
    eos_ids = eos_token_ids(model, tokenizer)
    return EndTokens(tuple(eos_ids), tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0])


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """Token ids of a user prompt as the model sees it (chat template with generation prompt).

    A chat template writes its own special tokens, so none are added then; without one the tokenizer's (BOS) are.
    SFT encodes prompts with this same function, so training and generation see identical prefixes.
    """
    text = format_prompt(tokenizer, prompt)
    add_special = not getattr(tokenizer, "chat_template", None)
    return tokenizer(text, add_special_tokens=add_special)["input_ids"]


def pad_sequences(sequences: list[list[int]], pad_id: int, side: str = "left") -> tuple[torch.Tensor, torch.Tensor]:
    """Pad token lists into (ids, mask), both (B, L), mask 1 on real tokens. Left (the default) puts every row's
    next token at the end, as generation needs; right keeps every row's first token at position 0."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', not {side!r}")
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)  # (B, L)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)  # (B, L)
    for row, tokens in enumerate(sequences):
        if tokens:
            span = slice(0, len(tokens)) if side == "right" else slice(width - len(tokens), width)
            ids[row, span] = torch.tensor(tokens, dtype=torch.long)
            mask[row, span] = 1
    return ids, mask


def response_mask_until_eos(response_ids: torch.Tensor, eos_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask (B, T) of tokens up to and including the first EOS of each row, and (B,) whether an EOS was found."""
    is_eos = torch.isin(response_ids, torch.tensor(eos_ids, device=response_ids.device))  # (B, T)
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()  # (B, T) EOS tokens strictly before t
    return (eos_before == 0).long(), is_eos.any(dim=1)


@torch.no_grad()
def generate_tokens(model, tokenizer, prompt_token_ids: list[list[int]], sampling: Sampling, n_per_prompt: int = 1,
                    hooks: DecodeHooks = DecodeHooks()) -> TokenBatch:
    """Generate `n_per_prompt` responses per prompt in one left-padded batch with `sampling` alone (rlhf.decode; no
    seeding here: see generate_answers); rows i*n ... i*n + n-1 answer prompt i, and share its KV. `hooks` are called
    during decoding (a row's end, each step).

    no_grad rather than inference_mode: PPO feeds these tensors to forward passes that build a graph, which
    inference tensors refuse. generate_answers, which only decodes, runs under inference_mode.
    """
    ends = end_tokens(model, tokenizer)
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = (t.to(device) for t in pad_sequences(prompt_token_ids, ends.pad_id))  # (Bp, P) left
    decoded = decode(model, prompt_ids, prompt_mask, sampling, ends, n_per_prompt, hooks=hooks)
    response_mask, _ = response_mask_until_eos(decoded.response, list(ends.eos_ids))  # (B, T)
    rows = torch.arange(len(prompt_token_ids), device=device).repeat_interleave(n_per_prompt)  # (B,)
    return TokenBatch(prompt_ids[rows], prompt_mask[rows], decoded.response, response_mask, decoded.ended)


def decode_answer(tokenizer, tokens: list[int], ended: bool) -> Answer:
    """The Answer of one response's tokens before its EOS (all of them when it never ended)."""
    text = tokenizer.decode(tokens, skip_special_tokens=True).strip()
    return Answer(text=text, n_tokens=len(tokens), finish_reason="stop" if ended else "length")


def decode_answers(tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor,
                   ended: torch.Tensor) -> list[Answer]:
    """The answers of a batch of (B, T) responses, the mask 1 up to and including each row's first EOS, (B,) `ended`
    whether it ended with EOS: text without special tokens, EOS not counted in n_tokens. The one way responses become
    what people, judges and a reward function read."""
    answers = []
    for row in range(response_ids.shape[0]):
        row_ended = bool(ended[row])
        n_tokens = int(response_mask[row].sum()) - int(row_ended)
        answers.append(decode_answer(tokenizer, response_ids[row, :n_tokens].tolist(), row_ended))
    return answers


@torch.inference_mode()
def generate_answers(model, tokenizer, prompts: list[str], n_per_prompt: int = 2, sampling: Sampling | None = None,
                     seed: int | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
                     watch: AnswerWatch | None = None) -> GeneratedAnswers:
    """Sample `n_per_prompt` whole answers for every prompt, in batches of about `batch_size` sequences:
    batch_size // n_per_prompt prompts (at least one), whose KV is computed once for all their answers.

    Prompts are grouped by length so that batches carry little padding; the result keeps the prompts' order. `seed`
    seeds the sampling on a forked random state (the caller's is left alone); None: not seeded. The model is switched
    to eval mode (no dropout) and back afterwards. `watch` hears of each answer as soon as it is finished and of each
    decoding step.
    """
    sampling = sampling or Sampling()
    if n_per_prompt < 1 or batch_size < 1:
        raise ValueError(f"n_per_prompt and batch_size must be at least 1, got {n_per_prompt} and {batch_size}")
    encoded = [encode_prompt(tokenizer, prompt) for prompt in prompts]
    # before any answer: refuse a max_new_tokens the context cannot hold, cut prompts that would overflow it
    encoded = fit_prompts(encoded, prompt_budget(model.config, sampling.max_new_tokens))
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))  # similar lengths together: little padding
    per_batch = max(1, batch_size // n_per_prompt)  # prompts a batch; each gives n_per_prompt rows
    run = _AnswerRun(tokenizer, [[None] * n_per_prompt for _ in prompts], len(prompts) * n_per_prompt,
                     watch or AnswerWatch())
    was_training = model.training
    model.eval()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    started = time.perf_counter()
    try:
        with torch.random.fork_rng(devices=devices, enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            for start in range(0, len(order), per_batch):
                run.batch(model, [(i, encoded[i]) for i in order[start:start + per_batch]], n_per_prompt, sampling)
    finally:
        model.train(was_training)
    return GeneratedAnswers(answers=run.results, stats=run.stats(time.perf_counter() - started))


class _AnswerRun:
    """The answers of one generate_answers call as they come: each finished answer stored and told to the watch once
    (when its row ends with EOS during decoding, else when its batch ends)."""

    def __init__(self, tokenizer, results: list[list[Answer | None]], total: int, watch: AnswerWatch):
        self.tokenizer, self.results, self.total, self.watch = tokenizer, results, total, watch
        self.finished = self.generated_tokens = 0

    def finish(self, job: tuple[int, int], answer: Answer) -> None:
        self.finished += 1
        self.results[job[0]][job[1]] = answer
        self.watch.answer(job[0], job[1], answer, self.finished, self.total)

    def batch(self, model, prompts: list[tuple[int, list[int]]], n_per_prompt: int, sampling: Sampling) -> None:
        """Decode one batch of (prompt index, tokens)."""
        jobs = [(i, j) for i, _ in prompts for j in range(n_per_prompt)]  # row -> (prompt, sample)
        early: set[int] = set()

        def row_end(row: int, tokens: torch.Tensor) -> None:
            early.add(row)
            self.finish(jobs[row], decode_answer(self.tokenizer, tokens.tolist(), ended=True))

        hooks = DecodeHooks(row_end=row_end, step=lambda step: self.watch.step(step, sampling.max_new_tokens))
        batch = generate_tokens(model, self.tokenizer, [tokens for _, tokens in prompts], sampling, n_per_prompt,
                                hooks=hooks)
        late = [row for row in range(len(jobs)) if row not in early]  # rows cut at max_new_tokens
        answers = decode_answers(self.tokenizer, batch.response_ids[late], batch.response_mask[late], batch.ended[late])
        for row, answer in zip(late, answers):
            self.finish(jobs[row], answer)
        self.generated_tokens += int(batch.response_mask.sum())

    def stats(self, seconds: float) -> dict[str, float]:
        flat = [answer for row in self.results for answer in row]
        return {
            "gen/tokens_per_s": self.generated_tokens / seconds if seconds > 0 else 0.0,
            "time/generate_s": seconds,
            "gen/answers": float(len(flat)),
            "gen/finished_share": sum(a.finish_reason == "stop" for a in flat) / len(flat) if flat else 0.0,
            "gen/mean_tokens": sum(a.n_tokens for a in flat) / len(flat) if flat else 0.0,
        }
