-- leasewrap's database fence and lease for PostgreSQL, version 5 (PostgreSQL 9.5 or later; tested with 15),
-- printed by `leasewrap fence-sql postgres` and installed as
-- /usr/share/leasewrap/sql/postgres-fence.sql.
--
-- Install or upgrade, as a superuser, as often as you like (it checks what is there first, and
-- changes nothing when it refuses; it waits at most 3 s for a lock, and a run that would wait
-- longer changes nothing and says so):
--     psql -X -v ON_ERROR_STOP=1 -d DATABASE -f postgres-fence.sql
-- Then let each job's role fence its names (a NAME, or a PREFIX*):
--     SELECT leasewrap.allow('report_job', 'report');
--
-- A job run by leasewrap calls the fence first in its own transaction, outside any savepoint:
--     BEGIN;
--     SELECT leasewrap.fence(:'name', :'token');
--     ... the job's writes ...
--     COMMIT;
-- with psql -X -v ON_ERROR_STOP=1 -v name="$LEASEWRAP_NAME" -v token="$LEASEWRAP_FENCING_TOKEN".
--
-- The fence locks the row of NAME until the transaction ends: a newer holder's fence waits for
-- an older holder's transaction (at most the function's lock_timeout, then 55P03) and then sees
-- what it committed. A token lower than the one recorded is refused with SQLSTATE LWF01 before
-- the transaction writes anything; bad input with LWF02; a role not allowed NAME with 42501; a
-- call inside a savepoint with LWF03. An equal token is allowed: one holder, many transactions.
--
-- What it makes: the role leasewrap_fence (NOLOGIN; it owns the schemas leasewrap and
-- leasewrap_data and what is in them, and nothing else). The schema leasewrap, which jobs see,
-- holds functions only: leasewrap.fence(text, text) and leasewrap.fence(text, numeric)
-- (SECURITY DEFINER; EXECUTE for the roles tied to a name), leasewrap.fences() (every name and
-- its token, for the roles an administrator grants it to), leasewrap.allow(regrole, text) and
-- leasewrap.disallow(regrole, text) (for administrators). The schema leasewrap_data, on which no
-- role but its owner has any right, holds the tables fence (NAME -> highest token), allowed
-- (role -> NAME or PREFIX*), installed (this version) and objects (what this script made, and
-- who gets which right on it), and the functions the others share. Nothing here is resolved
-- through the caller's search_path.
--
-- The lease (`leasewrap --database postgresql://... --name NAME -- COMMAND`, docs/database.md)
-- lives here too, on the same ties: leasewrap.lease_take, lease_renew, lease_release and
-- lease_read (SECURITY DEFINER; EXECUTE for the roles tied to a name) change or read the row of
-- NAME in leasewrap_data.lease, each in one statement, and a role may use only the names it is
-- tied to. leasewrap.lease_sql() tells leasewrap which version is installed. No function reads
-- a clock: leasewrap times the lease on its hosts' monotonic clocks. A release notifies the
-- channel leasewrap_lease with NAME, so that a waiter (LISTEN leasewrap_lease) takes the lease at
-- once; anyone may notify that channel, which only makes a waiter read the row.

BEGIN;
-- Only pg_catalog, then this session's own temp schema: an operator or function that another
-- role planted in public (or anywhere) is never resolved, neither here nor in the CHECKs and
-- function bodies made here.
SET LOCAL search_path = pg_catalog, pg_temp;
SET LOCAL client_min_messages = warning;
-- Every fence that comes after a waiting statement of this script waits behind it: no wait
-- here is longer than this.
SET LOCAL lock_timeout = '3s';

-- What this script makes, and who gets a right on it: the checks and the clean-up below go over
-- every object in the two schemas with this list, so a new table or function is added here.
-- for_whom: 'tied', the roles tied to a name (USAGE on a schema, EXECUTE on a function);
-- 'granted', the roles an administrator grants EXECUTE to; NULL, nobody but the owner.
-- 'old ...': what an earlier version made, which this one moves or drops.
CREATE TEMPORARY TABLE leasewrap_objects (
    kind text NOT NULL,
    identity text NOT NULL,
    for_whom text
) ON COMMIT DROP;
INSERT INTO pg_temp.leasewrap_objects VALUES
    ('schema', 'leasewrap', 'tied'),
    ('schema', 'leasewrap_data', NULL),
    ('table', 'leasewrap_data.fence', NULL),
    ('table', 'leasewrap_data.allowed', NULL),
    ('table', 'leasewrap_data.installed', NULL),
    ('table', 'leasewrap_data.objects', NULL),
    ('table', 'leasewrap_data.lease', NULL),
    ('table', 'leasewrap_data.run', NULL),
    ('function', 'leasewrap.fence(text,text)', 'tied'),
    ('function', 'leasewrap.fence(text,numeric)', 'tied'),
    ('function', 'leasewrap.fences()', 'granted'),
    ('function', 'leasewrap.lease_sql()', 'tied'),
    ('function', 'leasewrap.lease_read(text)', 'tied'),
    ('function', 'leasewrap.lease_take(text,bigint,bigint,text)', 'tied'),
    ('function', 'leasewrap.lease_renew(text,numeric)', 'tied'),
    ('function', 'leasewrap.lease_release(text,numeric)', 'tied'),
    ('function', 'leasewrap.lease_run_read(text,text)', 'tied'),
    ('function', 'leasewrap.lease_run_write(text,numeric,text,text)', 'tied'),
    ('function', 'leasewrap.lease_runs(text,integer,boolean)', 'tied'),
    ('function', 'leasewrap.lease_names()', 'tied'),
    ('function', 'leasewrap_data.lease_check(text)', NULL),
    ('function', 'leasewrap.allow(regrole,text)', NULL),
    ('function', 'leasewrap.disallow(regrole,text)', NULL),
    ('function', 'leasewrap_data.covers(text,text)', NULL),
    ('function', 'leasewrap_data.may_use(text)', NULL),
    ('function', 'leasewrap_data.grant_to(regrole,boolean)', NULL),
    ('old table', 'leasewrap.fence', NULL),
    ('old table', 'leasewrap.allowed', NULL),
    ('old table', 'leasewrap.installed', NULL),
    ('old function', 'leasewrap.grant_fence(regrole,boolean)', NULL);

