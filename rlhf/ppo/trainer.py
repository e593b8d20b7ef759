"""PPO with four models (DeepSpeed-Chat step 3): actor and critic trained, reference and reward model frozen.

One `PPOTrainer.step` = 1 generate, 2 log-probs, 3 values and scores, 4 rewards, 5 advantages, 6 updates.
All maths comes from `rlhf.losses`; this file only moves tensors between models and those functions.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from rlhf.distributed import make_accelerator
from rlhf.finite import refuse_non_finite
from rlhf.losses import (
    AdaptiveKLController,
    FixedKLController,
    RunningMoments,
    actor_loss,
    compute_rewards,
    critic_loss,
    gae_advantages_and_returns,
    masked_mean,
    masked_whiten,
    truncation_penalty,
)
from rlhf.generate import decode_answers, encode_prompt, end_tokens, pad_sequences
from rlhf.ppo.config import PPOConfig, RewardFunction
from rlhf.ppo.experience import (
    Experience,
    ValueHeadCall,
    generate_responses,
    policy_generation_config,
    response_log_probs,
    response_values,
    save_policy,
    sequence_answer_mask,
)
from rlhf.reward.conservative import conservative_scores, drift_exceeded, head_spread

Tensor = torch.Tensor


@dataclass
class AnswerScoring:
    """What scores PPO's answers besides PPOTrainer's reward model."""

    function: RewardFunction | None = None
    """Scores the decoded answers in place of the reward model (`PPOTrainer.reward_scores`), which is then not needed.
    config.normalize_rewards, the clip and the truncation penalty apply to its scores as to a model's: a caller whose
    function has its own units turns normalisation on (loop.config.function_ppo_settings)."""
    heads: Tensor | None = None
    """(H, D) bootstrap heads on the reward model's own features (rlhf.reward.strategies.score_heads), for the
    conservative reward (config.reward_spread_penalty), the drift budget and ppo/head_spread; unused with a function."""


class PPOTrainer:
    """Runs PPO steps on batches of prompts.

    actor: causal LM, trained (a peft model in LoRA mode). critic: value model (`rlhf.reward.RewardModel`
    or anything whose `forward_value(input_ids, attention_mask, answer_mask=None)` has .values (B, L), .scores
    (B,)), trained.
    reference: frozen causal LM; None means the actor with its adapters disabled (LoRA mode only).
    reward_model: frozen value model; None means the critic with its adapters disabled (LoRA mode, when
    the critic was initialised from the reward model, as DeepSpeed-Chat initialises it).
    scoring: a reward function in place of the reward model, or the reward model's bootstrap heads (AnswerScoring).
    """

    def __init__(self, actor, critic, tokenizer, config: PPOConfig, reward_model=None, reference=None,
                 accelerator: Accelerator | None = None, scoring: AnswerScoring | None = None):
        self.config = config
        scoring = scoring or AnswerScoring()
        reward_function, reward_heads = scoring.function, None if scoring.function is not None else scoring.heads
        if reward_heads is None:
            config.refuse_without_heads("the trainer was given none (AnswerScoring.heads)")
        self.accelerator = accelerator or make_accelerator(config.mixed_precision)
        set_seed(config.seed, device_specific=True)
        if reference is None and not hasattr(actor, "disable_adapter"):
            raise ValueError("PPOTrainer needs a reference model, or a LoRA (peft) actor to serve as its own")
        if reward_model is None and reward_function is None and not hasattr(critic, "disable_adapter"):
            raise ValueError("PPOTrainer needs a reward model, a LoRA (peft) critic initialised from one, or a reward "
                             "function")
        self.reward_function = reward_function
        self.tokenizer = tokenizer
        self.ends = end_tokens(actor, tokenizer)  # the tokenizer's EOS and the model's configured ones
        # one Sampling (config.sampling) for the rollouts and for every log-prob (actor, old, reference)
        # Dropout would make the first update's ratio differ from 1 and break reuse of the first forward.
        actor.eval()
        critic.eval()
        self.gathered_actor = None  # FSDP2: the plain copy that generates and is saved (rlhf.ppo.fsdp2)
        if config.engine != "fsdp2":
            actor_optimizer, critic_optimizer = self._optimizer(actor, "actor"), self._optimizer(critic, "critic")
            self.actor, self.critic, self.actor_optimizer, self.critic_optimizer = self.accelerator.prepare(
                actor, ValueHeadCall(critic), actor_optimizer, critic_optimizer)
        # frozen after the optimisers took the trained weights: a caller may pass one model as actor and reference
        device = self.accelerator.device
        self.reference = None if reference is None else reference.to(device).eval().requires_grad_(False)
        self.reward_model = None if reward_model is None else reward_model.to(device).eval().requires_grad_(False)
        if config.engine == "fsdp2":
            self._shard(actor, critic)
        self.reward_heads = None if reward_heads is None else reward_heads.float().to(device)  # (H, D)
        self.kl_controller = (AdaptiveKLController(config.kl_ctl, config.kl_target, config.kl_horizon)
                              if config.adaptive_kl else FixedKLController(config.kl_ctl))
        self.reward_moments = RunningMoments()

    def _optimizer(self, model, role: str, fused: bool = True) -> torch.optim.Optimizer:
        """AdamW over `model`'s trainable weights at the learning rate of its `role` ("actor", "critic"; LoRA's
        adapters: lora_lr)."""
        lr = self.config.lora_lr if self.config.use_lora else getattr(self.config, f"{role}_lr")
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError(f"{type(model).__name__} has no trainable parameters")
        # fused: one kernel per tensor instead of six elementwise passes (CPU and CUDA both have it)
        return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=self.config.weight_decay,
                                 fused=fused)

    def _shard(self, actor, critic) -> None:
        """ppo.engine = "fsdp2": the four models sharded over every process (rlhf.ppo.fsdp2), optimisers on the
        shards (not fused: they are DTensors), and the plain copy of the actor that generates and is saved."""
        from rlhf.ppo.fsdp2 import shard_models

        self.actor, critic, (self.reference, self.reward_model), self.gathered_actor = shard_models(
            actor, critic, (self.reference, self.reward_model), self.accelerator.device)
        self.critic = ValueHeadCall(critic)
        self.actor_optimizer = self._optimizer(self.actor, "actor", fused=False)
        self.critic_optimizer = self._optimizer(critic, "critic", fused=False)

    def generation_actor(self):
        """The actor to decode with: the unwrapped one, or under FSDP2 its plain copy refreshed from the shards."""
        if self.gathered_actor is not None:
            return self.gathered_actor.refreshed_from(self.actor)
        return self.unwrapped_actor()

    # ----- the models, unwrapped for passes without gradients -----

    def unwrapped_actor(self):
        return self.accelerator.unwrap_model(self.actor)

    def unwrapped_critic(self):
        return self.accelerator.unwrap_model(self.critic).value_model

    def encode_prompts(self, prompts: list[str]) -> dict[str, Tensor]:
        """Prompts as generation and SFT encode them, cut to their last max_prompt_length tokens, left-padded."""
        encoded = [encode_prompt(self.tokenizer, prompt)[-self.config.max_prompt_length:] for prompt in prompts]
        input_ids, attention_mask = pad_sequences(encoded, self.tokenizer.pad_token_id)  # (B, P) each, left-padded
        device = self.accelerator.device
        return {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}

    def log_probs(self, model, sequences: Tensor, attention_mask: Tensor, width: int, with_entropy: bool = False):
        """(log_probs, entropy or None), each (B, T), of `model` under the one sampling of the rollouts
        (config.sampling): the distribution the tokens were drawn from."""
        return response_log_probs(model, sequences, attention_mask, width, with_entropy=with_entropy,
                                  sampling=self.config.sampling, eos_ids=self.ends.eos_ids)

    def reference_log_probs(self, sequences: Tensor, attention_mask: Tensor, width: int) -> Tensor:
        """(B, T) reference log-probs under the same sampling as the actor's (so equal weights give a KL of exactly 0,
        and a token the reference's own top-k/top-p would drop still scores finitely); inference_mode."""
        if self.reference is not None:
            return self.log_probs(self.reference, sequences, attention_mask, width)[0]
        with self.unwrapped_actor().disable_adapter():
            return self.log_probs(self.unwrapped_actor(), sequences, attention_mask, width)[0]

    def reward_scores(self, sequences: Tensor, attention_mask: Tensor, action_mask: Tensor, ended: Tensor) -> Tensor:
        """(B,) PPO's reward of each answer (`scores_and_spread`); inference_mode."""
        return self.scores_and_spread(sequences, attention_mask, action_mask, ended)[0]

    def scores_and_spread(self, sequences: Tensor, attention_mask: Tensor, action_mask: Tensor,
                          ended: Tensor) -> tuple[Tensor, Tensor | None]:
        """((B,) reward of each answer, (B,) spread of the bootstrap heads' scores of it or None without heads).

        The reward: the reward model's score of the whole sequence (a mean-pooled one averages the response), or
        with config.reward_spread_penalty k > 0 the heads' conservative score, mean - k * std
        (rlhf.reward.conservative), or the reward function's scores of the decoded answers when there is one.
        """
        if self.reward_function is not None:
            texts = self.answer_texts(sequences, action_mask, ended)
            scores = [float(score) for score in self.reward_function(texts)]
            if len(scores) != len(texts):
                raise ValueError(f"the reward function returned {len(scores)} scores for {len(texts)} answers")
            return torch.tensor(scores, dtype=torch.float32, device=sequences.device), None  # (B,)
        answer_mask = sequence_answer_mask(action_mask, sequences.shape[1])  # (B, P+T)
        heads = {} if self.reward_heads is None else {"heads": self.reward_heads}  # any value model takes none
        if self.reward_model is not None:
            output = self.reward_model.forward_value(sequences, attention_mask, answer_mask, **heads)
        else:
            critic = self.unwrapped_critic()
            with critic.disable_adapter():
                output = critic.forward_value(sequences, attention_mask, answer_mask, **heads)
        if self.reward_heads is None:
            return output.scores, None
        head_scores = output.head_scores.float().T  # (H, B)
        k = self.config.reward_spread_penalty
        return (conservative_scores(head_scores, k) if k else output.scores), head_spread(head_scores)

    def answer_texts(self, sequences: Tensor, action_mask: Tensor, ended: Tensor) -> list[str]:
        """The batch's answers as text, as people and the demo's judge read them (rlhf.generate.decode_answers)."""
        response = sequences[:, -action_mask.shape[1]:]  # (B, T)
        return [answer.text for answer in decode_answers(self.tokenizer, response, action_mask, ended)]

    # ----- phases 4 and 5 -----

    def make_experience(self, sequences, attention_mask, action_mask, ended, log_probs, ref_log_probs,
                        values, reward_score) -> Experience:
        """Rewards (4) and advantages (5) from the models' outputs; all inputs detached, (B, T) or (B,)."""
        config = self.config
        score = reward_score.float()  # (B,)
        if config.normalize_rewards:
            self.reward_moments.update(self.accelerator.gather(score))
            score = self.reward_moments.normalize(score)  # (B,)
        if config.truncation_penalty:
            score = truncation_penalty(score, ended, config.truncation_penalty)  # (B,)
        rewards, kl = compute_rewards(log_probs, ref_log_probs, score, action_mask,
                                      self.kl_controller.value, config.clip_reward_value)  # (B, T) each
        advantages, returns = gae_advantages_and_returns(values, rewards, action_mask,
                                                         config.gamma, config.lam)  # (B, T) each
        if config.whiten_advantages:
            advantages = masked_whiten(advantages, action_mask)  # (B, T)
        return Experience(
            sequences=sequences, attention_mask=attention_mask, action_mask=action_mask,
            log_probs=log_probs, ref_log_probs=ref_log_probs, values=values, rewards=rewards,
            advantages=advantages, returns=returns, reward_score=reward_score,
            response_length=action_mask.sum(dim=-1), ended=ended, kl=kl,
        )

    # ----- phase 6 -----

    def trainable_forward(self, sequences: Tensor, attention_mask: Tensor, width: int):
        """(log_probs, values, entropy), each (B, T), from actor and critic with gradients."""
        log_probs, entropy = self.log_probs(self.actor, sequences, attention_mask, width, with_entropy=True)
        values = response_values(self.critic(sequences, attention_mask), width)  # (B, T)
        return log_probs, values, entropy

    def frozen_forward(self, sequences: Tensor, attention_mask: Tensor, width: int):
        """(log_probs, values), each (B, T), from actor and critic as they are; call under inference_mode."""
        log_probs = self.log_probs(self.unwrapped_actor(), sequences, attention_mask, width)[0]
        values = response_values(self.accelerator.unwrap_model(self.critic)(sequences, attention_mask), width)
        return log_probs, values

    def optimise(self, experience: Experience, log_probs: Tensor, values: Tensor, entropy: Tensor) -> dict:
        """One actor step and one critic step on a mini-batch; returns its detached statistics."""
        mask = experience.action_mask
        policy_loss, clipfrac, approx_kl = actor_loss(log_probs, experience.log_probs, experience.advantages,
                                                      mask, self.config.cliprange)
        self._step(self.actor, self.actor_optimizer, policy_loss)
        value_loss, vf_clipfrac = critic_loss(values, experience.values, experience.returns, mask,
                                              self.config.cliprange_value)
        self._step(self.critic, self.critic_optimizer, value_loss)
        return {"ppo/policy_loss": policy_loss.detach(), "ppo/value_loss": value_loss.detach(),
                "ppo/clipfrac": clipfrac, "ppo/vf_clipfrac": vf_clipfrac, "ppo/approx_kl": approx_kl,
                "ppo/entropy": masked_mean(entropy, mask)}

    def _step(self, model, optimizer, loss: Tensor) -> None:
        self.accelerator.backward(loss)
        if self.config.max_grad_norm:
            self.accelerator.clip_grad_norm_(model.parameters(), self.config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def minibatches(self, batch_size: int) -> list[Tensor]:
        order = torch.randperm(batch_size, device=self.accelerator.device)
        return list(order.split(self.config.mini_batch_size))

    # ----- the step -----

    def generate(self, prompts: list[str]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Phase 1: (sequences, attention_mask, action_mask, ended) sampled by the actor for `prompts`."""
        batch = self.encode_prompts(prompts)
        # no_grad, not inference_mode: autocast keeps its bf16 copy of each weight that requires grad for the whole
        # call only outside inference mode (8 x 48 tokens on one CPU thread: 4.2 s; 6.9 s recasting at every
        # decoding step under inference_mode; 6.2 s in fp32). LoRA's frozen base weights are never cached, so
        # LoRA on CPU generates in fp32 (15.4 s against 8.4 s).
        recast_every_step = self.config.use_lora and self.accelerator.device.type == "cpu"
        with torch.no_grad(), contextlib.nullcontext() if recast_every_step else self.accelerator.autocast():
            return generate_responses(self.generation_actor(), batch["input_ids"], batch["attention_mask"],
                                      self.config.sampling, self.ends)

    def evaluate(self, sequences: Tensor, attention_mask: Tensor, action_mask: Tensor, ended: Tensor,
                 keep_graph: bool = False) -> tuple[Experience, tuple | None]:
        """Phases 2-5 on a generated batch: the Experience, and (log_probs, values, entropy) with
        gradients when `keep_graph` (so the first update can reuse this forward pass)."""
        width = action_mask.shape[1]
        with self.accelerator.autocast():
            # 2 log-probs (actor, reference) and 3 values (critic) and scores (reward model)
            if keep_graph:
                trainable = self.trainable_forward(sequences, attention_mask, width)
            else:
                with torch.inference_mode():
                    trainable = self.frozen_forward(sequences, attention_mask, width)
            with torch.inference_mode():
                ref_log_probs = self.reference_log_probs(sequences, attention_mask, width)  # (B, T)
                reward_score, spread = self.scores_and_spread(sequences, attention_mask, action_mask, ended)  # (B,)
        log_probs, values = (t.detach().clone().float() for t in trainable[:2])  # (B, T) each
        # 4 rewards and 5 advantages
        experience = self.make_experience(sequences, attention_mask, action_mask, ended, log_probs,
                                          ref_log_probs.clone().float(), values, reward_score.clone().float())
        experience.head_spread = None if spread is None else spread.clone().float()  # (B,)
        return experience, trainable if keep_graph else None

    def update(self, experience: Experience, trainable: tuple | None = None) -> list[dict]:
        """Phase 6: ppo_epochs passes over shuffled mini-batches, or one step on `trainable` when given."""
        if trainable is not None:
            return [self.optimise(experience, *trainable)]
        stats = []
        width = experience.action_mask.shape[1]
        for _epoch in range(self.config.ppo_epochs):
            for index in self.minibatches(experience.sequences.shape[0]):
                mini = experience.select(index)
                with self.accelerator.autocast():
                    trainable = self.trainable_forward(mini.sequences, mini.attention_mask, width)
                    stats.append(self.optimise(mini, *trainable))
        return stats

    def step(self, prompts: list[str]) -> dict[str, float]:
        """One PPO step on a batch of prompts; returns the step's metrics (averaged over processes)."""
        start = time.perf_counter()
        sequences, attention_mask, action_mask, ended = self.generate(prompts)  # 1
        generated_at = time.perf_counter()
        # With one epoch over one mini-batch the update's own forward gives the old log-probs and values:
        # the same numbers, one actor and one critic pass fewer.
        experience, trainable = self.evaluate(sequences, attention_mask, action_mask, ended,
                                              keep_graph=self.config.fused_first_update)  # 2-5
        scored_at = time.perf_counter()
        stats = self.update(experience, trainable)  # 6
        updated_at = time.perf_counter()

        kl_ctl_used = self.kl_controller.value
        metrics = {name: torch.stack([s[name] for s in stats]).float().mean() for name in stats[0]}
        metrics.update({
            "ppo/reward": experience.rewards.sum(dim=-1).mean(),
            "ppo/score": experience.reward_score.mean(),
            "ppo/kl": experience.kl.sum(dim=-1).mean(),
            "ppo/response_len": experience.response_length.float().mean(),
            "ppo/ended": experience.ended.float().mean(),
            "ppo/advantages": masked_mean(experience.advantages, action_mask),
            "ppo/returns": masked_mean(experience.returns, action_mask),
            "ppo/values": masked_mean(experience.values, action_mask),
            "gen/tokens_per_s": action_mask.sum() / max(generated_at - start, 1e-9),
        })
        if experience.head_spread is not None:
            metrics["ppo/head_spread"] = experience.head_spread.mean()
        names = list(metrics)
        stacked = torch.stack([metrics[n].float().to(self.accelerator.device) for n in names])
        reduced = self.accelerator.reduce(stacked, reduction="mean")
        result = {name: float(value) for name, value in zip(names, reduced.tolist())}
        self.kl_controller.update(result["ppo/kl"], len(prompts) * self.accelerator.num_processes)
        result.update({"ppo/kl_ctl": kl_ctl_used, "time/generate": generated_at - start,
                       "time/score": scored_at - generated_at, "time/update": updated_at - scored_at})
        return result

    # ----- runs and saving -----

    def train(self, prompts: list[str], on_step: Callable[[dict], None] | None = None) -> list[dict]:
        """Steps over the prompts (this process's share), as many as config.steps or config.epochs say, or fewer when
        a step's KL passes config.stop_at_kl or its head spread config.drift_budget (that step's metrics then hold
        ppo/drift_stopped = 1).

        `on_step(metrics)` runs after every step on every process, with the metrics averaged over processes.
        """
        config, accelerator = self.config, self.accelerator
        shard = prompts[accelerator.process_index::accelerator.num_processes]
        if not shard:
            raise ValueError("no prompts to train PPO on")
        global_batch = config.batch_size * accelerator.num_processes
        total = config.steps or config.epochs * math.ceil(len(prompts) / global_batch)
        generator = torch.Generator().manual_seed(config.seed + accelerator.process_index)
        order: list[int] = []
        history = []
        progress = tqdm(total=total, desc="PPO", unit="step", disable=not accelerator.is_local_main_process)
        for step_index in range(total):
            while len(order) < config.batch_size:  # cycle through reshuffled passes over the shard
                order += torch.randperm(len(shard), generator=generator).tolist()
            batch, order = [shard[i] for i in order[:config.batch_size]], order[config.batch_size:]
            metrics = {"ppo/step": step_index + 1, **self.step(batch)}
            refuse_non_finite(f"PPO step {step_index + 1} of {total}", metrics)  # the same reduced metrics everywhere
            first = history[0] if history else metrics
            drifted = bool(config.drift_budget) and drift_exceeded(first["ppo/head_spread"], metrics["ppo/head_spread"],
                                                                   config.drift_budget)
            if drifted:  # recorded with the step, before on_step hands it on
                metrics["ppo/drift_stopped"] = 1.0
            history.append(metrics)
            if on_step is not None:
                on_step(metrics)
            progress.update(1)
            progress.set_postfix(score=f"{metrics['ppo/score']:.3f}", kl=f"{metrics['ppo/kl']:.3f}")
            if config.stop_at_kl and metrics["ppo/kl"] > config.stop_at_kl:  # the same reduced KL on every process
                progress.write(f"PPO: stopped after step {step_index + 1} of {total}: KL {metrics['ppo/kl']:.3f} per "
                               f"answer is above ppo.stop_at_kl = {config.stop_at_kl}.")
                break
            if drifted:  # the same reduced spreads on every process
                progress.write(f"PPO: stopped after step {step_index + 1} of {total}: head spread "
                               f"{metrics['ppo/head_spread']:.3f} per answer is above (1 + ppo.drift_budget = "
                               f"{config.drift_budget}) times the first step's {first['ppo/head_spread']:.3f}.")
                break
        progress.close()
        return history

    def save_actor(self, out_dir: str | Path) -> Path:
        """Save the actor with the tokenizer (its chat template included) and a generation_config.json of PPO's sampling
        settings alone (`policy_generation_config`). A LoRA actor saves its adapters alone, in peft's format (a few MB;
        adapter_config.json names the base model they sit on, and rlhf.models.load_causal_lm loads the folder merged);
        any other the whole model."""
        out_dir = Path(out_dir)
        self.accelerator.wait_for_everyone()
        actor = self.generation_actor()  # under FSDP2 the whole weights, gathered by every process
        refuse_non_finite("the trained actor", named_tensors=actor.named_parameters())  # every process
        if self.accelerator.is_main_process:
            save_policy(actor, self.tokenizer, policy_generation_config(self.tokenizer, self.config.sampling, self.ends),
                        out_dir)
        self.accelerator.wait_for_everyone()
        return out_dir
