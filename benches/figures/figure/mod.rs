//! One module per figure; each returns its rows and notes and prints nothing.

pub mod handover;
pub mod many;
pub mod memory;
pub mod overlap;
pub mod takeover;
pub mod waiters;
pub mod whole_run;
