# tine: `make demo` runs the main job, `make test` runs the tests.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec

GO ?= go
FUZZTIME ?= 10s
TEST_TIMEOUT ?= 30m

# Debian packages the tests, the demo and the benchmarks use.
DEBS := fuse3 restic casync fuse-overlayfs btrfs-progs qemu-system-x86 \
	busybox-static cpio kmod zstd xz-utils lz4 git gcc iproute2 bubblewrap \
	nftables util-linux curl chromium chromium-driver nodejs acl

.PHONY: all build binaries deps demo test test-full fuse-uring vet fuzz unit unit-full bench bench-chunkstore bench-cowfs bench-vmm bench-sandbox bench-staleness bench-report bench-quick kernels nested-test

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
	# The MCP tests drive tine mcp with the TypeScript SDK's client. Debian
	# packages npm apart from nodejs; other nodejs builds carry their own.
	command -v npm >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
	npm ci --prefix mcp/testdata/node --no-audit --no-fund --silent

# binaries builds tine and the guest agent, static (CGO off), into bin/.
binaries:
	CGO_ENABLED=0 $(GO) build -o bin/tine ./cmd/tine
	CGO_ENABLED=0 $(GO) build -o bin/tine-agent ./cmd/tine-agent

demo: deps binaries
	TINE=$(CURDIR)/bin/tine demo/run.sh

vet:
	$(GO) vet ./...

# fuzz runs every fuzz target in the tree for FUZZTIME each. A target that
# fails without writing a failing input under testdata/fuzz is run again,
# up to three runs in all: Go 1.26's fuzz coordinator can report its own
# -fuzztime deadline as a failure (go.dev/issue/75804, fixed in Go 1.27),
# more often on a loaded machine. A failing input always fails the run.
fuzz:
	@for pkg in $$($(GO) list ./...); do \
		dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
			for try in 1 2 3; do \
				echo "fuzz $$pkg $$f ($(FUZZTIME), run $$try)"; \
				before=$$( (ls "$$dir/testdata/fuzz/$$f" 2>/dev/null || true) | wc -l); \
				if $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; then break; fi; \
				after=$$( (ls "$$dir/testdata/fuzz/$$f" 2>/dev/null || true) | wc -l); \
				if [ "$$after" != "$$before" ]; then echo "fuzz $$f: failing input written to $$dir/testdata/fuzz/$$f"; exit 1; fi; \
				if [ $$try = 3 ]; then echo "fuzz $$f: failed three times without a failing input"; exit 1; fi; \
				echo "fuzz $$f: failed without a failing input (the fuzz coordinator's deadline race); running it again"; \
			done; \
		done; \
	done

# unit runs every test once, the nested real-KVM ones included, and closes
# with "N passed, N failed, N skipped", listing each skipped test with its
# reason. Long suites (crash kill points, hostile-file sizes) run their
# -short subset here; unit-full runs them whole. A failed test is run once
# more alone; one that then passes is listed as flaky with its first
# output (docs/testing.md), one that fails again fails the run.
# testsum, not go test's exit status, decides (it fails a run in which a
# package failed to build, or no package reported at all).
UNIT_FLAGS := -short -json -count=1 -timeout $(TEST_TIMEOUT)
unit: kernels
	export TINE_NESTED=1; ($(GO) test $(UNIT_FLAGS) ./... || true) | $(GO) run ./internal/testsum -- $(GO) test $(UNIT_FLAGS)

unit-full: kernels
	export TINE_NESTED=1; ($(GO) test -json -count=1 -timeout 3h ./... || true) | $(GO) run ./internal/testsum -- $(GO) test -json -count=1 -timeout 3h

test: deps kernels fuse-uring vet fuzz unit bench-quick

# test-full is test with every long suite run whole (hours, not minutes).
test-full: deps kernels fuse-uring vet fuzz unit-full

# fuse-uring makes the kernel offer FUSE over io_uring to new mounts, as
# tine serve does (ADR 0181), so that the tests run the mounts the way the
# daemon serves them; a kernel without it (before 6.14) is left as it is.
URING_PARAM := /sys/module/fuse/parameters/enable_uring
fuse-uring:
	@if [ -w $(URING_PARAM) ]; then echo Y > $(URING_PARAM); echo "fuse: io_uring offered to new mounts"; \
	else echo "fuse: no io_uring offer here ($(URING_PARAM) is not writable); mounts use /dev/fuse"; fi

