//! `cargo bench`: the figures of SPEC §11 (BENCHMARKS.md), leasewrap against `etcdctl lock` 3.4
//! and `flock(1)`, interleaved run by run, on the tests' own harness (tests/support: the etcd
//! and ZooKeeper launchers and the fault proxy).
//!
//!     cargo bench                     every figure, printed (about 4 minutes, plus the builds)
//!     cargo bench -- --write          the same, then rewrites BENCHMARKS.md and the pictures
//!                                     in docs/ (docs/paused-leader.svg)
//!     cargo bench -- --quick          small sizes, for development (about 1 minute)
//!     cargo bench -- --only 1,3       some figures
//!     cargo bench -- --output FILE    any run's report, written to FILE in BENCHMARKS.md's form,
//!                                     its pictures beside FILE
//!     cargo bench -- --wait-quiet 600 first wait up to 10 minutes for the CPUs to be idle
//!
//! `cargo test --all-targets` builds this target and runs it without `--bench`: it then measures
//! nothing. Its statistics are unit-tested in the integration test binary (tests/it/main.rs).
//!
//! # Layout
//!
//! - `bench`: the shared context: etcd, proxy, the tools' command lines, bounded waits.
//! - `observe`: instants of execs, writes (inotify) and exits (pidfd), stamped in poll().
//! - `procs`: spawning in sessions, sweeping, /proc readers.
//! - `figure`: one module per figure, each returning rows and notes (no printing).
//! - `goals`: the goals table, written once, used to judge and to print.
//! - `report`: the table on stdout and BENCHMARKS.md.
//! - `picture`: the pictures a figure draws of its runs (SVG, plotters).
//! - `stats`, `prom`: median, percentiles, ratios; etcd's /metrics as numbers.
//! - `machine`: the machine and run facts of the report.

#[allow(dead_code, unused_imports)]
#[path = "../../tests/support/mod.rs"]
mod support;

mod bench;
mod figure;
mod goals;
mod machine;
mod observe;
mod picture;
mod procs;
mod prom;
mod report;
mod stats;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use bench::{Bench, Sizes};
use report::Figure;

/// Measures one figure.
type Measure = fn(&mut Bench) -> Figure;

/// The figures by number, as `--only` names them.
const FIGURES: [(u32, &str, Measure); 13] = [
    (1, "-- true on etcd", figure::true_etcd::figure),
    (
        2,
        "-- true on the local backend",
        figure::true_local::figure,
    ),
    (3, "handover", figure::handover::figure),
    (4, "takeover after SIGKILL", figure::takeover::figure),
    (
        5,
        "overlap under SIGSTOP and partition",
        figure::overlap::figure,
    ),
    (6, "memory", figure::memory::figure),
    (7, "waiters on one lease", figure::waiters::figure),
    (8, "leases held at once", figure::many::figure),
    (9, "--once", figure::once::figure),
    (10, "the database fence", figure::fence_sql::figure),
    (11, "the ZooKeeper backend", figure::zookeeper::figure),
    (12, "the paused leader", figure::paused::figure),
    (13, "the database lease", figure::database::figure),
];