-- Every object in the two schemas (each has a dependency on its schema, and so do the schemas'
-- own entries below), with its owner and whether this script makes it.
CREATE OR REPLACE FUNCTION pg_temp.leasewrap_found()
RETURNS TABLE (classid oid, objid oid, what text, owner oid, listed boolean)
LANGUAGE sql
STABLE
AS $found$
    WITH present AS (
        SELECT d.classid, d.objid
            FROM pg_catalog.pg_depend AS d, pg_catalog.pg_namespace AS n
            WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
              AND d.refobjid OPERATOR(pg_catalog.=) n.oid AND d.deptype OPERATOR(pg_catalog.=) 'n'
              AND n.nspname OPERATOR(pg_catalog.=) ANY ('{leasewrap,leasewrap_data}'::pg_catalog.name[])
        UNION
        SELECT 'pg_catalog.pg_namespace'::pg_catalog.regclass, n.oid
            FROM pg_catalog.pg_namespace AS n
            WHERE n.nspname OPERATOR(pg_catalog.=) ANY ('{leasewrap,leasewrap_data}'::pg_catalog.name[])
    ), known AS (
        SELECT CASE o.kind
                   WHEN 'schema' THEN pg_catalog.to_regnamespace(o.identity)::pg_catalog.oid
                   WHEN 'function' THEN pg_catalog.to_regprocedure(o.identity)::pg_catalog.oid
                   WHEN 'old function' THEN pg_catalog.to_regprocedure(o.identity)::pg_catalog.oid
                   ELSE pg_catalog.to_regclass(o.identity)::pg_catalog.oid
               END AS objid
            FROM pg_temp.leasewrap_objects AS o
    )
    SELECT p.classid, p.objid, pg_catalog.pg_describe_object(p.classid, p.objid, 0),
           coalesce((SELECT s.refobjid FROM pg_catalog.pg_shdepend AS s
                         WHERE s.classid OPERATOR(pg_catalog.=) p.classid
                           AND s.objid OPERATOR(pg_catalog.=) p.objid
                           AND s.deptype OPERATOR(pg_catalog.=) 'o'),
                    10::pg_catalog.oid),
           p.objid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT k.objid FROM known AS k
                                                      WHERE k.objid IS NOT NULL))
        FROM present AS p;
$found$;

-- What is there already, and whether this script may build on it. Every refusal comes before
-- anything is changed, and the transaction then rolls back.
DO $check$
DECLARE
    owner_role pg_catalog.pg_roles%ROWTYPE;
    token_type text;
    installed integer;
    refused text;
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = current_user) THEN
        RAISE EXCEPTION 'leasewrap fence: install it as a superuser (this is %)', current_user
            USING ERRCODE = '42501',
                  HINT = 'it makes the role leasewrap_fence and gives it the schemas leasewrap and leasewrap_data';
    END IF;
    -- One run at a time (the numbers are this script's own): a second run waits for the first
    -- to commit, and then checks what it made.
    BEGIN
        PERFORM pg_catalog.pg_advisory_xact_lock(1819763045, 1852793707);
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'leasewrap fence: another run of this script has been installing the fence for longer than lock_timeout (3s); nothing was changed'
            USING ERRCODE = '55P03', HINT = 'run this again once it has ended';
    END;
    -- Made here if missing (another install may be making it at the same time: then this one
    -- waits for it, and checks what it made).
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname = 'leasewrap_fence') THEN
        BEGIN
            CREATE ROLE leasewrap_fence NOLOGIN NOINHERIT;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
    SELECT * INTO owner_role FROM pg_catalog.pg_roles AS r WHERE r.rolname = 'leasewrap_fence';
    IF (owner_role.rolsuper OR owner_role.rolcanlogin OR owner_role.rolcreaterole
            OR owner_role.rolcreatedb OR owner_role.rolreplication OR owner_role.rolbypassrls
            OR EXISTS (SELECT FROM pg_catalog.pg_auth_members AS m
                       WHERE m.roleid = owner_role.oid OR m.member = owner_role.oid)) THEN
        RAISE EXCEPTION 'leasewrap fence: the role leasewrap_fence exists and is not the plain NOLOGIN role this script makes (it can log in, has a privilege, a member or a membership)'
            USING ERRCODE = '42501',
                  HINT = 'find out who made it; drop it or make it NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS, with no members and no memberships';
    END IF;
    SELECT string_agg(format('the schema %I belongs to the role %s', n.nspname,
                             pg_catalog.pg_get_userbyid(n.nspowner)), '; ') INTO refused
        FROM pg_catalog.pg_namespace AS n
        WHERE n.nspname IN ('leasewrap', 'leasewrap_data') AND n.nspowner <> owner_role.oid
          AND NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.oid = n.nspowner);
    IF refused IS NOT NULL THEN
        RAISE EXCEPTION 'leasewrap fence: %, not to leasewrap_fence: it was not made by this script, and that role could replace the fence', refused
            USING ERRCODE = '42501',
                  HINT = 'find out who made it and what is in it; drop it (DROP SCHEMA ... CASCADE) and run this again';
    END IF;
    -- A function this script does not make (an overload of the fence, say, that catches calls
    -- whose arguments are varchar or bigint), a table, a type: nothing in the two schemas is
    -- another role's, or unknown to this script, whoever made it.
    SELECT string_agg(format('%s (owner %s)', f.what, pg_catalog.pg_get_userbyid(f.owner)), '; '
                      ORDER BY f.what) INTO refused
        FROM pg_temp.leasewrap_found() AS f
        WHERE NOT f.listed
           OR (f.owner <> owner_role.oid
               AND NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.oid = f.owner));
    IF refused IS NOT NULL THEN
        RAISE EXCEPTION 'leasewrap fence: not made by this script, or another role''s: %', refused
            USING ERRCODE = '42501', HINT = 'find out who made it; drop it and run this again';
    END IF;
    -- What would run, or hold a lock, inside every fence as its owner: triggers (a foreign key
    -- of another table is one), rules, row security.
    SELECT string_agg(DISTINCT d.what, '; ') INTO refused FROM (
        SELECT CASE WHEN t.tgconstraint = 0 THEN format('trigger %I on %s', t.tgname, t.tgrelid::regclass)
                    ELSE format('the foreign key %I of %s, which references %s', c.conname,
                                c.conrelid::regclass, t.tgrelid::regclass)
               END
            FROM pg_catalog.pg_trigger AS t LEFT JOIN pg_catalog.pg_constraint AS c ON c.oid = t.tgconstraint
            WHERE t.tgrelid IN (SELECT f.objid FROM pg_temp.leasewrap_found() AS f
                                WHERE f.classid = 'pg_catalog.pg_class'::regclass)
        UNION ALL
        SELECT format('rule %I on %s', w.rulename, w.ev_class::regclass)
            FROM pg_catalog.pg_rewrite AS w
            WHERE w.ev_class IN (SELECT f.objid FROM pg_temp.leasewrap_found() AS f
                                 WHERE f.classid = 'pg_catalog.pg_class'::regclass)
        UNION ALL
        SELECT format('policy %I on %s', p.polname, p.polrelid::regclass)
            FROM pg_catalog.pg_policy AS p
            WHERE p.polrelid IN (SELECT f.objid FROM pg_temp.leasewrap_found() AS f
                                 WHERE f.classid = 'pg_catalog.pg_class'::regclass)
        UNION ALL
        SELECT format('row level security on %s', c.oid::regclass)
            FROM pg_catalog.pg_class AS c
            WHERE (c.relrowsecurity OR c.relforcerowsecurity)
              AND c.oid IN (SELECT f.objid FROM pg_temp.leasewrap_found() AS f
                            WHERE f.classid = 'pg_catalog.pg_class'::regclass)
    ) AS d(what);
    IF refused IS NOT NULL THEN
        RAISE EXCEPTION 'leasewrap fence: %: it would run (or lock) inside every fence, as the fence''s owner', refused
            USING ERRCODE = '42501', HINT = 'find out who made it; drop it and run this again';
    END IF;
    -- What leasewrap_fence owns elsewhere runs with its rights on the fence's tables: only a
    -- role that once was a member of it (or a superuser) made it. Other databases' objects
    -- cannot be seen from here: the install there checks them.
    SELECT string_agg(DISTINCT pg_catalog.pg_describe_object(s.classid, s.objid, s.objsubid), '; ')
        INTO refused
        FROM pg_catalog.pg_shdepend AS s
        WHERE s.refclassid = 'pg_catalog.pg_authid'::regclass AND s.refobjid = owner_role.oid
          AND s.deptype = 'o' AND s.classid <> 'pg_catalog.pg_default_acl'::regclass
          AND (s.dbid = 0 OR s.dbid = (SELECT d.oid FROM pg_catalog.pg_database AS d
                                        WHERE d.datname = current_database()))
          AND (s.classid, s.objid) NOT IN (SELECT f.classid, f.objid FROM pg_temp.leasewrap_found() AS f);
    IF refused IS NOT NULL THEN
        RAISE EXCEPTION 'leasewrap fence: the role leasewrap_fence owns %: whatever runs as it may change the fence''s tables', refused
            USING ERRCODE = '42501',
                  HINT = 'find out who made it (a role that was a member of leasewrap_fence); drop it and run this again';
    END IF;
    SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) INTO token_type
        FROM pg_catalog.pg_attribute AS a
        WHERE a.attrelid = coalesce(pg_catalog.to_regclass('leasewrap_data.fence'),
                                    pg_catalog.to_regclass('leasewrap.fence'))
          AND a.attname = 'token' AND NOT a.attisdropped;
    IF coalesce(pg_catalog.to_regclass('leasewrap_data.fence'), pg_catalog.to_regclass('leasewrap.fence')) IS NOT NULL
            AND token_type IS DISTINCT FROM 'numeric(20,0)' THEN
        RAISE EXCEPTION 'leasewrap fence: the fence table''s token is %, not numeric(20,0): it cannot hold every fencing token (0 to 18446744073709551615)', coalesce(token_type, 'missing')
            USING ERRCODE = '42804',
                  HINT = format('while no job runs: ALTER TABLE %s ALTER COLUMN token TYPE numeric(20,0); then run this again',
                                coalesce(pg_catalog.to_regclass('leasewrap_data.fence'), pg_catalog.to_regclass('leasewrap.fence')));
    END IF;
    IF coalesce(pg_catalog.to_regclass('leasewrap_data.installed'), pg_catalog.to_regclass('leasewrap.installed')) IS NOT NULL THEN
        EXECUTE format('SELECT max(version) FROM %s', coalesce(pg_catalog.to_regclass('leasewrap_data.installed'),
                                                             pg_catalog.to_regclass('leasewrap.installed')))
            INTO installed;
        IF installed > 5 THEN
            RAISE EXCEPTION 'leasewrap fence: version % is installed, and this script is version 5', installed
                USING ERRCODE = '42710',
                      HINT = 'install the fence-sql of the leasewrap that made it, or a newer one';
        END IF;
    END IF;
