# vfnet — see README.md. `make test` runs every test; `make demo` shows the
# whole flow on a simulated node against a real Kubernetes control plane.
SHELL := /usr/bin/env bash
GO ?= go
# VFNET_CACHE from the environment (the scripts' own variable) is honoured too.
CACHE ?= $(or $(VFNET_CACHE),$(CURDIR)/.cache)
export VFNET_CACHE := $(CACHE)
include hack/tuning.mk

# Each tier ends with one line of its wall and CPU time (its children's too),
# so a slow CI run shows which tier took the machine.
TIMED = TIMEFORMAT='== $@: %0R s wall, %0U s user + %0S s sys CPU'; time
.PHONY: help all build test check-root testreport test-unit vet-race vet-kubevirt vet-helm build-shipped test-kubevirt test-helm helm-bin test-kernel kernel-deps virt-deps test-kubevirt-guest test-node node-bin lint deps k8s-bin demo generate verify-generate images bench bench-scale bench-peers bench-binding clean

# make alone lists the targets: each target's line ends with ## and what it does.
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z0-9-]*:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

all: build ## same as build

build: ## bin/vfnet-driver and bin/vfnet-binding (what ships), bin/vfnet-driver-sim and bin/vfnet-demo (tests, demos)
	$(GO) build -trimpath -tags grpcnotrace -o bin/ ./cmd/... ./test/cmd/...

deps: ## install the Debian packages the tiers use (root)
	@hack/install-deps.sh

# The control-plane binaries (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager, kubectl) built once into $(CACHE)/k8s-bin.
k8s-bin: ## build the control plane and kubelet into .cache/k8s-bin (about 10 min cold)
	@test/builds/kubernetes/build.sh >/dev/null

# Each build configuration is compiled by one target, which the tiers that
# share it wait for: Go's cache does not stop processes that start together
# from compiling the same packages each, and on a cold cache the race build
# compiled up to three times at once (unit, the real node, vet) and
# KubeVirt's tree four times. Warm, these take seconds. go vet compiles
# everything the packages' tests import too, then vets.
# The race build: unit and the real node (`go test -race`).
# Not niced: unit and the real node wait for it.
vet-race: ## go vet the module as its -race tests build it
	$(TIMED) $(ONE_THREAD) $(GO) vet $(CORES) -race -trimpath ./...

# test/kubevirt (KubeVirt v1.9.0 and Kubernetes 0.34: its own tree), built
# as its tests, the real-kernel tier's launcher and the real node's
# generators build it (static, -trimpath).
vet-kubevirt: ## go vet test/kubevirt (KubeVirt v1.9.0 tree)
	$(TIMED) ( cd test/kubevirt && CGO_ENABLED=0 GONOSUMDB=libvirt.org/go/libvirt $(ONE_THREAD) $(GO) vet $(CORES) -trimpath ./... )

# test/helm: its tests and the Helm CLI.
vet-helm: ## go vet test/helm (Helm v4 SDK)
	$(TIMED) ( cd test/helm && $(SHIPPED_ENV) $(ONE_THREAD) $(NICE_BUILD) $(GO) vet $(CORES) $(SHIPPED_GOFLAGS) ./... )

# The shipped configuration: the guest's binaries, the images, every binary
# the tests build (test/lib/gobuild), the tests that run without -race.
build-shipped: ## build every package as the shipped binaries are built
	$(TIMED) $(SHIPPED_ENV) $(ONE_THREAD) $(GO) build $(CORES) $(SHIPPED_GOFLAGS) ./...

lint: vet-race vet-kubevirt vet-helm ## gofmt and all three vets
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# Every tier's go test -json goes through hack/testreport: the readable
# output, a line with how many tests ran and skipped, and a failure for a
# skip, for a tier that ran no test, or for a -want test that did not run
# (a renamed test matches no -run pattern and would pass).
REPORT := $(CACHE)/bin/testreport
testreport: ## build hack/testreport, which every tier reports through
	@$(GO) build -o $(REPORT) ./hack/testreport

# Not run by unit: the tests of other tiers (each of those tiers requires
# its own with -want), the crash test (below) and the children that tests
# re-execute (*ChildProcess). test/kernel/guest runs only inside the
# real-kernel guest.
UNIT_ELSEWHERE := ^(TestRealKernel|TestRealNode|TestIdleMemoryVsExampleDriver|TestCrashAtEveryStep)$$|ChildProcess$$|^TestKVNode
# The crash test's children are other processes, where -race sees nothing
# and costs ~20x: it runs here without -race.
test-unit: vet-race build-shipped kernel-deps testreport ## go test -race of the module (e2e on a real control plane included)
	$(TIMED) ( set -o pipefail; export VFNET_K8S_BIN=$$(test/builds/kubernetes/build.sh) \
	  && $(NICE_UNIT) $(GO) test -json $(GOTEST_FLAGS) -skip '$(UNIT_ELSEWHERE)' $$($(GO) list ./... | grep -v '/test/kernel/guest$$') \
	  | $(REPORT) -tier test-unit \
	  && $(SHIPPED_ENV) $(NICE_UNIT) $(GO) test -json $(filter-out -race -trimpath,$(GOTEST_FLAGS)) $(SHIPPED_GOFLAGS) -run '^TestCrashAtEveryStep$$' ./test/prepare \
	  | $(REPORT) -tier test-unit-crash -want TestCrashAtEveryStep )

