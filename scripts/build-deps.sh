#!/usr/bin/env bash
# What building leasewrap needs beyond a Rust toolchain: protoc and the well-known protos it
# imports (google/protobuf/*.proto, in libprotobuf-dev, which --no-install-recommends would leave
# out), for etcd-client's protos. Installs them only when missing; uses sudo only when not root.
set -euo pipefail
command -v protoc >/dev/null && [ -f /usr/include/google/protobuf/descriptor.proto ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing protobuf-compiler libprotobuf-dev"
$SUDO apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    protobuf-compiler libprotobuf-dev >/dev/null
