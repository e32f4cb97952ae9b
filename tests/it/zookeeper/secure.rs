//! TLS on ZooKeeper's secure client port, a client certificate as the identity that owns what
//! leasewrap creates (x509), and SASL DIGEST-MD5 users (issue 25 item 13), against a real
//! ZooKeeper 3.8 with a Netty connection factory (`zookeeper::shared_secure`). A neighbour on
//! the plain port, without credentials, may read and may not change what leasewrap made.

use super::hold;
use crate::support::neighbour::Neighbour;
use crate::support::zookeeper::{self, Secure};
use crate::support::*;

/// leasewrap over TLS with the client certificate of `cert`, under `prefix`.
fn over_tls(s: &Secure, prefix: &str, cert: (&std::path::Path, &std::path::Path)) -> Leasewrap {
    Leasewrap::new()
        .on_zookeeper(&s.tls_connect())
        .args(&["--prefix", prefix, "--ttl", "4s"])
        .args(&["--cacert", s.tls.ca.to_str().unwrap()])
        .args(&[
            "--cert",
            cert.0.to_str().unwrap(),
            "--key",
            cert.1.to_str().unwrap(),
        ])
}

#[track_caller]
fn assert_refused(what: &str, result: Result<(), String>) {
    assert!(
        matches!(&result, Err(e) if e.contains("NoAuth")),
        "{what}: the server should refuse the neighbour (NoAuth): {result:?}"
    );
}

/// Over TLS, the client certificate is the identity: every node leasewrap creates is all its,
/// READ for everyone; a neighbour cannot delete the held node, and the run holds.
#[test]
fn over_tls_the_client_certificate_owns_what_leasewrap_creates() {
    let s = zookeeper::shared_secure();
    let sb = Sandbox::new();
    let prefix = format!("{}/", zookeeper::unique_name("x509"));
    let root = format!("/{}", prefix.trim_end_matches('/'));
    let mine = (s.tls.cert.as_path(), s.tls.key.as_path());
    let holder = hold(over_tls(s, &prefix, mine).name("job"), &sb, "a");
    let them = Neighbour::anonymous(&s.zk.connect());
    let acl = them.acl(&format!("{root}/job")).unwrap();
    assert_eq!(
        acl,
        ["x509:CN=leasewrap-test-client:31", "world:anyone:1"],
        "the lease's ACL"
    );
    let node = format!(
        "{root}/job/{}",
        them.children(&format!("{root}/job")).unwrap()[0]
    );
    assert_refused("delete the held node", them.delete(&node));
    assert!(pid_alive(holder.child()));
    let theirs = (s.other_cert.0.as_path(), s.other_cert.1.as_path());
    let other = over_tls(s, &prefix, theirs)
        .name("job")
        .args(&["-n"])
        .cmd(&["true"])
        .output();
    assert_exit(&other, 77);
    assert!(other.stderr.contains("identity"), "{}", other.stderr);
    holder.finish();
}

/// TLS refused: a CA that did not sign the server's certificate, or the plain port, is 77 with
/// the member named; a client certificate without a CA is bad usage (64).
#[test]
fn tls_with_the_wrong_ca_or_to_the_plain_port_is_77_and_a_certificate_without_a_ca_is_64() {
    let s = zookeeper::shared_secure();
    let mine = (s.tls.cert.as_path(), s.tls.key.as_path());
    let tried = |connect: &str, ca: &std::path::Path| {
        Leasewrap::new()
            .on_zookeeper(connect)
            .args(&["--cacert", ca.to_str().unwrap()])
            .args(&["--cert", mine.0.to_str().unwrap()])
            .args(&["--key", mine.1.to_str().unwrap()])
            .name("x")
            .args(&["-n"])
            .cmd(&["true"])
            .output()
    };
    let plain = tried(&s.zk.connect(), &s.tls.ca);
    assert_exit(&plain, 77);
    assert!(
        plain.stderr.contains("TLS handshake failed"),
        "{}",
        plain.stderr
    );
    let wrong_ca = tried(&s.tls_connect(), &s.other_cert.0);
    assert_exit(&wrong_ca, 77);
    assert!(
        wrong_ca.stderr.contains(&s.tls_connect()),
        "{}",
        wrong_ca.stderr
    );
    let no_ca = Leasewrap::new()
        .on_zookeeper(&s.tls_connect())
        .args(&[
            "--cert",
            mine.0.to_str().unwrap(),
            "--key",
            mine.1.to_str().unwrap(),
        ])
        .name("x")
        .cmd(&["true"])
        .output();
    assert_exit(&no_ca, 64);
    assert!(no_ca.stderr.contains("--cacert"), "{}", no_ca.stderr);
}

