//! Another application on the same ZooKeeper ensemble, played for real: a client of its own (the
//! `zookeeper-client` crate, independent of leasewrap's code), anonymous or with a digest
//! identity of its own, that tries to delete, rewrite, re-ACL or plant what leasewrap made. Each
//! call says what the server answered: `Ok`, or the error's name (`NoAuth`, `NoNode`, ...).

use std::time::Duration;

use zookeeper_client as zkc;

/// A hostile (or merely careless) neighbour's session.
pub struct Neighbour {
    rt: tokio::runtime::Runtime,
    client: zkc::Client,
}

/// Who may do what to a node the neighbour creates.
#[derive(Clone, Copy, Debug)]
pub enum Access {
    /// `world:anyone:cdrwa`.
    Open,
    /// All rights to the neighbour's own identity only.
    Mine,
}

impl Neighbour {
    /// An anonymous client of `connect`.
    pub fn anonymous(connect: &str) -> Neighbour {
        Neighbour::connect(connect, None)
    }

    /// A client authenticated with the digest `user:password`.
    pub fn with_digest(connect: &str, user: &str, password: &str) -> Neighbour {
        Neighbour::connect(connect, Some(format!("{user}:{password}")))
    }

    fn connect(connect: &str, digest: Option<String>) -> Neighbour {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the neighbour's client");
        let mut connector = zkc::Client::connector().with_session_timeout(Duration::from_secs(10));
        if let Some(auth) = &digest {
            connector = connector.with_auth("digest", auth.as_bytes());
        }
        let client = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), connector.connect(connect)).await
        });
        let client = client
            .unwrap_or_else(|_| panic!("the neighbour's client got no session from {connect}"))
            .unwrap_or_else(|e| panic!("the neighbour's client: {e}"));
        Neighbour { rt, client }
    }

    /// `call`'s request, made and awaited inside the client's runtime, within 10 s.
    fn run<'a, T, F>(&'a self, call: impl FnOnce(&'a zkc::Client) -> F) -> Result<T, String>
    where
        F: std::future::Future<Output = Result<T, zkc::Error>> + 'a,
    {
        let _inside = self.rt.enter();
        let f = call(&self.client);
        let bounded = self
            .rt
            .block_on(tokio::time::timeout(Duration::from_secs(10), f));
        match bounded {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(format!("{e:?}")),
            Err(_) => Err("no answer within 10 s".into()),
        }
    }

    pub fn delete(&self, path: &str) -> Result<(), String> {
        self.run(|c| c.delete(path, None))
    }

    /// Deletes `path` and everything under it, deepest first (as `deleteall` does).
    pub fn delete_all(&self, path: &str) -> Result<(), String> {
        for child in self.children(path)? {
            self.delete_all(&format!("{}/{child}", path.trim_end_matches('/')))?;
        }
        self.delete(path)
    }

    pub fn set_data(&self, path: &str, data: &[u8]) -> Result<(), String> {
        self.run(|c| c.set_data(path, data, None)).map(|_| ())
    }

    pub fn get_data(&self, path: &str) -> Result<Vec<u8>, String> {
        self.run(|c| c.get_data(path)).map(|(d, _)| d)
    }

    pub fn children(&self, path: &str) -> Result<Vec<String>, String> {
        self.run(|c| c.list_children(path))
    }

    /// Creates a persistent node at `path` (its parents must exist).
    pub fn create(&self, path: &str, data: &[u8], access: Access) -> Result<(), String> {
        let acls = match access {
            Access::Open => zkc::Acls::anyone_all(),
            Access::Mine => zkc::Acls::creator_all(),
        };
        let mode = zkc::CreateMode::Persistent.with_acls(acls);
        self.run(|c| c.create(path, data, &mode)).map(|_| ())
    }

    /// Creates `path` and any missing parent, all with `access`.
    pub fn create_all(&self, path: &str, access: Access) -> Result<(), String> {
        let mut at = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            at.push('/');
            at.push_str(part);
            match self.create(&at, b"", access) {
                Ok(()) => {}
                Err(e) if e.contains("NodeExists") => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Gives `path` the ACL "all rights to the digest identity `user:password`" (any other
    /// identity than leasewrap's).
    pub fn set_acl_to_digest(&self, path: &str, user: &str, password: &str) -> Result<(), String> {
        let id = format!("{user}:{}", digest_hash(user, password));
        let acl = [zkc::Acl::new(
            zkc::Permission::ALL,
            zkc::AuthId::new("digest", &id),
        )];
        self.run(|c| c.set_acl(path, &acl, None)).map(|_| ())
    }

    /// The ACL of `path`, as `scheme:id:perms` with perms a number.
    pub fn acl(&self, path: &str) -> Result<Vec<String>, String> {
        let (acls, _) = self.run(|c| c.get_acl(path))?;
        Ok(acls
            .iter()
            .map(|a| format!("{}:{}:{}", a.scheme(), a.id(), perms_of(a.permission())))
            .collect())
    }
}

/// The permission bits of `p` as a number (1 read, 2 write, 4 create, 8 delete, 16 admin).
fn perms_of(p: zkc::Permission) -> i32 {
    [
        (zkc::Permission::READ, 1),
        (zkc::Permission::WRITE, 2),
        (zkc::Permission::CREATE, 4),
        (zkc::Permission::DELETE, 8),
        (zkc::Permission::ADMIN, 16),
    ]
    .iter()
    .filter(|(perm, _)| p.has(*perm))
    .map(|(_, bit)| bit)
    .sum()
}

/// ZooKeeper's digest id of `user:password`: base64 of the SHA-1 of `user:password`, computed by
/// `openssl` (the tests' one crypto tool), as `DigestAuthenticationProvider.generateDigest` does.
pub fn digest_hash(user: &str, password: &str) -> String {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut sha = Command::new("openssl")
        .args(["dgst", "-sha1", "-binary"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl for a digest id");
    sha.stdin
        .take()
        .expect("openssl's stdin")
        .write_all(format!("{user}:{password}").as_bytes())
        .expect("write to openssl");
    let raw = sha.wait_with_output().expect("openssl's digest").stdout;
    let mut b64 = Command::new("openssl")
        .args(["base64", "-A"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl base64");
    b64.stdin
        .take()
        .expect("openssl's stdin")
        .write_all(&raw)
        .expect("write to openssl");
    String::from_utf8(b64.wait_with_output().expect("base64").stdout)
        .expect("base64 is ASCII")
        .trim()
        .to_owned()
}
