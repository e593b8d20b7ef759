#!/usr/bin/env bash
# Makes .venv-trl: TRL 0.29.1 (the last release with trl.experimental.ppo's PPOTrainer) in its own
# virtual environment, so bench/compare_trl.py can run TRL beside rlhf-loop without TRL becoming a
# project dependency. Same torch and transformers versions as the project venv when it can, so the
# comparison measures the trainers, not the libraries under them.
#   bash bench/trl_env.sh            # creates or updates .venv-trl in the repository root
#   TRL_VENV=/some/where bash bench/trl_env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${TRL_VENV:-.venv-trl}"
python="${PYTHON:-python3}"
project_python="${PROJECT_PYTHON:-.venv/bin/python}"

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pins=(torch==2.13.0 trl==0.29.1 psutil)
if [ -x "$project_python" ]; then
    # Pin the libraries under the trainers to what the project venv has.
    for dist in transformers accelerate datasets tokenizers safetensors; do
        version=$("$project_python" -c "import importlib.metadata as m; print(m.version('$dist'))" 2>/dev/null || true)
        [ -n "$version" ] && pins+=("$dist==$version")
    done
fi
"$venv/bin/pip" install --upgrade pip >/dev/null
echo "installing into $venv: ${pins[*]}"
"$venv/bin/pip" install "${pins[@]}"
"$venv/bin/python" -c "import trl, torch, transformers; from trl.experimental.ppo import PPOTrainer; \
print('trl', trl.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
