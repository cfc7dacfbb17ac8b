# syntax=docker/dockerfile:1
# Two images from one build:
#   docker build --target driver  -t vfnet-driver .
#   docker build --target binding -t vfnet-binding .
# Both binaries are static (CGO_ENABLED=0): the images carry no libc.
# grpcnotrace drops grpc's x/net/trace (off by default anyway), which keeps
# text/template out and the binaries ~40% smaller (less RSS per VM pod).
# ./cmd/vfnet-driver is the driver without the simulator: --simulate and
# test/lib/simhost are only in ./test/cmd/vfnet-driver-sim, for tests and the demo
# (TestDockerfile checks the driver built here carries none).

ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ENV CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH}
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -tags grpcnotrace -ldflags="-s -w" -o /out/vfnet-driver ./cmd/vfnet-driver && \
    go build -trimpath -tags grpcnotrace -ldflags="-s -w" -o /out/vfnet-binding ./cmd/vfnet-binding
# The binding runs as KubeVirt's non-root launcher user (qemu, 107:107);
# scratch has no user database, so ship a minimal one.
RUN mkdir -p /out/etc /out/var/run/kubevirt-hooks && \
    printf 'root:x:0:0:root:/:/sbin/nologin\nqemu:x:107:107:qemu:/:/sbin/nologin\n' > /out/etc/passwd && \
    printf 'root:x:0:\nqemu:x:107:\n' > /out/etc/group

# The driver executes nothing but itself: sysfs writes and netlink are done
# in-process. It runs as root in a privileged pod (see manifests/).
FROM scratch AS driver
COPY --from=build /out/vfnet-driver /usr/bin/vfnet-driver
ENTRYPOINT ["/usr/bin/vfnet-driver"]

FROM scratch AS binding
COPY --from=build /out/etc/passwd /out/etc/group /etc/
COPY --from=build --chown=107:107 /out/var/run/kubevirt-hooks /var/run/kubevirt-hooks
COPY --from=build /out/vfnet-binding /usr/bin/vfnet-binding
USER 107:107
ENTRYPOINT ["/usr/bin/vfnet-binding"]
