//! One connection to MariaDB and the lease's statements on it, each one CALL of a procedure that
//! `leasewrap fence-sql mariadb` installs. The wire protocol, its authentication and TLS come
//! from mysql_async and rustls (on the ring provider already linked): nothing here speaks the
//! protocol itself. MariaDB has no notifications: a holder keeps a named lock (GET_LOCK) of its
//! lease while it holds it, and a waiter's pause waits on that lock, which a release (or the
//! holder's connection ending) lets go: the waiter reads the row within milliseconds of a
//! release, and polls where nobody holds the lock.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder, Row, SslOpts};

use super::{RowState, SendBoxed, Statements, SQL_VERSION_MARIADB};
use crate::config::database::{DbConfig, Host};
use crate::error::Error;
use crate::lease::timing::db::Renewal;
use crate::lease::timing::KeySeen;

/// A connection, and where it goes, for messages.
pub struct My {
    conn: Conn,
    at: String,
}

/// Where `cfg` points, for messages.
pub fn place(cfg: &DbConfig) -> String {
    match &cfg.host {
        Host::Tcp(h) => format!("MariaDB at {h}:{}", cfg.port),
        Host::Socket(s) => format!("MariaDB at {}", s.display()),
    }
}

/// Connect and log in within the dial timeout, and check the installed SQL's version.
pub async fn connect(cfg: &DbConfig) -> Result<My, Error> {
    let at = place(cfg);
    let opened = tokio::time::timeout(cfg.dial_timeout, Conn::new(options(cfg))).await;
    let conn = opened.map_err(|_| {
        Error::Unavailable(format!(
            "{at}: no answer within {} ms (is it MariaDB, and does it listen there? --dial-timeout, or connect_timeout in the URL, bound the wait)",
            cfg.dial_timeout.as_millis()
        ))
    })?;
    let mut my = My {
        conn: conn.map_err(|e| failed(&at, &e))?,
        at,
    };
    check_sql(&mut my, cfg).await?;
    Ok(my)
}

/// The client's options: no settings read at connect (two round trips fewer), no move to a
/// socket the server names.
fn options(cfg: &DbConfig) -> OptsBuilder {
    let b = OptsBuilder::default()
        .user(Some(&cfg.user))
        .pass(cfg.password.clone())
        .db_name(Some(&cfg.dbname).filter(|d| !d.is_empty()))
        .prefer_socket(false)
        .max_allowed_packet(Some(1 << 24))
        .wait_timeout(Some(28_800));
    let b = match &cfg.host {
        Host::Tcp(h) => b.ip_or_hostname(h.as_str()).tcp_port(cfg.port),
        Host::Socket(s) => b.socket(Some(s.display().to_string())),
    };
    match &cfg.tls {
        None => b,
        Some(ca) => b.ssl_opts(SslOpts::default().with_root_certs(vec![ca.clone().into()])),
    }
}

/// The installed SQL's version must be the one this leasewrap needs.
async fn check_sql(my: &mut My, cfg: &DbConfig) -> Result<(), Error> {
    let install = format!(
        "install it with: leasewrap fence-sql mariadb | mariadb --no-defaults --user=root (as an administrator), then CALL leasewrap.allow('{}', 'NAME')",
        cfg.user
    );
    let answer = my
        .conn
        .query_first::<i64, _>("CALL leasewrap.lease_sql()")
        .await;
    let version = match answer {
        Ok(v) => v.unwrap_or(0),
        // The procedure is not there: not installed, or a version without the lease.
        Err(mysql_async::Error::Server(e)) if e.code == 1305 || e.code == 1049 => 0,
        // Every account may run it where the SQL is installed (PUBLIC, from MariaDB 10.11 on),
        // so none may where it is not. On older servers an untied user cannot tell.
        Err(mysql_async::Error::Server(e)) if e.code == 1370 => {
            return Err(Error::Config(format!(
                "{}: the lease's SQL (version {SQL_VERSION_MARIADB}) is not installed ({}); {install} (before MariaDB 10.11, this is also what a user tied to no lease name sees)",
                my.at, e.message
            )))
        }
        Err(e) => return Err(failed(&my.at, &e)),
    };
    if version < i64::from(SQL_VERSION_MARIADB) {
        let what = match version {
            0 => format!("the lease's SQL (version {SQL_VERSION_MARIADB}) is not installed, or is older"),
            v => format!("the lease's SQL installed is version {v}, older than the {SQL_VERSION_MARIADB} this leasewrap needs"),
        };
        return Err(Error::Config(format!("{}: {what}: {install}", my.at)));
    }
    Ok(())
}

