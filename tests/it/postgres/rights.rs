//! What rights the install leaves, played for real by the database's other roles: default
//! privileges the installing superuser (or a role that was a member of leasewrap_fence) set up,
//! grants an administrator added to the fence's schemas, tables, columns and functions, functions
//! planted in the schema while a role could create there, and what a member of leasewrap_fence
//! left behind (a trigger, a SECURITY DEFINER function elsewhere). After every run only the
//! owner's rights and the documented grants are left; what would run as the owner is refused by
//! name.

use super::{fence_table_of, install, pg, role, FENCE_SQL};
use crate::dbfence::Server as _;
use crate::support::postgres::Postgres;

/// Every right on the schemas leasewrap and leasewrap_data and on what is in them (tables, their
/// columns, functions) but the owner's, as `KIND OBJECT: GRANTEE PRIVILEGE`, sorted.
const RIGHTS: &str = "
WITH schemas AS (SELECT n.oid FROM pg_namespace AS n WHERE n.nspname IN ('leasewrap', 'leasewrap_data')),
objects AS (
    SELECT 'schema' AS kind, n.nspname::text AS object, n.nspowner AS owner, n.nspacl AS acl
        FROM pg_namespace AS n WHERE n.oid IN (SELECT oid FROM schemas)
    UNION ALL
    SELECT 'table', c.oid::regclass::text, c.relowner, c.relacl
        FROM pg_class AS c WHERE c.relnamespace IN (SELECT oid FROM schemas)
    UNION ALL
    SELECT 'column', format('%s(%I)', c.oid::regclass, a.attname), c.relowner, a.attacl
        FROM pg_class AS c JOIN pg_attribute AS a ON a.attrelid = c.oid
        WHERE c.relnamespace IN (SELECT oid FROM schemas) AND a.attacl IS NOT NULL
    UNION ALL
    SELECT 'function', p.oid::regprocedure::text, p.proowner, coalesce(p.proacl, acldefault('f', p.proowner))
        FROM pg_proc AS p WHERE p.pronamespace IN (SELECT oid FROM schemas))
SELECT format('%s %s: %s %s', o.kind, o.object,
              CASE WHEN e.grantee = 0 THEN 'PUBLIC' ELSE e.grantee::regrole::text END, e.privilege_type)
FROM objects AS o, aclexplode(o.acl) AS e
WHERE e.grantee <> o.owner
ORDER BY 1";

/// The rights on the fence's objects but its owner's, one per line.
pub(super) fn rights(pg: &Postgres, db: &str) -> Vec<String> {
    let out = pg.psql_ok(db, RIGHTS);
    out.lines().map(str::to_owned).collect()
}

/// What the documentation gives each role tied to a name (the fence, and the lease's and its
/// run records' functions), and nothing else.
pub(super) fn documented(tied: &[&str]) -> Vec<String> {
    let mut rights: Vec<String> = tied
        .iter()
        .flat_map(|role| {
            [
                format!("function leasewrap.fence(text,numeric): {role} EXECUTE"),
                format!("function leasewrap.fence(text,text): {role} EXECUTE"),
                format!("function leasewrap.lease_names(): {role} EXECUTE"),
                format!("function leasewrap.lease_read(text): {role} EXECUTE"),
                format!("function leasewrap.lease_release(text,numeric): {role} EXECUTE"),
                format!("function leasewrap.lease_renew(text,numeric): {role} EXECUTE"),
                format!("function leasewrap.lease_run_read(text,text): {role} EXECUTE"),
                format!(
                    "function leasewrap.lease_run_write(text,numeric,text,text): {role} EXECUTE"
                ),
                format!("function leasewrap.lease_runs(text,integer,boolean): {role} EXECUTE"),
                format!("function leasewrap.lease_sql(): {role} EXECUTE"),
                format!("function leasewrap.lease_take(text,bigint,bigint,text): {role} EXECUTE"),
                format!("schema leasewrap: {role} USAGE"),
            ]
        })
        .collect();
    rights.sort();
    rights
}

/// Roles of one test: `app` (NOLOGIN, what default privileges grant to), `member` (logs in, a
/// member of app, tied to the name `mine`), `victim` (tied to `victim`, which it fenced with
/// 100), `mallory` (another role of the database).
struct Roles {
    app: String,
    member: String,
    victim: String,
    mallory: String,
}

