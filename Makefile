# tine: `make demo` runs the main job, `make test` runs the tests.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec

GO ?= go
FUZZTIME ?= 10s
TEST_TIMEOUT ?= 45m

# Debian packages the tests, the demo and the benchmarks use.
DEBS := fuse3 restic casync fuse-overlayfs btrfs-progs qemu-system-x86 \
	busybox-static cpio kmod zstd xz-utils git gcc iproute2

.PHONY: all build deps demo test vet fuzz unit bench bench-chunkstore bench-cowfs bench-vmm

all: build

build:
	$(GO) build ./...

# deps installs the Debian packages that are missing (idempotent, quick when
# nothing is missing) and downloads Go modules.
deps:
	@missing=""; for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	$(GO) mod download

demo: deps
	$(GO) run ./cmd/tine demo

vet:
	$(GO) vet ./...

# fuzz runs every fuzz target in the tree for FUZZTIME each.
fuzz:
	@for pkg in $$($(GO) list ./...); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
			echo "fuzz $$pkg $$f ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done

# unit runs every test once and closes with "N passed, N failed, N skipped",
# listing each skipped test with its reason.
unit:
	$(GO) test -json -count=1 -timeout $(TEST_TIMEOUT) ./... | $(GO) run ./internal/testsum

test: deps vet fuzz unit

bench: bench-chunkstore bench-cowfs bench-vmm

bench-chunkstore: deps
	$(GO) run ./bench/chunkstore

bench-cowfs: deps
	$(GO) run ./bench/cowfs

bench-vmm: deps
	$(GO) run ./bench/vmm
