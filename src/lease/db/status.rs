//! The database as `status` reads it: the row of NAME, through the installed `lease_read`, which
//! answers only for the names the role is tied to. A reader knows the holder's `L` but not its
//! time left: that is counted on the holder's clock, and the row keeps none. Reads only.

use tokio::sync::{Mutex, OnceCell};

use super::{connect, Conn};
use crate::config::database::DbConfig;
use crate::error::Error;
use crate::lease::backend::{self, Boxed};
use crate::lease::report::{Holder, LeaseStatus};
use crate::runs::{RunRecord, Unreadable};

/// The database as `status` reads it; connected at the first read.
pub struct Reader<'a> {
    cfg: &'a DbConfig,
    conn: OnceCell<Mutex<Conn>>,
}

impl<'a> Reader<'a> {
    pub fn new(cfg: &'a DbConfig) -> Self {
        Reader {
            cfg,
            conn: OnceCell::new(),
        }
    }

    /// The connection, opened at the first read.
    async fn conn(&self) -> Result<tokio::sync::MutexGuard<'_, Conn>, Error> {
        let opened = self
            .conn
            .get_or_try_init(|| async { Ok::<_, Error>(Mutex::new(connect(self.cfg).await?)) });
        Ok(opened.await?.lock().await)
    }

    async fn lease(&self, name: &str) -> Result<LeaseStatus, Error> {
        let row = self.conn().await?.read(name).await?;
        let holder = serde_json::from_str::<Holder>(&row.holder).ok();
        Ok(LeaseStatus {
            name: name.to_owned(),
            backend: "database",
            held: row.held,
            holder: holder.filter(|_| row.held),
            token: (row.held).then_some(row.token),
            time_left_s: None,
            ttl_s: Some(row.ttl.as_secs() as i64).filter(|_| row.held),
            waiters: None,
            key: Some(name.to_owned()),
            refused: None,
            denied: false,
            ignored: Vec::new(),
            runs: Vec::new(),
            unreadable_runs: Vec::new(),
        })
    }
}

impl backend::Reader for Reader<'_> {
    fn label(&self) -> &'static str {
        "database"
    }

    fn leases<'a>(&'a self, name: Option<&'a str>) -> Boxed<'a, Result<Vec<LeaseStatus>, Error>> {
        Box::pin(async move {
            let names = match name {
                Some(name) => vec![name.to_owned()],
                None => self.conn().await?.names().await?,
            };
            let mut out = Vec::with_capacity(names.len());
            for name in &names {
                out.push(self.lease(name).await?);
            }
            Ok(out)
        })
    }

    fn runs<'a>(
        &'a self,
        name: &'a str,
        last: usize,
    ) -> Boxed<'a, Result<Vec<Result<RunRecord, Unreadable>>, Error>> {
        Box::pin(async move { super::runs::list(self.conn().await?.as_mut(), name, last).await })
    }

    fn run<'a>(
        &'a self,
        name: &'a str,
        key: &'a str,
    ) -> Boxed<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(async move { super::runs::read(self.conn().await?.as_mut(), name, key).await })
    }

    fn names(&self) -> Boxed<'_, Result<Vec<String>, Error>> {
        Box::pin(async move { self.conn().await?.names().await })
    }
}