/// SASL DIGEST-MD5 (`--zk-auth sasl`): the JAAS user owns what leasewrap creates (`sasl:bob`);
/// a wrong password is 77.
#[test]
fn with_sasl_the_jaas_user_owns_what_leasewrap_creates_and_a_wrong_password_is_77() {
    let s = zookeeper::shared_secure();
    let sb = Sandbox::new();
    let prefix = format!("{}/", zookeeper::unique_name("sasl"));
    let root = format!("/{}", prefix.trim_end_matches('/'));
    let file = |password: &str, name: &str| sb.password_file(name, password);
    let sasl = |password_file: &std::path::Path| {
        Leasewrap::new()
            .on_zookeeper(&s.zk.connect())
            .args(&[
                "--prefix",
                &prefix,
                "--zk-auth",
                "sasl",
                "--user",
                Secure::SASL_USER,
            ])
            .args(&["--password-file", password_file.to_str().unwrap()])
            .name("job")
            .cmd(&["true"])
            .output()
    };
    assert_exit(&sasl(&file(Secure::SASL_PASSWORD, "good")), 0);
    let them = Neighbour::anonymous(&s.zk.connect());
    let acl = them.acl(&format!("{root}/job")).unwrap();
    assert_eq!(
        acl,
        [
            format!("sasl:{}:31", Secure::SASL_USER),
            "world:anyone:1".into()
        ]
    );
    assert_refused("delete the lease", them.delete(&format!("{root}/job")));
    let wrong = sasl(&file("not-the-password", "bad"));
    assert_exit(&wrong, 77);
    assert!(wrong.stderr.contains("SASL"), "{}", wrong.stderr);
}

/// A JAAS password that fits ISO 8859-1 (`pässwort`): the server hashes it in ISO 8859-1
/// (RFC 2831 §2.1.2.1), and so must leasewrap, or the user is refused (77).
#[test]
fn a_sasl_password_in_iso_8859_1_authenticates() {
    let s = zookeeper::shared_secure();
    let sb = Sandbox::new();
    let file = sb.password_file("latin1", Secure::LATIN1_PASSWORD);
    let run = Leasewrap::new()
        .on_zookeeper(&s.zk.connect())
        .args(&[
            "--prefix",
            &format!("{}/", zookeeper::unique_name("latin1")),
        ])
        .args(&["--zk-auth", "sasl", "--user", Secure::LATIN1_USER])
        .args(&["--password-file", file.to_str().unwrap()])
        .name("job")
        .cmd(&["true"])
        .output();
    assert_exit(&run, 0);
}

/// An ensemble that requires SASL of every client (zookeeper.enforce.auth.schemes=sasl) closes
/// a digest user's session with -124: 77 at once, naming --zk-auth sasl (a run without -w used
/// to wait for ever); the same user with --zk-auth sasl runs.
#[test]
fn an_ensemble_that_requires_sasl_refuses_a_digest_user_with_77_naming_zk_auth_sasl() {
    let (zk, _files) = zookeeper::start_enforcing_sasl();
    let sb = Sandbox::new();
    let file = sb.password_file("bob", Secure::SASL_PASSWORD);
    let run = |scheme: &str| {
        Leasewrap::new()
            .on_zookeeper(&zk.connect())
            .args(&["--zk-auth", scheme, "--user", Secure::SASL_USER])
            .args(&["--password-file", file.to_str().unwrap()])
            .name("job")
            .cmd(&["true"])
            .output()
    };
    let digest = run("digest");
    assert_exit(&digest, 77);
    assert!(
        digest.stderr.contains("--zk-auth sasl"),
        "{}",
        digest.stderr
    );
    assert_exit(&run("sasl"), 0);
}
