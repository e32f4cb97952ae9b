-- leasewrap's database fence for PostgreSQL, version 2 (PostgreSQL 9.5 or later; tested with 15),
-- printed by `leasewrap fence-sql postgres` and installed as
-- /usr/share/leasewrap/sql/postgres-fence.sql.
--
-- Install or upgrade, as a superuser, as often as you like (it checks what is there first, and
-- changes nothing when it refuses):
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
-- What it makes: the role leasewrap_fence (NOLOGIN; it owns the schema leasewrap and what is in
-- it, and nothing else), the tables leasewrap.fence (NAME -> highest token), leasewrap.allowed
-- (role -> NAME or PREFIX*) and leasewrap.installed (this version), and the functions
-- leasewrap.fence(text, text), leasewrap.fence(text, numeric) (SECURITY DEFINER, EXECUTE granted
-- per job role), leasewrap.allow(regrole, text) and leasewrap.disallow(regrole, text) (for
-- administrators). Nothing here is resolved through the caller's search_path.

BEGIN;
-- Only pg_catalog, then this session's own temp schema: an operator or function that another
-- role planted in public (or anywhere) is never resolved, neither here nor in the CHECKs and
-- function bodies made here.
SET LOCAL search_path = pg_catalog, pg_temp;
SET LOCAL client_min_messages = warning;

-- What is there already, and whether this script may build on it. Every refusal comes before
-- anything is changed, and the transaction then rolls back.
DO $check$
DECLARE
    owner_role pg_catalog.pg_roles%ROWTYPE;
    schema_owner name;
    token_type text;
    installed integer;
    stranger text;
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = current_user) THEN
        RAISE EXCEPTION 'leasewrap fence: install it as a superuser (this is %)', current_user
            USING ERRCODE = '42501',
                  HINT = 'it makes the role leasewrap_fence and gives it the schema leasewrap';
    END IF;
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
    SELECT pg_catalog.pg_get_userbyid(n.nspowner) INTO schema_owner
        FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'leasewrap';
    IF schema_owner IS NOT NULL AND schema_owner <> 'leasewrap_fence'
            AND NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = schema_owner) THEN
        RAISE EXCEPTION 'leasewrap fence: the schema leasewrap belongs to the role %, not to leasewrap_fence: it was not made by this script, and that role could replace the fence', schema_owner
            USING ERRCODE = '42501',
                  HINT = 'find out who made it and what is in it; drop it (DROP SCHEMA leasewrap CASCADE) and run this again';
    END IF;
    SELECT c.relname || ' (owner ' || pg_catalog.pg_get_userbyid(c.relowner) || ')' INTO stranger
        FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_roles AS r ON r.oid = c.relowner
        WHERE c.relnamespace = pg_catalog.to_regnamespace('leasewrap')
          AND r.rolname <> 'leasewrap_fence' AND NOT r.rolsuper
        UNION ALL
        SELECT p.oid::pg_catalog.regprocedure::text || ' (owner ' || pg_catalog.pg_get_userbyid(p.proowner) || ')'
        FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_roles AS r ON r.oid = p.proowner
        WHERE p.pronamespace = pg_catalog.to_regnamespace('leasewrap')
          AND r.rolname <> 'leasewrap_fence' AND NOT r.rolsuper
        LIMIT 1;
    IF stranger IS NOT NULL THEN
        RAISE EXCEPTION 'leasewrap fence: leasewrap.% is not leasewrap''s: it belongs to another role', stranger
            USING ERRCODE = '42501', HINT = 'find out who made it; drop it and run this again';
    END IF;
    SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) INTO token_type
        FROM pg_catalog.pg_attribute AS a
        WHERE a.attrelid = pg_catalog.to_regclass('leasewrap.fence') AND a.attname = 'token'
          AND NOT a.attisdropped;
    IF pg_catalog.to_regclass('leasewrap.fence') IS NOT NULL
            AND token_type IS DISTINCT FROM 'numeric(20,0)' THEN
        RAISE EXCEPTION 'leasewrap fence: leasewrap.fence.token is %, not numeric(20,0): it cannot hold every fencing token (0 to 18446744073709551615)', coalesce(token_type, 'missing')
            USING ERRCODE = '42804',
                  HINT = 'while no job runs: ALTER TABLE leasewrap.fence ALTER COLUMN token TYPE numeric(20,0); then run this again';
    END IF;
    IF pg_catalog.to_regclass('leasewrap.installed') IS NOT NULL THEN
        EXECUTE 'SELECT max(version) FROM leasewrap.installed' INTO installed;
        IF installed > 2 THEN
            RAISE EXCEPTION 'leasewrap fence: version % is installed, and this script is version 2', installed
                USING ERRCODE = '42710',
                      HINT = 'install the fence-sql of the leasewrap that made it, or a newer one';
        END IF;
    END IF;
