# The two commands of the README: `make demo` (ringsnap's main job on a local sandbox cluster) and
# `make test` (the whole suite). Both install what they need; run them as root on Debian 12.
VENV ?= .venv
PY := $(VENV)/bin/python
# Debian packages the test bed and the agent need (Docker engine, image bootstrap, XFS pool, LVM,
# systemd-analyze for the unit-file checks, Prometheus and promtool for the alert rules' tests and the
# sandbox's Prometheus).
DEB_PACKAGES := docker.io debootstrap xfsprogs lvm2 openjdk-17-jre-headless maven util-linux systemd \
	prometheus

.PHONY: test demo install system-deps lint typecheck-tree generate clean-sandbox bench

# Tests without the Cassandra test bed run in parallel workers (each makes its own pools, servers
# and temp dirs); the integration tests share one sandbox ring per session, so they run in order.
test: system-deps lint
	$(PY) -m pytest -m "not integration" -n 4 --durations=15
	$(PY) -m pytest -m integration --durations=25

demo: system-deps install
	$(VENV)/bin/ringsnap sandbox demo

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

# Where a host running systemd has its runtime directory (a variable for the Makefile's own test).
SYSTEMD_RUNTIME ?= /run/systemd/system

# Debian's prometheus package enables and starts its own Prometheus on :9090 on a host running
# systemd. ringsnap needs only the binaries (the sandbox starts its own on 127.0.0.1:29000+k, the
# tests theirs on free ports): a service installed here is stopped and disabled again, so the
# machine does not keep a second Prometheus it never asked for. One installed before is left alone.
system-deps:
	@missing=""; for pkg in $(DEB_PACKAGES); do dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing || exit 1; \
	  case " $$missing " in *" prometheus "*) \
	    if [ -d "$(SYSTEMD_RUNTIME)" ]; then \
	      echo "stopping and disabling Debian's prometheus.service (:9090): ringsnap starts its own"; \
	      systemctl disable --now prometheus.service; \
	    fi;; \
	  esac; \
	fi

lint: install typecheck-tree
	$(PY) -m ruff check .
	$(PY) -m mypy -p ringsnap
	$(PY) -m mypy tests bench

# mypy cannot follow setuptools' package-dir mapping of an editable install, so it reads the
# import tree through symlinks laid out the way the wheel lays it out.
typecheck-tree:
	@rm -rf build/typecheck && mkdir -p build/typecheck/ringsnap
	@ln -s $(CURDIR)/core/* build/typecheck/ringsnap/
	@ln -s $(CURDIR)/proto/gen/ringsnap/api build/typecheck/ringsnap/api
	@for pkg in agent coordinator plugins sandbox; do ln -s $(CURDIR)/$$pkg build/typecheck/ringsnap/$$pkg; done

generate: install
	$(PY) proto/generate.py
	$(PY) monitoring/generate.py

bench: system-deps install
	$(PY) -m bench

clean-sandbox: install
	$(VENV)/bin/ringsnap sandbox down
