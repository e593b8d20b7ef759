"""Batched generation of whole answers: left-padded prompts, KV cache, stop at EOS, under inference mode.

Two layers: `generate_tokens` returns the token tensors (prompt, response, masks) that PPO's experience phase
needs; `generate_answers` decodes them into `Answer`s (text, n_tokens, finish_reason) for pairs shown to people.
Pairs are whole answers (DESIGN "The round"), so the defaults stop at EOS with a generous limit and a moderate
temperature. Measured with `bench/finish_rate.py` on the default model (2 answers per prompt, temperature 0.7,
top-p 0.95), the share of answers that end with EOS within a limit of N tokens:

    N =                                             128    256    384    512
    shipped prompts (first 16 of data/prompts.jsonl)
      no repetition penalty                          0%    12%    50%    84%
      penalty 1.1 on the answer's tokens             9%    38%    84%   100%   <- the defaults: 512, 1.1
    16 short everyday questions (--prompts everyday)
      no repetition penalty                         31%    59%    75%    81%
      penalty 1.1 on the answer's tokens            44%    91%    94%
      penalty 1.2 on the answer's tokens            62%    84%    91%          (drifts into gibberish)

The shipped prompts ask for advice, and the model answers at length (median 271 tokens, longest 473). Without
a penalty most answers that never end are loops ("A moment to pause, a moment to pause, ...") that no limit
ends. Counting the prompt's tokens in the penalty (transformers' plain `repetition_penalty`) also penalises the
chat template's EOS and the prompt's own words: 81% instead of 91% on the everyday questions at 256.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from tqdm.auto import tqdm

from rlhf.decode import Decoding, decode
from rlhf.models import fit_prompts, format_prompt, prompt_budget
from rlhf.sampling import AnswerSampling

ProgressCallback = Callable[[int, int], None]
"""Called as progress(done, total) each time an answer is finished (answers finished so far, answers planned)."""
RowEndCallback = Callable[[int, torch.Tensor], None]
"""Called as on_row_end(row, tokens) when row `row` of a batch writes its first EOS, with its (T,) tokens before it."""
AnswerCallback = Callable[[int, int, "Answer"], None]
"""Called as on_answer(prompt_index, sample_index, answer) as soon as that answer is finished."""


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


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every token id that ends an answer: the tokenizer's EOS and the model's generation-config EOS (may be a list)."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(configured if isinstance(configured, (list, tuple)) else [configured])
    return sorted(i for i in ids if i is not None)


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


def answer_decoding(sampling: AnswerSampling, eos_ids: list[int], pad_id: int) -> Decoding:
    """[sampling]'s settings and nothing else (nothing from the model's generation_config.json): top_k 0 is off,
    the repetition penalty counts the answer's tokens only."""
    return Decoding(max_new_tokens=sampling.max_new_tokens, eos_ids=tuple(eos_ids), pad_id=pad_id,
                    temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                    repetition_penalty=float(sampling.repetition_penalty))


@torch.no_grad()
def generate_tokens(model, tokenizer, prompt_token_ids: list[list[int]], sampling: AnswerSampling,
                    on_row_end: RowEndCallback | None = None,
                    on_step: Callable[[int], None] | None = None, n_per_prompt: int = 1) -> TokenBatch:
    """Generate `n_per_prompt` responses per prompt in one left-padded batch (rlhf.decode; no seeding here: see
    generate_answers); rows i*n ... i*n + n-1 answer prompt i, and share its KV. `on_row_end(row, tokens)` is called
    during decoding as each row ends with EOS, `on_step(step)` after each step.

    no_grad rather than inference_mode: PPO feeds these tensors to forward passes that build a graph, which
    inference tensors refuse. generate_answers, which only decodes, runs under inference_mode.
    """
    eos_ids = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = (t.to(device) for t in pad_sequences(prompt_token_ids, pad_id))  # (Bp, P) left-padded
    decoded = decode(model, prompt_ids, prompt_mask, answer_decoding(sampling, eos_ids, pad_id), n_per_prompt,
                     on_row_end=on_row_end, on_step=on_step)
    response_mask, _ = response_mask_until_eos(decoded.response, eos_ids)  # (B, T)
    rows = torch.arange(len(prompt_token_ids), device=device).repeat_interleave(n_per_prompt)  # (B,)
    return TokenBatch(prompt_ids[rows], prompt_mask[rows], decoded.response, response_mask, decoded.ended)


def decode_answer(tokenizer, tokens: list[int], ended: bool) -> Answer:
    """The Answer of one response's tokens before its EOS (all of them when it never ended)."""
    text = tokenizer.decode(tokens, skip_special_tokens=True).strip()
    return Answer(text=text, n_tokens=len(tokens), finish_reason="stop" if ended else "length")


