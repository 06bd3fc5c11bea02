# axtrain: `make demo` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch==2.13.0 resolves to the CPU build on disk on our machines (a plain `torch` pulls CUDA).
PIP_INSTALL := $(BIN)/pip install --disable-pip-version-check -q

.PHONY: install demo test test-slow bench bench-tpu golden sweep-doc clean

install: $(STAMP)

# The `gpu` extra (XLA's GPU compiler for `axtrain plan`) goes to its own folder, which only a
# GPU entry's plan puts on the path (launcher/plan.py:GPU_PLUGIN_DIR; pyproject.toml says why).
GPU_EXTRA := import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['gpu']))
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) -e '.[test,hf,tpu]'
	rm -rf $(VENV)/gpu-compiler
	$(PIP_INSTALL) --no-deps --target $(VENV)/gpu-compiler $$($(BIN)/python -c "$(GPU_EXTRA)")
	touch $(STAMP)

# `make demo` ends by sampling a continuation of this prompt from the model it trained.
DEMO_PROMPT := def __init__(self
demo: $(STAMP)
	$(BIN)/axtrain --config=configs/tiny.py --output_dir=runs/demo --overwrite
	@$(BIN)/python -c "import json; r = json.load(open('runs/demo/run.json')); print('demo: final validation loss %.3f nats/byte (status %s)' % (r['final_eval_loss'], r['status']))"
	@echo "demo: a sample from it (axtrain generate, temperature 0.6, seed 0; docs/generate.md):"
	@printf '%s' "$(DEMO_PROMPT)"
	@$(BIN)/axtrain generate --run_dir=runs/demo --prompt="$(DEMO_PROMPT)" --max_new_tokens=100 --temperature=0.6 --seed=0

# Two workers (pytest-xdist), one per core of the CI machine; a test file stays on one worker
# so its module fixtures are built once. `make test` (CI: .ci/run) is the quick suite, every test
# not marked `slow`, about 5-9 minutes on 2 cores (300-537 s on forty-five fresh clones; the budget is 6); `make test-slow` runs the tests marked `slow`
# (most over a minute on 2 cores: large-model TPU compiles, the one-chip memory sweep, the
# expert-parallel and context/pipeline workers, the runnable doc commands, two processes'
# kill-and-resume, the Slurm requeue).
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m 'not slow' tests

test-slow: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m slow tests

golden: $(STAMP)
	UPDATE_GOLDEN=1 $(BIN)/python -m pytest tests/test_golden_configs.py

bench: $(STAMP)
	$(BIN)/python -c "import matplotlib" 2>/dev/null || $(PIP_INSTALL) -e '.[bench]'
	$(BIN)/python -m benchmarks.run

# LLaMA-1B's train step as the TPU compiler builds it for v5e:4x4 (libtpu on this CPU), before
# (BEFORE, a git revision) and now: BENCHMARKS.md's TPU table. About 5 CPU-minutes a row.
BEFORE ?= f92658a
bench-tpu: $(STAMP)
	$(BIN)/python -m benchmarks.tpu_step --before=$(BEFORE) --write

# The README's sweep: three short tiny runs over the learning rate, their `axtrain runs` table
# (docs/sweep.txt, pasted into README.md) and plot (docs/sweep.png). About 3 CPU-minutes.
# The runs' config.json, run.json and metrics.jsonl are kept in tests/testdata/sweep/, from which
# tests/test_runs.py renders the table again and compares it with both documents.
AXTRAIN ?= $(BIN)/axtrain
SWEEP_LRS := 1e-3 3e-3 1e-2
SWEEP_SAVED := tests/testdata/sweep
sweep-doc: $(STAMP)
	for lr in $(SWEEP_LRS); do \
	  $(AXTRAIN) --config=configs/tiny.py --config.trainer.max_steps=100 \
	    --config.eval.every_steps=25 --config.optimizer.learning_rate=$$lr \
	    --output_dir=runs/sweep/lr=$$lr --overwrite || exit 1; \
	done
	$(AXTRAIN) runs runs/sweep --plot=docs/sweep.png > docs/sweep.txt
	rm -rf $(SWEEP_SAVED)
	for lr in $(SWEEP_LRS); do \
	  mkdir -p $(SWEEP_SAVED)/lr=$$lr && \
	  cp runs/sweep/lr=$$lr/config.json runs/sweep/lr=$$lr/run.json \
	    runs/sweep/lr=$$lr/metrics.jsonl $(SWEEP_SAVED)/lr=$$lr/ || exit 1; \
	done
	cat docs/sweep.txt

clean:
	rm -rf $(VENV) runs
