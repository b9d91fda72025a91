# xvs — the README's commands: `make demo` (the main job) and `make test`.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

# Where cargo puts what it builds: `CARGO_TARGET_DIR`, `build.target-dir` of a
# cargo config, or ./target; cargo itself says which.
TARGET_DIR := $(shell $(CARGO) metadata --format-version 1 --no-deps 2>/dev/null | \
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
ifeq ($(TARGET_DIR),)
TARGET_DIR := $(CURDIR)/target
endif
RELEASE := $(TARGET_DIR)/release

# Privileged tests (netns, AF_XDP) must not skip silently when they can run.
ifeq ($(shell id -u),0)
export XVS_REQUIRE_PRIVILEGED := 1
endif

.PHONY: all deps build deb test lint unit upgrade-build layout-upgrade-test leak-baseline leak-check vm-test vm-bench fuzz-build fuzz bench e2e-bench vm-image demo clean

all: build

## deps: install the Debian packages the build and tests need (only missing ones)
deps:
	@bash scripts/deps.sh

## build: debug build of the whole workspace
build: deps
	$(CARGO) build --workspace --all-targets

## test: formatting, clippy, the docs, every test, and the fuzz targets build
test: deps leak-baseline lint fuzz-build unit vm-test leak-check

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps

# A second build of `xvs` and `xvsadm` (the `second-build` feature only
# changes `xvs --version`) for the upgrade test: built, copied aside, and
# the first build relinked from the cache.
UPGRADE_DIR := $(TARGET_DIR)/upgrade
upgrade-build:
	$(CARGO) build -p xvs-control --bins --features second-build
	@mkdir -p $(UPGRADE_DIR) && cp $(TARGET_DIR)/debug/xvs $(TARGET_DIR)/debug/xvsadm $(UPGRADE_DIR)/
	$(CARGO) build -p xvs-control --bins

unit: upgrade-build
	XVS_UPGRADE_DIR=$(UPGRADE_DIR) $(CARGO) test --workspace

## layout-upgrade-test: live flows (200 streams; wrk to nginx) through the
## last build of the state file's previous layout (bb5d48b, layout 2), then
## this build on its file (rewritten in this layout); needs the
## repository's history, so it is not part of `make test`.
LAYOUT_FROM := bb5d48b
LAYOUT_DIR := $(TARGET_DIR)/layout-from
layout-upgrade-test: deps
	$(CARGO) build --workspace --bins
	rm -rf $(LAYOUT_DIR)/src && git worktree prune
	git worktree add --detach $(LAYOUT_DIR)/src $(LAYOUT_FROM)
	cd $(LAYOUT_DIR)/src && CARGO_TARGET_DIR=$(LAYOUT_DIR)/target $(CARGO) build -p xvs-control --bins
	XVS_UPGRADE_FROM=$(LAYOUT_DIR)/target/debug $(CARGO) test -p xvs-vm-tests --test restart \
	  --test real_clients upgrade_from_the_layout_before -- --nocapture; rc=$$?; \
	  git worktree remove --force $(LAYOUT_DIR)/src; exit $$rc

# Nothing a test created may outlive the suite: namespaces are named xvst-*,
# flow state mounts xvs-flows, and the tests' folders (daemons' configs,
# sockets and state) are /tmp/xvs-*.
# What was there before the suite began (a run killed before its cleanup,
# say) is recorded by leak-baseline, named, and not held against this run.
LEAK_BASELINE := $(TARGET_DIR)/leak-baseline
LEAK_LIST := { ip netns list 2>/dev/null | awk '/^xvst-/ {print "netns " $$1}'; \
  awk '$$5 ~ "^/tmp/" && / - tmpfs xvs-flows / {print "mount " $$5}' /proc/self/mountinfo; \
  find /tmp -maxdepth 1 -name 'xvs-*' -printf 'folder %p\n' 2>/dev/null; }
leak-baseline:
	@mkdir -p $(TARGET_DIR) && $(LEAK_LIST) > $(LEAK_BASELINE)
	@if [ -s $(LEAK_BASELINE) ]; then echo "there before the tests began (not theirs):" $$(cat $(LEAK_BASELINE)) >&2; fi
leak-check:
	@base=$(LEAK_BASELINE); [ -f "$$base" ] || base=/dev/null; \
	left=$$($(LEAK_LIST) | grep -vxF -f "$$base" || true); \
	if [ -n "$$left" ]; then echo "left behind by the tests:" $$left >&2; exit 1; fi

## vm-test: the two-VM recipe end to end (as root): builds the Debian image
## if missing (cached in vm-tests/vm/out/), boots both VMs under KVM or, where
## KVM cannot run a standard guest, TCG, and checks the generator's runs and
## a TCP check through xvs in the guest (vm-tests/vm/README.md)
vm-test: deps
	$(CARGO) build -p xvs-control -p xvs-benches -p xvs-vm-tests --bins
	XVS_BIN_DIR=$(TARGET_DIR)/debug bash vm-tests/vm/check.sh

# The fuzz crates live outside the workspace; building them on stable proves
# they compile (cargo-fuzz adds the sanitizer flags when fuzzing for real).
FUZZ_CRATES := config/fuzz dataplane/fuzz
fuzz-build:
	@for c in $(FUZZ_CRATES); do \
	  echo "building fuzz targets in $$c"; \
	  $(CARGO) build --manifest-path $$c/Cargo.toml --target-dir $(TARGET_DIR)/fuzz || exit 1; \
	done

## fuzz: run each fuzz target for FUZZ_SECONDS (needs nightly and cargo-fuzz)
FUZZ_SECONDS ?= 60
fuzz:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	cd config && $(CARGO) +nightly fuzz run parse_config -- -max_total_time=$(FUZZ_SECONDS)
	cd config && $(CARGO) +nightly fuzz run api_bodies -- -max_total_time=$(FUZZ_SECONDS)
	cd dataplane && $(CARGO) +nightly fuzz run classify_rewrite -- -max_total_time=$(FUZZ_SECONDS)
	cd dataplane && $(CARGO) +nightly fuzz run sync_parse -- -max_total_time=$(FUZZ_SECONDS)

## bench: criterion micro-benchmarks (release profile), then the end-to-end
## comparison with kube-proxy's iptables and nftables modes (as root);
## table on stdout, JSON and SVG chart in target/
BENCH_ARGS ?=
bench: deps
	$(CARGO) bench -p xvs-benches --bench '*' -- --warm-up-time 1
	$(MAKE) e2e-bench

e2e-bench: deps
	$(CARGO) build --release -p xvs-control -p xvs-benches -p xvs-vm-tests --bins
	$(RELEASE)/xvs-bench --chart $(TARGET_DIR)/xvs-bench.svg --json $(TARGET_DIR)/xvs-bench.json \
	  --criterion $(TARGET_DIR)/criterion $(BENCH_ARGS)
	$(RELEASE)/xvs-control-bench
	$(RELEASE)/xvs-dsr-bench

## vm-image: the two-VM recipe's Debian image (vm-tests/vm/README.md; as root)
vm-image: deps
	bash vm-tests/vm/build-image.sh

## vm-bench: the two-VM benchmark with the release build, VM_SECONDS per run
## and VM_QUEUES queues (figures mean something only under KVM)
VM_SECONDS ?= 10
VM_QUEUES ?= 2
vm-bench: vm-image
	$(CARGO) build --release -p xvs-control -p xvs-benches -p xvs-vm-tests --bins
	XVS_BIN_DIR=$(RELEASE) bash vm-tests/vm/run-bench.sh $(VM_SECONDS) $(VM_QUEUES)

## deb: the Debian package (release build) in $(TARGET_DIR)/deb
deb: deps
	$(CARGO) build --release -p xvs-control --bins
	bash packaging/deb/build.sh $(RELEASE) $(TARGET_DIR)/deb

## demo: the main job on a built-in network-namespace topology (as root)
demo: deps
	$(CARGO) build --release -p xvs-control -p xvs-vm-tests --bins
	$(RELEASE)/xvs-demo

clean:
	$(CARGO) clean