END;
$check$;

CREATE SCHEMA IF NOT EXISTS leasewrap AUTHORIZATION leasewrap_fence;
ALTER SCHEMA leasewrap OWNER TO leasewrap_fence;
REVOKE ALL ON SCHEMA leasewrap FROM PUBLIC;

-- The version that was there before this run (1 for leasewrap's first fence, which had no such
-- table; NULL for none), for the upgrade steps below.
CREATE TEMPORARY TABLE leasewrap_before ON COMMIT DROP AS
SELECT CASE
           WHEN pg_catalog.to_regclass('leasewrap.installed') IS NOT NULL THEN 2
           WHEN pg_catalog.to_regclass('leasewrap.fence') IS NOT NULL THEN 1
       END AS version;

-- One row per lease NAME: the highest fencing token a transaction has committed under.
-- numeric(20,0) holds every u64; bigint is signed and would not.
CREATE TABLE IF NOT EXISTS leasewrap.fence (
    name text PRIMARY KEY,
    token numeric(20,0) NOT NULL,
    fenced_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
ALTER TABLE leasewrap.fence OWNER TO leasewrap_fence;

-- Which roles may fence which names: a NAME, or a PREFIX followed by * (every name that starts
-- with PREFIX; * alone is every name).
CREATE TABLE IF NOT EXISTS leasewrap.allowed (
    role regrole NOT NULL,
    names text NOT NULL
        CHECK (names OPERATOR(pg_catalog.~) '^([A-Za-z0-9._@:+=-]{1,128}|[A-Za-z0-9._@:+=-]{0,127}[*])$'::text),
    PRIMARY KEY (role, names)
);
ALTER TABLE leasewrap.allowed OWNER TO leasewrap_fence;

-- The version installed.
CREATE TABLE IF NOT EXISTS leasewrap.installed (
    version integer NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
ALTER TABLE leasewrap.installed OWNER TO leasewrap_fence;

-- The checks of leasewrap.fence, made (again) with the search_path above: version 1 made them
-- with the installer's, where a planted operator could have been resolved.
DO $constraints$
BEGIN
    IF (SELECT version FROM pg_temp.leasewrap_before) = 1 THEN
        IF EXISTS (SELECT FROM leasewrap.fence AS f
                   WHERE f.name OPERATOR(pg_catalog.!~) '^[A-Za-z0-9._@:+=-]{1,128}$'::text) THEN
            RAISE EXCEPTION 'leasewrap fence: leasewrap.fence has rows whose name is not a lease name (1 to 128 ASCII letters, digits and ._-@:+=)'
                USING ERRCODE = '23514',
                      HINT = 'see them with SELECT name FROM leasewrap.fence; delete them and run this again';
        END IF;
        ALTER TABLE leasewrap.fence DROP CONSTRAINT IF EXISTS fence_name_check;
        ALTER TABLE leasewrap.fence DROP CONSTRAINT IF EXISTS fence_token_check;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_constraint AS c
                   WHERE c.conrelid = 'leasewrap.fence'::pg_catalog.regclass
                     AND c.conname = 'fence_name_check') THEN
        ALTER TABLE leasewrap.fence ADD CONSTRAINT fence_name_check
            CHECK (name OPERATOR(pg_catalog.~) '^[A-Za-z0-9._@:+=-]{1,128}$'::text);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_constraint AS c
                   WHERE c.conrelid = 'leasewrap.fence'::pg_catalog.regclass
                     AND c.conname = 'fence_token_check') THEN
        ALTER TABLE leasewrap.fence ADD CONSTRAINT fence_token_check
            CHECK (token OPERATOR(pg_catalog.>=) 0::numeric
                   AND token OPERATOR(pg_catalog.<=) 18446744073709551615::numeric);
    END IF;
