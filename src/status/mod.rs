//! `leasewrap status`: who holds a lease, with which token, for how long still, and how many
//! wait. Reads only; never takes or changes a lease.

use crate::cli::StatusArgs;
use crate::config::Env;
use crate::error::Error;

/// Print the status; exit 0 when NAME is held, 1 when it is free.
pub async fn run(args: &StatusArgs, env: Env<'_>) -> Result<u8, Error> {
    let _ = (args, env);
    Err(Error::Internal("status is not implemented yet".into()))
}
