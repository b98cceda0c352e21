# kvtier: two commands on a fresh Debian machine (as root).
#   make run    the main job: `kvtier replay` on a built-in workload (DRAM over NIXL FILE)
#   make test   every test, after installing what the tests need
.PHONY: setup run test lint bench

setup:
	bash scripts/setup.sh all

run: setup
	cargo run --release -p tier-cli -- replay

test: setup
	cargo nextest run --workspace --no-fail-fast
	cargo test --workspace --doc
	cargo run --example dram_tier
	cargo run --example custom_tier

lint: setup
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

bench: setup
	cargo bench --workspace