struct Options {
    quick: bool,
    /// Where the report goes: BENCHMARKS.md with `--write`, any file with `--output`.
    output: Option<PathBuf>,
    /// Where the pictures go: docs/ with `--write`, beside the `--output` file.
    pictures: Option<PathBuf>,
    build: bool,
    only: Vec<u32>,
    /// How long to wait for a quiet machine before measuring.
    wait_quiet: Duration,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        println!("figures: a benchmark (cargo bench); nothing measured under cargo test");
        return ExitCode::SUCCESS;
    }
    let opts = match parse(&args) {
        Ok(opts) => opts,
        Err(why) => {
            eprintln!("figures: {why}");
            return ExitCode::from(64);
        }
    };
    run(&opts)
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut opts = Options {
        quick: false,
        output: None,
        pictures: None,
        build: true,
        only: FIGURES.iter().map(|f| f.0).collect(),
        wait_quiet: Duration::ZERO,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--bench" => {}
            "--quick" => opts.quick = true,
            "--write" => {
                let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
                opts.output = Some(root.join("BENCHMARKS.md"));
                opts.pictures = Some(root.join("docs"));
            }
            "--output" => {
                let file = PathBuf::from(it.next().ok_or("--output needs a file")?);
                let dir = file.parent().map_or_else(PathBuf::new, Path::to_path_buf);
                opts.pictures = Some(if dir.as_os_str().is_empty() { ".".into() } else { dir });
                opts.output = Some(file);
            }
            "--no-build" => opts.build = false,
            "--wait-quiet" => {
                let secs = it.next().ok_or("--wait-quiet needs seconds")?;
                let secs: u64 = secs.parse().map_err(|_| format!("--wait-quiet {secs}: not seconds"))?;
                opts.wait_quiet = Duration::from_secs(secs);
            }
            "--only" => {
                let list = it.next().ok_or("--only needs a list such as 1,3")?;
                let only: Result<Vec<u32>, _> = list.split(',').map(str::parse).collect();
                opts.only =
                    only.map_err(|_| format!("--only {list}: not a list of figure numbers"))?;
            }
            other => {
                return Err(format!(
                    "unknown argument {other} (known: --quick, --write, --output FILE, --only LIST, --no-build, --wait-quiet SECS)"
                ))
            }
        }
    }
    let partial = opts.quick || opts.only.len() != FIGURES.len();
    if args.iter().any(|a| a == "--write") && partial {
        return Err(
            "--write rewrites BENCHMARKS.md from a full run: no --quick or --only \
                    (--output FILE takes any run)"
                .into(),
        );
    }
    Ok(opts)
}

fn run(opts: &Options) -> ExitCode {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let binary = PathBuf::from(support::BIN);
    if opts.build {
        build_release(&root);
    }
    raise_fd_limit();
    let mut machine = machine::Machine::start(&binary, &root, opts.wait_quiet);
    let sizes = if opts.quick {
        Sizes::QUICK
    } else {
        Sizes::FULL
    };
    let figures = measure(Bench::new(sizes, binary), &opts.only);
    machine.finish();
    report::print(&figures);
    for line in machine.lines() {
        println!("- {line}");
    }
    let missed = report::missed(&figures);
    println!(
        "\ngoals not met: {}",
        if missed.is_empty() {
            "none".into()
        } else {
            missed.join("\n    ")
        }
    );
    if let Some(path) = &opts.output {
        let args: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| a != "--bench")
            .collect();
        let command = format!("cargo bench -- {}", args.join(" "));
        report::write(
            path,
            &report::markdown(&figures, &machine, command.trim_end()),
        );
        println!("wrote {}", path.display());
    }
    if let Some(dir) = &opts.pictures {
        for path in report::write_pictures(&figures, dir) {
            println!("wrote {}", path.display());
        }
    }
    ExitCode::SUCCESS
}

/// Runs the figures named in `only`, in table order; drops the bench (etcd and all) at the end.
fn measure(mut bench: Bench, only: &[u32]) -> Vec<Figure> {
    let mut figures = Vec::new();
    for (number, what, measure) in FIGURES {
        if only.contains(&number) {
            println!("[{number}] {what}");
            let started = std::time::Instant::now();
            figures.push(measure(&mut bench));
            bench.sweep();
            println!("    done in {:.1} s", started.elapsed().as_secs_f64());
        }
    }
    figures
}

/// `cargo build --release`, so that the binary measured is the release build (cargo bench
/// builds `target/release/leasewrap` with the bench profile, which unwinds on panic).
fn build_release(root: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    println!("cargo build --release");
    let status = Command::new(cargo)
        .args(["build", "--release", "--bin", "leasewrap"])
        .current_dir(root)
        .status()
        .expect("run cargo build --release");
    assert!(status.success(), "cargo build --release failed: {status}");
}

/// 500 leases: etcd (which inherits the limit) needs a descriptor per connection.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write only `lim`, which lives across both calls.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}