impl Roles {
    fn new(pg: &Postgres, db: &str) -> Roles {
        let app = format!("{db}_app");
        pg.psql_ok(db, &format!("CREATE ROLE {app} NOLOGIN"));
        let member = role(pg, db, "member");
        pg.psql_ok(db, &format!("GRANT {app} TO {member}"));
        let (victim, mallory) = (role(pg, db, "victim"), role(pg, db, "mallory"));
        Roles {
            app,
            member,
            victim,
            mallory,
        }
    }

    fn tie(&self, pg: &Postgres, db: &str) {
        let (member, victim) = (&self.member, &self.victim);
        pg.psql_ok(
            db,
            &format!(
                "SELECT leasewrap.allow('{member}', 'mine'), leasewrap.allow('{victim}', 'victim')"
            ),
        );
        let fenced = pg.psql_as(victim, db, "SELECT leasewrap.fence('victim', 100)");
        assert_eq!(fenced.stdout.trim(), "100", "{}", fenced.stderr);
    }
}

/// What `member` tries with the rights the installer's default privileges gave `app`: each is
/// refused, and the victim's stale token after them too.
#[track_caller]
fn member_cannot_use_what_default_privileges_gave(pg: &Postgres, db: &str, roles: &Roles) {
    let fence = fence_table_of(pg, db);
    let allowed = fence.replace(".fence", ".allowed");
    let attacks = [
        format!("UPDATE {fence} SET token = 0 WHERE name = 'victim'"),
        format!("INSERT INTO {allowed} VALUES ('{}', '*')", roles.app),
        format!("CREATE TRIGGER t BEFORE UPDATE ON {fence} FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()"),
        format!("SELECT leasewrap.allow('{}', '*')", roles.member),
        "CREATE FUNCTION leasewrap.fence(name varchar, token varchar) RETURNS numeric LANGUAGE sql AS 'SELECT 0::numeric'".into(),
    ];
    for attack in &attacks {
        let out = pg.psql_as(&roles.member, db, attack);
        assert!(
            out.stderr.contains("42501"),
            "{attack}: {}{}",
            out.stdout,
            out.stderr
        );
    }
    let stale = pg.psql_as(&roles.victim, db, "SELECT leasewrap.fence('victim', 50)");
    assert!(stale.stderr.contains("LWF01"), "{}", stale.stderr);
}

/// A clean install made by a superuser whose default privileges give a role every right on new
/// tables, functions and schemas: none of them reaches the fence's objects. Then an
/// administrator grants more (on the table, its columns, the schemas, a function): a re-run takes
/// every such right back.
#[test]
fn every_run_leaves_the_owner_s_rights_and_the_documented_grants_and_nothing_else() {
    let pg = pg();
    let db = pg.0.database("rights");
    let roles = Roles::new(pg.0, &db);
    let app = &roles.app;
    pg.0.psql_ok(
        &db,
        &format!(
            "ALTER DEFAULT PRIVILEGES GRANT ALL ON TABLES TO {app};
         ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO {app};
         ALTER DEFAULT PRIVILEGES GRANT ALL ON SCHEMAS TO {app};"
        ),
    );
    install(pg.0, &db);
    roles.tie(pg.0, &db);
    member_cannot_use_what_default_privileges_gave(pg.0, &db, &roles);
    let tied = [roles.member.as_str(), roles.victim.as_str()];
    assert_eq!(rights(pg.0, &db), documented(&tied));
    let (fence, mallory) = (fence_table_of(pg.0, &db), &roles.mallory);
    pg.0.psql_ok(&db, &format!(
        "GRANT ALL ON {fence} TO {app};
         GRANT SELECT (name, token), UPDATE (token) ON {fence} TO {mallory};
         GRANT TRIGGER, REFERENCES ON {fence} TO {mallory};
         GRANT CREATE ON SCHEMA leasewrap TO {mallory};
         GRANT ALL ON SCHEMA leasewrap_data TO {mallory};
         GRANT EXECUTE ON FUNCTION leasewrap.allow(regrole, text), leasewrap_data.may_use(text) TO {app};
         GRANT EXECUTE ON FUNCTION leasewrap.fence(text, text) TO {mallory} WITH GRANT OPTION;"
    ));
    install(pg.0, &db);
    assert_eq!(rights(pg.0, &db), documented(&tied));
    member_cannot_use_what_default_privileges_gave(pg.0, &db, &roles);
}

