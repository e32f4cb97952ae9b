//! One module per figure; each returns its rows and notes and prints nothing.

pub mod database;
pub mod fence_sql;
pub mod handover;
pub mod many;
pub mod memory;
pub mod once;
pub mod overlap;
pub mod paused;
pub mod takeover;
pub mod true_etcd;
pub mod true_local;
pub mod waiters;
pub mod whole_run;
pub mod zookeeper;
