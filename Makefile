# Two entry points for a newcomer: `make demo` and `make test`.
# Both create .venv on first use and reuse it afterwards (the install step
# re-runs only when pyproject.toml changes).
#
# TORCH_SPEC picks the torch build. The default is the CPU build that lies on
# this machine's disk; GPU users pass e.g. TORCH_SPEC='torch==2.13.0' with a
# CUDA index, or TORCH_SPEC='torch' to take whatever pip resolves.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.rrfp-installed

.PHONY: demo test install clean

install: $(STAMP)

# setup.py and the C file: the optional compiled trace reader (docs/traces.md), rebuilt when either changes
$(STAMP): pyproject.toml setup.py profiler/trace/_fastread.c
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,hf]'
	@touch $@

demo: $(STAMP)
	$(BIN)/rrfp run --workload emulated --emulate vlm-mixed --ranks 4 --microbatches 16 --iters 6 --hint bfw --memory-budget 1f1b --compare

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis build profiler/trace/_fastread*.so