# The real-kernel tier (test/kernel): a Debian kernel under QEMU with emulated
# igb SR-IOV NICs behind an emulated IOMMU. VFNET_KERNEL_CASES=a,b runs a subset.
kernel-deps: ## Debian kernel and QEMU for the real-kernel tier, into .cache/kernel
	@hack/kernel-deps.sh

# libvirt 11.3 for the vm case and test/kubevirt's compat test ($(CACHE)/virt).
virt-deps: ## libvirt 11.x for the vm case and test-kubevirt, into .cache/virt
	@hack/virt-deps.sh

# The netns case runs the real driver against a control plane on the host.
test-kernel: kernel-deps virt-deps k8s-bin build-shipped vet-kubevirt testreport ## real-kernel tier: a Debian kernel in QEMU with emulated SR-IOV (VFNET_KERNEL_CASES=a,b)
	$(TIMED) ( set -o pipefail; VFNET_K8S_BIN=$$(test/builds/kubernetes/build.sh) VFNET_REAL_KERNEL=1 $(SHIPPED_ENV) $(GO) test -json $(SHIPPED_GOFLAGS) -vet=off -count=1 -timeout 60m -run '^TestRealKernel$$' ./test/kernel/ \
	  | $(REPORT) -tier test-kernel -v -want TestRealKernel )

# Built as the real-node tier builds its KubeVirt stand-ins (static, -trimpath;
# only the standard library's net and os/user have cgo code here), so the
# module's large dependency tree compiles once for both.
# Its compat test runs KubeVirt's define steps against the real libvirtd
# and QEMU that the real-kernel tier's vm case runs in its guest.
test-kubevirt: kernel-deps virt-deps vet-kubevirt build-shipped testreport ## KubeVirt v1.9.0 compatibility module against real libvirtd and QEMU (root)
	$(TIMED) ( set -o pipefail; cd test/kubevirt && CGO_ENABLED=0 GONOSUMDB=libvirt.org/go/libvirt VFNET_REQUIRE_LIBVIRT=1 $(NICE_BUILD) $(GO) test -json -trimpath -vet=off -count=1 -timeout 30m ./... \
	  | $(REPORT) -tier test-kubevirt )

# The Helm chart (deployments/helm/vfnet), in its own module (test/helm, the
# Helm v4 SDK and kustomize's API from the Go module proxy): renders the
# same objects as `kubectl kustomize manifests/`, its metrics values the
# same as manifests/components, the real-node tier's values the same as its
# overlay; `helm lint --strict` passes. Built as helm-bin builds the CLI
# (test/helm/build.sh), the product's configuration: the SDK compiles once.
test-helm: vet-helm testreport ## the Helm chart renders what manifests/ does; helm lint --strict
	$(TIMED) ( set -o pipefail; cd test/helm && $(SHIPPED_ENV) $(NICE_BUILD) $(GO) test -json $(SHIPPED_GOFLAGS) -vet=off -count=1 -timeout 10m ./... \
	  | $(REPORT) -tier test-helm )

# The Helm v4 CLI the real-node tier installs the chart with, built once
# into $(CACHE)/helm-bin.
helm-bin: vet-helm ## build the Helm v4 CLI into .cache/helm-bin
	@test/helm/build.sh >/dev/null

# containerd, its shim and ctr for the real-node tier, built once into
# $(CACHE)/node-bin (about 2 CPU-minutes the first time; BENCHMARKS.md: tiers-cold).
node-bin: ## build containerd, its shim and ctr into .cache/node-bin
	@test/builds/containerd/build.sh >/dev/null

# The real-node tier alone: a real kubelet and containerd in a private
# mount + network namespace, vfnet installed from manifests/ and then with
# the Helm chart (test/node).
test-node: deps k8s-bin vet-race build-shipped vet-kubevirt node-bin helm-bin testreport ## real-node tier: kubelet + containerd in private namespaces (root)
	$(TIMED) ( set -o pipefail; VFNET_REAL_NODE=1 VFNET_K8S_BIN=$$(test/builds/kubernetes/build.sh) VFNET_NODE_BIN=$$(test/builds/containerd/build.sh) \
	  VFNET_HELM_BIN=$$(test/helm/build.sh) \
	  $(GO) test -json $(GOTEST_FLAGS) -run '^TestRealNode$$' ./test/node/ | $(REPORT) -tier test-node -v -want TestRealNode )