END;
$check$;

-- What was there before this run: what is made now gets no right it did not get from here.
CREATE TEMPORARY TABLE leasewrap_existed ON COMMIT DROP AS
SELECT f.objid FROM pg_temp.leasewrap_found() AS f;

-- The version that was there before this run (1 for leasewrap's first fence, which had no
-- installed table; 2 for the one whose tables were in the schema leasewrap; 3 for version 3 and
-- later, whose tables are where this one keeps them; NULL for none).
CREATE TEMPORARY TABLE leasewrap_before ON COMMIT DROP AS
SELECT CASE
           WHEN pg_catalog.to_regclass('leasewrap_data.installed') IS NOT NULL THEN 3
           WHEN pg_catalog.to_regclass('leasewrap.installed') IS NOT NULL THEN 2
           WHEN pg_catalog.to_regclass('leasewrap.fence') IS NOT NULL THEN 1
       END AS version;

-- The locks of what this run changes in place: an upgrade moves the tables, and a table an
-- owner other than leasewrap_fence has gets it. A fence in progress holds its table until its
-- transaction ends, and every fence after this run's request waits behind the request: the
-- wait is bounded, and taken first, so that nothing is half done and no fence can wait on
-- this run while this run waits on it. A re-run that changes nothing in place takes no lock.
DO $lock$
DECLARE
    changed text;
    holders text;
BEGIN
    SELECT string_agg(c.oid::regclass::text, ', ' ORDER BY c.relname) INTO changed
        FROM pg_catalog.pg_class AS c
        WHERE c.oid IN (SELECT f.objid FROM pg_temp.leasewrap_found() AS f
                        WHERE f.classid = 'pg_catalog.pg_class'::regclass)
          AND (c.relnamespace = pg_catalog.to_regnamespace('leasewrap')
               OR c.relowner <> 'leasewrap_fence'::regrole);
    IF changed IS NULL THEN
        RETURN;
    END IF;
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', changed);
    DROP FUNCTION IF EXISTS leasewrap.grant_fence(regrole, boolean);
EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
    SELECT string_agg(DISTINCT format('pid %s (role %s, %s)', l.pid, a.usename, a.state), ', ') INTO holders
        FROM pg_catalog.pg_locks AS l JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
        WHERE l.granted AND l.pid <> pg_catalog.pg_backend_pid()
          AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())
          AND l.relation IN (SELECT f.objid FROM pg_temp.leasewrap_found() AS f
                             WHERE f.classid = 'pg_catalog.pg_class'::regclass);
    RAISE EXCEPTION 'leasewrap fence: this run changes % in place, and a transaction held it for longer than lock_timeout (3s): %; nothing was changed', changed, coalesce(holders, 'it has ended since')
        USING ERRCODE = '55P03',
              HINT = 'run this again once the jobs inside their fences have committed (an upgrade does this once)';
END;
$lock$;

CREATE SCHEMA IF NOT EXISTS leasewrap AUTHORIZATION leasewrap_fence;
CREATE SCHEMA IF NOT EXISTS leasewrap_data AUTHORIZATION leasewrap_fence;
ALTER SCHEMA leasewrap OWNER TO leasewrap_fence;
ALTER SCHEMA leasewrap_data OWNER TO leasewrap_fence;

-- Versions 1 and 2 kept the tables in the schema leasewrap, where every job's role has USAGE:
-- with it, a role takes a table's lock before its rights are checked (CREATE TRIGGER, a foreign
-- key to it, PREPARE of a query on it), and one queued behind a long fence makes every other
-- fence wait. They move to leasewrap_data with their rows.
DO $move$
DECLARE
    moved regclass;
BEGIN
    FOR moved IN SELECT c.oid FROM pg_catalog.pg_class AS c
                 WHERE c.relnamespace = pg_catalog.to_regnamespace('leasewrap') AND c.relkind = 'r' LOOP
        EXECUTE format('ALTER TABLE %s SET SCHEMA leasewrap_data', moved);
    END LOOP;
END;
$move$;

-- One row per lease NAME: the highest fencing token a transaction has committed under.
-- numeric(20,0) holds every u64; bigint is signed and would not.
CREATE TABLE IF NOT EXISTS leasewrap_data.fence (
    name text PRIMARY KEY,
    token numeric(20,0) NOT NULL,
    fenced_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);

