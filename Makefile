# blipless: `make run` starts a local node, `make test` runs every test.
CARGO ?= cargo
FUZZ_SECONDS ?= 60
SOAK_SECONDS ?= 600
# Debian packages the tests drive (package:command); make run needs only curl.
TEST_PACKAGES = curl:curl redis-server:redis-server dante-server:danted wireguard-go:wireguard-go wireguard-tools:wg iperf3:iperf3 nftables:nft iputils-ping:ping openssl:openssl systemd:systemd-analyze python3-jsonschema:jsonschema systemd-container:systemd-nspawn zbar-tools:zbarimg dnsmasq-base:dnsmasq bind9-dnsutils:dig python3-socks:/usr/lib/python3/dist-packages/socks.py python3-dnspython:/usr/lib/python3/dist-packages/dns/message.py
RUN_PACKAGES = curl:curl
# make bench's peers beside blipless (bench/src/scenarios/peers/); dante-server is in TEST_PACKAGES.
# On a host with systemd, installing nginx, haproxy or tinyproxy starts its service too (the bench
# starts its own, in the foreground, on free ports): stop or disable those if unwanted.
BENCH_PACKAGES = microsocks:microsocks tinyproxy:tinyproxy haproxy:haproxy nginx:nginx libnginx-mod-stream:/usr/lib/nginx/modules/ngx_stream_module.so
# make deb and its test (tests/tests/deb.rs) use this cargo-deb.
CARGO_DEB_VERSION = 3.8.0
# make lint's cargo deny.
CARGO_DENY_VERSION = 0.20.2

.PHONY: all build run test deps bench soak lint fuzz deb clean

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
	@$(CARGO) deb --version >/dev/null 2>&1 || $(CARGO) install cargo-deb --version $(CARGO_DEB_VERSION) --locked
	$(CARGO) build --workspace --bins
	@scripts/test.sh

## deb: target/debian/blipless_<version>-1_<arch>.deb (cargo-deb, installed when
## missing): binaries, units, man pages, completions (docs/INSTALL.md).
deb:
	@scripts/deb.sh

## bench: throughput and latency figures into docs/BENCHMARKS.md (WireGuard
## beside wireguard-go too, as root); BENCH_ARGS=--quick for a short check.
bench: deps
	@scripts/ensure-packages.sh $(BENCH_PACKAGES)
	$(CARGO) build --release -p blipless-ingress -p blipless-device -p blipless-ctl --bins
	$(CARGO) build --release -p blipless-tests -p blipless-bench --bins
	@scripts/bench.sh $(BENCH_ARGS)

## soak: the chaos soak (not part of `make test`): SOAK_SECONDS (600) of mixed load
## through random deploys, handoffs and SIGKILLs (WireGuard too, as root), checked;
## figures into docs/RELIABILITY.md; SOAK_ARGS for e.g. --seed N or --quick.
soak: deps
	$(CARGO) build --release -p blipless-ingress -p blipless-device -p blipless-ctl --bins
	$(CARGO) build --release -p blipless-tests -p blipless-bench --bins
	BLIPLESS_PROFILE=release BLIPLESS_TEST_LOG=info "$${CARGO_TARGET_DIR:-target}/release/blipless-soak" --seconds $(SOAK_SECONDS) $(SOAK_ARGS)

## lint: formatting, clippy with warnings as errors, and cargo deny (licenses,
## duplicate versions reported, sources; deny.toml says why not advisories); the
## fuzz targets type-check, so a changed message shape cannot wait for make fuzz.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	cd fuzz && $(CARGO) check --features ingress --bins
	@$(CARGO) deny --version >/dev/null 2>&1 || $(CARGO) install cargo-deny --version $(CARGO_DENY_VERSION) --locked
	$(CARGO) fetch --locked >/dev/null
	$(CARGO) deny --offline check licenses bans sources

## fuzz: each cargo-fuzz target for FUZZ_SECONDS (stable toolchain via RUSTC_BOOTSTRAP);
## FUZZ_TARGETS=... runs some of them. A crash stops it non-zero (fuzz/README.md).
## Feature `ingress` is what wg_datagram needs (it links the ingress crate).
FUZZ_TARGETS ?= channel channel_typed channel_encode socks5 socks5_client control wg_datagram config http_target wg_quick store_url wg_uapi client_limits inner_udp proxy_auth socks5_udp offload numeric_host
fuzz:
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked
	cd fuzz && for target in $(FUZZ_TARGETS); do \
		echo "fuzz: $$target for $(FUZZ_SECONDS) s"; \
		RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run --features ingress $$target -- \
			-max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 || exit 1; \
	done

clean:
	$(CARGO) clean
	rm -rf .run
