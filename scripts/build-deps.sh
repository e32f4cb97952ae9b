#!/usr/bin/env bash
# What building leasewrap needs beyond a Rust toolchain: protoc, for etcd-client's protos.
# Installs it only when missing; uses sudo only when not root.
set -euo pipefail
command -v protoc >/dev/null && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing protobuf-compiler"
$SUDO apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends protobuf-compiler >/dev/null
