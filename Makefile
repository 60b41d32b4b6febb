# Two commands: `make system-deps serve` (set up, export the voice, serve on CPU) and
# `make test` (set up everything, run every test). `make` alone lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
# The OpenAI-compatible gateway (tts_gateway); 0 serves Triton alone.
GATEWAY_PORT ?= 8080
WYOMING_PORT ?= 10200
# The supervisor's Prometheus metrics (outages, restarts); 0: none.
SUPERVISOR_METRICS_PORT ?= 8003
# nginx on the public ports in front of the front door and the gateway; EDGE=0: without it.
EDGE ?= 1
# Loopback by default; BIND=0.0.0.0 opens HTTP, gRPC and metrics to the network.
BIND ?= 127.0.0.1
PYTEST_ARGS ?=

.PHONY: help setup serve-setup check-system-deps check-setup kubectl client-venv agents-venv system-deps test-system-deps \
  apt-install export serve check test test-setup test-reliability unit lint format clean perf perf-smoke bench \
  soak flops profiles gpu-bundle deploy-venv lock image-cpu image-gpu simulate

help:  # the default goal: what each target does
	@echo "make system-deps     install the system packages (sudo apt-get: libb64-0d gcc libc6-dev nginx)"
	@echo "make serve           set up the lean venv, export the voice, serve on CPU (ports: README)"
	@echo "                     PROFILE=gpu|torch-cpu(-dlpack) adds torch; VOICES=voices.json more voices"
	@echo "make test            set up everything (system packages too) and run every test"
	@echo "make test-system-deps  the tests' own system packages (chromium, podman, debootstrap...)"
	@echo "make check           the edit loop: lint, unit, adapter and deployment tests (no server)"
	@echo "make unit | lint     the fast unit tests | ruff and the import layers"
	@echo "make test-reliability  the reliability tier with its long tests (--long)"
	@echo "make export          export the voice into model_repository (VOICES=voices.json: more)"
	@echo "make client-venv     .venv-client: the README's pip install lines alone (a user's view)"
	@echo "make perf-smoke      perf_analyzer on every model; against a running server:"
	@echo "                     PERF_ARGS=\"--grpc-port 8001 --http-port 8000\" (no export then)"
	@echo "make perf            the full perf_analyzer sweep and its plot (docs/perf.png)"
	@echo "make bench | soak    benchmarks (docs/performance.md, docs/reliability.md)"
	@echo "make flops           the voice's arithmetic per audio second (docs/performance.md)"
	@echo "  (test, perf, bench... install the full development set: about 2.2 GB;"
	@echo "   perf-smoke only what make serve does)"
	@echo "make gpu-bundle      an offline folder for a GPU machine (docs/gpu.md)"
	@echo "make image-cpu|gpu   the container image (docker/Dockerfile; docker or podman)"
	@echo "make lock            regenerate the image's hashed locks (requirements/image-*.lock)"
	@echo "make simulate        the autoscaler simulation and its plots (docs/scaling.md)"
	@echo "make clean           remove the exported voice and caches"

# System packages: libb64 for perf_analyzer (the rest ships in the Python wheels); nginx, the edge
# on make serve's public ports (tts_launcher/edge.py; Debian's package also enables the
# system's own nginx on port 80: `systemctl disable --now nginx` if you do not want it); a C compiler
# for tts_launcher/server_shim.c (keeps the admin key out of tritonserver's command line); the
# tests also drive the gateway's web page in Debian's headless Chromium; pesq (bench.cpu_variants)
# builds against python3-dev.
SYSTEM_PACKAGES := libb64-0d gcc libc6-dev nginx
# podman (with runc), debootstrap and podman-compose build and run the CPU image in the tests
# (tests/container).
TEST_SYSTEM_PACKAGES := chromium chromium-driver curl python3-dev podman runc debootstrap podman-compose
system-deps:
	@$(MAKE) --no-print-directory apt-install PACKAGES="$(SYSTEM_PACKAGES)"
