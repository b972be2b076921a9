# qwen3-asr-server. `make run` starts the server, `make test` runs lint and the whole suite.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8100
# torch comes first, pinned: the CPU wheel for 2.13.0 is on local disk here. Elsewhere add
# e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" to avoid a CUDA build.
TORCH_PIP_ARGS ?=

export HOST PORT

.PHONY: install install-dev run test lint format bench clean e2e image-test browser clients

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install $(TORCH_PIP_ARGS) "torch==2.13.0"
	$(BIN)/pip install -e ".[qwen,offline,vad,translate]"
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install -e ".[dev]"
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

run: install
	$(BIN)/python -m qwen3_asr_server

lint: install-dev
	$(BIN)/ruff format --check src tests bench scripts examples
	$(BIN)/ruff check src tests bench scripts examples
	$(BIN)/mypy

format: install-dev
	$(BIN)/ruff format src tests bench scripts examples
	$(BIN)/ruff check --fix src tests bench scripts examples

# Debian's chromium for the browser tests (tests/test_web.py, which skip without it): only as
# root and only when /usr/bin/chromium is missing; one retry after an apt-get update.
browser:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ]; then \
		apt-get install -y chromium || { apt-get update && apt-get install -y chromium; }; \
	fi

# Third-party clients for tests/test_clients.py: the npm project (OpenAI Node SDK, Vercel AI
# SDK) from its lock file, and LiteLLM in a venv of its own (it pins an older openai SDK than
# the tests use). The agent frameworks' Deepgram plugins for tests/test_agent_plugins.py get
# a venv each (their pins clash with ours: docs/notes/issue52-frameworks.md). Each download
# is tried twice.
CLIENTS := tests/clients
LITELLM := litellm==1.106.2
LIVEKIT := livekit-plugins-deepgram==1.8.9 livekit-agents==1.8.9
PIPECAT := "pipecat-ai[deepgram]==1.14.0" deepgram-sdk==7.16.0

$(CLIENTS)/node_modules/.installed: $(CLIENTS)/package-lock.json
	cd $(CLIENTS) && { npm ci --no-audit --no-fund || npm ci --no-audit --no-fund; }
	touch $@

$(CLIENTS)/.venv-litellm/.installed:
	$(PYTHON) -m venv $(CLIENTS)/.venv-litellm
	$(CLIENTS)/.venv-litellm/bin/pip install -q "$(LITELLM)" || \
		$(CLIENTS)/.venv-litellm/bin/pip install -q "$(LITELLM)"
	touch $@

$(CLIENTS)/.venv-livekit/.installed:
	$(PYTHON) -m venv $(CLIENTS)/.venv-livekit
	$(CLIENTS)/.venv-livekit/bin/pip install -q $(LIVEKIT) || \
		$(CLIENTS)/.venv-livekit/bin/pip install -q $(LIVEKIT)
	touch $@

$(CLIENTS)/.venv-pipecat/.installed:
	$(PYTHON) -m venv $(CLIENTS)/.venv-pipecat
	$(CLIENTS)/.venv-pipecat/bin/pip install -q $(PIPECAT) || \
		$(CLIENTS)/.venv-pipecat/bin/pip install -q $(PIPECAT)
	touch $@

clients: $(CLIENTS)/node_modules/.installed $(CLIENTS)/.venv-litellm/.installed \
	$(CLIENTS)/.venv-livekit/.installed $(CLIENTS)/.venv-pipecat/.installed

test: install-dev lint browser clients
	$(BIN)/python -m pytest -n 2 --dist loadfile tests

bench: install-dev
	$(BIN)/python bench/run_all.py

# Black-box suite (E2Etest/) against a local server with the bundled model on a free port;
# E2E_ARGS goes to pytest, e.g. make e2e E2E_ARGS="-m smoke".
e2e: install-dev
	$(BIN)/python scripts/run_e2e.py $(E2E_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# Build the CPU image with podman (from a debootstrapped bookworm base) and transcribe a WAV
# with the server run from the image's filesystem. Needs root; installs podman/debootstrap.
image-test:
	bash scripts/image_test.sh
