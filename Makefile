# te_compile: `make demo` and `make test` work on a fresh machine (they create .venv first).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch's version, pinned: the version the CPU suite runs on (CI). A machine whose pip index offers a CPU build
# under this pin installs that; PyPI alone offers CUDA builds (several GB): for a CPU build from pytorch.org run
#   make demo TORCH_PIN="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH_PIN ?= torch==2.13.0
BASE   := $(VENV)/.installed-base
TESTS  := $(VENV)/.installed-test
CUDA   := $(VENV)/.installed-cuda

.PHONY: demo test test-cuda bench install clean fuzz fuzz-cuda mutants

# the demo: te_compile and torch, nothing else (on a CPU no CUDA package). The commands run the checkout's own
# te_compile (Python puts the current folder first), so the installed copy only registers the package's metadata
# and entry points: it is reinstalled when pyproject.toml changes
$(BASE): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q .
	touch $(BASE)

# the CPU suite checks the cuDNN target's decisions with the cuDNN frontend's own validator, which runs without a
# GPU: the frontend's Python package alone (--no-deps: its CUDA libraries are needed only to run on a GPU), at the
# version whose private surface te_compile was checked on (te_compile/cudnn/frontend_private/, FRONTEND_CHECKED)
$(TESTS): $(BASE)
	$(PY) -m pip install -q ".[test]"
	$(PY) -m pip install -q --no-deps "nvidia-cudnn-frontend==1.32"
	touch $(TESTS)

# on a CUDA machine: the frontend with everything it runs with
$(CUDA): $(TESTS)
	$(PY) -m pip install -q ".[test,cuda]"
	touch $(CUDA)

install: $(BASE)

demo: $(BASE)
	$(PY) -m te_compile demo

test: $(TESTS)
	$(PY) -m pytest -q -m "not cuda" tests

# mutation testing (not part of make test): one-line mutants of te_compile's guards, each run against the CPU tests
# that must catch it, on a temporary copy of the checkout (tools/mutants.py; the list and score: docs/contributing.md)
MUTANTS_JOBS ?= 2
mutants: $(TESTS)
	$(PY) -m tools.mutants --jobs $(MUTANTS_JOBS)

# the differential fuzzer: a large CPU run (reference target, float64) ...
# A new seed every run (the time; the summary line prints it): FUZZ_SEED=N repeats a run.
FUZZ_CASES ?= 2000
FUZZ_JOBS  ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_SEED  ?= $(shell date +%s)
fuzz: $(TESTS)
	$(PY) -m tools.fuzz --cases $(FUZZ_CASES) --seed $(FUZZ_SEED) --jobs $(FUZZ_JOBS) --json fuzz-cpu.jsonl

# ... and the GPU run (cuDNN, bf16 vs eager fp32, serve="always"), on a CUDA machine
fuzz-cuda: $(CUDA)
	$(PY) -m tools.fuzz --device cuda --cases 500 --seed $(FUZZ_SEED) --jobs 10 --json fuzz-cuda.jsonl

# on a CUDA machine: the cuDNN numerics tests and the benchmark
test-cuda: $(CUDA)
	@$(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make test-cuda: no CUDA GPU here (torch.cuda.is_available() is False); the cuda tests need one. On a CPU machine run make test')"
	$(PY) -m pytest -q -m cuda tests

bench: $(CUDA)
	$(PY) bench/attention.py

clean:
	rm -rf $(VENV) *.egg-info
