# kvtier: two commands on a fresh Debian machine (as root).
#   make run    the main job: `kvtier replay` on a built-in workload (DRAM over NIXL FILE)
#   make test   every test, after installing what the tests need, beside a real S3 server
.PHONY: setup run test tests lint bench

setup:
	bash scripts/setup.sh all

run: setup
	cargo run --release -p tier-cli -- replay

# Every test runs beside one s3s-fs on 127.0.0.1 that scripts/with-s3.sh starts and stops.
test: setup
	bash scripts/with-s3.sh $(MAKE) --no-print-directory tests

tests:
	cargo nextest run --workspace --no-fail-fast
	cargo test --workspace --doc
	cargo run --example dram_tier
	cargo run --example custom_tier

lint: setup
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

bench: setup
	cargo bench --workspace
