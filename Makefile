# make demo / make test: both create the virtual environment (.venv) on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# Data root: $PYROBNN_DATA if set, else ../shared/data when it exists (this project's offline copies).
PYROBNN_DATA ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),)
export PYROBNN_DATA

.PHONY: venv demo test bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --no-cache-dir --upgrade pip
	$(PY) -m pip install -q --no-cache-dir -e '.[dev]'
	touch $@

demo: venv
	$(PY) -m pyrobnn train --dataset mnist --model mlp --hidden 400 --prior scale-mixture \
		--beta geometric --epochs 3 --num-samples 20 --out runs/demo --no-progress

test: venv
	$(PY) -m pytest

bench: venv
	$(PY) benchmarks/speed.py

clean:
	rm -rf runs .pytest_cache