/// Overloads of the fence, made while a role could create in the schema leasewrap, that catch
/// a job's call whose arguments are varchar or bigint (as JDBC's setString and an integer
/// parameter send them): the re-run refuses them by name, and once they are dropped it takes
/// the right to create there away.
#[test]
fn overloads_planted_while_a_role_could_create_in_the_schema_are_refused_by_name() {
    let pg = pg();
    let db = pg.report_db("overloads");
    let mallory = role(pg.0, &db.name, "mallory");
    pg.0.psql_ok(
        &db.name,
        &format!("GRANT CREATE ON SCHEMA leasewrap TO {mallory}"),
    );
    let plant = "CREATE FUNCTION leasewrap.fence(name varchar, token varchar) RETURNS numeric LANGUAGE sql AS 'SELECT 0::numeric';
                 CREATE FUNCTION leasewrap.fence(name text, token bigint) RETURNS numeric LANGUAGE sql AS 'SELECT 0::numeric';";
    let planted = pg.0.psql_as(&mallory, &db.name, plant);
    assert!(planted.status.success(), "{}", planted.stderr);
    let lease = &db.lease;
    let caught = format!("SELECT leasewrap.fence('{lease}'::varchar, '7'::varchar), leasewrap.fence('{lease}', 7::bigint)");
    let out = pg.0.psql_as(&db.job, &db.name, &caught);
    assert_eq!(
        out.stdout.trim(),
        "0|0",
        "the overloads catch the calls: {}",
        out.stderr
    );
    let fenced = format!(
        "SELECT count(*) FROM {} WHERE name = '{lease}'",
        fence_table_of(pg.0, &db.name)
    );
    assert_eq!(pg.0.psql_ok(&db.name, &fenced), "0", "nothing was fenced");
    let out =
        pg.0.psql_file(&db.name, &[], std::path::Path::new(FENCE_SQL));
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    for overload in [
        "leasewrap.fence(character varying,character varying)",
        "leasewrap.fence(text,bigint)",
    ] {
        let named = format!("function {overload} (owner {mallory})");
        assert!(out.stderr.contains(&named), "{named}: {}", out.stderr);
    }
    pg.0.psql_ok(
        &db.name,
        "DROP FUNCTION leasewrap.fence(varchar, varchar), leasewrap.fence(text, bigint)",
    );
    install(pg.0, &db.name);
    let again = pg.0.psql_as(&mallory, &db.name, plant);
    assert!(again.stderr.contains("42501"), "{}", again.stderr);
    assert_eq!(rights(pg.0, &db.name), documented(&[&db.job]));
}

/// As a role with CREATEROLE (on PostgreSQL 15 it may make itself a member of any role but a
/// superuser), `cr` joins leasewrap_fence on `db`, gives `mallory` by default privileges what
/// leasewrap_fence makes, runs `then`, and leaves.
fn as_a_member_of_leasewrap_fence(pg: &Postgres, db: &str, mallory: &str, then: &str) {
    let cr = role(pg, db, "cr");
    pg.psql_ok(
        db,
        &format!("ALTER ROLE {cr} CREATEROLE; GRANT CREATE ON DATABASE {db} TO {cr}"),
    );
    let plant = format!(
        "GRANT leasewrap_fence TO {cr};
         ALTER DEFAULT PRIVILEGES FOR ROLE leasewrap_fence GRANT ALL ON SCHEMAS TO {mallory};
         ALTER DEFAULT PRIVILEGES FOR ROLE leasewrap_fence GRANT ALL ON TABLES TO {mallory};
         {then}
         REVOKE leasewrap_fence FROM {cr};"
    );
    let out = pg.psql_as(&cr, db, &plant);
    assert!(out.status.success(), "{}", out.stderr);
}

