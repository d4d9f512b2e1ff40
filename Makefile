# Two entry points (see README):
#   make demo   set up .venv if needed, then run the main job
#   make test   set up .venv if needed, then run the whole test suite
# and `make oracle`, which records torchvision's ROI pooling outputs for the tests
# (tests/ops/roi_oracle.py) in a side virtualenv of 5.5 GB that `make test` does not need.
# Setup is idempotent: a stamp file records the inputs it was made from, so a second
# run installs nothing.

PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.mmseg-cann-installed
PYTEST_ARGS ?=
# pytest-xdist worker processes of `make test` (`logical`: one per logical core; 0 runs in one process).
# A test file runs in one worker (`--dist loadfile`): its module fixtures are made once.
TEST_WORKERS ?= logical

export PIP_DISABLE_PIP_VERSION_CHECK := 1
export MMCV_WITH_OPS := 1
export MAX_JOBS ?= 2

.PHONY: env demo test oracle clean-env

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

test: env side-envs
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

clean-env:
	rm -rf $(VENV)

# ---- side virtualenvs: packages that cannot live in .venv ----------------------------
# Each is made on first use from its requirements file; its check line must run there.
# If it cannot be made, the pip error's tail goes to DIR/install-failed.txt and the tests
# that need it skip with that message: `make test` never fails for that. The stamp is
# written either way; `make clean-side-envs` to try again.
#   $(1) directory  $(2) requirements file  $(3) check (python -c)  $(4) what it is for
define side_venv
$(1)/.mmseg-cann-installed: $(2)
	@mkdir -p $(1) && rm -f $(1)/install-failed.txt
	@echo "making $(1) ($(4))"
	@{ { test -x $(1)/bin/python || $(PYTHON) -m venv $(1); } \
	   && $(1)/bin/python -m pip install -q -r $(2) \
	   && $(1)/bin/python -c "$(3)"; \
	 } > $(1)/install.log 2>&1 \
	 && tail -n 1 $(1)/install.log \
	 || { echo "exit status $$$$?" >> $(1)/install.log; \
	      tail -n 20 $(1)/install.log > $(1)/install-failed.txt; \
	      echo "$(1) not made (the tests that need it will skip): $(1)/install-failed.txt"; }
	@touch $$@
endef

# .venv-ascend: triton-ascend 3.2.0 (it replaces the `triton` module) and the CPU torch
# from local disk, for the Ascend compile check (tools/ascend_check.py); a 54 MB download.
ASCEND_STAMP := .venv-ascend/.mmseg-cann-installed
ASCEND_CHECK := import torch, triton, triton.backends.ascend; \
	print('triton-ascend environment ready: triton', triton.__version__)
$(eval $(call side_venv,.venv-ascend,requirements/ascend.txt,$(ASCEND_CHECK),triton-ascend for tools/ascend_check.py))

# .venv-torchvision: torch 2.14.1 + torchvision 0.29.1 from local disk (about 5.5 GB), the
# oracle of roi_pool2d (tools/torchvision_oracle.py). No torchvision build runs beside the
# project's torch 2.13 CPU build: the wheels are CUDA builds that need libtorch_cuda.
# Made by `make oracle` only: the tests compare with the outputs it recorded in
# tests/ops/roi_pool_torchvision.pt.xz, and with the live oracle where it exists.
TV_STAMP := .venv-torchvision/.mmseg-cann-installed
TV_CHECK := import torch, torchvision; \
	torch.ops.torchvision.roi_pool(torch.zeros(1, 1, 2, 2), torch.zeros(1, 5), 1.0, 1, 1); \
	print('torchvision oracle ready: torchvision', torchvision.__version__)
$(eval $(call side_venv,.venv-torchvision,requirements/torchvision-oracle.txt,$(TV_CHECK),torchvision for the roi_pool2d oracle))

.PHONY: side-envs clean-side-envs
side-envs: $(ASCEND_STAMP)

# record torchvision's outputs for the ROI oracle cases again (after changing the cases)
oracle: env $(TV_STAMP)
	$(PY) -m tests.ops.roi_oracle

clean-side-envs:
	rm -rf .venv-ascend .venv-torchvision
