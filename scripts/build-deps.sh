#!/usr/bin/env bash
# What building leasewrap needs beyond a Rust toolchain: protoc and the well-known protos it
# imports (google/protobuf/*.proto, in libprotobuf-dev, which --no-install-recommends would leave
# out), for etcd-client's protos. Installs them only when missing; uses sudo only when not root.
# With --missing it installs nothing and prints the Debian packages it would install, one a line,
# so that scripts/test.sh can install them with its own in one apt-get update.
set -euo pipefail
missing=()
command -v protoc >/dev/null || missing+=(protobuf-compiler)
[ -f /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
if [ "${1:-}" = "--missing" ]; then
    [ "${#missing[@]}" -eq 0 ] || printf '%s\n' "${missing[@]}"
    exit 0
fi
[ "${#missing[@]}" -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing ${missing[*]}"
$SUDO apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
