# Two commands set up and run everything:
#   make workshop   install (if needed), then train every version on this machine's device
#   make test       install test extras (if needed), then run the test suite
PY := .venv/bin/python

.PHONY: workshop test install clean
workshop: .venv/.installed
	$(PY) -m harness.workshop $(ARGS)

test: .venv/.installed-test
	$(PY) -m pytest -q $(PYTEST_ARGS)

install: .venv/.installed

.venv/.installed: pyproject.toml setup/install.sh
	bash setup/install.sh

.venv/.installed-test: pyproject.toml setup/install.sh
	bash setup/install.sh test
	touch .venv/.installed

clean:
	rm -rf .venv results profiles
