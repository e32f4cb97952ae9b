//! One connection to PostgreSQL and the lease's statements on it, each one call of a function
//! that `leasewrap fence-sql postgres` installs. The wire protocol, SCRAM and TLS come from
//! tokio-postgres and rustls (on the ring provider already linked): nothing here speaks the
//! protocol itself. A connection LISTENs on `leasewrap_lease`, whose notifications (a release)
//! wake a waiter.

use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, Client, SimpleQueryMessage, Socket};

use super::{RowState, SendBoxed, Statements, SQL_VERSION};
use crate::config::database::{DbConfig, Host};
use crate::error::Error;
use crate::lease::timing::db::Renewal;
use crate::lease::timing::KeySeen;

/// A connection, and the notifications its driver task passes on.
pub struct Pg {
    client: Client,
    woken: mpsc::UnboundedReceiver<()>,
    /// The task that drives the connection; it ends when the client is dropped.
    driver: tokio::task::JoinHandle<()>,
    /// Where, for messages.
    at: String,
    /// Sends a cancel request for the statement in flight.
    canceller: Canceller,
}

/// A cancel request for one connection's statement in flight, over the same TLS as its own.
type Canceller = Arc<dyn Fn() -> SendBoxed<'static, ()> + Send + Sync>;

impl Drop for Pg {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Where `cfg` points, for messages: `host:port/db`.
pub fn place(cfg: &DbConfig) -> String {
    match &cfg.host {
        Host::Tcp(h) => format!("PostgreSQL at {h}:{}/{}", cfg.port, cfg.dbname),
        Host::Socket(d) => format!(
            "PostgreSQL at {}/.s.PGSQL.{} (database {})",
            d.display(),
            cfg.port,
            cfg.dbname
        ),
    }
}

/// Connect and log in within the dial timeout, check the installed SQL's version, and listen
/// for releases.
pub async fn connect(cfg: &DbConfig) -> Result<Pg, Error> {
    let at = place(cfg);
    let opened = tokio::time::timeout(cfg.dial_timeout, open(cfg, &at)).await;
    let pg = opened.map_err(|_| {
        Error::Unavailable(format!(
            "{at}: no answer within {} ms (is it PostgreSQL, and does it listen there? --dial-timeout, or connect_timeout in the URL, bound the wait)",
            cfg.dial_timeout.as_millis()
        ))
    })??;
    check_sql(&pg, cfg).await?;
    Ok(pg)
}

async fn open(cfg: &DbConfig, at: &str) -> Result<Pg, Error> {
    let mut pc = tokio_postgres::Config::new();
    match &cfg.host {
        Host::Tcp(h) => pc.host(h),
        Host::Socket(d) => pc.host_path(d),
    };
    pc.port(cfg.port)
        .dbname(&cfg.dbname)
        .user(&cfg.user)
        .application_name(&cfg.application_name);
    if let Some(p) = &cfg.password {
        pc.password(p);
    }
    match &cfg.tls {
        None => {
            pc.ssl_mode(tokio_postgres::config::SslMode::Disable);
            start(&pc, tokio_postgres::NoTls, at).await
        }
        Some(ca) => {
            pc.ssl_mode(tokio_postgres::config::SslMode::Require);
            let config = crate::lease::zk::tls::config(ca, None)
                .map_err(|e| Error::Config(format!("{at}: {e}")))?;
            let tls = tokio_postgres_rustls::MakeRustlsConnect::new(Arc::unwrap_or_clone(config));
            start(&pc, tls, at).await
        }
    }
}

/// Log in over `tls` and start the connection's driver.
async fn start<T>(pc: &tokio_postgres::Config, tls: T, at: &str) -> Result<Pg, Error>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let (client, mut connection) = pc.connect(tls.clone()).await.map_err(|e| failed(at, &e))?;
    let token = client.cancel_token();
    let canceller: Canceller = Arc::new(move || {
        let (token, tls) = (token.clone(), tls.clone());
        Box::pin(async move {
            if let Err(e) = token.cancel_query(tls).await {
                tracing::debug!(error = %e, "the cancel request failed");
            }
        })
    });
    let (tx, woken) = mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        // Until the client is dropped (None) or the connection fails.
        while let Some(Ok(message)) = poll_fn(|cx| connection.poll_message(cx)).await {
            if let AsyncMessage::Notification(_) = message {
                let _ = tx.send(());
            }
        }
    });
    Ok(Pg {
        client,
        woken,
        driver,
        at: at.to_owned(),
        canceller,
    })
}