END;
$constraints$;

-- The settings an administrator gave the functions (ALTER FUNCTION ... SET lock_timeout = ...),
-- which CREATE OR REPLACE below would drop: they are put back after it.
CREATE TEMPORARY TABLE leasewrap_settings ON COMMIT DROP AS
SELECT p.oid::pg_catalog.regprocedure AS fn, s.setting
    FROM pg_catalog.pg_proc AS p, pg_catalog.unnest(p.proconfig) AS s(setting)
    WHERE p.pronamespace = pg_catalog.to_regnamespace('leasewrap')
      AND s.setting OPERATOR(pg_catalog.!~~) 'search_path=%'::text;

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
    -- Only the names tied to a role that the session's role is a member of (a superuser is a
    -- member of every role). session_user is the role that logged in: SET ROLE does not change
    -- it, and current_user here is leasewrap_fence.
    IF NOT EXISTS (SELECT FROM leasewrap.allowed AS a
                       WHERE (a.names = fence.name
                              OR (right(a.names, 1) = '*'::text
                                  AND left(fence.name, length(a.names) - 1)
                                      = left(a.names, length(a.names) - 1)))
                         AND pg_has_role(session_user, a.role, 'MEMBER'::text)) THEN
        RAISE EXCEPTION 'leasewrap.fence: role % may not fence "%"', session_user, name
            USING ERRCODE = '42501',
                  HINT = format('an administrator ties names to roles: SELECT leasewrap.allow(%L, %L)',
                                session_user, name);
    END IF;
    -- ON CONFLICT DO UPDATE locks the conflicting row even when its WHERE is false, so a
    -- refused fence has also waited for the transaction that holds the row.
    INSERT INTO leasewrap.fence AS f (name, token)
        VALUES (fence.name, wanted)
        ON CONFLICT ON CONSTRAINT fence_pkey DO UPDATE
            SET token = EXCLUDED.token, fenced_at = now()
            WHERE f.token <= EXCLUDED.token
        RETURNING f.token, f.xmin::text INTO stored, row_xmin;
    IF NOT FOUND THEN
        SELECT f.token INTO stored FROM leasewrap.fence AS f WHERE f.name = fence.name;
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

