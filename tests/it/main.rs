//! The one integration-test binary: black-box tests of the built `leasewrap`, one module per
//! area, all on the one harness in `tests/support` (builder, etcd launcher, fault proxy).
//!
//! Run one area with a filter: `cargo test --test integration local::`.
//!
//! - `docs`: man pages, completions, units and package metadata stay true to the code, and every
//!   shell example of the README, docs/ and the man pages runs as its text says.
//! - `etcd`: the etcd backend against real etcd 3.4 and 3.5 (SPEC §4, §5, §9).
//! - `fence`: fenced-write and fenced-put (SPEC §7).
//! - `harness`: the harness itself (etcd servers, TLS, auth, cluster, proxy).
//! - `kernel`: an older kernel (a seccomp filter) is refused before anything is taken: 71.
//! - `local`: the local backend (flock + token file).
//! - `once`: once per scheduled run: --once, --once-per, --max-runtime, --metrics-file.
//! - `operating`: `status`, sd_notify, JSON logs.
//! - `database`: the database lease (`--database`) against a real PostgreSQL 15.
//! - `dbfence`: the database fence's scenarios, the same on every server (SPEC §9 F16).
//! - `postgres`, `mariadb`: the database fence against a real PostgreSQL 15 and MariaDB 10.11
//!   (SPEC §7, §9 F16), their other roles and users included.
//! - `release`: `scripts/release.sh`'s portable binary (its glibc floor), the .deb and the
//!   .rpm (the same files; lintian, rpmlint; installed into an empty root), the tarball, SHA256SUMS.
//! - `security`: hostile state directories, fence files, temp names and lease names.
//! - `shape`: the code's own shape (no function in src/ over 50 lines).
//! - `usage`: a new user's mistakes on the command line: one line saying what to type, 64.
//! - `zookeeper`: the ZooKeeper backend against a real ZooKeeper 3.8, standalone and as a
//!   3-member ensemble whose member links go through fault proxies (issue 17).
//! - `secrets`: what processes of the same user learn of a password; warnings about passwords.
//! - `bench_goals`, `bench_stats`, `bench_prom`: the benchmarks' goals, statistics, /metrics parsing.

#[path = "../support/mod.rs"]
mod support;

// The benchmarks' goals table, statistics and /metrics parsing (benches/figures), whose unit
// tests run here: a `harness = false` bench has no test runner.
#[path = "../../benches/figures/goals.rs"]
mod bench_goals;
#[path = "../../benches/figures/prom.rs"]
mod bench_prom;
#[path = "../../benches/figures/stats.rs"]
mod bench_stats;

mod database;
mod dbfence;
mod docs;
mod etcd;
mod fence;
mod harness;
mod kernel;
mod local;
mod mariadb;
mod once;
mod operating;
mod postgres;
mod release;
mod secrets;
mod security;
mod shape;
mod usage;
mod zookeeper;
