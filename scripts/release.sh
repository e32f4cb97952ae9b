#!/usr/bin/env bash
# One release, into one folder (target/dist, or DIR): the portable binary for x86_64 Linux,
# linked against glibc $GLIBC_FLOOR (cargo-zigbuild, with zig from PyPI's ziglang), a .deb
# (cargo-deb) and an .rpm (cargo-generate-rpm) of that same binary, a tarball, and SHA256SUMS.
# Installs the tools it needs when they are missing; uses sudo only when not root.
#
#     scripts/release.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

# The oldest glibc the binary is linked against. README's Install section and the man page
# state it; tests/it/release.rs checks that the binary needs no symbol version above it.
GLIBC_FLOOR=2.17
TRIPLE=x86_64-unknown-linux-gnu

target_dir=${CARGO_TARGET_DIR:-target}
out=${1:-$target_dir/dist}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
name=leasewrap-$version-x86_64-linux-gnu
# The packages' and the tarball's times: the commit's, so that one commit makes the same files.
# Only for the packaging: a build script (ring's) that watches it would rebuild at each commit.
epoch=$(git log -1 --format=%ct 2>/dev/null || date +%s)

say() { echo "release: $*" >&2; }

# A crate's cargo subcommand, unless its program (cargo-SUB) runs already.
cargo_tool() {
    local sub=$1 crate=$2
    "cargo-$sub" --version >/dev/null 2>&1 && return
    say "installing $crate"
    cargo install "$crate" --locked >/dev/null
}

# zig itself, from PyPI (cargo-zigbuild finds it as `python3 -m ziglang`), unless one runs.
install_zig() {
    command -v zig >/dev/null && return
    python3 -c 'import ziglang' 2>/dev/null && return
    say "installing ziglang"
    python3 -m pip install -q ziglang 2>/dev/null \
        || python3 -m pip install -q --break-system-packages ziglang
}

install_tools() {
    scripts/build-deps.sh
    install_zig
    cargo_tool zigbuild cargo-zigbuild
    cargo_tool deb cargo-deb
    cargo_tool generate-rpm cargo-generate-rpm
}

build() {
    say "building leasewrap $version for $TRIPLE, glibc $GLIBC_FLOOR"
    cargo zigbuild --release --locked --target "$TRIPLE.$GLIBC_FLOOR"
}

packages() {
    # Both from the binary just built: cargo-deb and cargo-generate-rpm read
    # target/release/leasewrap in Cargo.toml as target/$TRIPLE/release/leasewrap.
    SOURCE_DATE_EPOCH=$epoch cargo deb --no-build --no-strip --target "$TRIPLE" \
        --output "$out/" >/dev/null
    # The man pages gzipped, as rpmbuild would, where the .rpm's assets name them.
    local man=$target_dir/$TRIPLE/release/man
    rm -rf "$man"
    mkdir -p "$man"
    for page in man/*.1; do
        gzip -9n <"$page" >"$man/${page#man/}.gz"
    done
    SOURCE_DATE_EPOCH=$epoch cargo generate-rpm --target "$TRIPLE" --payload-compress gzip \
        --output "$out/"
}

# The tarball: the binary, man pages, completions, units, the cron and environment examples,
# the SQL, the docs, and SHA256SUMS of all of them; names, owners and times fixed.
tarball() {
    local stage
    stage=$(mktemp -d)
    local top=$stage/$name
    mkdir -p "$top"/{man,completions,systemd,sql,docs}
    install -m 755 "$target_dir/$TRIPLE/release/leasewrap" "$top/leasewrap"
    install -m 644 man/*.1 "$top/man/"
    install -m 644 packaging/completions/* "$top/completions/"
    install -m 644 packaging/systemd/* "$top/systemd/"
    install -m 644 packaging/cron/leasewrap.cron packaging/leasewrap.env "$top/"
    install -m 644 sql/*.sql "$top/sql/"
    install -m 644 docs/* "$top/docs/"
    install -m 644 README.md "$top/"
    (cd "$top" && find . -type f ! -name SHA256SUMS | LC_ALL=C sort | sed 's|^\./||' \
        | xargs sha256sum >SHA256SUMS)
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
        -C "$stage" -cf - "$name" | gzip -9n >"$out/$name.tar.gz"
    rm -rf "$stage"
}

install_tools
build
# Only what an earlier release left: DIR may hold other files.
mkdir -p "$out"
rm -f "$out"/leasewrap[-_]*.deb "$out"/leasewrap-*.rpm "$out"/leasewrap-*.tar.gz "$out/SHA256SUMS"
packages
tarball
(cd "$out" && sha256sum -- *.deb *.rpm *.tar.gz >SHA256SUMS)
say "done: $out"
ls -l "$out" >&2
