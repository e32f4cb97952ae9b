-- leasewrap's database fence and lease for MariaDB, version 3 (MariaDB 10.4 or later; tested with 10.11),
-- printed by `leasewrap fence-sql mariadb` and installed as
-- /usr/share/leasewrap/sql/mariadb-fence.sql. It uses MariaDB's own statements (BEGIN NOT
-- ATOMIC, CREATE OR REPLACE PROCEDURE, @@in_transaction): it does not run on MySQL.
--
-- Install or upgrade, as an administrator (root), as often as you like (it checks what is there
-- first, and changes nothing when it refuses):
--     mariadb --no-defaults --user=root < mariadb-fence.sql
-- Then let each job's user fence its names (a NAME, or a PREFIX*):
--     CALL leasewrap.allow('report_job', 'report');
--
-- A job run by leasewrap calls the fence first in its own transaction:
--     START TRANSACTION;
--     CALL leasewrap.fence(@name, @token);
--     ... the job's writes ...
--     COMMIT;
-- with @name and @token set from LEASEWRAP_NAME and LEASEWRAP_FENCING_TOKEN (docs/fencing.md).
--
-- The fence locks the row of NAME until the transaction ends: a newer holder's fence waits for
-- an older holder's transaction (at most innodb_lock_wait_timeout, then error 1205) and then
-- sees what it committed. A token lower than the one recorded is refused with SQLSTATE LWF01
-- before the transaction writes anything; bad input with LWF02; a call outside a transaction,
-- in a read-only one or with autocommit off, with LWF03; a user not allowed NAME with 42000.
-- Their error numbers are 9101, 9102, 9103 and 9104, for drivers that show no SQLSTATE. An
-- equal token is allowed.
--
-- A statement that commits on its own (DDL, TRUNCATE, LOCK TABLES, a second START TRANSACTION)
-- ends the transaction and the fence with it: after the fence, the session's later transactions
-- are read-only (tx_read_only), so that whatever the job writes after such a commit fails (error
-- 1792) instead of landing unfenced. A session that runs another fenced transaction starts it
-- with START TRANSACTION READ WRITE. The fence runs only with autocommit on, where SET
-- autocommit = 1 commits nothing.
--
-- The lease (`leasewrap --database mariadb://... --name NAME -- COMMAND`, docs/database.md) lives
-- here too, on the same ties: the procedures lease_take, lease_renew, lease_release and
-- lease_read (SQL SECURITY DEFINER; EXECUTE for the users tied to a name) change or read the row
-- of NAME in leasewrap.lease, each change in one statement, and a user may use only the names it
-- is tied to; lease_wait waits for a release (a holder keeps the named lock
-- leasewrap:MD5(NAME), GET_LOCK's, while it holds the lease: a hint, never the lease itself);
-- lease_sql tells leasewrap which version is installed. No procedure reads a clock: leasewrap
-- times the lease on its hosts' monotonic clocks.
--
-- What it makes: the account 'leasewrap_fence'@'localhost' (locked: nobody logs in as it; it
-- is the fence's definer, with rights on the fence's own tables and nothing else), the database
-- leasewrap with the tables fence (NAME -> highest token), allowed (user -> NAME or PREFIX*)
-- and installed (this version), and the procedures fence(name, token) (SQL SECURITY DEFINER,
-- EXECUTE granted per job user), fences() (every name and its token, for the accounts an
-- administrator grants it to), allow(user, names) and disallow(user, names) (for
-- administrators), the procedure check_call() the fence's uncommon calls go through, and the
-- functions covers(names, name) and may_use(user, name) they share. No other account may have a
-- right on the database leasewrap but EXECUTE: with SELECT on its tables, SELECT ... FOR UPDATE
-- would hold every name's row.

-- The procedures keep the sql_mode and character set they were made with: these, whatever the
-- installing session had, and not the caller's.
SET SESSION sql_mode = 'STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION,NO_ZERO_DATE,NO_ZERO_IN_DATE';
SET NAMES utf8mb4 COLLATE utf8mb4_bin;
-- No statement here waits long for a lock a job holds.
SET SESSION lock_wait_timeout = 3;
SET SESSION innodb_lock_wait_timeout = 3;

DELIMITER //

-- What is there already, and whether this script may build on it. Every refusal comes before
-- anything is changed: the checks leave it in @leasewrap_refused, and the statement after them
-- stops the script with it (the client shows the statement that failed: that one is short).
BEGIN NOT ATOMIC
    DECLARE refused TEXT;
    DECLARE installed INT;
    SET @leasewrap_refused = NULL;
    checks: BEGIN
        IF EXISTS (SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = 'leasewrap')
           AND NOT EXISTS (SELECT 1 FROM information_schema.TABLES
                           WHERE TABLE_SCHEMA = 'leasewrap' AND TABLE_NAME = 'installed') THEN
            SET @leasewrap_refused =
                'leasewrap fence: a database leasewrap exists that this script did not make (it has no leasewrap.installed): find out who made it and what is in it, drop it, and run this again';
            LEAVE checks;
        END IF;
        IF EXISTS (SELECT 1 FROM information_schema.TABLES
                   WHERE TABLE_SCHEMA = 'leasewrap' AND TABLE_NAME = 'installed') THEN
            SELECT MAX(version) INTO installed FROM leasewrap.installed;
        END IF;
        IF installed > 3 THEN
            SET @leasewrap_refused = CONCAT('leasewrap fence: version ', installed,
                ' is installed, and this script is version 3: use the fence-sql of the leasewrap that made it, or a newer one');
            LEAVE checks;
        END IF;
        -- What this script does not make, in the database leasewrap (a trigger on its tables runs
        -- inside every fence), and what would run as the fence's definer elsewhere.
        SELECT GROUP_CONCAT(what ORDER BY what SEPARATOR '; ') INTO refused FROM (
            SELECT CONCAT('table leasewrap.', TABLE_NAME) AS what FROM information_schema.TABLES
                WHERE TABLE_SCHEMA = 'leasewrap' AND TABLE_NAME NOT IN ('fence', 'allowed', 'installed', 'lease', 'run')
            UNION ALL
            SELECT CONCAT(LOWER(ROUTINE_TYPE), ' ', ROUTINE_SCHEMA, '.', ROUTINE_NAME)
                FROM information_schema.ROUTINES
                WHERE (ROUTINE_SCHEMA = 'leasewrap'
                       AND ROUTINE_NAME NOT IN ('fence', 'fences', 'allow', 'disallow', 'grant_fence', 'may_use',
                                            'covers', 'check_call', 'lease_caller', 'lease_sql', 'lease_read',
                                            'lease_take', 'lease_renew', 'lease_release', 'lease_wait', 'lease_hint',
                                            'lease_run_read', 'lease_run_write', 'lease_runs', 'lease_names'))
                   OR (ROUTINE_SCHEMA <> 'leasewrap' AND DEFINER = 'leasewrap_fence@localhost')
            UNION ALL
            SELECT CONCAT('trigger ', TRIGGER_SCHEMA, '.', TRIGGER_NAME) FROM information_schema.TRIGGERS
                WHERE EVENT_OBJECT_SCHEMA = 'leasewrap' OR TRIGGER_SCHEMA = 'leasewrap'
                   OR DEFINER = 'leasewrap_fence@localhost'
            UNION ALL
            SELECT CONCAT('view ', TABLE_SCHEMA, '.', TABLE_NAME) FROM information_schema.VIEWS
                WHERE DEFINER = 'leasewrap_fence@localhost'
            UNION ALL
            SELECT CONCAT('event ', EVENT_SCHEMA, '.', EVENT_NAME) FROM information_schema.EVENTS
                WHERE EVENT_SCHEMA = 'leasewrap' OR DEFINER = 'leasewrap_fence@localhost'
        ) AS found;
        IF refused IS NOT NULL THEN
            SET @leasewrap_refused = LEFT(CONCAT('leasewrap fence: not made by this script, or running as its definer leasewrap_fence: ',
                refused, ': find out who made it, drop it, and run this again'), 500);
            LEAVE checks;
        END IF;
        -- Another account's right on the database leasewrap (by its name or a wildcard that matches
        -- it), a table, a column or a routine of it: it could rewrite the fence's rows, hold them
        -- (SELECT ... FOR UPDATE needs only SELECT), or change a procedure. Only EXECUTE is given
        -- out; version 1's SELECT on the fence table is made EXECUTE on fences() below.
        SELECT GROUP_CONCAT(what ORDER BY what SEPARATOR '; ') INTO refused FROM (
            SELECT CONCAT(QUOTE(d.User), '@', QUOTE(d.Host), ' on ', d.Db, '.*') AS what
                FROM mysql.db AS d
                WHERE 'leasewrap' LIKE d.Db AND NOT (d.User = 'leasewrap_fence' AND d.Host = 'localhost')
                  AND 'Y' IN (d.Select_priv, d.Insert_priv, d.Update_priv, d.Delete_priv, d.Create_priv,
                              d.Drop_priv, d.Grant_priv, d.References_priv, d.Index_priv, d.Alter_priv,
                              d.Create_tmp_table_priv, d.Lock_tables_priv, d.Create_view_priv,
                              d.Show_view_priv, d.Create_routine_priv, d.Alter_routine_priv,
                              d.Event_priv, d.Trigger_priv, d.Delete_history_priv)
            UNION ALL
            SELECT CONCAT(QUOTE(t.User), '@', QUOTE(t.Host), ' on leasewrap.', t.Table_name)
                FROM mysql.tables_priv AS t
                WHERE t.Db = 'leasewrap' AND NOT (t.User = 'leasewrap_fence' AND t.Host = 'localhost')
                  AND (t.Table_priv <> '' OR t.Column_priv <> '')
                  AND NOT (installed = 1 AND t.Table_name = 'fence' AND t.Table_priv = 'Select'
                           AND t.Column_priv = '')
            UNION ALL
            SELECT CONCAT(QUOTE(c.User), '@', QUOTE(c.Host), ' on leasewrap.', c.Table_name, '(', c.Column_name, ')')
                FROM mysql.columns_priv AS c
                WHERE c.Db = 'leasewrap' AND NOT (c.User = 'leasewrap_fence' AND c.Host = 'localhost')
            UNION ALL
            SELECT CONCAT(QUOTE(p.User), '@', QUOTE(p.Host), ' on ', LOWER(p.Routine_type), ' leasewrap.', p.Routine_name)
                FROM mysql.procs_priv AS p
                WHERE p.Db = 'leasewrap' AND p.Proc_priv NOT IN ('', 'Execute')
        ) AS found;
        IF refused IS NOT NULL THEN
            SET @leasewrap_refused = LEFT(CONCAT('leasewrap fence: the account ', refused,
                ' may change the database leasewrap, or hold its rows: revoke that (it may be given EXECUTE on leasewrap.fences() to read), and run this again'), 500);
            LEAVE checks;
        END IF;
        IF EXISTS (SELECT 1 FROM mysql.global_priv
                   WHERE User = 'leasewrap_fence' AND Host = 'localhost'
                     AND JSON_VALUE(Priv, '$.access') <> '0') THEN
            SET @leasewrap_refused =
                'leasewrap fence: the account leasewrap_fence@localhost has global privileges, which the fence''s definer must not have: find out who gave them, revoke them, and run this again';
            LEAVE checks;
        END IF;
        -- What cannot be refused (an administrator's own rights) is named: these accounts may change
        -- any database, or the grant tables and the procedures' text in mysql, and are as trusted
        -- as root.
        SELECT GROUP_CONCAT(CONCAT(QUOTE(u.User), '@', QUOTE(u.Host)) ORDER BY u.User, u.Host SEPARATOR ', ')
            INTO refused
            FROM mysql.user AS u
            WHERE CONCAT(u.User, '@', u.Host) <> CURRENT_USER()
              AND ('Y' IN (u.Select_priv, u.Insert_priv, u.Update_priv, u.Delete_priv, u.Create_priv,
                           u.Drop_priv, u.Grant_priv, u.Index_priv, u.Alter_priv, u.Super_priv,
                           u.Lock_tables_priv, u.Create_routine_priv, u.Alter_routine_priv,
                           u.Create_user_priv, u.Trigger_priv, u.Delete_history_priv)
                   -- SET USER (1 << 30): it makes objects whose definer is any account.
                   OR EXISTS (SELECT 1 FROM mysql.global_priv AS g
                              WHERE g.User = u.User AND g.Host = u.Host
                                AND CAST(JSON_VALUE(g.Priv, '$.access') AS UNSIGNED) & 1073741824 <> 0)
                   OR EXISTS (SELECT 1 FROM mysql.db AS d
                              WHERE d.User = u.User AND d.Host = u.Host AND 'mysql' LIKE d.Db
                                AND 'Y' IN (d.Insert_priv, d.Update_priv, d.Delete_priv, d.Create_priv,
                                            d.Drop_priv, d.Alter_priv, d.Grant_priv)));
        IF refused IS NOT NULL THEN
            SELECT CONCAT('leasewrap fence: these accounts may change any database (or mysql''s grant tables), the fence''s included, and are as trusted as an administrator: ',
                          refused) AS `note`;
        END IF;
    END checks;
END //

-- Refused: nothing was changed.
BEGIN NOT ATOMIC IF @leasewrap_refused IS NOT NULL THEN SIGNAL SQLSTATE 'HY000' SET MESSAGE_TEXT = @leasewrap_refused; END IF; END //

DELIMITER ;

CREATE USER IF NOT EXISTS 'leasewrap_fence'@'localhost' ACCOUNT LOCK;
ALTER USER 'leasewrap_fence'@'localhost' ACCOUNT LOCK;

CREATE DATABASE IF NOT EXISTS leasewrap CHARACTER SET ascii COLLATE ascii_bin;

-- One row per lease NAME: the highest fencing token a transaction has committed under.
-- BIGINT UNSIGNED holds every u64. InnoDB, whatever the server's default engine: its row locks
-- are the fence.
CREATE TABLE IF NOT EXISTS leasewrap.fence (
    name VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    token BIGINT UNSIGNED NOT NULL,
    fenced_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    CONSTRAINT fence_name_check CHECK (name REGEXP '^[A-Za-z0-9._@:+=-]{1,128}\\z')
) ENGINE = InnoDB;

-- Which users may fence which names: a NAME, or a PREFIX followed by * (every name that starts
-- with PREFIX; * alone is every name). A user is a user name, whatever host it connects from.
-- Aria, not InnoDB: the fence reads it inside the job's transaction before it locks NAME's row,
-- and an InnoDB read there would either start the transaction's snapshot before the wait (a
-- plain read) or hold locks on this table until the job commits (a read inside IF, which
-- InnoDB makes a locking one).
CREATE TABLE IF NOT EXISTS leasewrap.allowed (
    user VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    names VARCHAR(129) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    PRIMARY KEY (user, names),
    CONSTRAINT allowed_names_check
        CHECK (names REGEXP '^([A-Za-z0-9._@:+=-]{1,128}|[A-Za-z0-9._@:+=-]{0,127}[*])\\z')
) ENGINE = Aria;

