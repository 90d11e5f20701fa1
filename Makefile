# Two commands on a fresh machine: `make run` (the main job) and `make test` (the tests).
# Each bootstraps .venv, installs the project and builds the region catalog when missing.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# Two pytest-xdist workers; which modules run beside which: tests/conftest.py, RayModulesApart.
PYTEST := $(BIN)/python -m pytest -n 2

.PHONY: pretrain release browser run test test-under-load test-slow test-all test-cluster lint catalog install clean-catalog \
	mlflow-server device-prep prometheus

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

catalog: $(STAMP)
	$(BIN)/optw catalog build --if-missing

run: catalog
	PROFILE=$(or $(PROFILE),quick) bash jobs/embedded.sh $(ARGS)

# The released global models (docs/releases.md): `make pretrain` trains each group's global
# model HOURS more CPU hours (one process and one core each, side by side), resuming
# pretraining/<group>/ (LR=2.5e-4 steps its lr down from now on); `make release` cools each
# state down, evaluates it and writes platform/optw/model/releases/<group>.{pt,json}.
GROUPS ?= solomon cordeau gavalas
HOURS  ?= 1
pretrain: catalog
	@pids=""; for g in $(GROUPS); do \
	  $(BIN)/optw pretrain --group $$g --hours $(HOURS) $(if $(LR),--lr $(LR)) & \
	  pids="$$pids $$!"; done; \
	  for p in $$pids; do wait $$p || exit 1; done

release: catalog
	@for g in $(GROUPS); do $(BIN)/optw release make --group $$g || exit 1; done

# Headless Chromium (Debian's package) for the report's browser test; without root or apt the
# test is skipped instead.
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "chromium could not be installed: the report's browser test will be skipped"

# Debian's Prometheus for the dashboard's panel test (tests/test_dashboards.py), which starts its
# own; the package's service is stopped and disabled, never left running. Without root or apt the
# test is skipped instead.
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    prometheus >/dev/null && \
	  { systemctl disable --now prometheus >/dev/null 2>&1 || \
	    service prometheus stop >/dev/null 2>&1 || true; }; } || \
	  echo "prometheus could not be installed: the dashboard's Prometheus test will be skipped"

test: catalog browser prometheus
	$(PYTEST)

# The default suite beside two CPU-burning processes, as on a machine shared with other work:
# tests assert behaviour, never speed, so it passes there too (slower).
test-under-load: catalog browser prometheus
	@bash -c '$(BIN)/python -c "while True: pass" & a=$$!; \
	  $(BIN)/python -c "while True: pass" & b=$$!; \
	  trap "kill $$a $$b" EXIT; $(PYTEST)'

test-slow: catalog
	$(PYTEST) -m slow

test-all: catalog
	$(PYTEST) -m "slow or not slow"

# The cluster path alone (also part of `make test`): a real two-node Ray cluster on this machine
# (needs root for `unshare -m`), S3 on loopback, an MLflow server; see docs/cluster.md.
test-cluster: $(STAMP)
	$(BIN)/python -m pytest tests/test_two_node.py tests/test_storage.py tests/test_cluster.py

lint: $(STAMP)
	$(BIN)/ruff check platform tests jobs benchmarks

clean-catalog:
	rm -f region_catalog/*.parquet region_catalog/manifest.json

# A local MLflow server (one worker, modest memory) on 127.0.0.1:5000 over the project's store;
# point jobs at it with MLFLOW_TRACKING_URI=http://127.0.0.1:5000.
mlflow-server: $(STAMP)
	$(BIN)/python -m optw.tracking.server --host 127.0.0.1 --port 5000

# What a GPU device run needs besides the source tree: the built catalog and the published
# weights (../shared does not travel). See docs/gpu.md.
device-prep: catalog
	mkdir -p .device/pretrained
	cp ../shared/reference/pretrained/*.pt .device/pretrained/