/// What the member leaves on an installed fence: a trigger, a rule and a policy (with row
/// security) on the fence table, and bd.backdoor(), a SECURITY DEFINER function owned by
/// leasewrap_fence that resets every token.
fn trigger_and_backdoor(fence: &str, mallory: &str) -> String {
    format!(
        "CREATE SCHEMA bd; GRANT ALL ON SCHEMA bd TO leasewrap_fence; GRANT USAGE ON SCHEMA bd TO {mallory};
         CREATE FUNCTION bd.backdoor() RETURNS void LANGUAGE sql SECURITY DEFINER
             AS 'UPDATE {fence} SET token = 0';
         ALTER FUNCTION bd.backdoor() OWNER TO leasewrap_fence;
         CREATE FUNCTION bd.steal() RETURNS trigger LANGUAGE plpgsql
             AS 'BEGIN NEW.token := 0; RETURN NEW; END';
         SET ROLE leasewrap_fence;
         GRANT EXECUTE ON FUNCTION bd.backdoor() TO {mallory};
         CREATE TRIGGER steal BEFORE UPDATE ON {fence} FOR EACH ROW EXECUTE FUNCTION bd.steal();
         CREATE RULE keep AS ON DELETE TO {fence} DO INSTEAD NOTHING;
         ALTER TABLE {fence} ENABLE ROW LEVEL SECURITY;
         CREATE POLICY everyone ON {fence} USING (true);
         RESET ROLE;"
    )
}

/// The install on `db`, refused with `named` in its message.
#[track_caller]
fn install_refuses_naming(pg: &Postgres, db: &str, named: &str) {
    let out = pg.psql_file(db, &[], std::path::Path::new(FENCE_SQL));
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    assert!(out.stderr.contains(named), "{named}: {}", out.stderr);
}

/// On a server of its own (the role leasewrap_fence is the server's, and a member of it makes
/// every install refuse meanwhile): what a member of leasewrap_fence left behind runs as the
/// fence's owner, and mallory resets the victim's token through it. The re-run refuses the
/// trigger and the function by name; once they are dropped it goes on, and leasewrap_fence's
/// default privileges are gone, in a database installed before them and in one installed after.
#[test]
fn what_a_member_of_leasewrap_fence_left_behind_is_refused_by_name() {
    let pg = Postgres::start();
    let db = pg.database("member");
    install(&pg, &db);
    let roles = Roles::new(&pg, &db);
    roles.tie(&pg, &db);
    let planted = trigger_and_backdoor(&fence_table_of(&pg, &db), &roles.mallory);
    as_a_member_of_leasewrap_fence(&pg, &db, &roles.mallory, &planted);
    let reset = pg.psql_as(&roles.mallory, &db, "SELECT bd.backdoor()");
    assert!(reset.status.success(), "{}", reset.stderr);
    let token = format!(
        "SELECT token FROM {} WHERE name = 'victim'",
        fence_table_of(&pg, &db)
    );
    assert_eq!(
        pg.psql_ok(&db, &token),
        "0",
        "the backdoor reset the victim's token"
    );
    let on_the_table = [
        "policy everyone on leasewrap_data.fence",
        "row level security on leasewrap_data.fence",
        "rule keep on leasewrap_data.fence",
        "trigger steal on leasewrap_data.fence",
    ];
    install_refuses_naming(&pg, &db, &on_the_table.join("; "));
    pg.psql_ok(&db, "DROP TRIGGER steal ON leasewrap_data.fence; DROP RULE keep ON leasewrap_data.fence;
        DROP POLICY everyone ON leasewrap_data.fence; ALTER TABLE leasewrap_data.fence DISABLE ROW LEVEL SECURITY");
    install_refuses_naming(
        &pg,
        &db,
        "the role leasewrap_fence owns function bd.backdoor()",
    );
    pg.psql_ok(&db, "DROP FUNCTION bd.backdoor()");
    install(&pg, &db);
    let defaults =
        "SELECT count(*) FROM pg_default_acl WHERE defaclrole = 'leasewrap_fence'::regrole";
    assert_eq!(pg.psql_ok(&db, defaults), "0");
    let fresh = pg.database("member_fresh");
    let mallory = role(&pg, &fresh, "mallory");
    as_a_member_of_leasewrap_fence(&pg, &fresh, &mallory, "");
    install(&pg, &fresh);
    assert_eq!(
        rights(&pg, &fresh),
        documented(&[]),
        "default privileges gave nothing"
    );
    assert_eq!(pg.psql_ok(&fresh, defaults), "0");
}
