"""The pieces of a PPO experience batch: generation, masks and the per-model forward passes.

Layout (DeepSpeed-Chat step 3): `sequences` is the left-padded prompt batch (width P) followed by the
response (width T, right-padded after the first EOS). Everything per token lives in the response-only
layout (B, T): position t is the t-th generated token, its log-prob comes from the logits at P + t - 1
and its value is the critic's value at P + t - 1 (the state before the token was chosen).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from transformers import GenerationConfig

from rlhf.decode import EndTokens, decode, position_ids_from_mask
from rlhf.generate import response_mask_until_eos
from rlhf.losses import entropy_from_logits, gather_log_probs
from rlhf.sampling import Sampling
from rlhf.warping import warp_logits

Tensor = torch.Tensor


@dataclass
class Experience:
    """One batch of PPO experience (OpenRLHF style); B prompts, P prompt width, T response width."""

    sequences: Tensor
    """(B, P+T) token ids: left-padded prompt, then the response, padded after its first EOS."""
    attention_mask: Tensor
    """(B, P+T) 1 on real prompt and response tokens (first EOS included), 0 on padding on either side."""
    action_mask: Tensor
    """(B, T) 1 on the response tokens the actor chose, up to and including the first EOS."""
    log_probs: Tensor
    """(B, T) actor log-probs of the response tokens when the experience was made (the "old" policy)."""
    ref_log_probs: Tensor
    """(B, T) reference log-probs of the same tokens."""
    values: Tensor
    """(B, T) critic values of the state before each response token (the "old" values)."""
    rewards: Tensor
    """(B, T) per-token rewards: -kl_ctl * (log_probs - ref_log_probs), clipped score added at the last token."""
    advantages: Tensor
    """(B, T) GAE advantages (whitened when the config says so); 0 on masked positions."""
    returns: Tensor
    """(B, T) advantages + values before whitening: the critic's regression targets."""
    reward_score: Tensor
    """(B,) reward-model score of each whole sequence, as produced (before normalisation, penalty, clip): with
    ppo.reward_spread_penalty the bootstrap heads' conservative score."""
    response_length: Tensor
    """(B,) number of response tokens, the first EOS included."""
    ended: Tensor
    """(B,) True where the response ended with EOS, False where it hit the length limit."""
    kl: Tensor
    """(B, T) log_probs - ref_log_probs on response tokens, 0 elsewhere (the per-token KL estimate)."""
    head_spread: Tensor | None = None
    """(B,) population std of the reward model's bootstrap heads' scores of each answer; None without heads."""

    @property
    def prompt_width(self) -> int:
        """P: the padded width of the prompt part of `sequences`."""
        return self.sequences.shape[1] - self.action_mask.shape[1]

    def select(self, index: Tensor) -> "Experience":
        """The rows `index` of every field (a mini-batch); prompt and response widths are kept."""
        picked = {f.name: getattr(self, f.name) for f in fields(self)}
        return Experience(**{name: None if value is None else value[index] for name, value in picked.items()})


def policy_generation_config(tokenizer, sampling: Sampling, ends: EndTokens) -> GenerationConfig:
    """The generation_config.json of a saved policy: the sampling PPO trained it under and nothing else.

    Neither the base model's own settings (a shipped repetition penalty was never part of training) nor the training
    run's lengths (max_new_tokens is the loop's budget, min_new_tokens a bench setting). top_k 0 is written out: left
    unset, transformers would sample with its default top-k of 50. A repetition penalty PPO sampled with is written
    as transformers' `repetition_penalty`, the nearest it has (it counts the prompt's tokens too, ours the answer's
    only); without one the key is left out.
    """
    penalty = {"repetition_penalty": sampling.repetition_penalty} if sampling.repetition_penalty != 1.0 else {}
    return GenerationConfig(
        do_sample=True,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        **penalty,
        eos_token_id=list(ends.eos_ids),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )


