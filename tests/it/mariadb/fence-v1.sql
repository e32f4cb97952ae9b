-- leasewrap's database fence for MariaDB, version 1 (MariaDB 10.4 or later; tested with 10.11),
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
-- before the transaction writes anything; bad input with LWF02; a call outside a transaction
-- with LWF03; a user not allowed NAME with 42000. Their error numbers are 9101, 9102, 9103 and
-- 9104, for drivers that show no SQLSTATE. An equal token is allowed.
--
-- What it makes: the account 'leasewrap_fence'@'localhost' (locked: nobody logs in as it; it
-- is the fence's definer, with rights on the fence's own tables and nothing else), the database
-- leasewrap with the tables fence (NAME -> highest token), allowed (user -> NAME or PREFIX*)
-- and installed (this version), and the procedures fence(name, token) (SQL SECURITY DEFINER,
-- EXECUTE granted per job user), allow(user, names) and disallow(user, names) (for
-- administrators).

-- The procedures keep the sql_mode and character set they were made with: these, whatever the
-- installing session had, and not the caller's.
SET SESSION sql_mode = 'STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION,NO_ZERO_DATE,NO_ZERO_IN_DATE';
SET NAMES utf8mb4 COLLATE utf8mb4_bin;

DELIMITER //

-- What is there already, and whether this script may build on it. Every refusal comes before
-- anything is changed.
BEGIN NOT ATOMIC
    DECLARE stranger TEXT;
    DECLARE installed INT;
    IF EXISTS (SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = 'leasewrap')
       AND NOT EXISTS (SELECT 1 FROM information_schema.TABLES
                       WHERE TABLE_SCHEMA = 'leasewrap' AND TABLE_NAME = 'installed') THEN
        SIGNAL SQLSTATE 'HY000' SET MESSAGE_TEXT =
            'leasewrap fence: a database leasewrap exists that this script did not make (it has no leasewrap.installed): find out who made it and what is in it, drop it, and run this again';
    END IF;
    -- Another account with rights on the database leasewrap (by its name or a wildcard that
    -- matches it) could rewrite the fence's rows or replace its procedures.
    SELECT CONCAT(QUOTE(d.User), '@', QUOTE(d.Host), ' on ', d.Db) INTO stranger
        FROM mysql.db AS d
        WHERE 'leasewrap' LIKE d.Db
          AND NOT (d.User = 'leasewrap_fence' AND d.Host = 'localhost')
          AND 'Y' IN (d.Insert_priv, d.Update_priv, d.Delete_priv, d.Create_priv, d.Drop_priv,
                      d.Alter_priv, d.Create_routine_priv, d.Alter_routine_priv, d.Grant_priv,
                      d.Index_priv, d.Trigger_priv, d.Event_priv, d.Create_view_priv,
                      d.Lock_tables_priv, d.Delete_history_priv)
        LIMIT 1;
    IF stranger IS NULL THEN
        SELECT CONCAT(QUOTE(t.User), '@', QUOTE(t.Host), ' on leasewrap.', t.Table_name) INTO stranger
            FROM mysql.tables_priv AS t
            WHERE t.Db = 'leasewrap' AND NOT (t.User = 'leasewrap_fence' AND t.Host = 'localhost')
              AND t.Table_priv NOT IN ('', 'Select')
            LIMIT 1;
    END IF;
    IF stranger IS NOT NULL THEN
        SET stranger = CONCAT('leasewrap fence: the account ', stranger,
            ' may change the database leasewrap, and so the fence: revoke that, and run this again');
        SIGNAL SQLSTATE 'HY000' SET MESSAGE_TEXT = stranger;
    END IF;
    IF EXISTS (SELECT 1 FROM mysql.global_priv
               WHERE User = 'leasewrap_fence' AND Host = 'localhost'
                 AND JSON_VALUE(Priv, '$.access') <> '0') THEN
        SIGNAL SQLSTATE 'HY000' SET MESSAGE_TEXT =
            'leasewrap fence: the account leasewrap_fence@localhost has global privileges, which the fence''s definer must not have: find out who gave them, revoke them, and run this again';
    END IF;
    IF EXISTS (SELECT 1 FROM information_schema.TABLES
               WHERE TABLE_SCHEMA = 'leasewrap' AND TABLE_NAME = 'installed') THEN
        SELECT MAX(version) INTO installed FROM leasewrap.installed;
        IF installed > 1 THEN
            SET stranger = CONCAT('leasewrap fence: version ', installed,
                ' is installed, and this script is version 1: use the fence-sql of the leasewrap that made it, or a newer one');
            SIGNAL SQLSTATE 'HY000' SET MESSAGE_TEXT = stranger;
        END IF;
    END IF;
