# The cold-build tuning make test runs with: which flags every build and
# test shares, how many compiler threads, which tiers yield the CPU. Why each
# setting, with the measurements: docs/development.md ("Build tuning") and
# BENCHMARKS.md. Included by the Makefile; a go build or go test by hand keeps
# Go's defaults.
# -count=1: several tests build and run the real binaries, which Go's test
# cache cannot see, so a cached pass could hide a broken binary.
# -trimpath everywhere: without it the module's packages compile again in
# every new clone (their directory is part of Go's cache key), which is
# what CI checks out.
# -vet=off: every package a go test here runs is vetted in full by
# vet-race, vet-kubevirt or vet-helm (all under lint); go test's own subset
# of vet is another configuration and, cold, about 150 CPU-seconds more.
GOTEST_FLAGS ?= -race -trimpath -vet=off -count=1 -timeout 40m
# No DWARF in what make compiles and links: nothing here runs a debugger
# (stack traces and race reports come from the runtime's own tables), the
# shipped binaries are stripped anyway, and a cold compile takes about 10%
# less CPU, its cache a fifth less disk (BENCHMARKS.md). Exported, so the
# builds the tests and scripts run (test/lib/gobuild, the real-kernel guest,
# test/builds/kubernetes/build.sh, ...) compile the same packages as make's own. A go
# build or go test by hand keeps Go's default and its own cache entries.
export GOFLAGS := $(strip $(GOFLAGS) -gcflags=all=-dwarf=false -ldflags=-w)
# The shipped binaries' configuration (hack/shipbuild checks it), for the
# tests that run without -race: they reuse the packages compiled for the
# binaries the tests build and run, so a cold Go cache compiles the module's
# dependency tree twice (this and -race), not once per set of flags.
SHIPPED_ENV := CGO_ENABLED=0
SHIPPED_GOFLAGS := -trimpath -tags grpcnotrace
# The gates' builds and vets run one compiler thread per core (GOMAXPROCS=1,
# -p = cores): about 10% less CPU than Go's default on a machine whose cores
# all run compiles (test/builds/kubernetes/build.sh says why). Not for go test: its test
# binaries would inherit GOMAXPROCS.
ONE_THREAD := GOMAXPROCS=1
CORES := -p $(shell nproc)
# CPU priority of the Go-only tiers under `make test` (see test:); empty alone.
NICE_UNIT ?=
NICE_BUILD ?=