# kubectl renders deploy/ (its built-in kustomize): a machine without one gets Debian's
# (kubernetes-client); one that has kubectl already keeps it.
test-system-deps:
	@$(MAKE) --no-print-directory apt-install PACKAGES="$(TEST_SYSTEM_PACKAGES) \
	  $$(command -v kubectl >/dev/null || echo kubernetes-client)"
apt-install:
	@missing=$$(for p in $(PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages: $$missing"; \
	  sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$sudo apt-get update -qq && $$sudo apt-get install -y -qq $$missing >/dev/null; \
	fi

# Three sets of pins: requirements/serve.txt (make serve), requirements/torch.txt (the torch
# profiles), requirements.txt (everything: tests and benchmarks; includes the other two).
PROJECT_FILES := pyproject.toml client/pyproject.toml
define install
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 needed"'
	@test -x $(PY) || { echo "creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "installing $(1) into $(VENV): $(2) (once; later runs skip this)"
	$(PY) -m pip install -q --disable-pip-version-check --upgrade "pip==24.3.1"
	$(PY) -m pip install -q --disable-pip-version-check -r $(1)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e client -e .
	@touch $@
endef
$(VENV)/.installed-serve: requirements/serve.txt $(PROJECT_FILES)
	$(call install,requirements/serve.txt,about 800 MB on a first run - a minute or two)
$(VENV)/.installed-torch: requirements/torch.txt $(VENV)/.installed-serve
	$(call install,requirements/torch.txt,torch for the torch profiles - about 700 MB more)
$(VENV)/.installed: requirements.txt requirements/serve.txt requirements/torch.txt $(PROJECT_FILES)
	$(call install,requirements.txt,the full development set - about 2.2 GB - a few minutes)
	@touch $(VENV)/.installed-serve $(VENV)/.installed-torch

setup: system-deps $(VENV)/.installed

# make serve installs no system package itself (make system-deps does, with sudo): it says
# what is missing and how to get it.
check-system-deps:
	@command -v $${CC:-cc} >/dev/null || { echo "make serve: no C compiler (cc) to build \
	tts_launcher/server_shim.c: run 'make system-deps' (sudo apt-get install gcc \
	libc6-dev) or install one"; exit 2; }
	@test "$(EDGE)" = 0 || command -v nginx >/dev/null || test -x /usr/sbin/nginx || { echo \
	"make serve: no nginx (the edge on the public ports): run 'make system-deps' (sudo \
	apt-get install nginx), or serve without it: make serve EDGE=0"; exit 2; }

TORCH_PROFILES := gpu torch-cpu gpu-dlpack torch-cpu-dlpack
serve-setup: check-system-deps $(VENV)/.installed-serve $(if $(filter $(TORCH_PROFILES),$(PROFILE)),$(VENV)/.installed-torch)

# Generates model_repository/{acoustic,vocoder}/1/model.onnx (+ voice.json); no-op when current.
# VOICES=voices.json exports (and serves) every voice listed (README, Voices); a later plain
# export keeps them (python -m export --single-voice goes back to the bundled voice alone).
export: $(VENV)/.installed-serve
	$(PY) -m export $(if $(VOICES),--voices $(VOICES)) \
	  $(if $(filter $(TORCH_PROFILES),$(PROFILE)),--check-torch)

# PROFILE=gpu (torch on CUDA) or PROFILE=torch-cpu serves model_repository/*/configs/$(PROFILE).pbtxt.
# Every other setting is a variable the processes read themselves (docs/configuration.md,
# Settings): `make serve TTS_FRONT_DEADLINE_S=5 TTS_GATEWAY_API_KEY=...` (make exports them).
serve: serve-setup export
	exec $(PY) -m tts_launcher --model-repository model_repository \
	  --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT) \
	  --gateway-port $(GATEWAY_PORT) --wyoming-port $(WYOMING_PORT) --supervisor-metrics-port $(SUPERVISOR_METRICS_PORT) --bind $(BIND) $(if $(PROFILE),--model-config-name=$(PROFILE)) \
	  $(if $(filter 0,$(EDGE)),--no-edge)

# Regenerate model_repository/*/configs/<profile>.pbtxt from config.pbtxt (tts_launcher/profiles.py).
profiles: $(VENV)/.installed
	$(PY) -m tts_launcher.profiles

# A folder to serve and benchmark the GPU profile on a CUDA machine without network (docs/gpu.md).
GPU_PYTHON ?= 3.12
gpu-bundle: setup export
	$(PY) -m tts_tools.gpu_bundle build out/gpu-bundle --python $(GPU_PYTHON) $(GPU_BUNDLE_ARGS)

lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports  # the layers in pyproject.toml [tool.importlinter]

format: $(VENV)/.installed
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

unit: $(VENV)/.installed
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

# The edit loop: lint, then the tiers that start no server (unit, model.py adapters with a
# fake pb_utils, the deployment files), on both cores; the tests marked slow run in
# `make test` only. It sets up what those tiers use (docs/testing.md gives its time).
# `make test` runs everything.
check: check-setup export lint
	$(PY) -m pytest -q -n $(or $(PYTEST_WORKERS),2) --dist loadfile -m "not slow" tests/unit \
	  tests/adapter tests/deployment $(PYTEST_ARGS)

# --durations: the slowest tests in every run, to keep the suite's time in view. Three workers
# on the two cores, one test file each at a time (a file's servers are its own): a file waiting
# on a timeout, an idle window or a restart leaves its core to another (docs/testing.md: 20:57
# of pytest beside two CPU hogs, against 25:08 with two workers). The benchmarks (marked
# `bench`) are one group on one worker (tests/support/scheduling.py).
# PYTEST_WORKERS sets the workers of `make check` (2) and `make test` (3); 0 runs one process.
PYTEST_WORKERS ?=
test: test-setup export lint
	$(PY) -m pytest -rfEs --durations=15 -n $(or $(PYTEST_WORKERS),3) --dist loadgroup --no-loadscope-reorder \
	  $(PYTEST_ARGS)

# What `make check`'s tiers need: the system packages (nginx renders the edge), kubectl (its
# kustomize renders deploy/), the development venv and the deployment tools' venv.
check-setup: system-deps kubectl
	@$(MAKE) --no-print-directory -j2 $(VENV)/.installed deploy-venv
kubectl:
	@command -v kubectl >/dev/null || $(MAKE) --no-print-directory apt-install \
	  PACKAGES=kubernetes-client

# The four venvs install side by side (one after another they took 2 minutes of a fresh
# clone's run; most of it unpacking, which overlaps); the system packages before them, once
# (two apt-get at a time would fight over dpkg's lock).
test-setup: system-deps test-system-deps
	@$(MAKE) --no-print-directory -j4 $(VENV)/.installed client-venv deploy-venv agents-venv

# A user's environment: the README's `pip install` lines and nothing else (./client, which
# carries ./wire's tts_wire and resolves the newest tritonclient in its range; openai at the
# project's pin), for tests/integration/test_client_alone.py and the README's Python blocks.
CLIENT_VENV ?= .venv-client
client-venv: $(CLIENT_VENV)/.installed
$(CLIENT_VENV)/.installed: client/pyproject.toml $(wildcard wire/tts_wire/*.py) requirements.txt
	rm -rf $(CLIENT_VENV)
	$(PYTHON) -m venv $(CLIENT_VENV)
	$(CLIENT_VENV)/bin/pip install -q --disable-pip-version-check ./client
	$(CLIENT_VENV)/bin/pip install -q --disable-pip-version-check $$(grep '^openai==' requirements.txt)
	touch $@

# The tools that check the deployment files (hadolint, kubernetes-validate, checkov), in a venv
# of their own: checkov's pins would clash with the project's. tests/deployment/test_image.py
# and test_deploy.py use it.
DEPLOY_VENV ?= .venv-deploy
deploy-venv: $(DEPLOY_VENV)/.installed
$(DEPLOY_VENV)/.installed: requirements/deploy.txt
	rm -rf $(DEPLOY_VENV)
	$(PYTHON) -m venv $(DEPLOY_VENV)
	$(DEPLOY_VENV)/bin/pip install -q --disable-pip-version-check -r requirements/deploy.txt
	touch $@

# The voice-agent frameworks the tests drive the gateway with (Pipecat), in a venv of their own:
# their pins would clash with the project's. tests/integration/test_piper_api.py uses it.
AGENTS_VENV ?= .venv-agents
agents-venv: $(AGENTS_VENV)/.installed
$(AGENTS_VENV)/.installed: requirements/agents.txt
	rm -rf $(AGENTS_VENV)
	$(PYTHON) -m venv $(AGENTS_VENV)
	$(AGENTS_VENV)/bin/pip install -q --disable-pip-version-check -r requirements/agents.txt
	touch $@

# The image's hashed locks, for the NGC image's Python (3.12) and platform, from
# requirements/image*.in with the versions of requirements/serve.txt and torch.txt (one pin
# each); every wheel of each version is hashed, so Debian's Python 3.11 installs them too.
# image-triton.lock: Triton's wheel alone (manylinux_2_35), installed without its dependencies.
LOCK_OPTIONS := --generate-hashes --no-header --quiet -c requirements/serve.txt -c requirements/torch.txt
LOCK_TARGET := --python-version 3.12 --python-platform x86_64-manylinux_2_28 $(LOCK_OPTIONS)
lock: $(VENV)/.installed
	$(VENV)/bin/uv pip compile requirements/image.in $(LOCK_TARGET) -o requirements/image-cpu.lock
	$(VENV)/bin/uv pip compile requirements/image-gpu.in $(LOCK_TARGET) -o requirements/image-gpu.lock
	$(VENV)/bin/uv pip compile requirements/image-triton.in --no-deps --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_35 $(LOCK_OPTIONS) -o requirements/image-triton.lock

# The image, with docker or podman (CONTAINER_ENGINE), from the wheels filled first into
# docker/wheels (an offline build: docs/deployment.md). podman keeps the HEALTHCHECK only in the
# docker format. The cpu image's Debian base comes from a registry, or on a host without one from
# docker/base-image.sh (debootstrap, as root).
CONTAINER_ENGINE ?= $(shell docker info >/dev/null 2>&1 && echo docker || echo podman)
image-cpu image-gpu: image-%: $(VENV)/.installed-serve
	$(PY) -m tts_tools.image wheels --profile $*
	$(CONTAINER_ENGINE) build $(if $(findstring podman,$(CONTAINER_ENGINE)),--format docker) \
	  -f docker/Dockerfile --target $* -t tts-triton:$* .

simulate: $(VENV)/.installed
	$(PY) -m bench.autoscale --device cpu --out docs/scaling
	$(PY) -m bench.autoscale --device h100 --out docs/scaling

# The reliability tier with its long tests (sustained overload, memory growth per bad input).
test-reliability: setup export
	$(PY) -m pytest -rfEs tests/reliability --long $(PYTEST_ARGS)

# Load tests with perf_analyzer (tritonclient 2.51 wheel). perf-smoke also runs inside `make test`.
perf: setup export
	$(PY) -m perf_analyzer_configs.run --plot docs/perf.png $(PERF_ARGS)

# Against a running server: make perf-smoke PERF_ARGS="--grpc-port 8001 --http-port 8000"; then
# the repository is not exported again (the running server uses it). It needs only what
# make serve installs (perf_analyzer comes with its tritonclient), not the development set.
perf-smoke: serve-setup $(if $(findstring --grpc-port,$(PERF_ARGS)),,export)
	$(PY) -m perf_analyzer_configs.run --smoke --out out/perf-smoke $(PERF_ARGS)

# Ours vs Piper's HTTP server vs Piper in-process, same texts, alternating (docs/performance.md).
bench: setup export
	$(PY) -m bench.compare --json out/bench.json

# 30 minutes of mixed load; RSS and /dev/shm into out/soak.csv and a plot (docs/reliability.md).
soak: setup export
	$(PY) -m bench.soak --minutes 30 --csv out/soak.csv --plot docs/soak.png

flops: setup export
	$(PY) -m bench.flops

clean:
	rm -rf .cache model_repository/*/1/*.onnx model_repository/*/1/voice.json \
	  model_repository/*/1/voices.json model_repository/*/1/voices \
	  model_repository/*/1/loudness.json model_repository/*/1/vocoder_reach.json \
	  model_repository/.export-manifest.json
