//! The resource side of fencing: `fenced-write` replaces a file only for a token at least as high
//! as any it has seen; `fenced-put` puts an etcd key only while the lock key still has the token.

use crate::cli::{FencedPutArgs, FencedWriteArgs};
use crate::config::Env;
use crate::error::Error;

/// `leasewrap fenced-write`.
pub fn write(args: &FencedWriteArgs) -> Result<(), Error> {
    let _ = args;
    Err(Error::Internal(
        "fenced-write is not implemented yet".into(),
    ))
}

/// `leasewrap fenced-put`.
pub async fn put(args: &FencedPutArgs, env: Env<'_>) -> Result<(), Error> {
    let _ = (args, env);
    Err(Error::Internal("fenced-put is not implemented yet".into()))
}