# bench runs every benchmark beside its peers, keeps each one's output in
# BENCH_OUT and writes docs/bench/REPORT.md with its plots from them.
BENCH_OUT ?= /var/tmp/tine-bench
bench: bench-chunkstore bench-cowfs bench-vmm bench-sandbox bench-staleness
	$(MAKE) bench-report

bench-chunkstore: deps
	mkdir -p $(BENCH_OUT)
	$(GO) run ./bench/chunkstore | tee $(BENCH_OUT)/chunkstore.txt

bench-cowfs: deps
	mkdir -p $(BENCH_OUT)
	$(GO) run ./bench/cowfs --save $(BENCH_OUT)/cowfs.json | tee $(BENCH_OUT)/cowfs.txt

# The VM benchmarks need /dev/kvm; without it the report says so.
bench-vmm: deps
	mkdir -p $(BENCH_OUT)
	@if [ -e /dev/kvm ]; then $(GO) run ./bench/vmm --save $(BENCH_OUT)/vmm.json | tee $(BENCH_OUT)/vmm.txt; \
	else echo "bench/vmm: not run: this machine has no /dev/kvm" | tee $(BENCH_OUT)/vmm.txt; fi

bench-sandbox: deps
	mkdir -p $(BENCH_OUT)
	$(GO) run ./bench/sandbox --md $(BENCH_OUT)/sandbox.md --save $(BENCH_OUT)/sandbox.json

bench-report:
	$(GO) run ./bench/report --cowfs $(BENCH_OUT)/cowfs.json --out docs/bench \
		$$([ -e $(BENCH_OUT)/sandbox.json ] && echo "--sandbox $(BENCH_OUT)/sandbox.json") \
		$$([ -e $(BENCH_OUT)/vmm.json ] && echo "--vmm $(BENCH_OUT)/vmm.json") \
		$$(for f in chunkstore.txt vmm.txt sandbox.md; do [ -e $(BENCH_OUT)/$$f ] && echo "--text $${f%.*}=$(BENCH_OUT)/$$f"; done)

# bench-quick checks that every benchmark runs and produces numbers, not
# that they are fast: the cowfs benchmark in its tiny mode (every section,
# every peer), the chunkstore benchmark on a small tree, the VM benchmark
# where /dev/kvm exists, and a report drawn from those results into a
# scratch directory. Under two minutes on an idle 2-core machine.
QUICK_OUT ?= /var/tmp/tine-bench-quick
bench-quick:
	rm -rf $(QUICK_OUT) && mkdir -p $(QUICK_OUT)
	$(GO) run ./bench/cowfs --tiny --save $(QUICK_OUT)/cowfs.json > $(QUICK_OUT)/cowfs.txt
	$(GO) run ./bench/chunkstore --quick --tools tine --random-mib 8 --src $$($(GO) env GOROOT)/src/bufio \
		--work $(QUICK_OUT)/chunkstore-work > $(QUICK_OUT)/chunkstore.txt
	@if [ -e /dev/kvm ]; then $(GO) run ./bench/vmm --quick --forks 10 --save $(QUICK_OUT)/vmm.json > $(QUICK_OUT)/vmm.txt; \
	else echo "bench/vmm: not run: this machine has no /dev/kvm" > $(QUICK_OUT)/vmm.txt; fi
	$(GO) run ./bench/sandbox --quick --dir $(QUICK_OUT) --save $(QUICK_OUT)/sandbox.json > $(QUICK_OUT)/sandbox.txt
	$(GO) run ./bench/report --check --cowfs $(QUICK_OUT)/cowfs.json --out $(QUICK_OUT)/report --sandbox $(QUICK_OUT)/sandbox.json \
		$$([ -e $(QUICK_OUT)/vmm.json ] && echo "--vmm $(QUICK_OUT)/vmm.json") \
		--text chunkstore=$(QUICK_OUT)/chunkstore.txt --text vmm=$(QUICK_OUT)/vmm.txt
	@grep -Eq '[0-9]' $(QUICK_OUT)/chunkstore.txt || { echo "bench-quick: chunkstore printed no numbers"; exit 1; }

bench-staleness: deps
	$(GO) run ./bench/staleness

