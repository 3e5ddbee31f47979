# FedSteer Book. `make book` and `make test` each do their own set-up (venv, packages, data).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON   ?= python3
VENV     := .venv
PY       := $(VENV)/bin/python
REQ_HASH := $(shell cat requirements.txt pyproject.toml | sha1sum | cut -c1-12)
STAMP    := $(VENV)/.installed-$(REQ_HASH)
PROFILE  ?= paper
# SEEDS=0,1 renders the chapters from those seeds only (the chapters say how many of the paper's
# 8 they show); empty = the profile's seeds.
SEEDS    ?=
WORKERS  ?= 2
# `make test` runs on TEST_WORKERS pytest-xdist processes, each with its share of the cores as
# torch threads (on 2 cores, 2 workers of 1 thread finish about 1.4x sooner than 1 of 2 threads:
# the small CNN's batches of 32 use a second thread poorly). tests/conftest.py keeps each file,
# and the chapters that share runs, whole on one worker.
TEST_WORKERS ?= 2
TEST_THREADS := $(shell n=$$(( $$(nproc) / $(TEST_WORKERS) )); [ $$n -ge 1 ] && echo $$n || echo 1)
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9]*.ipynb notebooks/[A-Z]_*.ipynb))
CHAPTERS  := $(patsubst notebooks/%.ipynb,book/chapters/%.ipynb,$(NOTEBOOKS))
LIB       := $(shell find fedsteer_lib -name "*.py")
MATHJAX   := book/_static/mathjax/tex-chtml.js
FMNIST_STAMP := data/.fmnist-ok

.PHONY: help setup venv data system-packages doctor book test lab lab-settings reproduce book-html clean gpu-data generated quick-runs

help:
	@echo "make book       set up, execute the notebooks (papermill, profile=$(PROFILE)) and build _build/html"
	@echo "                (SEEDS=0,1 renders from those seeds only, e.g. while a sweep is still running)"
	@echo "make test       set up, then unit tests, nbval over every notebook, book build and browser check"
	@echo "make lab        JupyterLab on notebooks/, opened on an index of the chapters and their reading"
	@echo "                copies (as-in-the-book/: numbers, citations and links as the book shows them);"
	@echo "                PORT=8899 picks the port, ARGS=\"--no-browser\" passes options to jupyter lab"
	@echo "make reproduce  recompute every result of the paper profile (resumable; WORKERS=$(WORKERS))"
	@echo "make doctor     one line per prerequisite (ok / missing) with the command that fixes it"

# The set is byte-compiled after pip installs it, on every core (37 s on a 2-core AMD EPYC; pip's own
# compilation would take about 50 s of one core). Not optional: where PYTHONDONTWRITEBYTECODE is
# set (it is on the machines this project is developed on) Python never writes the bytecode it
# compiles, so every process would compile every module it imports, every time: `import torch` took
# 5.5 s instead of 2.5 s on a 2-core AMD EPYC, in each of the hundreds of processes that `make test`
# starts. Like pip, it leaves a file that does not compile (torch ships one written for Python 3.12)
# to Python, which reports it if it is ever imported.
venv: $(STAMP)
$(STAMP): requirements.txt pyproject.toml
	@echo "== setting up $(VENV) (torch comes from local disk where available)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	{ $(PY) -m pip install -q --no-compile -r requirements.txt 2>&1 || echo PIP_FAILED; } | { grep -v "is ignored: it is neither" || true; } | tee $(VENV)/pip.log
	! grep -q PIP_FAILED $(VENV)/pip.log
	$(PY) -m pip install -q --no-compile --no-deps --no-build-isolation -e .
	$(PY) -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()['purelib'], quiet=2, workers=0)"
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (fedsteer)" > /dev/null
	rm -f $(VENV)/.installed-* && touch $@

data: $(FMNIST_STAMP)
$(FMNIST_STAMP): | $(STAMP)
	$(PY) -m fedsteer_lib data
	touch $@

setup: venv data $(MATHJAX)

# Debian packages the project uses that a fresh machine lacks (SYSTEM_PACKAGES in
# fedsteer_lib/experiments/doctor.py): today Chromium, for the book's browser check. As root this
# runs `apt-get install -y --no-install-recommends chromium` when it is missing; otherwise it prints
# that command. Standard library only, so it needs no .venv.
system-packages:
	$(PYTHON) -m fedsteer_lib system-packages

