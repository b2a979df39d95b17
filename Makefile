# te_compile: `make demo` and `make test` work on a fresh machine (they create .venv first).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch pinned to the 2.13.0 CPU build these machines install from disk; a looser pin downloads CUDA wheels.
TORCH_PIN ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: demo test test-cuda bench install clean fuzz fuzz-cuda

# the test venv takes the [cuda] extra too: the CPU suite checks the cuDNN target's decisions with the
# cuDNN frontend's own validator (no GPU needed); `pip install te_compile` alone is the CPU user's install
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e ".[test,cuda]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m te_compile demo

test: $(STAMP)
	$(PY) -m pytest -q -m "not cuda" tests

# the differential fuzzer (te_compile.testing.fuzz): a large CPU run (reference target, float64) ...
# A new seed every run (the time; the summary line prints it): FUZZ_SEED=N repeats a run.
FUZZ_CASES ?= 2000
FUZZ_JOBS  ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_SEED  ?= $(shell date +%s)
fuzz: $(STAMP)
	$(PY) -m te_compile.testing.fuzz --cases $(FUZZ_CASES) --seed $(FUZZ_SEED) --jobs $(FUZZ_JOBS) --json fuzz-cpu.jsonl

# ... and the GPU run (cuDNN, bf16 vs eager fp32, serve="always"), on a CUDA machine
fuzz-cuda: $(STAMP)
	$(PY) -m te_compile.testing.fuzz --device cuda --cases 500 --seed $(FUZZ_SEED) --jobs 10 --json fuzz-cuda.jsonl

# on a CUDA machine: the cuDNN numerics tests and the benchmark
test-cuda: $(STAMP)
	@$(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make test-cuda: no CUDA GPU here (torch.cuda.is_available() is False); the cuda tests need one. On a CPU machine run make test')"
	$(PY) -m pytest -q -m cuda tests

bench: $(STAMP)
	$(PY) bench/attention.py

clean:
	rm -rf $(VENV) *.egg-info