/// The installed SQL's version must be the one this leasewrap needs; the same round trip
/// starts listening for releases.
async fn check_sql(pg: &Pg, cfg: &DbConfig) -> Result<(), Error> {
    let install = format!(
        "install it with: leasewrap fence-sql postgres | psql -X -v ON_ERROR_STOP=1 -d {} (as a superuser), then SELECT leasewrap.allow('{}', 'NAME')",
        cfg.dbname, cfg.user
    );
    let asked = "LISTEN leasewrap_lease; SELECT leasewrap.lease_sql()";
    let version: i32 = match pg.client.simple_query(asked).await {
        Ok(messages) => version_of(&messages),
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            return Err(Error::Auth(format!(
                "{}: role {} is tied to no lease name ({}): an administrator ties it with SELECT leasewrap.allow('{}', 'NAME')",
                pg.at,
                cfg.user,
                e.as_db_error().map_or("permission denied", |d| d.message()),
                cfg.user
            )))
        }
        Err(e) if missing(&e) => {
            return Err(Error::Config(format!(
                "{}: the lease's SQL (version {SQL_VERSION}) is not installed, or is older: {install}",
                pg.at
            )))
        }
        Err(e) => return Err(failed(&pg.at, &e)),
    };
    if version < SQL_VERSION {
        return Err(Error::Config(format!(
            "{}: the lease's SQL installed is version {version}, older than the {SQL_VERSION} this leasewrap needs: {install}",
            pg.at
        )));
    }
    Ok(())
}

/// The version in the answer to `lease_sql()`; 0 when there is none.
fn version_of(messages: &[SimpleQueryMessage]) -> i32 {
    messages
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).and_then(|v| v.parse().ok()),
            _ => None,
        })
        .unwrap_or(0)
}

/// The function or schema is not there (or not visible to this role: no USAGE).
fn missing(e: &tokio_postgres::Error) -> bool {
    let code = e.code();
    code == Some(&SqlState::UNDEFINED_FUNCTION) || code == Some(&SqlState::INVALID_SCHEMA_NAME)
}

/// What a failure of the server or the connection means: refused credentials, permission or
/// TLS are 77, a bad name 64, anything else (no answer, not PostgreSQL) 69.
pub fn failed(at: &str, e: &tokio_postgres::Error) -> Error {
    if let Some(db) = e.as_db_error() {
        let what = format!("{at}: {} ({})", db.message(), db.code().code());
        return match db.code() {
            c if *c == SqlState::INVALID_PASSWORD
                || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
                || *c == SqlState::INSUFFICIENT_PRIVILEGE =>
            {
                Error::Auth(what)
            }
            c if c.code() == "LWF02" => Error::Usage(what),
            _ => Error::Unavailable(what),
        };
    }
    super::not_answered(at, e)
}

impl Statements for Pg {
    fn read<'a>(&'a mut self, name: &'a str) -> SendBoxed<'a, Result<RowState, Error>> {
        Box::pin(async move {
            let sql =
                "SELECT version, token::text, held, ttl_ms, holder FROM leasewrap.lease_read($1)";
            let row = self
                .client
                .query_typed_one(sql, &[(&name, Type::TEXT)])
                .await
                .map_err(|e| failed(&self.at, &e))?;
            Ok(RowState {
                version: row.get::<_, i64>(0) as u64,
                token: parse_token(row.get(1)),
                held: row.get(2),
                ttl: Duration::from_millis(row.get::<_, i64>(3).max(0) as u64),
                holder: row.get(4),
            })
        })
    }