-- The version installed.
CREATE TABLE IF NOT EXISTS leasewrap.installed (
    version INT NOT NULL,
    installed_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE = InnoDB;

-- One row per lease NAME (docs/database.md): version moves with every change, token with every
-- take (never reused: a row is never deleted), ttl_ms is the holder's L, holder who it is
-- (JSON). Every change is a compare-and-set on version or token, in one statement.
CREATE TABLE IF NOT EXISTS leasewrap.lease (
    name VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    version BIGINT UNSIGNED NOT NULL,
    token BIGINT UNSIGNED NOT NULL,
    held BOOLEAN NOT NULL,
    ttl_ms BIGINT UNSIGNED NOT NULL,
    holder TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    CONSTRAINT lease_name_check CHECK (name REGEXP '^[A-Za-z0-9._@:+=-]{1,128}\\z')
) ENGINE = InnoDB;

-- The run records of --once and --once-per (SPEC §10): one row per (NAME, KEY), the record's
-- JSON as leasewrap writes it. Written and deleted only by NAME's holder, under its token.
CREATE TABLE IF NOT EXISTS leasewrap.run (
    name VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    `key` VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    record TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    PRIMARY KEY (name, `key`),
    CONSTRAINT run_name_check CHECK (name REGEXP '^[A-Za-z0-9._@:+=-]{1,128}\\z'),
    CONSTRAINT run_key_check CHECK (`key` REGEXP '^[A-Za-z0-9._@:+=-]{1,128}\\z')
) ENGINE = InnoDB;

-- The definer's rights: its own tables, nothing else.
GRANT SELECT, INSERT, UPDATE ON leasewrap.fence TO 'leasewrap_fence'@'localhost';
GRANT SELECT ON leasewrap.allowed TO 'leasewrap_fence'@'localhost';
GRANT SELECT, INSERT, UPDATE ON leasewrap.lease TO 'leasewrap_fence'@'localhost';
GRANT SELECT, INSERT, UPDATE, DELETE ON leasewrap.run TO 'leasewrap_fence'@'localhost';

DELIMITER //

-- Whether a tie (a NAME, PREFIX* or *) covers the lease name NAME: the one rule of what a tie
-- covers, for who may use a name and for the overlaps allow() names.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
FUNCTION leasewrap.covers(p_names VARCHAR(129) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
                          p_name VARCHAR(129) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
RETURNS BOOLEAN
DETERMINISTIC
NO SQL
SQL SECURITY DEFINER
RETURN p_names = p_name
       OR (RIGHT(p_names, 1) = '*'
           AND LEFT(p_name, CHAR_LENGTH(p_names) - 1) = LEFT(p_names, CHAR_LENGTH(p_names) - 1)) //

-- Whether user may use the lease name NAME: one of its ties covers NAME. Every procedure that
-- uses a name asks here.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
FUNCTION leasewrap.may_use(p_user VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
                           p_name VARCHAR(129) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
RETURNS BOOLEAN
READS SQL DATA
SQL SECURITY DEFINER
RETURN EXISTS (SELECT 1 FROM leasewrap.allowed AS a
               WHERE a.user = p_user AND leasewrap.covers(a.names, p_name)) //

-- The checks of a fence's call that is not the common case, in the order their errors come: a
-- lease name (LWF02), a token (LWF02; the fence has checked it: p_token_ok), a transaction with
-- autocommit on (LWF03), a tie of the calling user's (p_caller) that covers NAME (42000).
-- Returns when all pass. Both arguments are compared byte for byte: a case-insensitive collation
-- would take the Kelvin sign for a K.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.check_call(IN p_name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
                               IN p_token LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
                               IN p_token_ok BOOLEAN,
                               IN p_caller VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
READS SQL DATA
SQL SECURITY DEFINER
BEGIN
    DECLARE message TEXT CHARACTER SET utf8mb4;
    IF p_name IS NULL OR p_name NOT REGEXP '^[A-Za-z0-9._@:+=-]{1,128}\\z' THEN
        SET message = CONCAT('leasewrap.fence: the lease name ',
            IFNULL(JSON_QUOTE(LEFT(p_name, 64)), 'NULL'),
            IF(CHAR_LENGTH(p_name) > 64, CONCAT(' (', CHAR_LENGTH(p_name), ' characters)'), ''),
            ' is not 1 to 128 ASCII letters, digits and ._-@:+=');
        SIGNAL SQLSTATE 'LWF02' SET MYSQL_ERRNO = 9102, MESSAGE_TEXT = message;
    END IF;
    IF NOT p_token_ok THEN
        SET message = CONCAT('leasewrap.fence: fencing token ',
            IFNULL(JSON_QUOTE(LEFT(p_token, 64)), 'NULL'), ' for "', p_name,
            '" is not a whole number from 0 to 18446744073709551615');
        SIGNAL SQLSTATE 'LWF02' SET MYSQL_ERRNO = 9102, MESSAGE_TEXT = message;
    END IF;
    -- With autocommit off, a later SET autocommit = 1 would commit the transaction, and MariaDB
    -- runs the one statement after it with this transaction's characteristics, not the
    -- session's read-only ones: it would write unfenced. With autocommit on it changes nothing.
    IF @@autocommit = 0 THEN
        SIGNAL SQLSTATE 'LWF03' SET MYSQL_ERRNO = 9103, MESSAGE_TEXT =
            'leasewrap.fence: called with autocommit off, where a later SET autocommit = 1 would end the fence: SET autocommit = 1, then START TRANSACTION, the fence, the writes and COMMIT';
    END IF;
    -- Outside a transaction the row lock would end with this call.
    IF @@in_transaction = 0 THEN
        SIGNAL SQLSTATE 'LWF03' SET MYSQL_ERRNO = 9103, MESSAGE_TEXT =
            'leasewrap.fence: called outside a transaction: START TRANSACTION first, then the fence, the writes and COMMIT';
    END IF;
    IF NOT leasewrap.may_use(p_caller, p_name) THEN
        SET message = CONCAT('leasewrap.fence: user ', JSON_QUOTE(p_caller), ' may not fence "',
            p_name, '": an administrator ties names to users with CALL leasewrap.allow(user, names)');
        SIGNAL SQLSTATE '42000' SET MYSQL_ERRNO = 9104, MESSAGE_TEXT = message;
    END IF;
END //

-- The fence. Every bad input gets LWF02: both arguments are taken as text and checked, a name by
-- leasewrap's own rule for lease names, a token as a decimal u64.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.fence(IN p_name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
                          IN p_token LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
MODIFIES SQL DATA
SQL SECURITY DEFINER
BEGIN
    -- USER() is the account that logged in (CURRENT_USER() here is the definer); the user name
    -- is what comes before its last @.
    DECLARE caller VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
        DEFAULT LEFT(USER(), CHAR_LENGTH(USER()) - LOCATE('@', REVERSE(USER())));
    -- A fencing token: 1 to 20 digits, at most 2^64-1.
    DECLARE token_ok BOOLEAN DEFAULT IFNULL(p_token REGEXP '^[0-9]{1,20}\\z'
        AND NOT (CHAR_LENGTH(p_token) = 20 AND p_token > '18446744073709551615'), FALSE);
    DECLARE stored BIGINT UNSIGNED;
    DECLARE message TEXT CHARACTER SET utf8mb4;
    DECLARE EXIT HANDLER FOR 1792
        SIGNAL SQLSTATE 'LWF03' SET MYSQL_ERRNO = 9103, MESSAGE_TEXT =
            'leasewrap.fence: called in a read-only transaction (after a fence, the session''s later transactions are read-only): start a fenced transaction with START TRANSACTION READ WRITE';
    -- Each statement here costs about what the job's own one-row update does, so the common case
    -- takes one test: a token, a transaction with autocommit on, and a tie of the calling user's
    -- to NAME itself (so NAME is a lease name: the tie's CHECK says so), looked up by its key.
    -- Anything else is checked by check_call(), whose errors come in their order.
    IF NOT (token_ok AND @@autocommit = 1 AND @@in_transaction = 1
            AND EXISTS (SELECT 1 FROM leasewrap.allowed AS a
                        WHERE a.user = caller AND a.names = CONVERT(p_name USING ascii) COLLATE ascii_bin)) THEN
        CALL leasewrap.check_call(p_name, p_token, token_ok, caller);
    END IF;
    -- NAME's row, made or locked in one statement. On a row that exists it locks that row alone
    -- (exclusively, until the transaction ends): it waits for the transaction that holds the
    -- row and reads the newest committed token, whatever this transaction's snapshot, and a
    -- refused fence keeps the row locked too. A missing row is inserted: no gap of the index
    -- is locked, so a first fence of a new name waits for no other name's. The token moves only
    -- up; an update counts 2 rows, an insert 1 and a refusal 0 (1 for a client that counts rows
    -- found).
    INSERT INTO leasewrap.fence (name, token) VALUES (p_name, p_token)
        ON DUPLICATE KEY UPDATE
            fenced_at = IF(token <= VALUES(token), CURRENT_TIMESTAMP(6), fenced_at),
            token = IF(token <= VALUES(token), VALUES(token), token);
    IF ROW_COUNT() <> 2 THEN
        -- The row is this transaction's now: the read waits for nobody. NAME in the column's own
        -- type, so that the key is used and only its row is read.
        SELECT f.token INTO stored FROM leasewrap.fence AS f
            WHERE f.name = CONVERT(p_name USING ascii) COLLATE ascii_bin FOR UPDATE;
        IF stored > CAST(p_token AS UNSIGNED) THEN
            SET message = CONCAT('stale fencing token ', CAST(p_token AS UNSIGNED), ' for "', p_name,
                '": ', stored, ' is recorded');
            SIGNAL SQLSTATE 'LWF01' SET MYSQL_ERRNO = 9101, MESSAGE_TEXT = message;
        END IF;
    END IF;
    -- A statement that commits on its own ends this transaction, and the row lock with it: the
    -- session's next transactions are read-only, so that the job's writes after such a commit
    -- fail instead of landing unfenced. This transaction stays as it began.
    SET SESSION tx_read_only = 1;
END //

-- A definer must itself be allowed to run what it defines.
GRANT EXECUTE ON PROCEDURE leasewrap.fence TO 'leasewrap_fence'@'localhost' //
GRANT EXECUTE ON FUNCTION leasewrap.may_use TO 'leasewrap_fence'@'localhost' //
GRANT EXECUTE ON FUNCTION leasewrap.covers TO 'leasewrap_fence'@'localhost' //
GRANT EXECUTE ON PROCEDURE leasewrap.check_call TO 'leasewrap_fence'@'localhost' //

-- Every name and its token, for the accounts an administrator lets read them
-- (GRANT EXECUTE ON PROCEDURE leasewrap.fences TO ...): no other account may read the table
-- itself, since SELECT ... FOR UPDATE would hold its rows.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.fences()
READS SQL DATA
SQL SECURITY DEFINER
SELECT f.name, f.token, f.fenced_at FROM leasewrap.fence AS f ORDER BY f.name //

GRANT EXECUTE ON PROCEDURE leasewrap.fences TO 'leasewrap_fence'@'localhost' //

-- The lease's procedures. Each checks NAME and the calling user's tie (lease_caller) first.
-- USER() is the account that logged in (CURRENT_USER() here is the definer).
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.lease_caller(IN p_name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
READS SQL DATA
SQL SECURITY DEFINER
BEGIN
    DECLARE caller VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
        DEFAULT LEFT(USER(), CHAR_LENGTH(USER()) - LOCATE('@', REVERSE(USER())));
    DECLARE message TEXT CHARACTER SET utf8mb4;
    IF p_name IS NULL OR p_name NOT REGEXP '^[A-Za-z0-9._@:+=-]{1,128}\\z' THEN
        SET message = CONCAT('leasewrap lease: the lease name ',
            IFNULL(JSON_QUOTE(LEFT(p_name, 64)), 'NULL'),
            ' is not 1 to 128 ASCII letters, digits and ._-@:+=');
        SIGNAL SQLSTATE 'LWF02' SET MYSQL_ERRNO = 9102, MESSAGE_TEXT = message;
    END IF;
    IF NOT leasewrap.may_use(caller, p_name) THEN
        SET message = CONCAT('leasewrap lease: user ', JSON_QUOTE(caller), ' may not use the lease "',
            p_name, '": an administrator ties names to users with CALL leasewrap.allow(user, names)');
        SIGNAL SQLSTATE '42000' SET MYSQL_ERRNO = 9104, MESSAGE_TEXT = message;
    END IF;
END //

-- The version of this SQL, which leasewrap checks before it takes a lease.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.lease_sql()
NO SQL
SQL SECURITY DEFINER
SELECT 3 AS version //

-- The row of NAME; a name never taken reads as version 0, free.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.lease_read(IN p_name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
READS SQL DATA
SQL SECURITY DEFINER
BEGIN
    CALL leasewrap.lease_caller(p_name);
    SELECT l.version, l.token, l.held, l.ttl_ms, l.holder FROM leasewrap.lease AS l
        WHERE l.name = CONVERT(p_name USING ascii) COLLATE ascii_bin
    UNION ALL
    SELECT 0, 0, FALSE, 0, ''
        WHERE NOT EXISTS (SELECT 1 FROM leasewrap.lease AS l
                          WHERE l.name = CONVERT(p_name USING ascii) COLLATE ascii_bin)
    LIMIT 1;
END //

-- Take NAME: a compare-and-set on the version p_seen a read found (0: a row never taken). The
-- token moves up by one; the answer is the new token, or no row when the version moved. The
-- holder keeps the named lock of NAME from here on, for lease_wait's waiters.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.lease_take(IN p_name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
                               IN p_seen BIGINT UNSIGNED, IN p_ttl_ms BIGINT UNSIGNED,
                               IN p_holder LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
MODIFIES SQL DATA
SQL SECURITY DEFINER
BEGIN
    DECLARE taken BIGINT UNSIGNED;
    -- Another session's lock on the row is waited for 1 s at most (error 1205 then): a take
    -- that leasewrap gave up on cannot commit long after, for no one.
    SET SESSION innodb_lock_wait_timeout = 1;
    CALL leasewrap.lease_caller(p_name);
    IF p_seen IS NULL OR p_ttl_ms IS NULL OR p_ttl_ms < 1000 OR p_ttl_ms > 315360000000
       OR p_holder IS NULL OR CHAR_LENGTH(p_holder) > 4096 THEN
        SIGNAL SQLSTATE 'LWF02' SET MYSQL_ERRNO = 9102,
            MESSAGE_TEXT = 'leasewrap lease: a take needs a version, a ttl_ms of 1000 to 315360000000 and a holder of at most 4096 characters';
    END IF;
    IF p_seen = 0 THEN
        -- A row that exists already is left as it is: it counts 0 rows.
        INSERT INTO leasewrap.lease (name, version, token, held, ttl_ms, holder)
            VALUES (p_name, 1, 1, TRUE, p_ttl_ms, p_holder)
            ON DUPLICATE KEY UPDATE name = name;
        IF ROW_COUNT() = 1 THEN
            SET taken = 1;
        END IF;
    ELSE
        -- The new token is set aside by the very statement that makes it.
        UPDATE leasewrap.lease AS l
            SET l.version = l.version + 1, l.token = (@leasewrap_token := l.token + 1), l.held = TRUE,
                l.ttl_ms = p_ttl_ms, l.holder = p_holder
            WHERE l.name = CONVERT(p_name USING ascii) COLLATE ascii_bin AND l.version = p_seen
              AND l.token < 18446744073709551615;
        IF ROW_COUNT() = 1 THEN
            SET taken = @leasewrap_token;
        END IF;
        SET @leasewrap_token = NULL;
    END IF;
    IF taken IS NOT NULL THEN
        CALL leasewrap.lease_hint(p_name);
        SELECT taken AS token;
    END IF;
END //

-- Renew NAME: a compare-and-set on the holder's token; the version moves. renewed is false when
-- the row is another holder's (token) or free (held).
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.lease_renew(IN p_name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
                                IN p_token BIGINT UNSIGNED)
MODIFIES SQL DATA
SQL SECURITY DEFINER
BEGIN
    -- Another session's lock on the row is waited for 1 s at most (error 1205 then): a take
    -- that leasewrap gave up on cannot commit long after, for no one.
    SET SESSION innodb_lock_wait_timeout = 1;
    CALL leasewrap.lease_caller(p_name);
    UPDATE leasewrap.lease AS l SET l.version = l.version + 1
        WHERE l.name = CONVERT(p_name USING ascii) COLLATE ascii_bin AND l.token = p_token AND l.held;
    IF ROW_COUNT() = 1 THEN
        CALL leasewrap.lease_hint(p_name);
        SELECT TRUE AS renewed, TRUE AS held;
    ELSE
        SELECT FALSE AS renewed, IFNULL(MAX(l.held), FALSE) AS held FROM leasewrap.lease AS l
            WHERE l.name = CONVERT(p_name USING ascii) COLLATE ascii_bin;
    END IF;
END //

-- Release NAME: a compare-and-set on the holder's token; the row is free and the version moves,
-- and the named lock goes, which wakes the waiters in lease_wait.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.lease_release(IN p_name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
                                  IN p_token BIGINT UNSIGNED)
MODIFIES SQL DATA
SQL SECURITY DEFINER
BEGIN
    DECLARE hint VARCHAR(64) CHARACTER SET ascii DEFAULT CONCAT('leasewrap:', MD5(p_name));
    DECLARE released BOOLEAN;
    -- Another session's lock on the row is waited for 1 s at most (error 1205 then): a take
    -- that leasewrap gave up on cannot commit long after, for no one.
    SET SESSION innodb_lock_wait_timeout = 1;
    CALL leasewrap.lease_caller(p_name);
    UPDATE leasewrap.lease AS l SET l.version = l.version + 1, l.held = FALSE
        WHERE l.name = CONVERT(p_name USING ascii) COLLATE ascii_bin AND l.token = p_token AND l.held;
    SET released = ROW_COUNT() = 1;
    IF IS_USED_LOCK(hint) = CONNECTION_ID() THEN
        DO RELEASE_LOCK(hint);
    END IF;
    SELECT released;
END //

-- The holder's named lock of NAME, taken when nobody has it: while it is held, a waiter's
-- lease_wait waits for it; a release or the holder's end of connection lets it go.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.lease_hint(IN p_name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
NO SQL
SQL SECURITY DEFINER
BEGIN
    DECLARE hint VARCHAR(64) CHARACTER SET ascii DEFAULT CONCAT('leasewrap:', MD5(p_name));
    IF IS_USED_LOCK(hint) IS NULL THEN
        DO GET_LOCK(hint, 0);
    END IF;
END //

-- Wait at most p_seconds for the holder of NAME to let its named lock go. released is 1 when it
-- did, or when the row's version is no longer p_seen (it changed since the caller's read: no
-- release is missed between that read and this wait); 0 when nobody held the lock (then there is
-- nothing to wait for: the caller polls) or the wait ran out. The lock is looked at before the
-- version: a release in between shows as the version's change, or as a lock GET_LOCK gets at once.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.lease_wait(IN p_name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
                               IN p_seen BIGINT UNSIGNED, IN p_seconds DOUBLE)
READS SQL DATA
SQL SECURITY DEFINER
BEGIN
    DECLARE hint VARCHAR(64) CHARACTER SET ascii DEFAULT CONCAT('leasewrap:', MD5(p_name));
    DECLARE held_by_someone BOOLEAN DEFAULT IS_FREE_LOCK(hint) = 0;
    DECLARE released INT DEFAULT 0;
    CALL leasewrap.lease_caller(p_name);
    IF IFNULL((SELECT l.version FROM leasewrap.lease AS l
               WHERE l.name = CONVERT(p_name USING ascii) COLLATE ascii_bin), 0) <> p_seen THEN
        SET released = 1;
    ELSEIF held_by_someone THEN
        SET released = IFNULL(GET_LOCK(hint, LEAST(GREATEST(p_seconds, 0), 10)), 0);
        IF released = 1 THEN
            DO RELEASE_LOCK(hint);
        END IF;
    END IF;
    SELECT released;
END //

-- The run record of (NAME, KEY): its JSON, or no row before its first run.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.lease_run_read(IN p_name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
                                   IN p_key LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
READS SQL DATA
SQL SECURITY DEFINER
BEGIN
    CALL leasewrap.lease_caller(p_name);
    SELECT r.record FROM leasewrap.run AS r
        WHERE r.name = CONVERT(p_name USING ascii) COLLATE ascii_bin
          AND r.`key` = CONVERT(p_key USING ascii) COLLATE ascii_bin;
END //

-- Store (p_delete: delete) the run record of (NAME, KEY) while NAME is held under p_token: one
-- transaction, the lease's row locked in share mode first, so that no take commits between the
-- check and the write. written is FALSE, and nothing changed, for a stale holder.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.lease_run_write(IN p_name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
                                    IN p_token BIGINT UNSIGNED,
                                    IN p_key LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
                                    IN p_record LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
MODIFIES SQL DATA
SQL SECURITY DEFINER
BEGIN
    DECLARE holds INT DEFAULT 0;
    CALL leasewrap.lease_caller(p_name);
    SET SESSION innodb_lock_wait_timeout = 1;
    START TRANSACTION;
    SELECT COUNT(*) INTO holds FROM leasewrap.lease AS l
        WHERE l.name = CONVERT(p_name USING ascii) COLLATE ascii_bin AND l.token = p_token AND l.held
        LOCK IN SHARE MODE;
    IF holds = 1 AND p_record IS NULL THEN
        DELETE FROM leasewrap.run
            WHERE name = CONVERT(p_name USING ascii) COLLATE ascii_bin
              AND `key` = CONVERT(p_key USING ascii) COLLATE ascii_bin;
    ELSEIF holds = 1 THEN
        INSERT INTO leasewrap.run (name, `key`, record) VALUES (p_name, p_key, p_record)
            ON DUPLICATE KEY UPDATE record = VALUES(record);
    END IF;
    COMMIT;
    SELECT holds = 1 AS written;
END //

-- At most p_max of NAME's run records, by KEY: the last keys first (a --once-per slot's key is
-- its time, so those are the newest), or the first (p_oldest_first: a sweep's).
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.lease_runs(IN p_name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
                               IN p_max INT, IN p_oldest_first BOOLEAN)
READS SQL DATA
SQL SECURITY DEFINER
BEGIN
    DECLARE most INT DEFAULT GREATEST(LEAST(IFNULL(p_max, 0), 1000), 0);
    CALL leasewrap.lease_caller(p_name);
    SELECT r.`key`, r.record FROM leasewrap.run AS r
        WHERE r.name = CONVERT(p_name USING ascii) COLLATE ascii_bin
        ORDER BY IF(p_oldest_first, r.`key`, NULL) ASC, IF(p_oldest_first, NULL, r.`key`) DESC
        LIMIT most;
END //

-- The names, at most 1000, that have a lease's row or a run record and that the user that
-- logged in may use: what `leasewrap status` without a NAME lists.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.lease_names()
READS SQL DATA
SQL SECURITY DEFINER
BEGIN
    DECLARE caller VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
        DEFAULT LEFT(USER(), CHAR_LENGTH(USER()) - LOCATE('@', REVERSE(USER())));
    SELECT n.name FROM (SELECT l.name FROM leasewrap.lease AS l
                        UNION SELECT r.name FROM leasewrap.run AS r) AS n
        WHERE leasewrap.may_use(caller, n.name)
        ORDER BY n.name
        LIMIT 1000;
END //

-- A definer must itself be allowed to run what it defines.
GRANT EXECUTE ON PROCEDURE leasewrap.lease_caller TO 'leasewrap_fence'@'localhost' //
GRANT EXECUTE ON PROCEDURE leasewrap.lease_hint TO 'leasewrap_fence'@'localhost' //
GRANT EXECUTE ON PROCEDURE leasewrap.lease_sql TO 'leasewrap_fence'@'localhost' //
GRANT EXECUTE ON PROCEDURE leasewrap.lease_read TO 'leasewrap_fence'@'localhost' //
GRANT EXECUTE ON PROCEDURE leasewrap.lease_take TO 'leasewrap_fence'@'localhost' //
GRANT EXECUTE ON PROCEDURE leasewrap.lease_renew TO 'leasewrap_fence'@'localhost' //
GRANT EXECUTE ON PROCEDURE leasewrap.lease_release TO 'leasewrap_fence'@'localhost' //
GRANT EXECUTE ON PROCEDURE leasewrap.lease_wait TO 'leasewrap_fence'@'localhost' //
GRANT EXECUTE ON PROCEDURE leasewrap.lease_run_read TO 'leasewrap_fence'@'localhost' //
GRANT EXECUTE ON PROCEDURE leasewrap.lease_run_write TO 'leasewrap_fence'@'localhost' //
GRANT EXECUTE ON PROCEDURE leasewrap.lease_runs TO 'leasewrap_fence'@'localhost' //
GRANT EXECUTE ON PROCEDURE leasewrap.lease_names TO 'leasewrap_fence'@'localhost' //

-- Every account may ask which version is installed, so that leasewrap tells a server without
-- the SQL (78) from a user tied to no name (77). Servers before MariaDB 10.11 have no PUBLIC:
-- there the two look alike to an untied user, and leasewrap names both.
BEGIN NOT ATOMIC
    DECLARE CONTINUE HANDLER FOR SQLEXCEPTION BEGIN END;
    EXECUTE IMMEDIATE 'GRANT EXECUTE ON PROCEDURE leasewrap.lease_sql TO PUBLIC';
END //

-- Lets every account of user fence names: a NAME, PREFIX* or *. Grants EXECUTE on the fence;
-- nothing on the tables. Names another user's tie that covers a name this one covers too: each
-- of the two may record a token the other's holders cannot pass (18446744073709551615 stops
-- every later holder of that name).
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.allow(IN p_user VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
                          IN p_names VARCHAR(129) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE overlaps TEXT;
    IF p_user IS NULL OR p_names IS NULL
       OR p_names NOT REGEXP '^([A-Za-z0-9._@:+=-]{1,128}|[A-Za-z0-9._@:+=-]{0,127}[*])\\z' THEN
        SIGNAL SQLSTATE 'LWF02' SET MYSQL_ERRNO = 9102, MESSAGE_TEXT =
            'leasewrap.allow: pass a user name and a lease name, PREFIX* or *';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM mysql.global_priv WHERE User = p_user) THEN
        SIGNAL SQLSTATE 'HY000' SET MESSAGE_TEXT = 'leasewrap.allow: no account has that user name';
    END IF;
    INSERT IGNORE INTO leasewrap.allowed (user, names) VALUES (p_user, p_names);
    -- The row of a NAME is made now, with the lowest token.
    IF RIGHT(p_names, 1) <> '*' THEN
        INSERT IGNORE INTO leasewrap.fence (name, token) VALUES (p_names, 0);
    END IF;
    CALL leasewrap.grant_fence(p_user, TRUE);
    SELECT GROUP_CONCAT(CONCAT(a.user, ' (', a.names, ')') ORDER BY a.user, a.names SEPARATOR ', ')
        INTO overlaps
        FROM leasewrap.allowed AS a
        WHERE a.user <> p_user
          AND (leasewrap.covers(a.names, TRIM(TRAILING '*' FROM p_names))
               OR leasewrap.covers(p_names, TRIM(TRAILING '*' FROM a.names)));
    IF overlaps IS NOT NULL THEN
        SELECT CONCAT('leasewrap.allow: warning: user ', p_user, ' (', p_names,
                      ') and these users may both fence a name: ', overlaps,
                      '; either may record a token that stops the other''s holders: give each user names no other user''s names cover, such as a prefix of its own that ends in a dot (etl.*, report.*)')
            AS `warning`;
    END IF;
END //

-- Undoes allow(user, names); the user's EXECUTE goes with its last tie.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.disallow(IN p_user VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
                             IN p_names VARCHAR(129) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DELETE FROM leasewrap.allowed WHERE user = p_user AND names = p_names;
    IF NOT EXISTS (SELECT 1 FROM leasewrap.allowed WHERE user = p_user) THEN
        CALL leasewrap.grant_fence(p_user, FALSE);
    END IF;
END //

-- Grants (or revokes) EXECUTE on the fence and the lease's procedures to every account of a user.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.grant_fence(IN p_user VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
                                IN p_grant BOOLEAN)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE host VARCHAR(255) CHARACTER SET utf8mb4;
    DECLARE done BOOLEAN DEFAULT FALSE;
    DECLARE accounts CURSOR FOR SELECT g.Host FROM mysql.global_priv AS g WHERE g.User = p_user;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET done = TRUE;
    -- Revoking what an account does not have: nothing to do.
    DECLARE CONTINUE HANDLER FOR 1141, 1147, 1403 BEGIN END;
    OPEN accounts;
    each_account: LOOP
        FETCH accounts INTO host;
        IF done THEN LEAVE each_account; END IF;
        FOR made IN (SELECT 'fence' AS name UNION ALL SELECT 'lease_sql' UNION ALL SELECT 'lease_read'
                     UNION ALL SELECT 'lease_take' UNION ALL SELECT 'lease_renew'
                     UNION ALL SELECT 'lease_release' UNION ALL SELECT 'lease_wait'
                     UNION ALL SELECT 'lease_run_read' UNION ALL SELECT 'lease_run_write'
                     UNION ALL SELECT 'lease_runs' UNION ALL SELECT 'lease_names') DO
            EXECUTE IMMEDIATE CONCAT(IF(p_grant, 'GRANT', 'REVOKE'),
                ' EXECUTE ON PROCEDURE leasewrap.', made.name, IF(p_grant, ' TO ', ' FROM '),
                QUOTE(p_user), '@', QUOTE(host));
        END FOR;
    END LOOP;
    CLOSE accounts;
END //

-- From version 1, whose documentation let an administrator grant SELECT on the fence table:
-- such an account reads with fences() now, and its SELECT goes. Then every tied user's EXECUTE
-- again, and the version.
BEGIN NOT ATOMIC
    DECLARE account TEXT;
    DECLARE tied VARCHAR(128) CHARACTER SET utf8mb4;
    DECLARE done BOOLEAN DEFAULT FALSE;
    DECLARE readers CURSOR FOR SELECT CONCAT(QUOTE(t.User), '@', QUOTE(t.Host)) FROM mysql.tables_priv AS t
        WHERE t.Db = 'leasewrap' AND t.Table_name = 'fence' AND t.Table_priv = 'Select'
          AND NOT (t.User = 'leasewrap_fence' AND t.Host = 'localhost');
    DECLARE users CURSOR FOR SELECT DISTINCT a.user FROM leasewrap.allowed AS a
        WHERE EXISTS (SELECT 1 FROM mysql.global_priv AS g WHERE g.User = a.user);
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET done = TRUE;
    OPEN readers;
    each_reader: LOOP
        FETCH readers INTO account;
        IF done THEN LEAVE each_reader; END IF;
        EXECUTE IMMEDIATE CONCAT('GRANT EXECUTE ON PROCEDURE leasewrap.fences TO ', account);
        EXECUTE IMMEDIATE CONCAT('REVOKE SELECT ON leasewrap.fence FROM ', account);
        SELECT CONCAT('leasewrap fence: ', account,
                      ' may no longer read leasewrap.fence (SELECT ... FOR UPDATE would hold its rows); it reads every name and token with CALL leasewrap.fences()')
            AS `note`;
    END LOOP;
    CLOSE readers;
    SET done = FALSE;
    OPEN users;
    each_user: LOOP
        FETCH users INTO tied;
        IF done THEN LEAVE each_user; END IF;
        CALL leasewrap.grant_fence(tied, TRUE);
    END LOOP;
    CLOSE users;
    DELETE FROM leasewrap.installed;
    INSERT INTO leasewrap.installed (version) VALUES (3);
END //

DELIMITER ;
