# Two commands set up and run everything:
#   make workshop   install (if needed), then train every version on this machine's device
#   make test       install test extras (if needed), then run the test suite
#                   (make test-slow: the few slow tests it leaves out, which CI runs once)
# And for instructors:
#   make notebooks  install JupyterLab (if needed) and open the four notebooks
#   make check-notebooks  run each notebook headless, top to bottom (a check before a class)
#   make results    (on a GPU) re-measure every published number (benchmarks/reproduce.sh; ARGS="compare-medium" for one step)
#   make workshop ARGS="--quick"   tiny preset, 3 steps per version (what CI runs first)
# Afterwards run scripts in the project's environment: source .venv/bin/activate
PY := .venv/bin/python

.PHONY: workshop test test-slow install clean results notebooks check-notebooks
workshop: .venv/.installed
	$(PY) -m training.workshop $(ARGS)

# -n auto: one test process per CPU core (pytest-xdist), each test on one thread; an idle
# process takes tests from a busy one's queue (worksteal), so a few long tests end together
XDIST := -n auto --dist worksteal
test: .venv/.installed-test
	$(PY) -m pytest -q -m "not slow" $(XDIST) $(PYTEST_ARGS)

test-slow: .venv/.installed-test
	$(PY) -m pytest -q -m slow $(XDIST) $(PYTEST_ARGS)

install: .venv/.installed

# Jupyter refuses to start as root (a container's usual user) unless told it may.
JUPYTER_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
notebooks: .venv/.installed-notebooks
	$(PY) -m jupyter lab exercises/notebooks/ $(JUPYTER_ROOT) $(ARGS)

# The notebook tests of make test-slow: every notebook executed by a headless kernel.
check-notebooks: .venv/.installed-test
	$(PY) -m pytest -q tests/test_notebooks.py $(XDIST) $(PYTEST_ARGS)

results: .venv/.installed
	bash benchmarks/reproduce.sh $(ARGS)

.venv/.installed: pyproject.toml setup/install.sh
	bash setup/install.sh

.venv/.installed-test: pyproject.toml setup/install.sh
	bash setup/install.sh test
	touch .venv/.installed

.venv/.installed-notebooks: pyproject.toml setup/install.sh
	bash setup/install.sh notebooks
	touch .venv/.installed

clean:
	rm -rf .venv results profiles