-- Grants (or revokes) role USAGE on the schema and EXECUTE on both fence functions.
CREATE OR REPLACE FUNCTION leasewrap.grant_fence(role regrole, grant_it boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $grant$
DECLARE
    verb text := CASE WHEN grant_it THEN 'GRANT %s %s TO %s' ELSE 'REVOKE %s %s FROM %s' END;
BEGIN
    EXECUTE format(verb, 'USAGE ON SCHEMA', 'leasewrap', role);
    EXECUTE format(verb, 'EXECUTE ON FUNCTION', 'leasewrap.fence(text, text), leasewrap.fence(text, numeric)', role);
END;
$grant$;

-- Lets role fence names: a NAME, PREFIX* or *. Grants the role USAGE on the schema and EXECUTE
-- on both fence functions; nothing on the tables.
CREATE OR REPLACE FUNCTION leasewrap.allow(role regrole, names text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $allow$
BEGIN
    IF role IS NULL OR role = 0::oid::regrole OR names IS NULL
       OR names !~ '^([A-Za-z0-9._@:+=-]{1,128}|[A-Za-z0-9._@:+=-]{0,127}[*])$'::text THEN
        RAISE EXCEPTION 'leasewrap.allow: % is not a role and a lease name, PREFIX* or *',
                format('%s, %s', coalesce(role::text, 'NULL'), coalesce(to_json(left(names, 64))::text, 'NULL'))
            USING ERRCODE = 'LWF02';
    END IF;
    PERFORM leasewrap.grant_fence(role, true);
    INSERT INTO leasewrap.allowed (role, names) VALUES (allow.role, allow.names)
        ON CONFLICT DO NOTHING;
END;
$allow$;

-- Undoes allow(role, names); the role's grants go with its last tie.
CREATE OR REPLACE FUNCTION leasewrap.disallow(role regrole, names text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $disallow$
BEGIN
    DELETE FROM leasewrap.allowed AS a WHERE a.role = disallow.role AND a.names = disallow.names;
    IF NOT EXISTS (SELECT FROM leasewrap.allowed AS a WHERE a.role = disallow.role) THEN
        PERFORM leasewrap.grant_fence(role, false);
    END IF;
END;
$disallow$;

ALTER FUNCTION leasewrap.fence(text, text) OWNER TO leasewrap_fence;
ALTER FUNCTION leasewrap.fence(text, numeric) OWNER TO leasewrap_fence;
ALTER FUNCTION leasewrap.allow(regrole, text) OWNER TO leasewrap_fence;
ALTER FUNCTION leasewrap.disallow(regrole, text) OWNER TO leasewrap_fence;
ALTER FUNCTION leasewrap.grant_fence(regrole, boolean) OWNER TO leasewrap_fence;
REVOKE ALL ON FUNCTION leasewrap.fence(text, text), leasewrap.fence(text, numeric),
    leasewrap.allow(regrole, text), leasewrap.disallow(regrole, text),
    leasewrap.grant_fence(regrole, boolean) FROM PUBLIC;

-- The administrator's settings back; on a first install (or from version 1) the fence's own
-- wait gets its bound.
DO $settings$
DECLARE
    kept record;
BEGIN
    FOR kept IN SELECT * FROM pg_temp.leasewrap_settings LOOP
        EXECUTE format('ALTER FUNCTION %s SET %s TO %L', kept.fn,
                       split_part(kept.setting, '=', 1),
                       substr(kept.setting, strpos(kept.setting, '=') + 1));
    END LOOP;
    IF (SELECT version FROM pg_temp.leasewrap_before) IS DISTINCT FROM 2 THEN
        ALTER FUNCTION leasewrap.fence(text, text) SET lock_timeout = '2min';
    END IF;
END;
$settings$;

-- From version 1: the job roles had SELECT, INSERT and UPDATE on leasewrap.fence, which let
-- one job reset or poison another's row. Their write rights go; each such role may go on
-- fencing every name (*) until an administrator ties it to its own names.
DO $from_version_1$
DECLARE
    job regrole;
BEGIN
    IF (SELECT version FROM pg_temp.leasewrap_before) IS DISTINCT FROM 1 THEN
        RETURN;
    END IF;
    FOR job IN
        SELECT DISTINCT acl.grantee::regrole
        FROM pg_class AS c, aclexplode(c.relacl) AS acl
        WHERE c.oid = 'leasewrap.fence'::regclass AND acl.grantee <> 0::oid
          AND acl.grantee <> c.relowner
          AND acl.privilege_type IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE')
    LOOP
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON leasewrap.fence FROM %s', job);
        PERFORM leasewrap.allow(job, '*');
        RAISE WARNING 'leasewrap fence: role % may no longer write leasewrap.fence, and may fence every name: tie it to its own with leasewrap.allow(%L, NAME) and leasewrap.disallow(%L, %L)',
            job, job::text, job::text, '*';
    END LOOP;
    REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON leasewrap.fence FROM PUBLIC;
END;
$from_version_1$;

DELETE FROM leasewrap.installed;
INSERT INTO leasewrap.installed (version) VALUES (2);

COMMIT;