/// What a failure of the server or the connection means: refused credentials, rights or TLS are
/// 77, a bad name 64, anything else (no answer, not MariaDB) 69.
pub fn failed(at: &str, e: &mysql_async::Error) -> Error {
    if let mysql_async::Error::Server(s) = e {
        let what = format!("{at}: {} ({})", s.message, s.code);
        return match s.code {
            // Access denied (password, database), a name not tied.
            1044 | 1045 | 9104 => Error::Auth(what),
            // No EXECUTE on the lease's procedures: the user is tied to no name.
            1370 => Error::Auth(format!(
                "{what}: the user is tied to no lease name: an administrator ties it with CALL leasewrap.allow('USER', 'NAME')"
            )),
            9102 => Error::Usage(what),
            _ => Error::Unavailable(what),
        };
    }
    super::not_answered(at, e)
}

impl My {
    /// The one row a CALL answers, if any.
    async fn call(
        &mut self,
        procedure: &'static str,
        params: Vec<mysql_async::Value>,
    ) -> Result<Option<Row>, Error> {
        Ok(self.call_rows(procedure, params).await?.into_iter().next())
    }

    /// Every row a CALL answers.
    async fn call_rows(
        &mut self,
        procedure: &'static str,
        params: Vec<mysql_async::Value>,
    ) -> Result<Vec<Row>, Error> {
        self.conn
            .query(statement(procedure, &params))
            .await
            .map_err(|e| failed(&self.at, &e))
    }
}

/// `CALL leasewrap.PROCEDURE(...)` with `params` written in: one round trip, where a prepared
/// statement on a new connection costs a second one to prepare it. Text goes in as a hex literal
/// with its character set named, so no escaping (and no server's sql_mode) is involved; numbers
/// go in as the client library writes them.
fn statement(procedure: &str, params: &[mysql_async::Value]) -> String {
    let literal = |v: &mysql_async::Value| match v {
        mysql_async::Value::Bytes(b) => format!("_utf8mb4 X'{}'", crate::text::hex(b)),
        other => other.as_sql(true),
    };
    let args: Vec<String> = params.iter().map(literal).collect();
    format!("CALL leasewrap.{procedure}({})", args.join(", "))
}

impl My {
    /// Column `at` of a row the installed SQL answered.
    fn column<T: mysql_async::prelude::FromValue>(&self, row: &Row, at: usize) -> Result<T, Error> {
        row.get_opt(at)
            .and_then(Result::ok)
            .ok_or_else(|| self.odd())
    }

    /// The installed SQL answered what it never does (changed by hand?).
    fn odd(&self) -> Error {
        Error::Unavailable(format!(
            "{}: the lease's SQL answered what it does not answer (run leasewrap fence-sql mariadb again)",
            self.at
        ))
    }
}