-- Which roles may fence which names: a NAME, or a PREFIX followed by * (every name that starts
-- with PREFIX; * alone is every name).
CREATE TABLE IF NOT EXISTS leasewrap_data.allowed (
    role regrole NOT NULL,
    names text NOT NULL
        CHECK (names OPERATOR(pg_catalog.~) '^([A-Za-z0-9._@:+=-]{1,128}|[A-Za-z0-9._@:+=-]{0,127}[*])$'::pg_catalog.text),
    PRIMARY KEY (role, names)
);

-- One row per lease NAME, never deleted (docs/database.md): version moves with every change,
-- token counts the takes (the fencing token, a u64), held says whether someone holds it, ttl_ms
-- is L as its holder asked for it, holder says who (JSON: host, pid, program). No clock column:
-- nothing here is timed by a server's clock.
CREATE TABLE IF NOT EXISTS leasewrap_data.lease (
    name text PRIMARY KEY
        CHECK (name OPERATOR(pg_catalog.~) '^[A-Za-z0-9._@:+=-]{1,128}$'::pg_catalog.text),
    version bigint NOT NULL CHECK (version OPERATOR(pg_catalog.>=) 1::pg_catalog.int8),
    token numeric(20,0) NOT NULL
        CHECK (token OPERATOR(pg_catalog.>=) 1::pg_catalog.numeric
               AND token OPERATOR(pg_catalog.<=) 18446744073709551615::pg_catalog.numeric),
    held boolean NOT NULL,
    ttl_ms bigint NOT NULL,
    holder text NOT NULL
);

-- The run records of --once and --once-per (SPEC §10): one row per (NAME, KEY), the record's
-- JSON as leasewrap writes it. Written and deleted only by NAME's holder, under its token.
CREATE TABLE IF NOT EXISTS leasewrap_data.run (
    name text NOT NULL
        CHECK (name OPERATOR(pg_catalog.~) '^[A-Za-z0-9._@:+=-]{1,128}$'::pg_catalog.text),
    key text NOT NULL
        CHECK (key OPERATOR(pg_catalog.~) '^[A-Za-z0-9._@:+=-]{1,128}$'::pg_catalog.text),
    record text NOT NULL CHECK (pg_catalog.length(record) OPERATOR(pg_catalog.<=) 65536),
    PRIMARY KEY (name, key)
);

-- The version installed.
CREATE TABLE IF NOT EXISTS leasewrap_data.installed (
    version integer NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);

-- What this script made, and who gets a right on it (leasewrap_objects, above): what a tie
-- grants is read from here.
CREATE TABLE IF NOT EXISTS leasewrap_data.objects (
    kind text NOT NULL,
    identity text PRIMARY KEY,
    for_whom text
);
DELETE FROM leasewrap_data.objects;
INSERT INTO leasewrap_data.objects (kind, identity, for_whom)
    SELECT o.kind, o.identity, o.for_whom FROM pg_temp.leasewrap_objects AS o
    WHERE o.kind OPERATOR(pg_catalog.!~~) 'old %';

DO $owners$
DECLARE
    table_made regclass;
BEGIN
    FOR table_made IN SELECT c.oid FROM pg_catalog.pg_class AS c
                      WHERE c.relnamespace = pg_catalog.to_regnamespace('leasewrap_data')
                        AND c.relkind = 'r' AND c.relowner <> 'leasewrap_fence'::regrole LOOP
        EXECUTE format('ALTER TABLE %s OWNER TO leasewrap_fence', table_made);
    END LOOP;
END;
$owners$;

-- The checks of the fence table, made (again) with the search_path above: version 1 made them
-- with the installer's, where a planted operator could have been resolved.
DO $constraints$
BEGIN
    IF (SELECT version FROM pg_temp.leasewrap_before) = 1 THEN
        IF EXISTS (SELECT FROM leasewrap_data.fence AS f
                   WHERE f.name OPERATOR(pg_catalog.!~) '^[A-Za-z0-9._@:+=-]{1,128}$'::pg_catalog.text) THEN
            RAISE EXCEPTION 'leasewrap fence: leasewrap.fence has rows whose name is not a lease name (1 to 128 ASCII letters, digits and ._-@:+=)'
                USING ERRCODE = '23514',
                      HINT = 'see them with SELECT name FROM leasewrap.fence; delete them and run this again';
        END IF;
        ALTER TABLE leasewrap_data.fence DROP CONSTRAINT IF EXISTS fence_name_check;
        ALTER TABLE leasewrap_data.fence DROP CONSTRAINT IF EXISTS fence_token_check;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_constraint AS c
                   WHERE c.conrelid = 'leasewrap_data.fence'::pg_catalog.regclass
                     AND c.conname = 'fence_name_check') THEN
        ALTER TABLE leasewrap_data.fence ADD CONSTRAINT fence_name_check
            CHECK (name OPERATOR(pg_catalog.~) '^[A-Za-z0-9._@:+=-]{1,128}$'::pg_catalog.text);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_constraint AS c
                   WHERE c.conrelid = 'leasewrap_data.fence'::pg_catalog.regclass
                     AND c.conname = 'fence_token_check') THEN
        ALTER TABLE leasewrap_data.fence ADD CONSTRAINT fence_token_check
            CHECK (token OPERATOR(pg_catalog.>=) 0::pg_catalog.numeric
                   AND token OPERATOR(pg_catalog.<=) 18446744073709551615::pg_catalog.numeric);
    END IF;
END;
$constraints$;

-- The settings an administrator gave the functions (ALTER FUNCTION ... SET lock_timeout = ...),
-- which CREATE OR REPLACE below would drop: they are put back after it.
CREATE TEMPORARY TABLE leasewrap_settings ON COMMIT DROP AS
SELECT p.oid::pg_catalog.regprocedure::pg_catalog.text AS fn, s.setting
    FROM pg_catalog.pg_proc AS p, pg_catalog.unnest(p.proconfig) AS s(setting)
    WHERE p.pronamespace = pg_catalog.to_regnamespace('leasewrap')
      AND s.setting OPERATOR(pg_catalog.!~~) 'search_path=%'::pg_catalog.text;