# Issue 33 item 3: the real-node tier's cluster with the real-kernel
# tier's guest as a second node, where KubeVirt v1.9.0's own virt-handler
# and virt-launcher run the example VM on a real VF (test/node guest steps,
# test/kernel/guest's kubevirt case). First the node images alone
# (test/lib/kvnode: virt-handler and virt-launcher built with cgo, ~200
# CPU-s cold, with Debian's libvirt 11.3 and QEMU 10; the launcher image's
# libvirt runs node-labeller.sh in a private mount namespace). Not part of
# make test: about 25 minutes on an idle machine (BENCHMARKS.md,
# kubevirt-guest).
test-kubevirt-guest: deps kernel-deps virt-deps k8s-bin build-shipped vet-kubevirt node-bin helm-bin testreport ## KubeVirt's own virt-handler and virt-launcher run the example VM on a real VF in the real-kernel guest (root)
	$(TIMED) ( set -o pipefail; VFNET_KUBEVIRT_GUEST=1 $(SHIPPED_ENV) $(NICE_BUILD) $(GO) test -json $(SHIPPED_GOFLAGS) -vet=off -count=1 -timeout 30m -run '^TestKVNode' ./test/lib/kvnode/ \
	  | $(REPORT) -tier test-kubevirt-guest-images -v -want TestKVNodeBuildWritesArchives,TestKVNodeImagesCarryWhatPodsExec,TestKVNodeLauncherLibvirtRuns \
	  && VFNET_REAL_NODE=1 VFNET_NODE_GUEST=1 VFNET_K8S_BIN=$$(test/builds/kubernetes/build.sh) VFNET_NODE_BIN=$$(test/builds/containerd/build.sh) \
	  VFNET_HELM_BIN=$$(test/helm/build.sh) $(SHIPPED_ENV) \
	  $(GO) test -json $(SHIPPED_GOFLAGS) -vet=off -count=1 -timeout 100m -run '^TestRealNode$$' ./test/node/ | $(REPORT) -tier test-kubevirt-guest -v -want TestRealNode )

# The tiers mostly wait (control planes, QEMU, kubelet): run them side by side.
# --output-sync keeps each tier's output together in the log. The real-kernel
# tier is the longest path, and its TCG guest slows down many times over when
# its vCPU threads lose the CPU: it starts first (its packages, containerd and
# the guest build overlap), and the tiers that only build and run Go tests
# yield the CPU to it and to the real node (nice; they have no guest clock).
test: check-root deps k8s-bin ## every tier, side by side: what CI runs (root)
	$(MAKE) --no-print-directory -j4 --output-sync=target NICE_UNIT='nice -n 5' NICE_BUILD='nice -n 10' \
	  test-kernel test-node test-unit test-kubevirt test-helm lint verify-generate

# make test needs root, and says so before it starts rather than run part
# of it and stop: most tiers make namespaces, mounts or device nodes.
check-root: ## fail early, naming what needs root, when not root
	@if [ "$$(id -u)" != 0 ]; then \
	  echo "make test needs root (you are uid $$(id -u)); these parts need it:"; \
	  echo "  deps           apt-get installs the Debian packages the tiers use"; \
	  echo "  test-unit      network namespaces (driver/kernel/vflink), device nodes (test/lib/simhost), mount namespaces (test/node)"; \
	  echo "  test-node      a kubelet and containerd in private mount and network namespaces"; \
	  echo "  test-kubevirt  libvirtd and the binding as uid 107 in a private mount namespace (unshare, setpriv)"; \
	  echo "  test-kernel    a cold guest build unpacks Debian packages with the deps' private apt"; \
	  echo "run it as root (sudo make test), or a part alone: make test-helm lint verify-generate need none"; \
	  exit 1; \
	fi

demo: deps k8s-bin ## the flow, narrated, on a simulated node and a real control plane
	VFNET_K8S_BIN=$$(test/builds/kubernetes/build.sh) $(GO) run ./test/cmd/vfnet-demo

generate: ## regenerate the hooks protobuf code with pinned generators
	hack/generate.sh

# Fails when the committed protobuf code differs from what the pinned generators make.
verify-generate: ## fail when the committed protobuf code differs from a fresh generate
	$(TIMED) $(NICE_BUILD) hack/generate.sh --check

bench: bench-binding ## Go benchmarks, and bench-binding
	$(GO) test -run '^$$' -bench . -benchmem ./...