impl Statements for My {
    fn read<'a>(&'a mut self, name: &'a str) -> SendBoxed<'a, Result<RowState, Error>> {
        Box::pin(async move {
            let row = self.call("lease_read", vec![name.into()]);
            let row = row.await?.ok_or_else(|| self.odd())?;
            Ok(RowState {
                version: self.column(&row, 0)?,
                token: self.column(&row, 1)?,
                held: self.column::<i64>(&row, 2)? != 0,
                ttl: Duration::from_millis(self.column(&row, 3)?),
                holder: self.column(&row, 4)?,
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
            let ttl_ms = ttl.as_millis() as u64;
            let params = vec![name.into(), seen.into(), ttl_ms.into(), holder.into()];
            let row = self.call("lease_take", params).await?;
            row.map(|r| self.column(&r, 0)).transpose()
        })
    }

    fn renew<'a>(&'a mut self, name: &'a str, token: u64) -> SendBoxed<'a, Result<Renewal, Error>> {
        Box::pin(async move {
            let row = self.call("lease_renew", vec![name.into(), token.into()]);
            let row = row.await?.ok_or_else(|| self.odd())?;
            let (renewed, held): (i64, i64) = (self.column(&row, 0)?, self.column(&row, 1)?);
            Ok(match (renewed != 0, held != 0) {
                (true, _) => Renewal::Renewed,
                (false, true) => Renewal::Refused(KeySeen::Replaced),
                (false, false) => Renewal::Refused(KeySeen::Gone),
            })
        })
    }

    fn release<'a>(&'a mut self, name: &'a str, token: u64) -> SendBoxed<'a, Result<(), Error>> {
        Box::pin(async move {
            self.call("lease_release", vec![name.into(), token.into()])
                .await?;
            Ok(())
        })
    }

    /// Wait on the holder's named lock, unless the row moved since `seen`; where nobody holds
    /// the lock, sleep out the nap (a poll).
    fn pause<'a>(
        &'a mut self,
        name: &'a str,
        seen: u64,
        nap: Duration,
    ) -> SendBoxed<'a, Result<(), Error>> {
        Box::pin(async move {
            let started = Instant::now();
            let params = vec![name.into(), seen.into(), nap.as_secs_f64().into()];
            let row = self.call("lease_wait", params).await?;
            let released = match row {
                Some(r) => self.column::<i64>(&r, 0)? == 1,
                None => false,
            };
            if released {
                tracing::debug!("woken by a release");
            } else {
                tokio::time::sleep(nap.saturating_sub(started.elapsed())).await;
            }
            Ok(())
        })
    }

    /// Nothing to send: the lease's procedures wait at most 1 s for a row lock
    /// (innodb_lock_wait_timeout), so the server ends a take queued behind another session's
    /// lock itself. (`KILL QUERY` would not do: the statement runs as the procedures' definer,
    /// whose threads the user does not own.)
    fn cancel(&self) -> SendBoxed<'static, ()> {
        Box::pin(std::future::ready(()))
    }

    fn run_read<'a>(
        &'a mut self,
        name: &'a str,
        key: &'a str,
    ) -> SendBoxed<'a, Result<Option<String>, Error>> {
        Box::pin(async move {
            let params = vec![name.into(), key.into()];
            let row = self.call("lease_run_read", params).await?;
            row.map(|r| self.column(&r, 0)).transpose()
        })
    }

    /// One procedure both stores and (with a NULL record) deletes.
    fn run_write<'a>(
        &'a mut self,
        name: &'a str,
        token: u64,
        key: &'a str,
        record: Option<&'a str>,
    ) -> SendBoxed<'a, Result<bool, Error>> {
        Box::pin(async move {
            let params = vec![name.into(), token.into(), key.into(), record.into()];
            let row = self.call("lease_run_write", params);
            let row = row.await?.ok_or_else(|| self.odd())?;
            Ok(self.column::<i64>(&row, 0)? == 1)
        })
    }

    fn names(&mut self) -> SendBoxed<'_, Result<Vec<String>, Error>> {
        Box::pin(async move {
            let rows = self.call_rows("lease_names", Vec::new()).await?;
            rows.iter().map(|r| self.column(r, 0)).collect()
        })
    }

    fn runs<'a>(
        &'a mut self,
        name: &'a str,
        max: usize,
        oldest_first: bool,
    ) -> SendBoxed<'a, Result<Vec<(String, String)>, Error>> {
        Box::pin(async move {
            let params: Vec<mysql_async::Value> = vec![
                name.into(),
                (max.min(1000) as u64).into(),
                oldest_first.into(),
            ];
            let rows = self.call_rows("lease_runs", params).await?;
            rows.iter()
                .map(|r| Ok((self.column(r, 0)?, self.column(r, 1)?)))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::statement;

    #[test]
    fn a_statement_writes_text_as_hex_and_numbers_as_digits() {
        let params = vec![
            "a'b\\".into(),
            7u64.into(),
            0.25f64.into(),
            None::<String>.into(),
        ];
        assert_eq!(
            statement("lease_x", &params),
            "CALL leasewrap.lease_x(_utf8mb4 X'6127625c', 7, 0.25, NULL)"
        );
        assert_eq!(
            statement("lease_names", &[]),
            "CALL leasewrap.lease_names()"
        );
    }
}
