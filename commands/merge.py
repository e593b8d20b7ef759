"""`python app.py --merge SOURCE OUT`: a LoRA round's policy, a folder of adapters (or a policy id of --db), merged into
its base model as a whole model folder, to publish or to load with transformers alone (rlhf.models.merge_adapter)."""

from __future__ import annotations

import sys
from pathlib import Path

from commands.data import existing_store
from loop.config import LoopConfig


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def policy_folder(source: str, db: str) -> str:
    """`source` when it names something on disk or is not a number; else the folder of policy `source` of `db` (KeyError
    for no such policy, loop.retention.PolicyPruned for one whose folder was pruned)."""
    if Path(source).exists() or not source.isdigit():
        return source
    from loop.retention import loadable_path

    with existing_store(db) as store:
        return loadable_path(store.policy(int(source)))


def merge(args, config: LoopConfig) -> int:
    """Merge the adapters at SOURCE into their base model, saved whole to the new folder OUT. Exit 0 done; 2 when
    SOURCE holds a whole model (nothing to merge) or nothing loadable, OUT exists, or the base model cannot be
    loaded."""
    from loop.retention import PolicyPruned
    from rlhf.models import ModelNotFoundError, adapter_base, merge_adapter

    source, out = args.merge
    try:
        folder = policy_folder(source, config.app.db)
    except KeyError:
        return _fail(f"{source} is neither a folder nor the id of a policy in {config.app.db}")
    except PolicyPruned as error:
        return _fail(str(error))
    if not Path(folder).exists():
        return _fail(f"{folder} does not exist: name a policy folder a LoRA round saved (its adapter_config.json "
                     "names the base model), or a policy id with --db")
    try:
        path = merge_adapter(folder, out)
    except (ModelNotFoundError, FileExistsError) as error:  # NothingToMerge is a ModelNotFoundError
        return _fail(str(error))
    except OSError as error:
        return _fail(f"the merged model could not be written to {out}: {error.strerror or error}")
    print(f"Merged the adapters of {folder} into their base model {adapter_base(folder)}: a whole model in {path}, "
          "which AutoModelForCausalLM.from_pretrained loads alone.")
    return 0