    fn take<'a>(
        &'a mut self,
        name: &'a str,
        seen: u64,
        ttl: Duration,
        holder: &'a str,
    ) -> SendBoxed<'a, Result<Option<u64>, Error>> {
        Box::pin(async move {
            let sql = "SELECT token::text FROM leasewrap.lease_take($1, $2, $3, $4)";
            let (seen, ttl_ms) = (seen as i64, ttl.as_millis() as i64);
            let params: [(&(dyn ToSql + Sync), Type); 4] = [
                (&name, Type::TEXT),
                (&seen, Type::INT8),
                (&ttl_ms, Type::INT8),
                (&holder, Type::TEXT),
            ];
            let rows = self
                .client
                .query_typed(sql, &params)
                .await
                .map_err(|e| failed(&self.at, &e))?;
            Ok(rows.first().map(|r| parse_token(r.get(0))))
        })
    }

    fn renew<'a>(&'a mut self, name: &'a str, token: u64) -> SendBoxed<'a, Result<Renewal, Error>> {
        Box::pin(async move {
            let sql = "SELECT renewed, held FROM leasewrap.lease_renew($1, $2::text::numeric)";
            let row = self
                .client
                .query_typed_one(
                    sql,
                    &[(&name, Type::TEXT), (&token.to_string(), Type::TEXT)],
                )
                .await
                .map_err(|e| failed(&self.at, &e))?;
            Ok(match (row.get::<_, bool>(0), row.get::<_, bool>(1)) {
                (true, _) => Renewal::Renewed,
                (false, true) => Renewal::Refused(KeySeen::Replaced),
                (false, false) => Renewal::Refused(KeySeen::Gone),
            })
        })
    }

    fn release<'a>(&'a mut self, name: &'a str, token: u64) -> SendBoxed<'a, Result<(), Error>> {
        Box::pin(async move {
            let sql = "SELECT leasewrap.lease_release($1, $2::text::numeric)";
            self.client
                .query_typed_one(
                    sql,
                    &[(&name, Type::TEXT), (&token.to_string(), Type::TEXT)],
                )
                .await
                .map_err(|e| failed(&self.at, &e))?;
            Ok(())
        })
    }

    /// The nap, over early at a release's notification.
    fn pause<'a>(
        &'a mut self,
        _name: &'a str,
        _seen: u64,
        nap: Duration,
    ) -> SendBoxed<'a, Result<(), Error>> {
        Box::pin(async move {
            let woken = async {
                if self.woken.recv().await.is_none() {
                    // The connection ended: no more wake-ups, only the poll.
                    std::future::pending::<()>().await;
                }
                // One read answers every wake-up that came meanwhile.
                while self.woken.try_recv().is_ok() {}
            };
            tokio::select! {
                () = tokio::time::sleep(nap) => {}
                () = woken => tracing::debug!("woken by a release"),
            }
            Ok(())
        })
    }

    fn cancel(&self) -> SendBoxed<'static, ()> {
        (self.canceller)()
    }

    fn run_read<'a>(
        &'a mut self,
        name: &'a str,
        key: &'a str,
    ) -> SendBoxed<'a, Result<Option<String>, Error>> {
        Box::pin(async move {
            let sql = "SELECT leasewrap.lease_run_read($1, $2)";
            let row = self
                .client
                .query_typed_one(sql, &[(&name, Type::TEXT), (&key, Type::TEXT)])
                .await
                .map_err(|e| failed(&self.at, &e))?;
            Ok(row.get(0))
        })
    }

    fn run_write<'a>(
        &'a mut self,
        name: &'a str,
        token: u64,
        key: &'a str,
        record: Option<&'a str>,
    ) -> SendBoxed<'a, Result<bool, Error>> {
        Box::pin(async move {
            let token = token.to_string();
            let sql = "SELECT leasewrap.lease_run_write($1, $2::text::numeric, $3, $4)";
            let params: [(&(dyn ToSql + Sync), Type); 4] = [
                (&name, Type::TEXT),
                (&token, Type::TEXT),
                (&key, Type::TEXT),
                (&record, Type::TEXT),
            ];
            let row = self
                .client
                .query_typed_one(sql, &params)
                .await
                .map_err(|e| failed(&self.at, &e))?;
            Ok(row.get(0))
        })
    }

    fn names(&mut self) -> SendBoxed<'_, Result<Vec<String>, Error>> {
        Box::pin(async move {
            let sql = "SELECT leasewrap.lease_names()";
            let rows = self
                .client
                .query_typed(sql, &[])
                .await
                .map_err(|e| failed(&self.at, &e))?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    fn runs<'a>(
        &'a mut self,
        name: &'a str,
        max: usize,
        oldest_first: bool,
    ) -> SendBoxed<'a, Result<Vec<(String, String)>, Error>> {
        Box::pin(async move {
            let sql = "SELECT key, record FROM leasewrap.lease_runs($1, $2, $3)";
            let max = max.min(1000) as i32;
            let rows = self
                .client
                .query_typed(
                    sql,
                    &[
                        (&name, Type::TEXT),
                        (&max, Type::INT4),
                        (&oldest_first, Type::BOOL),
                    ],
                )
                .await
                .map_err(|e| failed(&self.at, &e))?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
    }
}

/// A token as the server prints numeric(20,0); 0 for what is not one.
fn parse_token(text: String) -> u64 {
    text.parse().unwrap_or(0)
}