END //

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

-- The definer's rights: its own tables, nothing else.
GRANT SELECT, INSERT, UPDATE ON leasewrap.fence TO 'leasewrap_fence'@'localhost';
GRANT SELECT ON leasewrap.allowed TO 'leasewrap_fence'@'localhost';

DELIMITER //

-- The fence. Every bad input gets LWF02: both arguments are taken as text and checked here, a
-- name by leasewrap's own rule for lease names, a token as a decimal u64.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.fence(IN p_name LONGTEXT CHARACTER SET utf8mb4, IN p_token LONGTEXT CHARACTER SET utf8mb4)
MODIFIES SQL DATA
SQL SECURITY DEFINER
BEGIN
    DECLARE wanted BIGINT UNSIGNED;
    DECLARE stored BIGINT UNSIGNED;
    DECLARE message TEXT CHARACTER SET utf8mb4;
    -- USER() is the account that logged in (CURRENT_USER() here is the definer); the user
    -- name is what comes before its last @.
    DECLARE caller TEXT CHARACTER SET utf8mb4 DEFAULT LEFT(USER(), CHAR_LENGTH(USER()) - LOCATE('@', REVERSE(USER())));
    -- NAME in the column's own type: compared with a utf8mb4 value, the key could not be used,
    -- and every row read would be locked.
    DECLARE lease VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE duplicate BOOLEAN DEFAULT FALSE;
    DECLARE CONTINUE HANDLER FOR 1062 SET duplicate = TRUE;
    -- No row of NAME yet: stored stays NULL.
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
    IF p_name IS NULL OR p_name NOT REGEXP '^[A-Za-z0-9._@:+=-]{1,128}\\z' THEN
        SET message = CONCAT('leasewrap.fence: the lease name ',
            IFNULL(JSON_QUOTE(LEFT(p_name, 64)), 'NULL'),
            IF(CHAR_LENGTH(p_name) > 64, CONCAT(' (', CHAR_LENGTH(p_name), ' characters)'), ''),
            ' is not 1 to 128 ASCII letters, digits and ._-@:+=');
        SIGNAL SQLSTATE 'LWF02' SET MYSQL_ERRNO = 9102, MESSAGE_TEXT = message;
    END IF;
    IF p_token IS NULL OR p_token NOT REGEXP '^[0-9]{1,20}\\z'
       OR (CHAR_LENGTH(p_token) = 20 AND p_token > '18446744073709551615') THEN
        SET message = CONCAT('leasewrap.fence: fencing token ',
            IFNULL(JSON_QUOTE(LEFT(p_token, 64)), 'NULL'), ' for "', p_name,
            '" is not a whole number from 0 to 18446744073709551615');
        SIGNAL SQLSTATE 'LWF02' SET MYSQL_ERRNO = 9102, MESSAGE_TEXT = message;
    END IF;
    SET wanted = CAST(p_token AS UNSIGNED);
    SET lease = p_name;
    -- Outside a transaction (autocommit, no START TRANSACTION) the row lock would end with this
    -- call, and the job's writes after it would not be fenced.
    IF @@autocommit = 1 AND @@in_transaction = 0 THEN
        SIGNAL SQLSTATE 'LWF03' SET MYSQL_ERRNO = 9103, MESSAGE_TEXT =
            'leasewrap.fence: called outside a transaction: START TRANSACTION first (or SET autocommit = 0), then the fence, the writes and COMMIT';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM leasewrap.allowed AS a
                   WHERE a.user = caller
                     AND (a.names = lease
                          OR (RIGHT(a.names, 1) = '*'
                              AND LEFT(lease, CHAR_LENGTH(a.names) - 1)
                                  = LEFT(a.names, CHAR_LENGTH(a.names) - 1)))) THEN
        SET message = CONCAT('leasewrap.fence: user ', JSON_QUOTE(caller), ' may not fence "',
            p_name, '": an administrator ties names to users with CALL leasewrap.allow(user, names)');
        SIGNAL SQLSTATE '42000' SET MYSQL_ERRNO = 9104, MESSAGE_TEXT = message;
    END IF;
    -- A locking read of NAME's row: it waits for the transaction that holds the row, then reads
    -- the newest committed token, whatever this transaction's snapshot, and keeps the row
    -- locked (exclusively, until the transaction ends), refused or not. On a row that exists
    -- it locks that row alone; under REPEATABLE READ a missing row's gap is locked too, until
    -- the first transaction of a name ends (allow() makes the row of a NAME beforehand).
    SELECT f.token INTO stored FROM leasewrap.fence AS f WHERE f.name = lease FOR UPDATE;
    IF stored IS NULL THEN
        INSERT INTO leasewrap.fence (name, token) VALUES (lease, wanted);
        IF duplicate THEN
            -- Another transaction made the row meanwhile (READ COMMITTED) and has ended.
            SELECT f.token INTO stored FROM leasewrap.fence AS f WHERE f.name = lease FOR UPDATE;
        END IF;
    END IF;
    IF stored > wanted THEN
        SET message = CONCAT('stale fencing token ', wanted, ' for "', p_name, '": ', stored,
            ' is recorded');
        SIGNAL SQLSTATE 'LWF01' SET MYSQL_ERRNO = 9101, MESSAGE_TEXT = message;
    END IF;
    IF stored IS NOT NULL THEN
        UPDATE leasewrap.fence SET token = wanted, fenced_at = CURRENT_TIMESTAMP(6)
            WHERE name = lease;
    END IF;
