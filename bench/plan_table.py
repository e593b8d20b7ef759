"""The memory plan (rlhf.memory_plan, `python app.py --plan`) of models too large for this machine, from their
published configs alone: Qwen2.5-1.5B, Llama-3-8B and Llama-3-70B on 1 and 8 GPUs of 80 GB, at the round's PPO
settings (batch 8, prompts 256 + answers 48 tokens, the reward model on votes.feature's 2 layers, bf16 autocast).

    python bench/plan_table.py            # the table of docs/multi-gpu.md, then one JSON line

The configs are written here from the models' config.json values (nothing is downloaded); the plan builds each model
on the meta device.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loop.config import LoopConfig
from loop.memory import plan_round_memory

CONFIGS = {
    "Qwen2.5-1.5B": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536,
                     "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
                     "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
                     "max_position_embeddings": 32768},
    "Llama-3-8B": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                   "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
                   "max_position_embeddings": 8192},
    "Llama-3-70B": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
                    "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
                    "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
                    "max_position_embeddings": 8192},
}
GB = 1024 ** 3


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory(prefix="plan-table-") as scratch:
        for name, values in CONFIGS.items():
            folder = Path(scratch) / name
            folder.mkdir()
            (folder / "config.json").write_text(json.dumps(values))
            for gpus in (1, 8):
                plan = plan_round_memory(LoopConfig(), model=str(folder), gpus=gpus, gpu_memory_gb=80)
                row = plan.to_json()
                row["model"] = name
                rows.append(row)
    print("| model | GPUs of 80 GB | DDP (full) | LoRA | FSDP2 (full) | FSDP2 + LoRA | recommended |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        cells = [f"{e['gb_per_gpu']:.1f} GB{'' if e['fits'] else ' (no)'}, batch {e['largest_batch_size']}"
                 for e in row["engines"].values()]
        print(f"| {row['model']} ({row['parameters'] / 1e9:.2f}B) | {row['gpus']} | {' | '.join(cells)} | "
              f"{row['recommended'] or 'none'}: {row['why']} |")
    print(json.dumps({"bench": "plan_table", "rows": [{k: row[k] for k in ("model", "parameters", "gpus", "engines",
                                                                             "recommended")} for row in rows]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
