# Elastic LLM Operator: every target installs what it needs (`make setup` creates .venv itself).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= operator,trainer,dev
PYTEST_ARGS ?=

.PHONY: help setup tools images test test-unit lint crds demo bench clean-cluster release

help:
	@echo "make demo    - build tools (first run), local cluster whose pods run, the operator and a job that trains through a node loss"
	@echo "              DEMO_ARGS=--containers: every worker in a container of the trainer image (builds it first: make images)"
	@echo "              DEMO_ARGS=--kubelet: real kubelet nodes (root) pull that image; a node is deleted and one added"
	@echo "make test    - unit, trainer, chart and integration tests against a real local control plane"
	@echo "make lint    - ruff + mypy --strict on the packages"
	@echo "make crds    - regenerate crds/, the chart's copy and docs/api.md from the API models"
	@echo "make setup   - create .venv with the operator, trainer and dev extras"
	@echo "make tools   - build the pinned upstream binaries into the per-machine cache"
	@echo "make images  - build the operator and trainer images with podman + runc (offline, cached by content)"
	@echo "make release - dist/release/<version>/: chart, CRD bundle, wheels + sdists, images tagged, SBOMs, SHA256SUMS"
	@echo "              RELEASE_ARGS=--save-images: the images as OCI archives too"

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml images/trainer/constraints.txt
	@echo ">> creating $(VENV) and installing .[$(EXTRAS)] (first run downloads torch: several GB)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --progress-bar off -c images/trainer/constraints.txt -e '.[$(EXTRAS)]'
	touch $@

tools: setup
	$(BIN)/llmjob tools build

# Standard library only (no .venv needed): installs podman, runc and mmdebstrap from Debian's packages when
# missing (root), prints '<name> <reference>' per image. PYTHON must be the Python whose pip downloads the wheels.
images:
	PYTHONPATH=testbed $(PYTHON) -m llm_testbed.images build

# The tiers run cheapest first (pyproject's testpaths: unit, trainer, chart, integration) while the Go tools and
# then the images build in the background, one after the other (two cores: docs/development.md, "CI time").
# A test that needs a tool or an image waits for that one alone (a lock per tool group and per image).
test: setup
	@mkdir -p _out
	@echo ">> tools, then images, build in the background: _out/tools-build.log, _out/images-build.log"
	@( $(BIN)/llmjob tools build > _out/tools-build.log 2>&1; \
	   PYTHONPATH=testbed $(PYTHON) -m llm_testbed.images build > _out/images-build.log 2>&1 ) &
	$(BIN)/pytest $(PYTEST_ARGS)

test-unit: setup
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check operator trainer runtime testbed tests bench examples
	$(BIN)/ruff format --check operator trainer runtime testbed tests bench examples
	$(BIN)/mypy operator/llm_operator trainer/llm_trainer runtime/llm_elastic testbed/llm_testbed
	$(BIN)/pytest tests/unit/test_import_contract.py -q -p no:cacheprovider  # trainer/bench/examples: public llm_elastic only
	$(BIN)/python tests/unit/check_runtime_imports.py  # runtime: no part imports session.py, no import circle, no module > 300 lines but the named whole ones (<= 450), no function > 60

crds: setup
	$(BIN)/llmjob crd > crds/elasticllm.dev_llmtrainingjobs.yaml
	$(BIN)/llmjob crd --kind LLMTrainingRuntime > crds/elasticllm.dev_llmtrainingruntimes.yaml
	$(BIN)/llmjob crd --kind ClusterLLMTrainingRuntime > crds/elasticllm.dev_clusterllmtrainingruntimes.yaml
	cp crds/elasticllm.dev_llmtrainingjobs.yaml crds/elasticllm.dev_llmtrainingruntimes.yaml \
	  crds/elasticllm.dev_clusterllmtrainingruntimes.yaml charts/elastic-llm-operator/crds/
	$(BIN)/llmjob api-docs > docs/api.md
	$(BIN)/python deploy/kustomize/render_base.py

# The version is pyproject.toml's; the chart gets it as --version/--app-version. PYTHONPATH and LLMJOB_REPO_ROOT
# make the release read this tree even when .venv (VENV=...) was installed from another checkout.
release: setup
	PYTHONPATH=operator:runtime:trainer:testbed$${PYTHONPATH:+:$$PYTHONPATH} LLMJOB_REPO_ROOT=$(CURDIR) \
	  $(BIN)/python -m llm_testbed.release $(RELEASE_ARGS)

demo: setup tools
	$(BIN)/llmjob demo $(DEMO_ARGS)

clean-cluster: setup
	$(BIN)/llmjob cluster down --all
