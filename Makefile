# blipless: `make run` starts a local node, `make test` runs every test.
CARGO ?= cargo
FUZZ_SECONDS ?= 60
# Debian packages the tests drive (package:command); make run needs only curl.
TEST_PACKAGES = curl:curl redis-server:redis-server wireguard-go:wireguard-go wireguard-tools:wg iperf3:iperf3 nftables:nft iputils-ping:ping
RUN_PACKAGES = curl:curl

.PHONY: all build run test deps bench lint fuzz clean

all: build

build:
	$(CARGO) build --workspace --bins

## run: an ingress and a device plane on the embedded store, a demo client, and what to type.
## Only the daemons' and blipless-ctl's packages: a workspace build would take in
## the tests crate and with it the test-only fault-injection feature.
run:
	@scripts/ensure-packages.sh $(RUN_PACKAGES)
	$(CARGO) build --release -p blipless-ingress -p blipless-device -p blipless-ctl --bins
	@scripts/run-local.sh

## deps: install the Debian packages the tests need (as root), or say how.
deps:
	@scripts/ensure-packages.sh $(TEST_PACKAGES)

## test: every unit, property and end-to-end test. The workspace build includes
## the tests crate, which turns on the daemons' fault-injection feature.
test: deps
	$(CARGO) build --workspace --bins
	@scripts/test.sh

## bench: throughput and latency figures into docs/BENCHMARKS.md (WireGuard
## beside wireguard-go too, as root); BENCH_ARGS=--quick for a short check.
bench: deps
	$(CARGO) build --release -p blipless-ingress -p blipless-device -p blipless-ctl --bins
	$(CARGO) build --release -p blipless-tests -p blipless-bench --bins
	@scripts/bench.sh $(BENCH_ARGS)

## lint: formatting and clippy with warnings as errors.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## fuzz: each cargo-fuzz target for FUZZ_SECONDS (stable toolchain via RUSTC_BOOTSTRAP).
fuzz:
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked
	cd fuzz && for target in channel socks5; do \
		RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run $$target -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

clean:
	$(CARGO) clean
	rm -rf .run
