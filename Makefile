# Two commands do all the set-up on a fresh machine:
#   make smoke   installs, runs matrices/smoke.yaml and prints its summary
#   make test    installs and runs the tests
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
EXTRAS := hf,llamacpp,analysis,test

.PHONY: setup smoke test env-vllm clean

$(BIN)/bench: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# llama-cpp-python compiles from source here (about 5 minutes on 2 cores, cached by pip after)
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	touch $@

setup: $(BIN)/bench

smoke: setup
	$(BIN)/bench run matrices/smoke.yaml --run-dir results/smoke

test: setup
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) results/smoke
