//! SASL DIGEST-MD5 (RFC 2831), the client side, as ZooKeeper's servers speak it with the users
//! of their JAAS file: an empty first token, the server's challenge, our response, and the
//! server's `rspauth`, which is checked, so that a member that does not know the password cannot
//! pass for one that does. Only `qop=auth` (authentication; the connection itself is left to
//! TLS). The identity the server grants is `sasl:USER`.

use md5::{Digest, Md5};

use super::net::{handshake_answer, Failure, Io};
use super::wire::{In, Op, Out};
use crate::text::hex;

/// The service and server names ZooKeeper's DIGEST-MD5 server expects in `digest-uri`.
const DIGEST_URI: &str = "zookeeper/zk-sasl-md5";

/// Authenticate on a fresh connection (the connect answer read, nothing else sent).
pub async fn authenticate(io: &mut Box<dyn Io>, user: &str, password: &str) -> Result<(), Failure> {
    let challenge = exchange(io, 1, b"").await?;
    let cnonce = format!(
        "{:016x}{:016x}",
        crate::files::random_u64(),
        crate::files::random_u64()
    );
    let step = respond(
        &String::from_utf8_lossy(&challenge),
        user,
        password,
        &cnonce,
    )
    .map_err(|why| Failure::AuthFailed(format!("SASL: {why}")))?;
    let last = exchange(io, 2, step.response.as_bytes()).await?;
    let rspauth = String::from_utf8_lossy(&last);
    match rspauth.strip_prefix("rspauth=") {
        Some(given) if given == step.rspauth => Ok(()),
        _ => Err(Failure::AuthFailed(
            "SASL: the server's proof (rspauth) does not match the password: is it the ensemble you meant?".into(),
        )),
    }
}

/// Send one SASL token with request number `xid`; the server's token in its answer.
async fn exchange(io: &mut Box<dyn Io>, xid: i32, token: &[u8]) -> Result<Vec<u8>, Failure> {
    use tokio::io::AsyncWriteExt;
    let mut out = Out::request(xid, Op::Sasl);
    out.buffer(token);
    io.write_all(&out.finish())
        .await
        .map_err(|e| Failure::Io(e.to_string()))?;
    let body = handshake_answer(io, xid, "SASL").await?;
    In::new(&body)
        .buffer()
        .map_err(|e| Failure::NotZooKeeper(format!("its SASL token: {e}")))
}

/// Our response to a challenge, and the `rspauth` the server must then send.
#[derive(Debug, PartialEq, Eq)]
pub struct Step {
    pub response: String,
    pub rspauth: String,
}

/// The response to `challenge` (RFC 2831 §2.1.2) for `user` with `password`.
pub fn respond(challenge: &str, user: &str, password: &str, cnonce: &str) -> Result<Step, String> {
    respond_for(DIGEST_URI, challenge, user, password, cnonce)
}

fn respond_for(
    uri: &str,
    challenge: &str,
    user: &str,
    password: &str,
    cnonce: &str,
) -> Result<Step, String> {
    let get = |key: &str| directive(challenge, key);
    let nonce = get("nonce").ok_or("the challenge has no nonce")?;
    let realm = get("realm").unwrap_or_default();
    let qops = get("qop").unwrap_or_else(|| "auth".into());
    if !qops.split(',').any(|q| q.trim() == "auth") {
        return Err(format!("the server offers qop {qops:?}, not auth"));
    }
    if get("algorithm").as_deref() != Some("md5-sess") {
        return Err("the challenge is not md5-sess".into());
    }
    let nc = "00000001";
    let mut secret = latin1_or_utf8(user);
    secret.push(b':');
    secret.extend(latin1_or_utf8(&realm));
    secret.push(b':');
    secret.extend(latin1_or_utf8(password));
    let inner = Md5::digest(&secret);
    let mut a1 = inner.to_vec();
    a1.extend_from_slice(format!(":{nonce}:{cnonce}").as_bytes());
    let ha1 = hex(&Md5::digest(&a1));
    let kd = |a2: &str| {
        let ha2 = hex(&Md5::digest(a2.as_bytes()));
        hex(&Md5::digest(
            format!("{ha1}:{nonce}:{nc}:{cnonce}:auth:{ha2}").as_bytes(),
        ))
    };
    let response = format!(
        "charset=utf-8,username=\"{}\",realm=\"{}\",nonce=\"{nonce}\",nc={nc},cnonce=\"{cnonce}\",\
         digest-uri=\"{uri}\",maxbuf=65536,response={},qop=auth",
        quoted(user),
        quoted(&realm),
        kd(&format!("AUTHENTICATE:{uri}"))
    );
    Ok(Step {
        response,
        rspauth: kd(&format!(":{uri}")),
    })
}

