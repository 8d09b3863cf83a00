# The two commands a newcomer needs: `make demo` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
APT_PKGS := redis-server faketime docker-compose

.PHONY: test demo lint typecheck pytest bench drill sysdeps venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# Installs the Debian packages the real-server tests need, only when a binary is missing.
# Sentinel runs as `redis-server <file> --sentinel` (tests/integration/sentinel_support.py): the
# redis-server package is enough; Debian's redis-sentinel would only add a system-wide service.
sysdeps:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v faketime >/dev/null || missing="$$missing faketime"; \
	command -v docker-compose >/dev/null || missing="$$missing docker-compose"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

lint: $(STAMP)
	$(VENV)/bin/ruff check singleton listeners tests bench scripts
	$(VENV)/bin/ruff format --check singleton listeners tests bench scripts

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Most tests run in parallel, a test file per worker (they wait on leases more than they compute);
# the timing-sensitive drills (marker `serial`) run afterwards, alone. Exit code 5 means "nothing
# selected" (a PYTEST_ARGS that picks from one part only).
PYTEST_WORKERS ?= 3
pytest: $(STAMP) sysdeps
	$(VENV)/bin/pytest -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile -v -m "not serial" --durations=15 $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(VENV)/bin/pytest -p no:cacheprovider -m serial --durations=10 $(PYTEST_ARGS) || [ $$? -eq 5 ]

test: sysdeps $(STAMP) lint typecheck pytest

demo: $(STAMP)
	$(VENV)/bin/singleton demo $(DEMO_ARGS)

bench: $(STAMP) sysdeps
	$(PY) -m bench

drill: $(STAMP) sysdeps
	$(VENV)/bin/singleton drill --rounds 100 $(DRILL_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
