//! What figures 1, 2 and 9 share: the wall time of whole uncontended runs of `-- true`, from just
//! before the spawn to waitpid's return, the command lines interleaved run by run.

use std::ffi::OsString;

use crate::bench::Bench;

/// Runs discarded before each measured series (page cache, etcd's first connections).
const WARMUP: usize = 3;

/// One command line per iteration, under a label.
pub type Run<'a> = (&'static str, Box<dyn Fn(usize) -> Vec<OsString> + 'a>);

/// Milliseconds of each run, per label; the order of the labels flips every iteration.
pub fn alternate(bench: &mut Bench, runs: &[Run], n: usize) -> Vec<Vec<f64>> {
    let mut out = vec![Vec::new(); runs.len()];
    for i in 0..WARMUP + n {
        let mut order: Vec<usize> = (0..runs.len()).collect();
        if i % 2 == 1 {
            order.reverse();
        }
        for k in order {
            let (label, argv) = &runs[k];
            let took = bench.procs.timed(&argv(i), label);
            if i >= WARMUP {
                out[k].push(took.as_secs_f64() * 1e3);
            }
        }
    }
    out
}
