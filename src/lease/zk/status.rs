//! ZooKeeper as `status` reads it: each lease is a child of `/leasewrap` with lock nodes under
//! it; the holder is the lowest sequence, its record the node's data, its token the node's czxid,
//! and the waiters the nodes behind it. One session for the whole listing, opened at the first
//! read and closed with the reader. Reads only.

use std::time::Duration;

use tokio::sync::OnceCell;
use zookeeper_client as zkc;

use super::client::{self, bounded};
use super::{lock, runs};
use crate::config::ZkConfig;
use crate::error::Error;
use crate::lease::backend::{self, Boxed};
use crate::lease::report::{Holder, LeaseStatus};
use crate::runs::{RunRecord, Unreadable};

const BACKEND: &str = "zookeeper";

/// The session timeout a reader asks for: it renews nothing, and its session ends with it.
const READER_TIMEOUT: Duration = Duration::from_secs(10);

/// ZooKeeper as `status` reads it.
pub struct Reader<'a> {
    cfg: &'a ZkConfig,
    zk: OnceCell<zkc::Client>,
}

impl<'a> Reader<'a> {
    pub fn new(cfg: &'a ZkConfig) -> Self {
        Reader {
            cfg,
            zk: OnceCell::new(),
        }
    }

    async fn zk(&self) -> Result<&zkc::Client, Error> {
        self.zk
            .get_or_try_init(|| async {
                Ok(client::connect(self.cfg, READER_TIMEOUT, false)
                    .await?
                    .client)
            })
            .await
    }

    /// The lease `name` as its queue stands. A holder released between the listing and the
    /// read of its node is looked for again, a few times.
    async fn lease(&self, name: &str) -> Result<LeaseStatus, Error> {
        let zk = self.zk().await?;
        let parent = lock::parent(self.cfg, name);
        let mut last = None;
        for _ in 0..3 {
            let queue = lock::queue(runs::children(self.cfg, zk, &parent).await?);
            let Some(first) = queue.first() else {
                return Ok(LeaseStatus::free(name, BACKEND));
            };
            let path = format!("{parent}/{first}");
            match bounded(self.cfg, self.cfg.conn.dial_timeout, zk.get_data(&path)).await {
                Ok((data, stat)) => return Ok(held(name, path, &data, &stat, queue.len())),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Internal("reading a lock node".into())))
    }
}

/// Where the lock parents are: the root, or `/` with `--prefix ''`.
fn root(cfg: &ZkConfig) -> &str {
    if cfg.root.is_empty() {
        "/"
    } else {
        &cfg.root
    }
}

/// A held lease: its first node at `path`, with `data` and `stat`, in a queue of `nodes`.
fn held(name: &str, path: String, data: &[u8], stat: &zkc::Stat, nodes: usize) -> LeaseStatus {
    LeaseStatus {
        held: true,
        holder: Holder::parse(data),
        token: Some(stat.czxid as u64),
        waiters: Some(nodes as u64 - 1),
        key: Some(path),
        ..LeaseStatus::free(name, BACKEND)
    }
}

impl backend::Reader for Reader<'_> {
    fn label(&self) -> &'static str {
        BACKEND
    }

    fn leases<'a>(&'a self, name: Option<&'a str>) -> Boxed<'a, Result<Vec<LeaseStatus>, Error>> {
        Box::pin(async move {
            let names = match name {
                Some(n) => vec![n.to_owned()],
                None => runs::children(self.cfg, self.zk().await?, root(self.cfg)).await?,
            };
            let mut out = Vec::new();
            for n in names {
                let lease = self.lease(&n).await?;
                // `runs` holds the records; it is listed only when it is a lease's queue too.
                if name.is_some() || n != "runs" || lease.held {
                    out.push(lease);
                }
            }
            out.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(out)
        })
    }

    fn runs<'a>(
        &'a self,
        name: &'a str,
        _last: usize,
    ) -> Boxed<'a, Result<Vec<Result<RunRecord, Unreadable>>, Error>> {
        Box::pin(async move { runs::list(self.cfg, self.zk().await?, name).await })
    }

    fn run<'a>(
        &'a self,
        name: &'a str,
        key: &'a str,
    ) -> Boxed<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(async move { runs::read(self.cfg, self.zk().await?, name, key).await })
    }

    fn names(&self) -> Boxed<'_, Result<Vec<String>, Error>> {
        Box::pin(async move { runs::names(self.cfg, self.zk().await?).await })
    }
}
