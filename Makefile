# make demo / make test / make docs: each creates the virtual environment (.venv) on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# Data root: $PYROBNN_DATA if set, else ../shared/data when it exists (this project's offline copies).
PYROBNN_DATA ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),)
export PYROBNN_DATA
# Sphinx: warnings are errors (a broken reference, a docstring that does not parse, a public name without one).
SPHINX := $(PY) -m sphinx -b html -n -W --keep-going -q

.PHONY: venv demo test test-threads slow check docs docs-ci wheel bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --no-cache-dir --upgrade pip
	$(PY) -m pip install -q --no-cache-dir -e '.[dev,docs]'
	$(PY) -m pip install -q --no-cache-dir --no-deps jupyter-server-mathjax  # MathJax's files: the site's math offline
	touch $@

demo: venv
	$(PY) -m pyrobnn train --dataset mnist --model mlp --hidden 400 --prior scale-mixture \
		--beta geometric --epochs 3 --num-samples 20 --out runs/demo --no-progress

# The fast loop (under 10 minutes on 2 cores): every test but those marked slow, in two pytest-xdist workers (each
# test runs torch on one thread, tests/conftest.py, so two workers use both cores).
test: venv
	$(PY) -m pytest -m "not slow" -n 2

# The fast tests marked recorded (each compares with what a seeded run gave once) again, torch on TEST_THREADS
# threads: another thread count sums in another order, a cheap stand-in for another CPU's floats.
TEST_THREADS ?= 3
test-threads: venv
	PYROBNN_TEST_THREADS=$(TEST_THREADS) $(PY) -m pytest -m "recorded and not slow" -n 2

# The slow checks alone (the NUTS agreement with Pyro and NumPyro, the documentation site at its CI size, the release
# check, Dask, processes, full-size runs), one at a time.
slow: venv
	$(PY) -m pytest -m slow

# Everything CI runs (.ci/run): the fast loop, the recorded tests at another thread count, then the slow checks.
check: test test-threads slow

# The site as a reader gets it, tutorials at full size (minutes each): docs/_build/html/index.html
docs: venv
	$(SPHINX) docs docs/_build/html

# The site with the tutorials at their CI size (seconds each), as tests/docs/test_docs.py builds it.
docs-ci: venv
	PYROBNN_TUTORIAL_SIZE=ci $(SPHINX) -E docs docs/_build/ci

# An sdist and a wheel in dist/, checked by twine.
wheel: venv
	rm -rf dist && $(PY) -m build --no-isolation --outdir dist . && $(PY) -m twine check --strict dist/*

bench: venv
	$(PY) benchmarks/speed.py

clean:
	rm -rf runs .pytest_cache docs/_build docs/generated docs/auto_tutorials docs/sg_execution_times.rst dist