doctor:
	@$(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m fedsteer_lib doctor

# MathJax 3 served from a local copy (the book renders offline).
$(MATHJAX):
	@echo "== fetching MathJax 3 from the npm registry into book/_static/mathjax"
	mkdir -p .cache/npm
	npm install --silent --no-audit --no-fund --prefix .cache/npm mathjax@3 > /dev/null
	rm -rf book/_static/mathjax && mkdir -p book/_static
	cp -r .cache/npm/node_modules/mathjax/es5 book/_static/mathjax

# Each chapter is executed as a reader would run it: its parameters cell edited to the profile (and
# SEEDS), nothing injected (tools/notebooks.py execute); it loads the results committed in
# data/results and computes only what is missing. Chapters executed with another profile are
# stale: a profile stamp clears them.
COMMA := ,
PROFILE_STAMP := book/chapters/.profile-$(PROFILE)$(if $(SEEDS),-seeds-$(subst $(COMMA),_,$(SEEDS)))
$(PROFILE_STAMP):
	$(if $(SEEDS),$(PYTHON) -m fedsteer_lib check-seeds "$(SEEDS)")
	rm -rf book/chapters && mkdir -p book/chapters && touch $@

book/chapters/%.ipynb: notebooks/%.ipynb $(LIB) tools/notebooks.py $(PROFILE_STAMP) | setup
	$(PY) -m tools.notebooks execute book/chapters $< --profile $(PROFILE) $(if $(SEEDS),--seeds $(SEEDS))

# Generated pages of the book (not committed): the runtime and environment table of the rerun
# page and the CSV of every run's summary, from the committed results. Always rewritten (a few
# seconds; a file whose content is unchanged keeps its date).
GENERATED_DIR := book/_generated
generated: | $(STAMP)
	$(PY) -m tools.generated $(GENERATED_DIR)

book-html: generated | setup
	$(VENV)/bin/jupyter-book build . --toc book/_toc.yml --config _config.yml -W -n --quiet
	@echo "book: $(CURDIR)/_build/html/index.html"

book: setup $(CHAPTERS)
	$(MAKE) --no-print-directory book-html

# The tests. First the book itself: every chapter executed with the paper profile as a reader would
# (its parameters cell edited), with FEDSTEER_NO_COMPUTE=1 so that a chapter that would compute a
# run or a measurement fails (everything is committed); the book built from them is the real one,
# in _build/html, which the browser tests open. Then one pytest run: the unit tests, the browser
# check and nbval over every notebook with its own `quick` profile (every code path at a small size).
# The set-up steps run side by side (pip into .venv, then the data; MathJax from npm; Chromium from
# apt): on a fresh machine the last two take about 20 s that pip's install would otherwise wait for.
test:
	$(MAKE) --no-print-directory -j3 setup system-packages
	rm -rf book/chapters && mkdir -p book/chapters && touch book/chapters/.profile-paper
	FEDSTEER_NO_COMPUTE=1 OMP_NUM_THREADS=$(TEST_THREADS) $(PY) -m tools.notebooks execute book/chapters --profile paper --jobs $(TEST_WORKERS)
	$(MAKE) --no-print-directory -j2 book-html quick-runs
	OMP_NUM_THREADS=$(TEST_THREADS) $(PY) -m pytest -p no:cacheprovider -n $(TEST_WORKERS) \
		$(NOTEBOOKS) tests --nbval-lax --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --durations=25

# The quick profile's runs that the chapters share are computed once, by a pool that keeps both
# workers busy, before nbval executes the chapters (so a chapter's 150 s budget is its own work, not
# whichever shared runs it happened to need first); the quick groups no chapter reads (the pinned
# reference and the bf16 parity runs) are left to the tests that need them. `make test` builds the
# HTML book (one process) beside it.
QUICK_GROUPS := main,ablations,conventions,regimes,diagnostics,server_step,calibrated
quick-runs: | setup
	OMP_NUM_THREADS=$(TEST_THREADS) $(PY) -m fedsteer_lib sweep --profile quick --dataset fmnist --kernels native \
		--what $(QUICK_GROUPS) --workers $(TEST_WORKERS)

# JupyterLab on notebooks/ (the chapters to edit and rerun), opened on notebooks/index.ipynb: the
# chapters in the book's order, each with its reading copy in notebooks/as-in-the-book/, and the
# rerun, numerics and Flower pages (tools/lab.py). In a copy the glued numbers, citations and
# cross-references read as in the book. JupyterLab refuses to run as root unless told, so
# --allow-root is passed then (and only then). Jupyter's news prompt is off: LAB_SETTINGS holds
# tools/lab_overrides.json (fetchNews "false"), JupyterLab's overrides of its defaults in .venv.
# PORT=8899 serves on that port; ARGS="--no-browser ..." is passed on to `jupyter lab`.
# tests/test_lab.py runs this line.
PORT ?=
ARGS ?=
LAB_COPIES   := notebooks/as-in-the-book
LAB_INDEX    := notebooks/index.ipynb
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json
LAB_ARGS     := $(if $(filter 0,$(shell id -u)),--allow-root) --ServerApp.root_dir=notebooks \
	--LabApp.default_url=/lab/tree/index.ipynb $(if $(PORT),--ServerApp.port=$(PORT)) $(ARGS)
lab: setup $(CHAPTERS) $(LAB_SETTINGS)
	$(PY) -m tools.lab notebooks $(CHAPTERS)
	$(VENV)/bin/jupyter lab $(LAB_ARGS)

lab-settings: $(LAB_SETTINGS)
$(LAB_SETTINGS): tools/lab_overrides.json
	mkdir -p $(@D) && cp $< $@

reproduce: setup
	$(PY) -m fedsteer_lib sweep --profile paper --dataset fmnist --what all --workers $(WORKERS)
	$(MAKE) --no-print-directory book

clean:
	rm -rf _build book/chapters $(LAB_COPIES) $(LAB_INDEX)

# For a session lent a GPU (bench/gpu_session.sh): the data travels with the working tree.
gpu-data: $(FMNIST_STAMP)
	mkdir -p data/FashionMNIST/raw
	src="$$($(PY) -m fedsteer_lib data | tail -1)"; [ "$$src" -ef data/FashionMNIST/raw ] || cp -n "$$src"/*-ubyte* data/FashionMNIST/raw/
