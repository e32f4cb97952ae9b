//! A ZooKeeper ensemble shared with other applications (issue 25 items 1-5, 11): another client,
//! played for real with a ZooKeeper client of its own (`support::neighbour`), anonymous or with
//! an identity of its own, tries to delete, rewrite, re-ACL or plant what leasewrap made. With
//! credentials the server refuses it, nothing overlaps, no run is skipped or repeated; without,
//! a planted node is still never waited for. Each test keeps to a prefix of its own on the
//! shared server, since ACLs hold for the whole root.

use serde_json::Value;

use super::hold;
use crate::support::neighbour::{Access, Neighbour};
use crate::support::zookeeper::{self, Zk};
use crate::support::*;

const USER: &str = "alice";
const PASSWORD: &str = "alice-secret";

/// A prefix of its own on the shared server, and its root path.
fn own_prefix(test: &str) -> (String, String) {
    let name = zookeeper::unique_name(test);
    (format!("{name}/"), format!("/{name}"))
}

/// leasewrap on the shared server under `prefix`, authenticated as alice when `sb` is given.
fn lw(zk: &Zk, prefix: &str, name: &str, sb: Option<&Sandbox>) -> Leasewrap {
    let lw = Leasewrap::new()
        .on_zookeeper(&zk.connect())
        .args(&["--prefix", prefix, "--ttl", "4s"])
        .name(name);
    match sb {
        Some(sb) => {
            let file = sb.password_file("password", PASSWORD);
            lw.args(&["--user", USER, "--password-file", file.to_str().unwrap()])
        }
        None => lw,
    }
}

/// The ACL that alice's nodes must have: all rights to alice, READ to everyone.
fn alices_acl() -> Vec<String> {
    vec![
        // The server shows a digest to a client without ADMIN on the node as USER:x.
        format!("digest:{USER}:x:31"),
        "world:anyone:1".into(),
    ]
}

#[track_caller]
fn assert_refused(what: &str, result: Result<(), String>) {
    match result {
        Err(e) if e.contains("NoAuth") => {}
        other => panic!("{what}: the server should refuse an anonymous client (NoAuth): {other:?}"),
    }
}

/// Item 1: the held lock node, its parent and the root refuse an anonymous delete, rewrite,
/// re-ACL or planted node; the waiter never starts while the holder runs.
#[test]
fn with_credentials_what_leasewrap_made_refuses_an_anonymous_client_and_nothing_overlaps() {
    let zk = zookeeper::shared();
    let sb = Sandbox::new();
    let (prefix, root) = own_prefix("acl");
    let holder = hold(lw(zk, &prefix, "job", Some(&sb)), &sb, "a");
    let waiter = Job::spawn(
        lw(zk, &prefix, "job", Some(&sb)),
        Marks::new(&sb, "b"),
        false,
    );
    let parent = format!("{root}/job");
    wait_until(STARTUP, "the waiter to queue", || {
        zookeeper::ephemerals_under(zk.port(), &parent).is_ok_and(|q| q.len() == 2)
    });
    let nodes = zookeeper::ephemerals_under(zk.port(), &parent).unwrap();
    let held = format!(
        "{parent}/{}",
        nodes.iter().min_by_key(|n| super::sequence_of(n)).unwrap()
    );
    refuses_an_anonymous_client(&zk.connect(), &root, &parent, &held);
    assert!(
        pid_alive(holder.child()),
        "the holder's child was disturbed"
    );
    assert!(
        !waiter.marks.started(),
        "the waiter started while the holder ran"
    );
    holder.finish();
    let token = waiter.token();
    assert!(token > 0);
    waiter.finish();
}