def decode_answers(tokenizer, batch: TokenBatch) -> list[Answer]:
    """Answers of a TokenBatch: text without special tokens, EOS not counted in n_tokens."""
    answers = []
    for row in range(batch.response_ids.shape[0]):
        ended = bool(batch.ended[row])
        n_tokens = int(batch.response_mask[row].sum()) - int(ended)
        answers.append(decode_answer(tokenizer, batch.response_ids[row, :n_tokens].tolist(), ended))
    return answers


@torch.inference_mode()
def generate_answers(
    model,
    tokenizer,
    prompts: list[str],
    n_per_prompt: int = 2,
    sampling: AnswerSampling | None = None,
    progress: ProgressCallback | None = None,
    show_bar: bool = False,
    on_answer: AnswerCallback | None = None,
    steps: ProgressCallback | None = None,
) -> GeneratedAnswers:
    """Sample `n_per_prompt` whole answers for every prompt, in batches of about `sampling.batch_size` sequences:
    batch_size // n_per_prompt prompts (at least one), whose KV is computed once for all their answers.

    Prompts are grouped by length so that batches carry little padding; the result keeps the prompts' order. The model is switched to eval mode (no dropout) and back afterwards. Each answer is handed to
    `on_answer(prompt_index, sample_index, answer)` and counted in `progress(done, total)` as soon as it is finished:
    during decoding when it ends with EOS, at the end of its batch when it reaches max_new_tokens.
    `steps(step, max_new_tokens)` follows each decoding step of the batch being generated (a batch ends at EOS in
    every row or at max_new_tokens). The callbacks change nothing that is sampled.
    """
    sampling = sampling or AnswerSampling()
    if n_per_prompt < 1:
        raise ValueError(f"n_per_prompt must be at least 1, got {n_per_prompt}")
    if sampling.batch_size < 1 or sampling.max_new_tokens < 1:
        raise ValueError(f"batch_size and max_new_tokens must be at least 1, got {sampling}")
    encoded = [encode_prompt(tokenizer, prompt) for prompt in prompts]
    # before any answer: refuse a max_new_tokens the context cannot hold, cut prompts that would overflow it
    encoded = fit_prompts(encoded, prompt_budget(model.config, sampling.max_new_tokens))
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))  # similar lengths together: little padding
    per_batch = max(1, sampling.batch_size // n_per_prompt)  # prompts a batch; each gives n_per_prompt rows
    total = len(prompts) * n_per_prompt
    results: list[list[Answer | None]] = [[None] * n_per_prompt for _ in prompts]

    was_training = model.training
    model.eval()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    bar = tqdm(total=total, desc="generating answers", unit="answer", disable=not show_bar)
    generated_tokens, started, finished = 0, time.perf_counter(), 0

    def finish(job: tuple[int, int], answer: Answer) -> None:
        nonlocal finished
        finished += 1
        bar.update(1)
        if on_answer is not None:
            on_answer(job[0], job[1], answer)
        if progress is not None:
            progress(finished, total)

    try:
        with torch.random.fork_rng(devices=devices, enabled=sampling.seed is not None):
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            for start in range(0, len(order), per_batch):
                chunk = [(i, j) for i in order[start:start + per_batch] for j in range(n_per_prompt)]  # row -> job
                early: set[int] = set()

                def row_end(row: int, tokens: torch.Tensor, chunk=chunk, early=early) -> None:
                    early.add(row)
                    finish(chunk[row], decode_answer(tokenizer, tokens.tolist(), ended=True))

                watch = on_answer is not None or progress is not None or show_bar
                on_step = None if steps is None else (lambda step: steps(step, sampling.max_new_tokens))
                batch = generate_tokens(model, tokenizer, [encoded[i] for i in order[start:start + per_batch]],
                                        sampling, on_row_end=row_end if watch else None, on_step=on_step,
                                        n_per_prompt=n_per_prompt)
                for row, ((i, j), answer) in enumerate(zip(chunk, decode_answers(tokenizer, batch))):
                    results[i][j] = answer
                    if row not in early:
                        finish((i, j), answer)
                generated_tokens += int(batch.response_mask.sum())
    finally:
        bar.close()
        model.train(was_training)

    seconds = time.perf_counter() - started
    flat = [answer for row in results for answer in row]
    stats = {
        "gen/tokens_per_s": generated_tokens / seconds if seconds > 0 else 0.0,
        "time/generate_s": seconds,
        "gen/answers": float(len(flat)),
        "gen/finished_share": sum(a.finish_reason == "stop" for a in flat) / len(flat) if flat else 0.0,
        "gen/mean_tokens": sum(a.n_tokens for a in flat) / len(flat) if flat else 0.0,
    }
    return GeneratedAnswers(answers=results, stats=stats)
