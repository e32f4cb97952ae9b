//! The binary: a thin wrapper around `leasewrap::entry`.

use std::process::ExitCode;

fn main() -> ExitCode {
    leasewrap::entry(std::env::args_os().collect()).finish()
}