/// An anonymous client can neither read-modify nor remove the root, the lease's parent or the
/// held lock node, nor plant a lock-shaped node beside it.
fn refuses_an_anonymous_client(connect: &str, root: &str, parent: &str, held: &str) {
    let them = Neighbour::anonymous(connect);
    for node in [root, parent, held] {
        assert_eq!(them.acl(node), Ok(alices_acl()), "{node}'s ACL");
    }
    assert_refused("delete the held lock node", them.delete(held));
    assert_refused(
        "delete the lease's parent and all under it",
        them.delete_all(parent),
    );
    assert_refused(
        "rewrite the holder record",
        them.set_data(held, br#"{"host":"forged"}"#),
    );
    assert_refused(
        "re-ACL the root",
        them.set_acl_to_digest(root, "mallory", "x"),
    );
    let planted = format!("{parent}/_c_{}-lock-0000000000", "0".repeat(32));
    assert_refused(
        "plant a lock-shaped node",
        them.create(&planted, b"", Access::Open),
    );
}

/// Item 2: run records refuse an anonymous forgery, rewrite or delete: the real run is neither
/// skipped nor run twice.
#[test]
fn with_credentials_run_records_refuse_a_forgery_a_rewrite_and_a_delete() {
    let zk = zookeeper::shared();
    let sb = Sandbox::new();
    let (prefix, root) = own_prefix("records");
    let ran = sb.path("ran");
    let job = |key: &str| {
        lw(zk, &prefix, "job", Some(&sb))
            .args(&["--once", key])
            .cmd(&["sh", "-c", &format!("echo {key} >> {}", q(&ran))])
    };
    assert_exit(&job("k").output(), 0);
    let them = Neighbour::anonymous(&zk.connect());
    let record = format!("{root}/runs/job/k");
    let forged =
        br#"{"format":"leasewrap-run/1","name":"job","key":"k","outcome":"failed","attempts":99}"#;
    assert_refused("rewrite a record", them.set_data(&record, forged));
    assert_refused("delete a record", them.delete(&record));
    let planted = format!("{root}/runs/job/k2");
    assert_refused(
        "forge a record",
        them.create(&planted, forged, Access::Open),
    );
    assert_eq!(them.acl(&record), Ok(alices_acl()));
    assert_exit(&job("k").output(), 75);
    assert_exit(&job("k2").output(), 0);
    let lines = std::fs::read_to_string(&ran).unwrap();
    assert_eq!(lines, "k\nk2\n", "each KEY ran exactly once");
}

/// Item 3: nobody but leasewrap's identity may re-ACL what it made, and `status` reads it
/// without credentials (READ is everyone's).
#[test]
fn with_credentials_status_reads_without_credentials_what_nobody_else_may_re_acl() {
    let zk = zookeeper::shared();
    let sb = Sandbox::new();
    let (prefix, root) = own_prefix("status");
    let holder = hold(lw(zk, &prefix, "job", Some(&sb)), &sb, "a");
    let them = Neighbour::anonymous(&zk.connect());
    assert_refused(
        "re-ACL the lease",
        them.set_acl_to_digest(&format!("{root}/job"), "m", "x"),
    );
    let out = Leasewrap::subcommand("status")
        .on_zookeeper(&zk.connect())
        .args(&["--prefix", &prefix, "--json", "job"])
        .output();
    assert_exit(&out, 0);
    let lease: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(lease["held"], true, "{lease}");
    assert_eq!(lease["token"], holder.token(), "{lease}");
    holder.finish();
}

/// Item 4: a persistent node with a lock node's name (no session owns it) is never waited for,
/// and `status` shows it for what it is.
#[test]
fn a_planted_persistent_lock_shaped_node_is_never_waited_for_and_status_shows_it_ignored() {
    let zk = zookeeper::shared();
    let (prefix, root) = own_prefix("planted");
    let them = Neighbour::anonymous(&zk.connect());
    let planted = format!("{root}/job/_c_{}-lock-0000000000", "a".repeat(32));
    them.create_all(&format!("{root}/job"), Access::Open)
        .unwrap();
    them.create(&planted, b"", Access::Open).unwrap();
    let out = lw(zk, &prefix, "job", None)
        .args(&["-n"])
        .cmd(&["true"])
        .output();
    assert_exit(&out, 0);
    let status = Leasewrap::subcommand("status")
        .on_zookeeper(&zk.connect())
        .args(&["--prefix", &prefix, "job"])
        .output();
    assert_exit(&status, 1);
    assert!(
        status
            .stdout
            .contains(&format!("{planted} is not a lock node")),
        "{}",
        status.stdout
    );
    let json = Leasewrap::subcommand("status")
        .on_zookeeper(&zk.connect())
        .args(&["--prefix", &prefix, "--json", "job"])
        .output();
    let lease: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(lease["held"], false, "{lease}");
    assert_eq!(lease["ignored"][0], planted.as_str(), "{lease}");
}

/// Item 3, read side: a lease this identity may not read is a row saying so, the others are
/// listed, and `status` exits 77.
#[test]
fn status_lists_what_it_may_read_and_names_what_it_may_not() {
    let zk = zookeeper::shared();
    let (prefix, root) = own_prefix("denied");
    let them = Neighbour::anonymous(&zk.connect());
    them.create_all(&format!("{root}/open"), Access::Open)
        .unwrap();
    let eve = Neighbour::with_digest(&zk.connect(), "eve", "eve-secret");
    eve.create(&format!("{root}/closed"), b"", Access::Mine)
        .unwrap();
    let out = Leasewrap::subcommand("status")
        .on_zookeeper(&zk.connect())
        .args(&["--prefix", &prefix])
        .output();
    assert_exit(&out, 77);
    let rows: Vec<&str> = out.stdout.lines().collect();
    assert!(
        rows.iter()
            .any(|r| r.starts_with("open ") && r.contains("free")),
        "{}",
        out.stdout
    );
    let closed = rows
        .iter()
        .find(|r| r.starts_with("closed "))
        .expect("a row for closed");
    assert!(
        closed.contains("refused") && closed.contains("identities"),
        "{closed}"
    );
    assert!(
        out.stderr.contains("closed") || out.stderr.contains("identities"),
        "{}",
        out.stderr
    );
}

/// Item 11: a missing permission without credentials says that none were given (not "refused
/// the credentials"), and is 77.
#[test]
fn a_missing_permission_without_credentials_says_none_were_given() {
    let zk = zookeeper::shared();
    let (prefix, root) = own_prefix("noperm");
    let eve = Neighbour::with_digest(&zk.connect(), "eve", "eve-secret");
    eve.create(&root, b"", Access::Mine).unwrap();
    let out = lw(zk, &prefix, "job", None).cmd(&["true"]).output();
    assert_exit(&out, 77);
    assert!(
        out.stderr.contains("leasewrap was given none") && out.stderr.contains("--user"),
        "{}",
        out.stderr
    );
}

/// Build item 1: a parent that another client made open is reported by name, not changed.
#[test]
fn with_credentials_an_existing_parent_with_an_open_acl_is_reported_by_name() {
    let zk = zookeeper::shared();
    let sb = Sandbox::new();
    let (prefix, root) = own_prefix("open-parent");
    let them = Neighbour::anonymous(&zk.connect());
    them.create(&root, b"", Access::Open).unwrap();
    let out = lw(zk, &prefix, "job", Some(&sb)).cmd(&["true"]).output();
    assert_exit(&out, 0);
    let warning = out
        .stderr
        .lines()
        .find(|l| l.contains("WARN") && l.contains(&root));
    let warning = warning.unwrap_or_else(|| panic!("no warning naming {root}: {}", out.stderr));
    assert!(warning.contains("world:anyone:cdrwa"), "{warning}");
    assert_eq!(
        them.acl(&root),
        Ok(vec!["world:anyone:31".to_owned()]),
        "left as it was"
    );
}

/// Without credentials every node is open, as the README says: any client may delete it.
#[test]
fn without_credentials_every_node_leasewrap_makes_is_open_to_every_client() {
    let zk = zookeeper::shared();
    let (prefix, root) = own_prefix("open");
    assert_exit(&lw(zk, &prefix, "job", None).cmd(&["true"]).output(), 0);
    let them = Neighbour::anonymous(&zk.connect());
    for node in [root.clone(), format!("{root}/job")] {
        assert_eq!(
            them.acl(&node),
            Ok(vec!["world:anyone:31".to_owned()]),
            "{node}"
        );
    }
}

/// Item 5: the holder record keeps the program, not its arguments, where every client reads it.
#[test]
fn the_holder_record_keeps_no_argument_for_every_client_to_read() {
    let zk = zookeeper::shared();
    let sb = Sandbox::new();
    let (prefix, root) = own_prefix("record");
    let job = hold(lw(zk, &prefix, "job", Some(&sb)), &sb, "a");
    let them = Neighbour::anonymous(&zk.connect());
    let parent = format!("{root}/job");
    let node = queue_node(zk, &parent);
    let data = String::from_utf8(them.get_data(&node).unwrap()).unwrap();
    let record: Value = serde_json::from_str(&data).unwrap();
    assert_eq!(record["command"], serde_json::json!(["sh"]), "{record}");
    assert_eq!(record["args"], 2, "{record}");
    assert!(
        !data.contains("while"),
        "the script is not in the record: {data}"
    );
    assert_refused(
        "forge the holder",
        them.set_data(&node, br#"{"host":"forged"}"#),
    );
    job.finish();
}

/// The one lock node under `parent` (the shared server lists its ephemerals).
fn queue_node(zk: &Zk, parent: &str) -> String {
    let nodes = zookeeper::ephemerals_under(zk.port(), parent).unwrap();
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    format!("{parent}/{}", nodes[0])
}
