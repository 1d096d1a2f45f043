# The two commands of the README: `make demo` (ringsnap's main job on a local sandbox cluster) and
# `make test` (the whole suite). Both install what they need; run them as root on Debian 12.
VENV ?= .venv
PY := $(VENV)/bin/python
# Debian packages the test bed and the agent need (Docker engine, image bootstrap, XFS pool, LVM).
DEB_PACKAGES := docker.io debootstrap xfsprogs lvm2 openjdk-17-jre-headless maven util-linux

.PHONY: test demo install system-deps lint generate clean-sandbox bench

test: system-deps install
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest

demo: system-deps install
	$(VENV)/bin/ringsnap sandbox demo

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

system-deps:
	@missing=""; for pkg in $(DEB_PACKAGES); do dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

lint: install
	$(PY) -m ruff check .
	$(PY) -m mypy

generate: install
	$(PY) proto/generate.py

bench: system-deps install
	$(PY) -m bench

clean-sandbox: install
	$(VENV)/bin/ringsnap sandbox down