def save_policy(actor, tokenizer, generation_config: GenerationConfig, out_dir) -> None:
    """Write a trained actor to `out_dir` with the tokenizer and `generation_config` (PPO's sampling alone): a LoRA
    (peft) actor as its adapters alone, any other as the whole model."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if hasattr(actor, "peft_config"):
        actor.save_pretrained(out_dir, safe_serialization=True)
        generation_config.save_pretrained(out_dir)
    else:
        shipped = actor.generation_config
        actor.generation_config = generation_config
        try:
            actor.save_pretrained(out_dir, safe_serialization=True)
        finally:
            actor.generation_config = shipped
    tokenizer.save_pretrained(out_dir)


def generate_responses(
    actor, prompt_ids: Tensor, prompt_mask: Tensor, sampling: Sampling, ends: EndTokens
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Sample one response per prompt with `sampling` alone (rlhf.decode); returns (sequences, attention_mask,
    action_mask, ended).

    `actor` is the unwrapped model; call under torch.no_grad. The response is padded to the longest one in the batch
    (decoding stops when every row has written EOS or at the limit).
    """
    decoded = decode(actor, prompt_ids, prompt_mask, sampling, ends)
    action_mask, _ = response_mask_until_eos(decoded.response, list(ends.eos_ids))  # (B, T): to the first EOS
    attention_mask = torch.cat([prompt_mask.long(), action_mask], dim=1)  # (B, P+T)
    return torch.cat([prompt_ids, decoded.response], dim=1), attention_mask, action_mask, decoded.ended


def response_log_probs(
    model, sequences: Tensor, attention_mask: Tensor, response_width: int, with_entropy: bool = False,
    sampling: Sampling | None = None, eos_ids: tuple[int, ...] = (),
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (B, T) of the response tokens under the distribution `sampling` draws from (None: the raw logits'),
    and its entropy (B, T) when asked; `eos_ids` are the ids its min_new_tokens holds back.

    PPO passes its sampling settings (rlhf.warping): the log-probs
    are then those of the distribution the tokens were drawn from (TRL divides by the temperature), so the ratio is
    on-policy and the KL estimate log pi - log pi_ref is unbiased. Raw logits (DeepSpeed-Chat) at temperature 0.7
    make the sampled tokens look likelier than they were drawn, and a round measured a KL of -0.29 per answer.
    Only the last T + 1 positions go through the LM head (`logits_to_keep`): the prompt's logits are never needed
    and the vocabulary projection is the largest matmul of a small model.
    """
    logits = model(
        input_ids=sequences,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        logits_to_keep=response_width + 1,
        use_cache=False,
    ).logits[:, :-1]  # (B, T, V): the logits at P+t-1 predict response token t
    tokens = sequences[:, -response_width:]  # (B, T)
    if sampling is not None and not sampling.is_identity:
        # in fp32: under autocast a frozen model's logits are bf16, the prepared actor's fp32, and a bf16 division
        # would round the two differently (KL 0.04 per answer between identical models instead of 0)
        logits = warp_logits(logits, tokens, sampling, eos_ids)  # (B, T, V) fp32, -inf where it could not sample
    log_probs = gather_log_probs(logits, tokens)  # (B, T)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach())  # (B, T)
    return log_probs, entropy


def sequence_answer_mask(action_mask: Tensor, width: int) -> Tensor:
    """The response's tokens in the whole-sequence layout: (B, T) action mask -> (B, width), 0 over the prompt.

    What a mean-pooled reward model averages over (the answer it was trained on: its tokens, EOS included).
    """
    prompt_part = action_mask.new_zeros(action_mask.shape[0], width - action_mask.shape[1])  # (B, P)
    return torch.cat([prompt_part, action_mask], dim=1)  # (B, P+T)


def response_values(values: Tensor, response_width: int) -> Tensor:
    """Per-position values (B, P+T) -> the values of the states before each response token (B, T)."""
    return values[:, -response_width - 1:-1]  # (B, T)


class ValueHeadCall(torch.nn.Module):
    """Calls a value model's `forward_value` (-> .values (B, L), .scores (B,)) as `forward`, returning the values.

    Accelerate's wrappers (DDP, autocast) hook `forward`; a peft-wrapped critic forwards `forward_value`
    to its base model but its own `forward` expects a transformers model, so the critic is called
    through this module.
    """

    def __init__(self, value_model: torch.nn.Module):
        super().__init__()
        self.value_model = value_model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.value_model.forward_value(input_ids, attention_mask).values  # (B, L)
