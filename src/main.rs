//! The binary: the hidden watchdog mode, or a run.

use std::process::ExitCode;

use leasewrap::supervise::watchdog;

fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == watchdog::MODE) {
        watchdog::main(args[2..].to_vec());
    }
    leasewrap::entry(args).finish()
}
