//! ZooKeeper as `status` reads it: each lease is a child of `/leasewrap` with lock nodes under
//! it; the holder is the first lock node (by sequence) that a session owns, its record the
//! node's data, its token the node's czxid, and the waiters the lock nodes behind it. A node of
//! a lock node's name that no session owns is shown as ignored. A lease whose nodes this
//! identity may not read is a row saying so (and `status` then exits 77). One session for the
//! whole listing, opened at the first read and closed when done. Reads only.

use std::time::Duration;

use tokio::sync::OnceCell;

use super::client::{self, answered};
use super::session::Zk;
use super::wire::{Code, Stat};
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
    zk: OnceCell<Zk>,
}

impl<'a> Reader<'a> {
    pub fn new(cfg: &'a ZkConfig) -> Self {
        Reader {
            cfg,
            zk: OnceCell::new(),
        }
    }

    async fn zk(&self) -> Result<&Zk, Error> {
        self.zk
            .get_or_try_init(|| async {
                let opened = client::connect(self.cfg, READER_TIMEOUT, false).await;
                Ok(opened.map_err(|n| n.error)?.zk)
            })
            .await
    }

    /// The lease `name` as its queue stands: every lock-shaped node read at once, those gone
    /// since the listing left out (the next one then holds, or is about to).
    async fn lease(&self, name: &str) -> Result<LeaseStatus, Error> {
        let zk = self.zk().await?;
        let parent = lock::parent(self.cfg, name);
        let queue = match answered(self.cfg, &parent, zk.children(&parent)).await? {
            Ok((children, _)) => lock::queue(children),
            Err(e) if e.is(Code::NO_NODE) => Vec::new(),
            Err(e) => return denied_or(self.cfg, name, &parent, &e),
        };
        let paths: Vec<String> = queue.iter().map(|c| format!("{parent}/{c}")).collect();
        let reads: Vec<_> = paths.iter().map(|p| zk.get_data(p)).collect();
        let (mut locks, mut ignored) = (Vec::new(), Vec::new());
        for (path, read) in paths.into_iter().zip(reads) {
            match answered(self.cfg, &path, read).await? {
                Ok((_, stat)) if !lock::is_lock_node(&stat) => ignored.push(path),
                Ok((data, stat)) => locks.push((path, data, stat)),
                Err(e) if e.is(Code::NO_NODE) => {}
                Err(e) => return denied_or(self.cfg, name, &path, &e),
            }
        }
        Ok(lease_of(name, &locks, ignored))
    }
}

/// A row saying the lease cannot be read, for a refused permission; the error otherwise.
fn denied_or(
    cfg: &ZkConfig,
    name: &str,
    path: &str,
    e: &super::session::ZkError,
) -> Result<LeaseStatus, Error> {
    match client::failure(cfg, path, e) {
        Error::Auth(why) if e.is(Code::NO_AUTH) => Ok(LeaseStatus::denied(name, BACKEND, why)),
        other => Err(other),
    }
}

/// The lease `name` whose lock nodes are `locks` (path, data, stat) in queue order.
fn lease_of(name: &str, locks: &[(String, Vec<u8>, Stat)], ignored: Vec<String>) -> LeaseStatus {
    let free = LeaseStatus {
        ignored,
        ..LeaseStatus::free(name, BACKEND)
    };
    let Some((path, data, stat)) = locks.first() else {
        return free;
    };
    LeaseStatus {
        held: true,
        holder: Holder::parse(data),
        token: Some(stat.czxid as u64),
        waiters: Some(locks.len() as u64 - 1),
        key: Some(path.clone()),
        ..free
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

impl Reader<'_> {
    /// Every lease under the root; a row saying so when the root may not be read.
    async fn all(&self) -> Result<Vec<LeaseStatus>, Error> {
        let zk = self.zk().await?;
        let at = root(self.cfg);
        let names = match answered(self.cfg, at, zk.children(at)).await? {
            Ok((names, _)) => names,
            Err(e) if e.is(Code::NO_NODE) => Vec::new(),
            Err(e) => return denied_or(self.cfg, at, at, &e).map(|row| vec![row]),
        };
        let mut out = Vec::new();
        for n in names {
            let lease = self.lease(&n).await?;
            // `runs` holds the records; it is listed only when it is a lease's queue too.
            if n != "runs" || lease.held {
                out.push(lease);
            }
        }
        Ok(out)
    }
}

impl backend::Reader for Reader<'_> {
    fn label(&self) -> &'static str {
        BACKEND
    }

    fn leases<'a>(&'a self, name: Option<&'a str>) -> Boxed<'a, Result<Vec<LeaseStatus>, Error>> {
        Box::pin(async move {
            let mut out = match name {
                Some(n) => vec![self.lease(n).await?],
                None => self.all().await?,
            };
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

    fn close(&self) -> Boxed<'_, ()> {
        Box::pin(async move {
            if let Some(zk) = self.zk.get() {
                zk.close(Duration::from_secs(1)).await;
            }
        })
    }
}
