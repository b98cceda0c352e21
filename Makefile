# kvtier: two commands on a fresh Debian machine (as root).
#   make run    the main job: `kvtier replay` on a built-in workload (DRAM over NIXL FILE)
#   make test   every test, after installing what the tests need, beside a real S3 server
VENV ?= $(or $(KVTIER_VENV),/opt/kvtier/venv)
LMCACHE_VENV ?= $(or $(KVTIER_LMCACHE_VENV),/opt/kvtier/venv-lmcache)
VLLM_VENV ?= $(or $(KVTIER_VLLM_VENV),/opt/kvtier/venv-vllm)
PY310_VENV ?= $(or $(KVTIER_PY310_VENV),/opt/kvtier/venv-py310)

.PHONY: setup run test tests pytests py310 wheel lint pylint soak bench bench-sglang bench-lmcache bench-vllm

setup:
	bash scripts/setup.sh all

run:
	bash scripts/setup.sh build
	bash scripts/setup.sh nixl
	cargo run --release -p tier-cli -- replay

# Every test runs beside one s3s-fs on 127.0.0.1 that scripts/with-s3.sh starts and stops.
test: setup
	bash scripts/with-s3.sh $(MAKE) --no-print-directory tests

# The nightly soak (`make soak`) is checked to be built and selected: listed, not run.
tests:
	cargo nextest run --workspace --no-fail-fast
	cargo nextest list -p tier-nixl --test soak --run-ignored only | grep -q soak_1m_operations_stays_flat
	cargo test --workspace --doc
	cargo run --example dram_tier
	cargo run --example custom_tier
	$(MAKE) --no-print-directory pytests

# Nightly: the 1,000,000-operation soak of the NIXL FILE tier (about ten minutes on 2 cores),
# ignored by `make test`, which checks only that it is built and selected.
soak: setup
	cargo nextest run -p tier-nixl --test soak --run-ignored only

# The kvtier wheel (PyO3 + maturin) into target/wheels/.
wheel:
	rm -f target/wheels/kvtier-*.whl
	$(VENV)/bin/maturin build --release --quiet -m crates/tier-py/Cargo.toml -i $(VENV)/bin/python

# The Python tests, on the wheel installed into the venv, on SGLang's real classes; then
# each engine's tests in that engine's venv, on its own code.
pytests: wheel
	$(VENV)/bin/pip install --quiet --force-reinstall --no-deps target/wheels/kvtier-*.whl
	cd crates/tier-py/tests && $(VENV)/bin/python -m pytest -q -p no:warnings -p no:cacheprovider --ignore=engines
	$(MAKE) --no-print-directory py310
	$(LMCACHE_VENV)/bin/pip install --quiet --force-reinstall --no-deps target/wheels/kvtier-*.whl
	cd crates/tier-py/tests && $(LMCACHE_VENV)/bin/python -m pytest -q -rA -p no:warnings -p no:cacheprovider engines/lmcache
	$(VLLM_VENV)/bin/pip install --quiet --force-reinstall --no-deps target/wheels/kvtier-*.whl
	cd crates/tier-py/tests && $(VLLM_VENV)/bin/python -m pytest -q -rA -p no:warnings -p no:cacheprovider engines/vllm

# The package on Python 3.10, the oldest it supports: a wheel of its own (the abi3 wheel needs
# 3.11's stable buffer protocol) and the tests that need no torch and no engine.
py310:
	rm -rf target/wheels-py310
	$(VENV)/bin/maturin build --release --quiet --no-default-features -m crates/tier-py/Cargo.toml -i $(PY310_VENV)/bin/python -o target/wheels-py310
	$(PY310_VENV)/bin/pip install --quiet --force-reinstall --no-deps target/wheels-py310/kvtier-*.whl
	cd crates/tier-py/tests && $(PY310_VENV)/bin/python -m pytest -q -p no:warnings -p no:cacheprovider --noconftest plain test_readme.py

# kvtier's SGLang backend beside SGLang's own NIXL backend, on SGLang's host pool.
bench-sglang: setup wheel
	$(VENV)/bin/pip install --quiet --force-reinstall --no-deps target/wheels/kvtier-*.whl
	$(VENV)/bin/python crates/tier-py/bench/sglang_backends.py

# kvtier beside LMCache's own file-system L2 adapters, and beside vLLM's own fs tier, each
# through its engine's code path.
bench-lmcache: setup wheel
	$(LMCACHE_VENV)/bin/pip install --quiet --force-reinstall --no-deps target/wheels/kvtier-*.whl
	$(LMCACHE_VENV)/bin/python crates/tier-py/bench/lmcache_l2.py

bench-vllm: setup wheel
	$(VLLM_VENV)/bin/pip install --quiet --force-reinstall --no-deps target/wheels/kvtier-*.whl
	$(VLLM_VENV)/bin/python crates/tier-py/bench/vllm_tiers.py

lint: setup
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(MAKE) --no-print-directory pylint

# The Python package: ruff (lint and format), mypy --strict (pyproject.toml), and the one stub
# (`_kvtier.pyi`) checked against the built native module by stubtest.
pylint: wheel
	$(VENV)/bin/ruff check crates/tier-py/python
	$(VENV)/bin/ruff format --check crates/tier-py/python
	cd crates/tier-py && $(VENV)/bin/mypy python/kvtier
	$(VENV)/bin/pip install --quiet --force-reinstall --no-deps target/wheels/kvtier-*.whl
	cd /tmp && $(VENV)/bin/python -m mypy.stubtest kvtier._kvtier

bench: setup
	cargo bench --workspace
