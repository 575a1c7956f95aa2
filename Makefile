# ultracluster — one entry point. Every target is idempotent and safe to run twice.
SHELL := /bin/bash
.DEFAULT_GOAL := help

export LOCAL_ULTRACLUSTER_HOME ?= /var/lib/local-ultracluster
export AWS_ENDPOINT_URL ?= http://127.0.0.1:5055
VENVS := $(CURDIR)/.venvs
PYTEST_ARGS ?=
# Two pytest-xdist workers: the end-to-end group (mostly waiting on Slurm and Airflow) runs beside
# the rest. TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2

.PHONY: help setup setup-xla up down demo test bench lock clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

setup:  ## apt packages, the venvs and the local dataset (only what is missing)
	@bash scripts/setup_apt.sh
	@bash scripts/setup_venvs.sh
	@bash scripts/build_local_dataset.sh "$(LOCAL_ULTRACLUSTER_HOME)/dataset"

setup-xla: setup  ## the tests' production-twin training venv (torch-xla 2.9.0; 7 GB, built once per machine)
	@bash scripts/setup_xla_venv.sh

up: setup  ## start the local UltraCluster's AWS stand-in (moto, buckets, key pair, dataset), PostgreSQL and Airflow
	@bash scripts/up.sh

down:  ## stop everything `make up` and the demo started: clusters, daemons, moto, Airflow, PostgreSQL
	@bash scripts/down.sh

demo: up  ## the main job: the whole pipeline on the local UltraCluster, then a results summary
	@bash scripts/demo.sh

test: setup-xla  ## run the whole test suite (starts and stops its own daemons)
	@UC_TRAINING_DATASET_CACHE="$(LOCAL_ULTRACLUSTER_HOME)/dataset" $(VENVS)/airflow/bin/python -m pytest -n $(TEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

bench: setup  ## the benchmarks in bench/ (ratios against baselines measured in the same run) -> bench/results/
	@bash bench/run.sh

lock:  ## re-resolve the pins into the lock files
	@$(VENVS)/tools/bin/uv pip compile -q -p 3.11 requirements.txt requirements-dev.txt -o requirements.lock
	@$(VENVS)/tools/bin/uv pip compile -q -p 3.11 localcluster/pyproject.toml -o localcluster/requirements.lock
	@$(VENVS)/tools/bin/uv pip compile -q -p 3.11 requirements-pcluster.txt -o requirements-pcluster.lock
	@$(VENVS)/tools/bin/uv pip compile -q -p 3.11 --python-platform x86_64-manylinux_2_28 include/training/requirements-xla.txt -o include/training/requirements-xla.lock

clean: down  ## remove the venvs and the local state
	rm -rf $(VENVS) .airflow "$(LOCAL_ULTRACLUSTER_HOME)"
