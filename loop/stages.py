"""The single-stage commands' work on the store (`--sft`, `--train-reward`, `--train-ppo`): what each reads from the
database (or a file in its place) and what it records there. The trainers themselves are in `rlhf/`."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from annotate.store import Store
from loop.config import LoopConfig
from rlhf.distributed import is_main_process


class StageInputError(ValueError):
    """What a stage would train on is missing; the message says what to do."""


@dataclass
class SFTOutcome:
    """An SFT run and the policy it was recorded as (None on processes other than the main one)."""

    result: object
    """rlhf.sft.train.SFTResult."""
    policy_id: int | None


def sft_on_store(config: LoopConfig, data_file: str | None, out_dir: Path) -> SFTOutcome:
    """SFT of config.app.model on `data_file` (JSONL of prompt, response), or on the better answers people wrote, then
    the new model recorded as the round-0 policy: the reference and starting actor of the next rounds. Raises
    StageInputError without demonstrations, and rlhf's SFTDataError or ModelNotFoundError."""
    from rlhf.sft import train

    model, db = config.app.model, config.app.db
    main_process = is_main_process()  # under accelerate launch / torchrun only one writes the store
    with Store(db) as store:
        if data_file:
            examples, source = train.sft_examples_from_jsonl(data_file), data_file
        else:
            examples, source = store.demonstrations(), f"the demonstrations in {db}"
            if not examples:
                raise StageInputError(
                    f"{db} holds no demonstrations yet. Annotators write them in the app's 'write a better answer' "
                    "box; or pass a JSONL file: --sft FILE with one {\"prompt\": ..., \"response\": ...} object a "
                    "line.")
        current = store.ensure_base_policy(model) if main_process else store.latest_policy()
        if main_process and current.round > 0:
            print(f"app.py --sft: note: rounds have already run (the current policy is round {current.round}). The "
                  "SFT model becomes the reference of the next rounds; they go on from the current policy.",
                  file=sys.stderr)
        if main_process:
            print(f"SFT of {model} on {len(examples)} examples from {source}; saving to {out_dir}", file=sys.stderr)
        result = train.train_sft(model, examples, config.sft, out_dir)
        if not main_process:
            return SFTOutcome(result, None)
        base = store.policies()[0]  # the first recorded policy is the base model
        return SFTOutcome(result, store.add_policy(round=0, path=str(result.out_dir), parent_id=base.id))


def preference_pairs(data_file: str | None, db: str) -> list:
    """Pairs from `data_file` when given, else the store's majority preferences; raises PreferenceDataError."""
    from rlhf.reward.data import PreferenceDataError, load_preference_file

    if data_file:
        return load_preference_file(data_file)
    if not Path(db).is_file():
        raise PreferenceDataError(
            f"No database at {db}: nothing has been voted on yet. Collect votes in the app first, pass --db PATH, "
            "or train from a file with --data FILE (JSONL or a dataset folder with prompt, chosen, rejected)."
        )
    with Store(db) as store:
        return list(store.preferences())


def ppo_prompts(prompts_file: str | None, db: str) -> list[str]:
    """Prompts from `prompts_file`, else from the store; raises StageInputError with the fix in its message."""
    from annotate.importers import PromptImportError, read_prompts

    if prompts_file:
        try:
            return read_prompts(prompts_file)
        except PromptImportError as error:
            raise StageInputError(str(error)) from None
    if not Path(db).is_file():
        raise StageInputError(f"no database at {db}: import prompts with --import-prompts FILE, "
                              "or pass them with --prompts FILE")
    with Store(db) as store:
        prompts = [prompt.text for prompt in store.prompts()]
    if not prompts:
        raise StageInputError(f"{db} holds no prompts: import some with --import-prompts FILE, "
                              "or pass them with --prompts FILE")
    return prompts


def train_ppo_with_card(config: LoopConfig, reward_model: str, prompts: list[str], ppo, out_dir: Path,
                        reference: str | None = None):
    """`--train-ppo`: PPO of config.app.model on `prompts` against `reward_model` with the settings `ppo`, the actor
    saved to `out_dir` with a model card naming its base model (the reference), its reward and the run's means. Returns
    rlhf.ppo.train.PPOResult; raises ModelNotFoundError."""
    from loop.model_card import write_model_card
    from rlhf.ppo import train

    result = train.train_ppo(config.app.model, reward_model, prompts, ppo, out_dir, reference_path=reference)
    if is_main_process():
        Path(result.saved_path).mkdir(parents=True, exist_ok=True)
        write_model_card(result.saved_path, str(reference or config.app.model),
                         metrics=train.summarise_ppo(result.history), sampling=ppo.sampling,
                         reward_model=train.reward_label(reward_model))
    return result