# kernels fetches Debian's cloud kernel into $(KERNEL_DIR) (idempotent): the
# bzImage (vmlinuz), an uncompressed vmlinux cut out of it for PVH boots, its
# config and System.map, and the decompressed modules in KERNEL_MODULES. The concrete package is the one the linux-image-cloud-amd64
# metapackage depends on.
KERNEL_DIR ?= testdata/cache/kernel
# KERNEL_MODULES: kvm and tun for the nested harness's L1; the virtio
# transport and devices (ADR 0170), the network driver with the two
# modules it needs (ADR 0174), and fuse and virtiofs for the project share
# (ADR 0176) for vm-runtime guests, loaded from their initramfs.
KERNEL_MODULES := irqbypass kvm kvm-amd tun virtio virtio_ring virtio_mmio vsock \
	vmw_vsock_virtio_transport_common vmw_vsock_virtio_transport virtio_blk virtio_console virtio-rng \
	failover net_failover virtio_net fuse virtiofs
KERNEL_STAMP := modules-4
kernels: deps
	@pkg=$$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-[0-9]/ {print $$2; exit}'); \
	if [ -z "$$pkg" ]; then echo "kernels: linux-image-cloud-amd64 has no concrete kernel dependency" >&2; exit 1; fi; \
	if [ "$$(cat $(KERNEL_DIR)/PACKAGE 2>/dev/null)" = "$$pkg $(KERNEL_STAMP)" ]; then exit 0; fi; \
	echo "kernels: fetching $$pkg into $(KERNEL_DIR)"; \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	(cd "$$tmp" && apt-get download -q "$$pkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true); \
	dpkg -x "$$tmp"/$$pkg_*.deb "$$tmp/x"; \
	rm -rf $(KERNEL_DIR); mkdir -p $(KERNEL_DIR); \
	cp "$$tmp"/x/boot/vmlinuz-* $(KERNEL_DIR)/vmlinuz; \
	cp "$$tmp"/x/boot/config-* $(KERNEL_DIR)/config; \
	cp "$$tmp"/x/boot/System.map-* $(KERNEL_DIR)/System.map; \
	for m in $(KERNEL_MODULES); do \
		src=$$(find "$$tmp/x/lib/modules" -name "$$m.ko" -o -name "$$m.ko.xz" -o -name "$$m.ko.zst" -o -name "$$m.ko.gz" | sort | sed -n 1p); \
		if [ -z "$$src" ]; then echo "kernels: module $$m not found in $$pkg" >&2; exit 1; fi; \
		case "$$src" in \
			*.xz) xz -dc "$$src" ;; *.zst) zstd -qdc "$$src" ;; *.gz) gzip -dc "$$src" ;; *) cat "$$src" ;; \
		esac > $(KERNEL_DIR)/$$m.ko; \
	done; \
	k=$(KERNEL_DIR)/vmlinuz; \
	sects=$$(od -An -tu1 -j 497 -N1 "$$k" | tr -d ' '); \
	set -- $$(od -An -tu4 -j 584 -N8 "$$k"); poff=$$1; plen=$$2; \
	start=$$(( (sects + 1) * 512 + poff )); \
	magic=$$(od -An -tx1 -j $$start -N4 "$$k" | tr -d ' '); \
	case "$$magic" in \
		02214c18) dec="lz4 -dc" ;; 1f8b*) dec="gzip -dc" ;; fd377a58) dec="xz -dc --single-stream" ;; \
		28b52ffd) dec="zstd -qdc" ;; *) echo "kernels: unknown payload magic $$magic in $$k" >&2; exit 1 ;; \
	esac; \
	dd if="$$k" iflag=skip_bytes,count_bytes skip=$$start count=$$((plen - 4)) status=none | $$dec > $(KERNEL_DIR)/vmlinux; \
	if [ "$$(od -An -tx1 -N4 $(KERNEL_DIR)/vmlinux | tr -d ' ')" != 7f454c46 ]; then echo "kernels: extracted vmlinux is not ELF" >&2; exit 1; fi; \
	echo "$$pkg $(KERNEL_STAMP)" > $(KERNEL_DIR)/PACKAGE; \
	ls -l $(KERNEL_DIR)

# nested-test runs the tests that need real hardware virtualization inside
# QEMU with an emulated SVM CPU (see docs/nested.md). Packages with such
# tests add themselves to NESTED_PKGS.
NESTED_PKGS ?= ./vmm/nested
nested-test: deps kernels
	TINE_NESTED=1 $(GO) test -count=1 -v -timeout 15m $(NESTED_PKGS)
