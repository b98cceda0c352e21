# kvtier: two commands on a fresh Debian machine (as root).
#   make run    the main job: builds a DRAM tier, stores and reads pages, prints stats
#   make test   every test, after installing what the tests need
.PHONY: setup run test lint bench

setup:
	bash scripts/setup.sh all

run: setup
	cargo run --release --example dram_tier

test: setup
	cargo nextest run --workspace --no-fail-fast
	cargo test --workspace --doc

lint: setup
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

bench: setup
	cargo bench --workspace