-- Whether a tie (a NAME, PREFIX* or *) covers the lease name NAME: the one rule of what a tie
-- covers, for the fence's check and for the overlaps allow() warns of. Plain SQL with every
-- name qualified, so that the planner inlines it where it is used.
CREATE OR REPLACE FUNCTION leasewrap_data.covers(names text, name text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $covers$
    SELECT names OPERATOR(pg_catalog.=) name
        OR (pg_catalog.right(names, 1) OPERATOR(pg_catalog.=) '*'::pg_catalog.text
            AND pg_catalog.left(name, pg_catalog.length(names) OPERATOR(pg_catalog.-) 1)
                OPERATOR(pg_catalog.=) pg_catalog.left(names, pg_catalog.length(names) OPERATOR(pg_catalog.-) 1));
$covers$;

-- Who may use the lease name NAME: a row when the role that logged in is a member of a role
-- tied to names that cover NAME (a superuser is a member of every role). The role is
-- session_user: current_user, inside a fence, is its owner, and SET ROLE does not change
-- session_user. Every function that uses a name asks here, as EXISTS (SELECT FROM
-- leasewrap_data.may_use(NAME)): a set-returning SQL function with no SET clause and every name
-- in it qualified is inlined into that query by the planner, where a call of its own would cost
-- the fence as much again as its write.
CREATE OR REPLACE FUNCTION leasewrap_data.may_use(name text)
RETURNS SETOF boolean
LANGUAGE sql
STABLE
AS $may_use$
    SELECT true FROM leasewrap_data.allowed AS a
    WHERE leasewrap_data.covers(a.names, may_use.name)
      AND pg_catalog.pg_has_role(session_user, a.role, 'MEMBER'::pg_catalog.text)
    LIMIT 1;
$may_use$;

-- The fence. Every bad input gets LWF02 (a token of any text, '1e1000000' and 'NaN' included, is
-- parsed here, not by numeric's input); a name is checked by leasewrap's own rule for lease names.
CREATE OR REPLACE FUNCTION leasewrap.fence(name text, token text)
RETURNS numeric
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fence$
DECLARE
    wanted numeric;
    stored numeric;
    row_xmin text;
BEGIN
    IF name IS NULL OR name !~ '^[A-Za-z0-9._@:+=-]{1,128}$'::text THEN
        RAISE EXCEPTION 'leasewrap.fence: the lease name % is not 1 to 128 ASCII letters, digits and ._-@:+=',
                CASE WHEN name IS NULL THEN 'NULL'
                     ELSE to_json(left(name, 64))::text
                          || CASE WHEN length(name) > 64
                                  THEN format(' (%s characters)', length(name)) ELSE '' END
                END
            USING ERRCODE = 'LWF02',
                  HINT = 'pass the lease name, with psql''s -v name="$LEASEWRAP_NAME"';
    END IF;
    IF token IS NULL OR token !~ '^[0-9]{1,20}$'::text
            OR token::numeric > 18446744073709551615::numeric THEN
        RAISE EXCEPTION 'leasewrap.fence: fencing token % for "%" is not a whole number from 0 to 18446744073709551615',
                coalesce(to_json(left(token, 64))::text, 'NULL'), name
            USING ERRCODE = 'LWF02',
                  HINT = 'pass the token leasewrap gave, with psql''s -v token="$LEASEWRAP_FENCING_TOKEN"';
    END IF;
    wanted := token::numeric;
    IF NOT EXISTS (SELECT FROM leasewrap_data.may_use(fence.name)) THEN
        RAISE EXCEPTION 'leasewrap.fence: role % may not fence "%"', session_user, name
            USING ERRCODE = '42501',
                  HINT = format('an administrator ties names to roles: SELECT leasewrap.allow(%L, %L)',
                                session_user, name);
    END IF;
    -- ON CONFLICT DO UPDATE locks the conflicting row even when its WHERE is false, so a
    -- refused fence has also waited for the transaction that holds the row.
    INSERT INTO leasewrap_data.fence AS f (name, token)
        VALUES (fence.name, wanted)
        ON CONFLICT ON CONSTRAINT fence_pkey DO UPDATE
            SET token = EXCLUDED.token, fenced_at = now()
            WHERE f.token <= EXCLUDED.token
        RETURNING f.token, f.xmin::text INTO stored, row_xmin;
    IF NOT FOUND THEN
        SELECT f.token INTO stored FROM leasewrap_data.fence AS f WHERE f.name = fence.name;
        RAISE EXCEPTION 'stale fencing token % for "%": % is recorded', wanted, name, stored
            USING ERRCODE = 'LWF01',
                  HINT = 'a newer holder of the lease has written; this transaction must not';
    END IF;
    -- The row version just written carries the writing (sub)transaction's id: another id than
    -- the top-level transaction's means a savepoint (or an exception block), and rolling back
    -- to it would release the row while the transaction goes on writing.
    IF row_xmin <> (txid_current() % 4294967296)::text THEN
        RAISE EXCEPTION 'leasewrap.fence: called inside a savepoint or an exception block, whose rollback would undo the fence while the transaction goes on'
            USING ERRCODE = 'LWF03',
                  HINT = 'call the fence first in the transaction, outside any SAVEPOINT (psql: no ON_ERROR_ROLLBACK; psycopg: connect with autocommit=True, so that conn.transaction() is a transaction)';
    END IF;
    RETURN stored;
END;
$fence$;

-- The same for a token passed as a number (an integer, bigint or numeric argument).
CREATE OR REPLACE FUNCTION leasewrap.fence(name text, token numeric)
RETURNS numeric
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fence$
    SELECT leasewrap.fence(name, token::text);
$fence$;

-- Every name and its token, for the roles an administrator lets read them
-- (GRANT USAGE ON SCHEMA leasewrap, EXECUTE ON FUNCTION leasewrap.fences() TO monitor): no role
-- but the owner may read the table itself, or lock its rows.
CREATE OR REPLACE FUNCTION leasewrap.fences()
RETURNS TABLE (name text, token numeric, fenced_at timestamptz)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fences$
    SELECT f.name, f.token, f.fenced_at FROM leasewrap_data.fence AS f ORDER BY f.name;
$fences$;

-- The lease's check of a name and of the role that logged in: LWF02 for a bad name, 42501 for
-- a role not tied to it (docs/security.md). Called by the lease's functions only.
CREATE OR REPLACE FUNCTION leasewrap_data.lease_check(name text)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $lease_check$
BEGIN
    IF name IS NULL OR name !~ '^[A-Za-z0-9._@:+=-]{1,128}$'::text THEN
        RAISE EXCEPTION 'leasewrap lease: the lease name % is not 1 to 128 ASCII letters, digits and ._-@:+=',
                coalesce(to_json(left(name, 64))::text, 'NULL')
            USING ERRCODE = 'LWF02';
    END IF;
    IF NOT EXISTS (SELECT FROM leasewrap_data.may_use(lease_check.name)) THEN
        RAISE EXCEPTION 'leasewrap lease: role % may not use the lease "%"', session_user, name
            USING ERRCODE = '42501',
                  HINT = format('an administrator ties names to roles: SELECT leasewrap.allow(%L, %L)',
                                session_user, name);
    END IF;
END;
$lease_check$;

-- The version of this SQL, which leasewrap checks before it takes a lease.
CREATE OR REPLACE FUNCTION leasewrap.lease_sql()
RETURNS integer
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $lease_sql$
    SELECT 5;
$lease_sql$;

-- The row of NAME; a name never taken reads as version 0, free.
CREATE OR REPLACE FUNCTION leasewrap.lease_read(name text)
RETURNS TABLE (version bigint, token numeric, held boolean, ttl_ms bigint, holder text)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $lease_read$
BEGIN
    PERFORM leasewrap_data.lease_check(lease_read.name);
    RETURN QUERY
        SELECT l.version, l.token, l.held, l.ttl_ms, l.holder FROM leasewrap_data.lease AS l
            WHERE l.name = lease_read.name
        UNION ALL
        SELECT 0::bigint, 0::numeric, false, 0::bigint, ''::text
            WHERE NOT EXISTS (SELECT FROM leasewrap_data.lease AS l WHERE l.name = lease_read.name)
        LIMIT 1;
END;
$lease_read$;

-- Take NAME: a compare-and-set on the version the taker read (0: never taken). One more take on
-- the token, the version moved, L and the holder recorded. No row when the version moved.
CREATE OR REPLACE FUNCTION leasewrap.lease_take(name text, seen bigint, ttl_ms bigint, holder text)
RETURNS TABLE (version bigint, token numeric)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $lease_take$
BEGIN
    PERFORM leasewrap_data.lease_check(lease_take.name);
    IF seen IS NULL OR seen < 0 OR ttl_ms IS NULL OR ttl_ms < 1000 OR ttl_ms > 315360000000
            OR holder IS NULL OR length(holder) > 4096 THEN
        RAISE EXCEPTION 'leasewrap lease: take of "%" with version %, ttl_ms % and a holder of % characters',
                name, seen, ttl_ms, length(holder)
            USING ERRCODE = 'LWF02';
    END IF;
    IF seen = 0 THEN
        RETURN QUERY
            INSERT INTO leasewrap_data.lease AS l (name, version, token, held, ttl_ms, holder)
                VALUES (lease_take.name, 1, 1, true, lease_take.ttl_ms, lease_take.holder)
                ON CONFLICT ON CONSTRAINT lease_pkey DO NOTHING
                RETURNING l.version, l.token;
    ELSE
        RETURN QUERY
            UPDATE leasewrap_data.lease AS l
                SET version = l.version + 1, token = l.token + 1, held = true,
                    ttl_ms = lease_take.ttl_ms, holder = lease_take.holder
                WHERE l.name = lease_take.name AND l.version = lease_take.seen
                  AND l.token < 18446744073709551615::numeric
                RETURNING l.version, l.token;
    END IF;
END;
$lease_take$;

-- Renew NAME: a compare-and-set on the holder's token; the version moves. renewed is false when
-- the row is another holder's (token) or free (held).
CREATE OR REPLACE FUNCTION leasewrap.lease_renew(name text, token numeric)
RETURNS TABLE (renewed boolean, token_now numeric, held boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $lease_renew$
BEGIN
    PERFORM leasewrap_data.lease_check(lease_renew.name);
    RETURN QUERY
        UPDATE leasewrap_data.lease AS l SET version = l.version + 1
            WHERE l.name = lease_renew.name AND l.token = lease_renew.token AND l.held
            RETURNING true, l.token, l.held;
    IF NOT FOUND THEN
        RETURN QUERY
            SELECT false, l.token, l.held FROM leasewrap_data.lease AS l WHERE l.name = lease_renew.name
            UNION ALL
            SELECT false, 0::numeric, false
                WHERE NOT EXISTS (SELECT FROM leasewrap_data.lease AS l WHERE l.name = lease_renew.name)
            LIMIT 1;
    END IF;
END;
$lease_renew$;

-- Release NAME: a compare-and-set on the holder's token; the row is free and the version moves,
-- and the waiters that listen on leasewrap_lease are told (at commit).
CREATE OR REPLACE FUNCTION leasewrap.lease_release(name text, token numeric)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $lease_release$
BEGIN
    PERFORM leasewrap_data.lease_check(lease_release.name);
    UPDATE leasewrap_data.lease AS l SET version = l.version + 1, held = false
        WHERE l.name = lease_release.name AND l.token = lease_release.token AND l.held;
    IF FOUND THEN
        PERFORM pg_notify('leasewrap_lease', lease_release.name);
    END IF;
    RETURN FOUND;
END;
$lease_release$;

-- The run record of (NAME, KEY): its JSON, or NULL before its first run.
CREATE OR REPLACE FUNCTION leasewrap.lease_run_read(name text, key text)
RETURNS text
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $lease_run_read$
BEGIN
    PERFORM leasewrap_data.lease_check(lease_run_read.name);
    RETURN (SELECT r.record FROM leasewrap_data.run AS r
            WHERE r.name = lease_run_read.name AND r.key = lease_run_read.key);
END;
$lease_run_read$;

-- Store the run record of (NAME, KEY), or delete it when RECORD is NULL (a sweep's: leasewrap
-- judges it expired), while NAME is held under TOKEN: the lease's row is locked (FOR SHARE) for
-- the statement, so no take commits between the check and the write. False, and nothing changed,
-- for a stale holder.
CREATE OR REPLACE FUNCTION leasewrap.lease_run_write(name text, token numeric, key text, record text)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $lease_run_write$
BEGIN
    PERFORM leasewrap_data.lease_check(lease_run_write.name);
    PERFORM FROM leasewrap_data.lease AS l
        WHERE l.name = lease_run_write.name AND l.token = lease_run_write.token AND l.held
        FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    ELSIF record IS NULL THEN
        DELETE FROM leasewrap_data.run AS r
            WHERE r.name = lease_run_write.name AND r.key = lease_run_write.key;
    ELSE
        INSERT INTO leasewrap_data.run AS r (name, key, record)
            VALUES (lease_run_write.name, lease_run_write.key, lease_run_write.record)
            ON CONFLICT ON CONSTRAINT run_pkey DO UPDATE SET record = EXCLUDED.record;
    END IF;
    RETURN true;
END;
$lease_run_write$;

-- At most max_rows of NAME's run records, by KEY: the last keys first (a --once-per slot's key
-- is its time, so those are the newest), or the first (a sweep's).
CREATE OR REPLACE FUNCTION leasewrap.lease_runs(name text, max_rows integer, oldest_first boolean)
RETURNS TABLE (key text, record text)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $lease_runs$
BEGIN
    PERFORM leasewrap_data.lease_check(lease_runs.name);
    RETURN QUERY
        SELECT r.key, r.record FROM leasewrap_data.run AS r WHERE r.name = lease_runs.name
            ORDER BY CASE WHEN oldest_first THEN r.key END COLLATE "C" ASC,
                     CASE WHEN NOT oldest_first THEN r.key END COLLATE "C" DESC
            LIMIT greatest(least(max_rows, 1000), 0);
END;
$lease_runs$;

-- The names, at most 1000, that have a lease's row or a run record and that the role that logged
-- in may use: what `leasewrap status` without a NAME lists.
CREATE OR REPLACE FUNCTION leasewrap.lease_names()
RETURNS SETOF text
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $lease_names$
    SELECT n.name FROM (SELECT l.name FROM leasewrap_data.lease AS l
                        UNION SELECT r.name FROM leasewrap_data.run AS r) AS n
    WHERE EXISTS (SELECT FROM leasewrap_data.may_use(n.name))
    ORDER BY n.name COLLATE "C"
    LIMIT 1000;
$lease_names$;

-- Grants (or revokes) role what a tie gives it: the objects listed for 'tied' (USAGE on the
-- schema leasewrap, EXECUTE on the fence). A role dropped since it was tied has nothing left to
-- grant or revoke; a role that reads with fences() keeps its USAGE.
CREATE OR REPLACE FUNCTION leasewrap_data.grant_to(role regrole, grant_it boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $grant_to$
DECLARE
    made record;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles AS r WHERE r.oid = role) THEN
        RETURN;
    END IF;
    FOR made IN SELECT o.kind, o.identity FROM leasewrap_data.objects AS o WHERE o.for_whom = 'tied' LOOP
        CONTINUE WHEN NOT grant_it AND made.kind = 'schema'
            AND EXISTS (SELECT FROM leasewrap_data.objects AS g
                        WHERE g.for_whom = 'granted'
                          AND has_function_privilege(role, to_regprocedure(g.identity), 'EXECUTE'));
        EXECUTE format(CASE WHEN grant_it THEN 'GRANT %s ON %s %s TO %s' ELSE 'REVOKE %s ON %s %s FROM %s' END,
                       CASE made.kind WHEN 'schema' THEN 'USAGE' ELSE 'EXECUTE' END,
                       upper(made.kind), made.identity, role);
    END LOOP;
END;
$grant_to$;

-- Lets role fence names: a NAME, PREFIX* or *. Grants the role what a tie gives (USAGE on the
-- schema leasewrap, EXECUTE on the fence); nothing on the tables. Warns of another role's tie
-- that covers a name this one covers too: each of the two may record a token the other's
-- holders cannot pass (18446744073709551615 stops every later holder of that name).
CREATE OR REPLACE FUNCTION leasewrap.allow(role regrole, names text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $allow$
DECLARE
    other record;
BEGIN
    IF role IS NULL OR NOT EXISTS (SELECT FROM pg_roles AS r WHERE r.oid = role) OR names IS NULL
       OR names !~ '^([A-Za-z0-9._@:+=-]{1,128}|[A-Za-z0-9._@:+=-]{0,127}[*])$'::text THEN
        RAISE EXCEPTION 'leasewrap.allow: % is not a role and a lease name, PREFIX* or *',
                format('%s, %s', coalesce(role::text, 'NULL'), coalesce(to_json(left(names, 64))::text, 'NULL'))
            USING ERRCODE = 'LWF02';
    END IF;
    PERFORM leasewrap_data.grant_to(role, true);
    INSERT INTO leasewrap_data.allowed (role, names) VALUES (allow.role, allow.names)
        ON CONFLICT DO NOTHING;
    FOR other IN SELECT a.role, a.names FROM leasewrap_data.allowed AS a
                 WHERE a.role <> allow.role
                   AND (leasewrap_data.covers(a.names, rtrim(allow.names, '*'))
                        OR leasewrap_data.covers(allow.names, rtrim(a.names, '*')))
                 ORDER BY a.role::text, a.names LOOP
        RAISE WARNING '%', format('leasewrap.allow: role %s (%s) and role %s (%s) may both fence a name: either may record a token that stops the other''s holders',
                                  role, names, other.role, other.names)
            USING HINT = 'give each role names no other role''s names cover, such as a prefix of its own that ends in a dot (etl.*, report.*)';
    END LOOP;
END;
$allow$;

-- Undoes allow(role, names), also for a role dropped since; the role's grants go with its last
-- tie.
CREATE OR REPLACE FUNCTION leasewrap.disallow(role regrole, names text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $disallow$
BEGIN
    DELETE FROM leasewrap_data.allowed AS a WHERE a.role = disallow.role AND a.names = disallow.names;
    IF NOT EXISTS (SELECT FROM leasewrap_data.allowed AS a WHERE a.role = disallow.role) THEN
        PERFORM leasewrap_data.grant_to(role, false);
    END IF;
END;
$disallow$;

-- The functions' owner, and the administrator's settings back; on a first install (or from
-- version 1) the fence's own wait gets its bound.
DO $settings$
DECLARE
    made record;
    kept record;
BEGIN
    FOR made IN SELECT o.identity FROM leasewrap_data.objects AS o
                WHERE o.kind = 'function'
                  AND (SELECT p.proowner FROM pg_catalog.pg_proc AS p
                       WHERE p.oid = pg_catalog.to_regprocedure(o.identity)) <> 'leasewrap_fence'::regrole LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO leasewrap_fence', made.identity);
    END LOOP;
    FOR kept IN SELECT * FROM pg_temp.leasewrap_settings AS s
                WHERE pg_catalog.to_regprocedure(s.fn) IS NOT NULL LOOP
        EXECUTE format('ALTER FUNCTION %s SET %s TO %L', kept.fn,
                       split_part(kept.setting, '=', 1),
                       substr(kept.setting, strpos(kept.setting, '=') + 1));
    END LOOP;
    IF (SELECT version FROM pg_temp.leasewrap_before) IS DISTINCT FROM 2
            AND (SELECT version FROM pg_temp.leasewrap_before) IS DISTINCT FROM 3 THEN
        -- (3 is also any later version: their settings are kept.)
        ALTER FUNCTION leasewrap.fence(text, text) SET lock_timeout = '2min';
    END IF;
END;
$settings$;

-- Keeps on every object this script made (of those that were not there before the run, with
-- `fresh`) its owner's rights and, unless `fresh`, the rights its entry in leasewrap_data.objects
-- gives; nothing else: not what default privileges gave it when it was made (ALTER DEFAULT
-- PRIVILEGES ... GRANT ... TO app_rw), not a column's grant, not TRIGGER or REFERENCES, not
-- CREATE on a schema, not PUBLIC's EXECUTE.
CREATE OR REPLACE FUNCTION pg_temp.leasewrap_keep_only_documented(fresh boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $keep$
DECLARE
    tied oid[] := ARRAY(SELECT DISTINCT a.role::oid FROM leasewrap_data.allowed AS a);
    readers oid[];
    made record;
    entry record;
    kept text;
BEGIN
    readers := ARRAY(SELECT DISTINCT acl.grantee
                     FROM leasewrap_data.objects AS o, pg_catalog.pg_proc AS p, aclexplode(p.proacl) AS acl
                     WHERE o.for_whom = 'granted' AND p.oid = pg_catalog.to_regprocedure(o.identity)
                       AND acl.grantee <> 0 AND acl.grantee <> p.proowner);
    FOR made IN
        SELECT o.kind, o.identity, o.for_whom, x.owner, coalesce(x.acl, acldefault(x.code, x.owner)) AS acl
        FROM leasewrap_data.objects AS o,
             LATERAL (SELECT n.oid, n.nspowner, n.nspacl, 'n'::"char" FROM pg_catalog.pg_namespace AS n
                          WHERE o.kind = 'schema' AND n.nspname = o.identity
                      UNION ALL
                      SELECT c.oid, c.relowner, c.relacl, 'r'::"char" FROM pg_catalog.pg_class AS c
                          WHERE o.kind = 'table' AND c.oid = pg_catalog.to_regclass(o.identity)
                      UNION ALL
                      SELECT p.oid, p.proowner, p.proacl, 'f'::"char" FROM pg_catalog.pg_proc AS p
                          WHERE o.kind = 'function' AND p.oid = pg_catalog.to_regprocedure(o.identity))
                 AS x(objid, owner, acl, code)
        WHERE NOT fresh OR x.objid NOT IN (SELECT e.objid FROM pg_temp.leasewrap_existed AS e)
    LOOP
        FOR entry IN
            SELECT acl.grantee,
                   array_agg(acl.privilege_type || CASE WHEN acl.is_grantable THEN '*' ELSE '' END
                             ORDER BY acl.privilege_type) AS privileges
            FROM aclexplode(made.acl) AS acl
            GROUP BY acl.grantee
        LOOP
            kept := CASE
                        WHEN entry.grantee = made.owner THEN NULL
                        WHEN fresh OR entry.grantee = 0 OR made.for_whom IS NULL THEN ''
                        WHEN made.for_whom = 'granted'
                             OR entry.grantee = ANY (tied)
                             OR (made.kind = 'schema' AND entry.grantee = ANY (readers))
                            THEN CASE made.kind WHEN 'schema' THEN 'USAGE' ELSE 'EXECUTE' END
                        ELSE ''
                    END;
            CONTINUE WHEN kept IS NULL OR entry.privileges = ARRAY[kept];
            EXECUTE format('REVOKE ALL ON %s %s FROM %s CASCADE', upper(made.kind), made.identity,
                           CASE WHEN entry.grantee = 0 THEN 'PUBLIC' ELSE entry.grantee::regrole::text END);
            IF kept <> '' THEN
                EXECUTE format('GRANT %s ON %s %s TO %s', kept, upper(made.kind), made.identity,
                               entry.grantee::regrole);
            END IF;
        END LOOP;
        EXECUTE format('GRANT ALL ON %s %s TO leasewrap_fence', upper(made.kind), made.identity);
    END LOOP;
    FOR entry IN
        SELECT DISTINCT a.attrelid::regclass AS table_made, a.attname, acl.grantee
        FROM leasewrap_data.objects AS o, pg_catalog.pg_attribute AS a, aclexplode(a.attacl) AS acl
        WHERE o.kind = 'table' AND a.attrelid = pg_catalog.to_regclass(o.identity)
          AND (NOT fresh OR a.attrelid NOT IN (SELECT e.objid FROM pg_temp.leasewrap_existed AS e))
    LOOP
        EXECUTE format('REVOKE ALL (%I) ON TABLE %s FROM %s CASCADE', entry.attname, entry.table_made,
                       CASE WHEN entry.grantee = 0 THEN 'PUBLIC' ELSE entry.grantee::regrole::text END);
    END LOOP;
END;
$keep$;

-- What the objects made by this run got when they were made (default privileges, PUBLIC's
-- EXECUTE) goes before anything is granted on them.
DO $fresh$ BEGIN PERFORM pg_temp.leasewrap_keep_only_documented(true); END; $fresh$;

-- From version 1, whose job roles had rights on the fence table (in its ACL or a column's): a
-- role that could write it may fence every name (*) until an administrator ties it to its
-- own; a role that could only read it reads with fences(). Versions 1 and 2 let an
-- administrator grant a role SELECT on the table: such a role reads with fences() too. The
-- table rights themselves go with the clean-up below.
DO $from_older$
DECLARE
    before integer := (SELECT version FROM pg_temp.leasewrap_before);
    grantee record;
BEGIN
    IF before IS NULL OR before >= 3 THEN
        RETURN;
    END IF;
    FOR grantee IN
        SELECT acl.grantee::regrole AS role,
               bool_or(acl.privilege_type IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE')) AS wrote
        FROM (SELECT (aclexplode(c.relacl)).* FROM pg_catalog.pg_class AS c
                  WHERE c.oid = 'leasewrap_data.fence'::regclass AND c.relacl IS NOT NULL
              UNION ALL
              SELECT (aclexplode(a.attacl)).* FROM pg_catalog.pg_attribute AS a
                  WHERE a.attrelid = 'leasewrap_data.fence'::regclass AND a.attacl IS NOT NULL) AS acl
        WHERE acl.grantee <> 0 AND acl.grantee <> 'leasewrap_fence'::regrole
        GROUP BY acl.grantee
        ORDER BY acl.grantee::regrole::text
    LOOP
        IF grantee.wrote AND before = 1 THEN
            PERFORM leasewrap.allow(grantee.role, '*');
            RAISE WARNING '%', format('leasewrap fence: role %s may no longer write the fence table, and may fence every name: tie it to its own with leasewrap.allow(%L, NAME) and leasewrap.disallow(%L, %L)',
                                      grantee.role, grantee.role, grantee.role, '*');
        ELSIF NOT grantee.wrote THEN
            EXECUTE format('GRANT USAGE ON SCHEMA leasewrap TO %s', grantee.role);
            EXECUTE format('GRANT EXECUTE ON FUNCTION leasewrap.fences() TO %s', grantee.role);
            RAISE WARNING '%', format('leasewrap fence: role %s may no longer read the fence table, which only its owner may now use; it reads every name and token with SELECT * FROM leasewrap.fences()',
                                      grantee.role);
        END IF;
    END LOOP;
END;
$from_older$;

-- A tie of a role dropped since (DROP OWNED BY, then DROP ROLE) names nobody: it goes.
DO $dropped$
DECLARE
    gone record;
BEGIN
    FOR gone IN DELETE FROM leasewrap_data.allowed AS a
                WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid = a.role)
                RETURNING a.role::oid AS role, a.names LOOP
        RAISE WARNING '%', format('leasewrap fence: the role whose OID was %s has been dropped; its tie to %s is removed',
                                  gone.role, gone.names);
    END LOOP;
END;
$dropped$;

-- Every object: its owner's rights and the documented ones.
DO $documented$ BEGIN PERFORM pg_temp.leasewrap_keep_only_documented(false); END; $documented$;


-- Default privileges of leasewrap_fence (which only a role that could act as it made) would
-- give its next objects to others: they go, and a global entry gets back the built-in default.
DO $defaults$
DECLARE
    entry record;
BEGIN
    FOR entry IN
        SELECT d.defaclnamespace, d.defaclobjtype, acl.grantee,
               CASE d.defaclobjtype WHEN 'r' THEN 'TABLES' WHEN 'S' THEN 'SEQUENCES'
                   WHEN 'f' THEN 'FUNCTIONS' WHEN 'T' THEN 'TYPES' ELSE 'SCHEMAS' END AS objects
        FROM pg_catalog.pg_default_acl AS d, aclexplode(d.defaclacl) AS acl
        WHERE d.defaclrole = 'leasewrap_fence'::regrole
    LOOP
        EXECUTE format('ALTER DEFAULT PRIVILEGES FOR ROLE leasewrap_fence %s REVOKE ALL ON %s FROM %s',
                       CASE WHEN entry.defaclnamespace <> 0
                            THEN format('IN SCHEMA %I', entry.defaclnamespace::regnamespace) ELSE '' END,
                       entry.objects,
                       CASE WHEN entry.grantee = 0 THEN 'PUBLIC' ELSE entry.grantee::regrole::text END);
        IF entry.defaclnamespace = 0 THEN
            EXECUTE format('ALTER DEFAULT PRIVILEGES FOR ROLE leasewrap_fence GRANT ALL ON %s TO leasewrap_fence',
                           entry.objects);
            IF entry.defaclobjtype IN ('f', 'T') THEN
                EXECUTE format('ALTER DEFAULT PRIVILEGES FOR ROLE leasewrap_fence GRANT ALL ON %s TO PUBLIC',
                               entry.objects);
            END IF;
        END IF;
    END LOOP;
END;
$defaults$;

-- What each tie gives, to every tied role (an upgrade's and a re-run's alike).
DO $ties$
DECLARE
    tied regrole;
BEGIN
    FOR tied IN SELECT DISTINCT a.role FROM leasewrap_data.allowed AS a LOOP
        PERFORM leasewrap_data.grant_to(tied, true);
    END LOOP;
END;
$ties$;

DELETE FROM leasewrap_data.installed;
INSERT INTO leasewrap_data.installed (version) VALUES (5);

COMMIT;
