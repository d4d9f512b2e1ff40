# Two entry points (see README):
#   make demo   set up .venv if needed, then run the main job
#   make test   set up .venv if needed, then run the whole test suite
# Setup is idempotent: a stamp file records the inputs it was made from, so a second
# run installs nothing.

PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.mmseg-cann-installed
PYTEST_ARGS ?=

export PIP_DISABLE_PIP_VERSION_CHECK := 1
export MMCV_WITH_OPS := 1
export MAX_JOBS ?= 2

.PHONY: env demo test clean-env

env: $(STAMP)

$(STAMP): setup.py requirements/build.txt requirements/runtime.txt requirements/tests.txt Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q "pip>=24"
	# 1. torch first: the CPU wheel on local disk (a bare `torch` would pull a CUDA build).
	$(PIP) install -q torch==2.13.0
	# 2. build tools, then mmcv with compiled ops built against that torch (cached by pip).
	#    pip reports that torch asks for setuptools>=77: mmcv 2.1's setup.py needs <70
	#    (pkg_resources) while it builds; step 4 lifts it again.
	$(PIP) install -q -r requirements/build.txt
	$(PIP) install -q --no-build-isolation mmcv==2.1.0
	# 3. the OpenMMLab stack, this package (editable) and the test dependencies.
	$(PIP) install -q -r requirements/runtime.txt
	$(PIP) install -q --no-build-isolation --no-deps -e .
	$(PIP) install -q -r requirements/tests.txt
	# 4. lift setuptools to what torch declares, so `pip check` is clean (<80: its
	#    pkg_resources, which mmengine imports, warns only as a DeprecationWarning; 80+
	#    prints a UserWarning in every tool run).
	$(PIP) install -q "setuptools>=77.0.3,<80"
	$(PY) -m pip check
	$(PY) -c "import mmcv.ops, mmseg, mmseg_cann; print('environment ready:', mmseg_cann.__version__)"
	@touch $@

demo: env
	$(PY) tools/demo.py

test: env .venv-ascend/.mmseg-cann-ascend-installed .venv-torchvision/.mmseg-cann-tv-installed
	$(PY) -m pytest $(PYTEST_ARGS)

clean-env:
	rm -rf $(VENV)

# ---- .venv-ascend: the triton-ascend compile check (tools/ascend_check.py) -------------
# triton-ascend replaces the `triton` module, so it gets its own virtualenv, made on first
# use (torch from local disk, the 54 MB triton-ascend wheel from PyPI). If it cannot be
# made, the pip error's tail goes to install-failed.txt and the check's test skips with
# it: `make test` never fails for that. `make clean-env-ascend` to try again.
ASCEND_VENV  := .venv-ascend
ASCEND_STAMP := $(ASCEND_VENV)/.mmseg-cann-ascend-installed
ASCEND_FAIL  := $(ASCEND_VENV)/install-failed.txt

.PHONY: env-ascend clean-env-ascend

env-ascend: $(ASCEND_STAMP)

$(ASCEND_STAMP): requirements/ascend.txt
	@mkdir -p $(ASCEND_VENV) && rm -f $(ASCEND_FAIL)
	@echo "making $(ASCEND_VENV) (triton-ascend, for tools/ascend_check.py)"
	@{ { test -x $(ASCEND_VENV)/bin/python || $(PYTHON) -m venv $(ASCEND_VENV); } \
	   && $(ASCEND_VENV)/bin/python -m pip install -q -r requirements/ascend.txt \
	   && $(ASCEND_VENV)/bin/python -c "import torch, triton, triton.backends.ascend; \
	      print('triton-ascend environment ready: triton', triton.__version__)"; \
	 } > $(ASCEND_VENV)/install.log 2>&1 \
	 && tail -n 1 $(ASCEND_VENV)/install.log \
	 || { echo "exit status $$?" >> $(ASCEND_VENV)/install.log; \
	      tail -n 20 $(ASCEND_VENV)/install.log > $(ASCEND_FAIL); \
	      echo "$(ASCEND_VENV) not made (the triton-ascend check will skip): $(ASCEND_FAIL)"; }
	@touch $@

clean-env-ascend:
	rm -rf $(ASCEND_VENV)

# ---- .venv-torchvision: the torchvision oracle of roi_pool2d (tools/torchvision_oracle.py)
# No torchvision build runs on the project's torch 2.13 CPU build (the wheels are CUDA
# builds of torch 2.14), so torchvision.ops.roi_pool gets its own virtualenv with its own
# torch, made on first use from the wheels on local disk (about 5.4 GB; 98 s on the
# 2-core development machine, 249 s while other jobs ran). If it cannot be made, the pip
# error's tail goes to install-failed.txt and the oracle tests skip with it: `make test`
# never fails for that. `make clean-env-tv` to try again.
TV_VENV  := .venv-torchvision
TV_STAMP := $(TV_VENV)/.mmseg-cann-tv-installed
TV_FAIL  := $(TV_VENV)/install-failed.txt

.PHONY: tv-oracle clean-env-tv

tv-oracle: $(TV_STAMP)

$(TV_STAMP): requirements/torchvision-oracle.txt
	@mkdir -p $(TV_VENV) && rm -f $(TV_FAIL)
	@echo "making $(TV_VENV) (torch + torchvision, the roi_pool2d oracle)"
	@{ { test -x $(TV_VENV)/bin/python || $(PYTHON) -m venv $(TV_VENV); } \
	   && $(TV_VENV)/bin/python -m pip install -q -r requirements/torchvision-oracle.txt \
	   && $(TV_VENV)/bin/python -c "import torch, torchvision; \
	      torch.ops.torchvision.roi_pool(torch.zeros(1, 1, 2, 2), torch.zeros(1, 5), 1.0, 1, 1); \
	      print('torchvision oracle ready: torchvision', torchvision.__version__)"; \
	 } > $(TV_VENV)/install.log 2>&1 \
	 && tail -n 1 $(TV_VENV)/install.log \
	 || { echo "exit status $$?" >> $(TV_VENV)/install.log; \
	      tail -n 20 $(TV_VENV)/install.log > $(TV_FAIL); \
	      echo "$(TV_VENV) not made (the torchvision oracle tests will skip): $(TV_FAIL)"; }
	@touch $@

clean-env-tv:
	rm -rf $(TV_VENV)