# vfnet-binding against KubeVirt v1.9.0's passt sidecar, three runs (both
# built as shipped: static, grpcnotrace; needs root for the passt sidecar's
# private mount namespace), then the in-process OnDefineDomain benchmark with
# CPU and allocation profiles for `go tool pprof` under $(CACHE)/profiles.
bench-binding: ## vfnet-binding against KubeVirt v1.9.0 passt sidecar, three runs
	cd test/kubevirt && for run in 1 2 3; do \
	  echo "== bindingbench run $$run"; \
	  GONOSUMDB=libvirt.org/go/libvirt $(GO) run ./cmd/bindingbench -cgo 0 -tags grpcnotrace || exit 1; \
	done
	mkdir -p $(CACHE)/profiles
	$(GO) test -run '^$$' -bench 'OnDefineDomain8VFsOverSocket$$' -benchmem -o $(CACHE)/profiles/sidecar-server.test \
	  -cpuprofile $(CACHE)/profiles/sidecar-cpu.pprof -memprofile $(CACHE)/profiles/sidecar-mem.pprof ./sidecar/server
	@echo "profiles: go tool pprof -top $(CACHE)/profiles/sidecar-server.test $(CACHE)/profiles/sidecar-cpu.pprof (or sidecar-mem.pprof)"

# Only the many-node benchmark (100 nodes x 256 VFs, 500 pods per phase, vfnet's
# claims and upstream scheduler_perf's DRA shape in the same run; a few minutes).
# BENCH_SCALE_ARGS passes -scale.* flags, e.g.
# BENCH_SCALE_ARGS=-scale.scheduler-feature-gates=SchedulerPreQueueingHints=true
BENCH_SCALE_ARGS ?=
bench-scale: k8s-bin ## 100 nodes x 256 VFs through the real scheduler, three runs
	VFNET_K8S_BIN=$$(test/builds/kubernetes/build.sh) $(GO) test -run '^$$' -bench ManyNodes -benchtime 1x -count 3 -timeout 90m \
	  ./test/scale -args $(BENCH_SCALE_ARGS)

# vfnet-driver's idle RSS next to kubernetes-sigs/dra-example-driver's kubelet
# plugin on one control plane, three runs; needs root (vfnet-driver runs as
# shipped, its PF netdevs in a network namespace of their own). The peer is
# built from PEER_SRC at PEER_COMMIT, the commit BENCHMARKS.md measured
# (test/peers fails on any other). Without PEER_SRC, PEER_GIT_DIR=<a git
# directory that has the commit> (a clone or mirror) makes it; else this
# fails saying how to provide it, before the control plane's cold build.
PEER_COMMIT := 31914ceacda29bbc55208ef75e68c0991e1c9568
PEER_SRC := $(or $(VFNET_PEER_SRC),$(CACHE)/peers/dra-example-driver/src)
PEER_GIT_DIR ?=
bench-peers: ## idle RSS against dra-example-driver at its pinned commit, three runs (root)
	@set -e; src='$(PEER_SRC)'; if [ ! -e "$$src" ]; then \
	  if [ -z '$(PEER_GIT_DIR)' ]; then \
	    echo "bench-peers: no dra-example-driver source in $$src; provide it at commit $(PEER_COMMIT):" >&2; \
	    echo "  git clone https://github.com/kubernetes-sigs/dra-example-driver $$src && git -C $$src checkout --detach $(PEER_COMMIT)" >&2; \
	    echo "or from a local git directory (a clone or mirror) that has the commit: make bench-peers PEER_GIT_DIR=<dir>" >&2; \
	    exit 1; \
	  fi; \
	  rm -rf "$$src.tmp"; mkdir -p "$$(dirname "$$src")"; \
	  git clone --quiet --no-checkout '$(PEER_GIT_DIR)' "$$src.tmp"; \
	  git -C "$$src.tmp" checkout --quiet --detach $(PEER_COMMIT); \
	  mv "$$src.tmp" "$$src"; echo "bench-peers: $$src at $(PEER_COMMIT), from $(PEER_GIT_DIR)"; \
	fi
	VFNET_BENCH_PEERS=1 VFNET_K8S_BIN=$$(test/builds/kubernetes/build.sh) $(GO) test -count=3 -v -timeout 40m \
	  -run '^TestIdleMemoryVsExampleDriver$$' ./test/peers

# With a Docker engine: the Dockerfile's targets. Without one: the same static
# builds packed as OCI archives by hack/ociimage (bin/images/vfnet-{driver,binding}.tar;
# `ctr -n k8s.io images import`, `docker load -i` or `skopeo copy oci-archive:` load them).
images: ## both images: Docker from the Dockerfile, else OCI archives in bin/images
	@if docker info >/dev/null 2>&1; then \
	  docker build --target driver -t vfnet-driver:dev . && \
	  docker build --target binding -t vfnet-binding:dev . ; \
	else \
	  echo "make images: no Docker engine reachable; writing OCI archives with hack/mkimages"; \
	  $(GO) run ./hack/mkimages -o bin/images; \
	fi

clean: ## remove bin/
	rm -rf bin
