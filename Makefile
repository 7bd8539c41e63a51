# The two set-up commands of the README. Both install what is missing first (scripts/setup).
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
G4C := target/debug/g4c
DEMO_MODEL := build/tiny

.PHONY: setup build demo test lint fuzz

setup:
	@scripts/setup

build: setup
	cargo build --locked

# Makes the tiny synthetic model, compiles it for the CPU into an artifact (StableHLO, weights and
# executables for the PJRT CPU plugin) and generates text from the artifact.
demo: build
	@test -d $(DEMO_MODEL) || $(G4C) synth --preset tiny --seed 0 -o $(DEMO_MODEL)
	$(G4C) compile $(DEMO_MODEL) --target cpu -o $(DEMO_MODEL).g4c
	$(G4C) run $(DEMO_MODEL).g4c --prompt "ba de fi ko" --max-new-tokens 24 --stats

# Ends with one "N passed, N failed" line summing every test binary.
test: setup
	@mkdir -p build
	@set -o pipefail; cargo test --workspace --locked 2>&1 | tee build/test.log
	@awk '/^test result:/ { p += $$4; f += $$6 } END { printf "%d passed, %d failed\n", p, f }' build/test.log

# The fuzz targets and property tests (tests/fuzz.rs, tests/properties.rs) at 20,000 inputs each
# instead of make test's 100; another G4C_FUZZ_SEED explores other inputs. Failing inputs are written
# to tests/fuzz/<target>/crash-* to be committed with their fix.
FUZZ_CASES ?= 20000
fuzz: setup
	G4C_FUZZ_CASES=$(FUZZ_CASES) cargo test --release --locked --test g4c -- fuzz:: properties::

lint:
	cargo fmt --check
	cargo clippy --workspace --all-targets -- -D warnings