END //

-- A definer must itself be allowed to run what it defines.
GRANT EXECUTE ON PROCEDURE leasewrap.fence TO 'leasewrap_fence'@'localhost' //

-- Lets every account of user fence names: a NAME, PREFIX* or *. Grants EXECUTE on the fence;
-- nothing on the tables.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.allow(IN p_user VARCHAR(128) CHARACTER SET utf8mb4, IN p_names VARCHAR(129) CHARACTER SET utf8mb4)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    IF p_user IS NULL OR p_names IS NULL
       OR p_names NOT REGEXP '^([A-Za-z0-9._@:+=-]{1,128}|[A-Za-z0-9._@:+=-]{0,127}[*])\\z' THEN
        SIGNAL SQLSTATE 'LWF02' SET MYSQL_ERRNO = 9102, MESSAGE_TEXT =
            'leasewrap.allow: pass a user name and a lease name, PREFIX* or *';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM mysql.global_priv WHERE User = p_user) THEN
        SIGNAL SQLSTATE 'HY000' SET MESSAGE_TEXT = 'leasewrap.allow: no account has that user name';
    END IF;
    INSERT IGNORE INTO leasewrap.allowed (user, names) VALUES (p_user, p_names);
    -- The row of a NAME is made now, with the lowest token, so that no fence of it has to
    -- insert (and lock a gap of the index) in a job's transaction.
    IF RIGHT(p_names, 1) <> '*' THEN
        INSERT IGNORE INTO leasewrap.fence (name, token) VALUES (p_names, 0);
    END IF;
    CALL leasewrap.grant_fence(p_user, TRUE);
END //

-- Undoes allow(user, names); the user's EXECUTE goes with its last tie.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.disallow(IN p_user VARCHAR(128) CHARACTER SET utf8mb4, IN p_names VARCHAR(129) CHARACTER SET utf8mb4)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DELETE FROM leasewrap.allowed WHERE user = p_user AND names = p_names;
    IF NOT EXISTS (SELECT 1 FROM leasewrap.allowed WHERE user = p_user) THEN
        CALL leasewrap.grant_fence(p_user, FALSE);
    END IF;
END //

-- Grants (or revokes) EXECUTE on the fence to every account of a user.
CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost'
PROCEDURE leasewrap.grant_fence(IN p_user VARCHAR(128) CHARACTER SET utf8mb4, IN p_grant BOOLEAN)
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
        EXECUTE IMMEDIATE CONCAT(IF(p_grant, 'GRANT', 'REVOKE'),
            ' EXECUTE ON PROCEDURE leasewrap.fence ', IF(p_grant, 'TO ', 'FROM '),
            QUOTE(p_user), '@', QUOTE(host));
    END LOOP;
    CLOSE accounts;
END //

-- Every tied user's EXECUTE again: replacing the fence above may have dropped it.
BEGIN NOT ATOMIC
    DECLARE tied VARCHAR(128) CHARACTER SET utf8mb4;
    DECLARE done BOOLEAN DEFAULT FALSE;
    DECLARE users CURSOR FOR SELECT DISTINCT a.user FROM leasewrap.allowed AS a
        WHERE EXISTS (SELECT 1 FROM mysql.global_priv AS g WHERE g.User = a.user);
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET done = TRUE;
    OPEN users;
    each_user: LOOP
        FETCH users INTO tied;
        IF done THEN LEAVE each_user; END IF;
        CALL leasewrap.grant_fence(tied, TRUE);
    END LOOP;
    CLOSE users;
    DELETE FROM leasewrap.installed;
    INSERT INTO leasewrap.installed (version) VALUES (1);
END //

DELIMITER ;
