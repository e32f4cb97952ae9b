//! `leasewrap fence-sql DATABASE`: the SQL that installs the database fence (SPEC §7), as
//! shipped in sql/ and installed with the package. It only prints: it connects to nothing, and
//! the fence itself is the database's, checked inside the job's own transaction.

use std::io::Write;

use crate::cli::{FenceSqlArgs, FenceSqlDatabase};
use crate::error::Error;

/// sql/postgres-fence.sql, also installed as /usr/share/leasewrap/sql/postgres-fence.sql.
pub const POSTGRES: &str = include_str!("../sql/postgres-fence.sql");

/// sql/mariadb-fence.sql, also installed as /usr/share/leasewrap/sql/mariadb-fence.sql.
pub const MARIADB: &str = include_str!("../sql/mariadb-fence.sql");

/// The fence's SQL for `database`.
pub const fn text(database: FenceSqlDatabase) -> &'static str {
    match database {
        FenceSqlDatabase::Postgres => POSTGRES,
        FenceSqlDatabase::Mariadb => MARIADB,
    }
}

/// Print the SQL on stdout: status 0, or leasewrap's own failure when stdout cannot take it.
pub fn print(args: &FenceSqlArgs) -> Result<u8, Error> {
    let mut out = std::io::stdout().lock();
    out.write_all(text(args.database).as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| Error::internal("writing the SQL to standard output", e))?;
    Ok(0)
}
