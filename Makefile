# The two commands a newcomer needs: `make demo` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
APT_PKGS := redis-server faketime docker-compose

.PHONY: test demo lint typecheck pytest bench drill sysdeps venv clean package-check k8s-check

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

test: sysdeps $(STAMP) lint typecheck docs-check k8s-check pytest

demo: $(STAMP)
	$(VENV)/bin/singleton demo $(DEMO_ARGS)

bench: $(STAMP) sysdeps
	$(PY) -m bench

# What operators and servers do to the index: every kind, on both lease backends (history-loss's
# oplog flood slows the stand-in for seconds: on MongoDB leases with ttl 5 s, so that the lease
# store's bounded calls outlast it).
SINK_FAULTS = index-delete,alias-delete,index-close,alias-split
drill: $(STAMP) sysdeps
	$(VENV)/bin/singleton drill --rounds 100 $(DRILL_ARGS)
	$(VENV)/bin/singleton drill --shaped --rounds 30 $(DRILL_ARGS)
	$(VENV)/bin/singleton drill --related --rounds 30 $(DRILL_ARGS)
	$(VENV)/bin/singleton drill --faults $(SINK_FAULTS) --rounds 20 $(DRILL_ARGS)
	$(VENV)/bin/singleton drill --backend mongo --faults $(SINK_FAULTS) --rounds 20 $(DRILL_ARGS)
	$(VENV)/bin/singleton drill --faults history-loss,index-delete,alias-delete --rounds 8 $(DRILL_ARGS)
	$(VENV)/bin/singleton drill --backend mongo --ttl 5 --faults history-loss,index-delete,alias-delete --rounds 8 $(DRILL_ARGS)

# The distribution as PyPI would get it: a wheel and an sdist, their metadata and README checked.
package-check: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(VENV)/bin/twine check --strict dist/*

# The Kubernetes manifests against the API schemas (kubernetes-validate ships them: no cluster).
k8s-check: $(STAMP)
	$(VENV)/bin/kubernetes-validate --strict deploy/kubernetes/*.yaml

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# The documentation site (MkDocs Material, mkdocs.yml): `make docs` serves it with live reload on
# http://127.0.0.1:8000; `make docs-check` builds it as CI does, where a broken link, anchor or
# API reference, or a config key without a description, fails the build.
.PHONY: docs docs-check
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

docs-check: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