/// A value as RFC 2831 §2.1.2.1 hashes it with `charset=utf-8`: in ISO 8859-1 when every
/// character fits there (as the JDK's server does, each value on its own), else in UTF-8.
fn latin1_or_utf8(text: &str) -> Vec<u8> {
    text.chars()
        .map(|c| u8::try_from(u32::from(c)).ok())
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| text.as_bytes().to_vec())
}

/// The value of `key` in a list of `key=value` or `key="value"` directives.
fn directive(text: &str, key: &str) -> Option<String> {
    let mut rest = text;
    while !rest.is_empty() {
        let (name, after) = rest.split_once('=')?;
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => {
                let end = quoted.find('"')?;
                (
                    quoted[..end].to_owned(),
                    quoted[end + 1..].trim_start_matches(','),
                )
            }
            None => match after.split_once(',') {
                Some((v, next)) => (v.to_owned(), next),
                None => (after.to_owned(), ""),
            },
        };
        if name.trim() == key {
            return Some(value);
        }
        rest = next;
    }
    None
}

/// A value inside double quotes: `"` and `\` escaped.
fn quoted(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 2831 §4's example: the response and the rspauth it gives.
    #[test]
    fn the_rfcs_example_gives_the_rfcs_response_and_rspauth() {
        let challenge = r#"realm="elwood.innosoft.com",nonce="OA6MG9tEQGm2hh",qop="auth",algorithm=md5-sess,charset=utf-8"#;
        let uri = "imap/elwood.innosoft.com";
        let step = respond_for(uri, challenge, "chris", "secret", "OA6MHXh6VqTrRk").unwrap();
        assert!(
            step.response
                .contains("response=d388dad90d4bbd760a152321f2143af7,"),
            "{}",
            step.response
        );
        assert!(
            step.response.contains(r#"username="chris""#),
            "{}",
            step.response
        );
        assert_eq!(step.rspauth, "ea40f60335c427b5527b84dbabcdfffd");
    }

    /// The JDK's server hashes `pässwort` as ISO 8859-1 (0xe4), not as UTF-8 (0xc3 0xa4).
    #[test]
    fn a_password_that_fits_iso_8859_1_is_hashed_in_it_and_one_that_does_not_in_utf_8() {
        assert_eq!(latin1_or_utf8("pässwort"), b"p\xe4sswort");
        assert_eq!(latin1_or_utf8("bob"), b"bob");
        assert_eq!(latin1_or_utf8("pa€"), "pa€".as_bytes());
        let challenge =
            r#"realm="zk-sasl-md5",nonce="n",qop="auth",algorithm=md5-sess,charset=utf-8"#;
        let latin1 = respond(challenge, "bob", "pässwort", "c").unwrap();
        let expected = {
            let inner = Md5::digest(b"bob:zk-sasl-md5:p\xe4sswort");
            let mut a1 = inner.to_vec();
            a1.extend_from_slice(b":n:c");
            hex(&Md5::digest(&a1))
        };
        let ha2 = hex(&Md5::digest(format!(":{DIGEST_URI}").as_bytes()));
        let rspauth = hex(&Md5::digest(
            format!("{expected}:n:00000001:c:auth:{ha2}").as_bytes(),
        ));
        assert_eq!(latin1.rspauth, rspauth);
    }

    #[test]
    fn directives_read_quoted_and_bare_values() {
        let text = r#"realm="zk-sasl-md5",nonce="a,b",charset=utf-8,algorithm=md5-sess"#;
        assert_eq!(directive(text, "nonce").as_deref(), Some("a,b"));
        assert_eq!(directive(text, "charset").as_deref(), Some("utf-8"));
        assert_eq!(directive(text, "algorithm").as_deref(), Some("md5-sess"));
        assert_eq!(directive(text, "qop"), None);
    }

    #[test]
    fn a_challenge_without_nonce_or_auth_is_refused() {
        assert!(respond("realm=\"r\",algorithm=md5-sess", "u", "p", "c").is_err());
        let integrity_only = r#"nonce="n",qop="auth-conf",algorithm=md5-sess"#;
        assert!(respond(integrity_only, "u", "p", "c").is_err());
    }
}
