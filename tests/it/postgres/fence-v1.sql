-- leasewrap's database fence for PostgreSQL (9.5 or later; tested with 15), printed by
-- `leasewrap fence-sql postgres` and installed as /usr/share/leasewrap/sql/postgres-fence.sql.
--
-- Install, as often as you like (every statement is idempotent):
--     psql -v ON_ERROR_STOP=1 -f postgres-fence.sql DATABASE
--
-- A job run by leasewrap calls the fence first in its own transaction:
--     BEGIN;
--     SELECT leasewrap.fence(:'name', :'token');
--     ... the job's writes ...
--     COMMIT;
-- with psql -v name="$LEASEWRAP_NAME" -v token="$LEASEWRAP_FENCING_TOKEN".
--
-- The fence locks the row of NAME until the transaction ends: a newer holder's fence waits for
-- an older holder's transaction and then sees what it committed. A token lower than the one
-- recorded is refused with SQLSTATE LWF01 before the transaction writes anything; bad input
-- (an empty NAME, a token outside 0..2^64-1) with LWF02; a token that is not a number with
-- PostgreSQL's own 22P02. An equal token is allowed: one holder, many transactions.

CREATE SCHEMA IF NOT EXISTS leasewrap;

-- One row per lease NAME: the highest fencing token a transaction has committed under.
-- numeric(20,0) holds every u64; bigint is signed and would not.
CREATE TABLE IF NOT EXISTS leasewrap.fence (
    name text PRIMARY KEY CHECK (name <> ''),
    token numeric(20,0) NOT NULL CHECK (token >= 0 AND token <= 18446744073709551615),
    fenced_at timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION leasewrap.fence(name text, token numeric)
RETURNS numeric
LANGUAGE plpgsql
AS $fence$
DECLARE
    stored numeric;
BEGIN
    IF name IS NULL OR name = '' THEN
        RAISE EXCEPTION 'leasewrap.fence: the lease NAME is empty or NULL'
            USING ERRCODE = 'LWF02',
                  HINT = 'pass the lease name, as psql -v name="$LEASEWRAP_NAME"';
    END IF;
    IF token IS NULL OR token < 0 OR token > 18446744073709551615 OR token <> trunc(token) THEN
        RAISE EXCEPTION 'leasewrap.fence: fencing token % for "%" is not a whole number from 0 to 18446744073709551615',
                coalesce(token::text, 'NULL'), name
            USING ERRCODE = 'LWF02',
                  HINT = 'pass the token leasewrap gave, as psql -v token="$LEASEWRAP_FENCING_TOKEN"';
    END IF;
    -- ON CONFLICT DO UPDATE locks the conflicting row even when its WHERE is false, so a
    -- refused fence has also waited for the transaction that holds the row.
    INSERT INTO leasewrap.fence AS f (name, token)
        VALUES (fence.name, fence.token)
        ON CONFLICT ON CONSTRAINT fence_pkey DO UPDATE
            SET token = EXCLUDED.token, fenced_at = now()
            WHERE f.token <= EXCLUDED.token
        RETURNING f.token INTO stored;
    IF NOT FOUND THEN
        SELECT f.token INTO stored FROM leasewrap.fence AS f WHERE f.name = fence.name;
        RAISE EXCEPTION 'stale fencing token % for "%": % is recorded', token, name, stored
            USING ERRCODE = 'LWF01',
                  HINT = 'a newer holder of the lease has written; this transaction must not';
    END IF;
    RETURN stored;
END;
$fence$;
