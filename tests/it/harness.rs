//! Proves the test harness itself: real etcd 3.4 and 3.5 servers (plain, TLS, auth, a 3-member
//! cluster) and the fault-injecting proxy behave as the leasewrap tests assume.
//!
//! Nothing of leasewrap runs here; a failure in this file is a broken harness or a broken machine.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Output;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::etcd::{self, Cluster, Etcd, Version};
use crate::support::proxy::{Mode, Proxy};

#[track_caller]
fn assert_ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "etcdctl failed ({}): {stderr}",
        out.status
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn server_version(etcd: &Etcd) -> String {
    let status = etcd.etcdctl_ok(&["endpoint", "status", "-w", "json"]);
    let status: serde_json::Value = serde_json::from_str(&status).expect("status is JSON");
    status[0]["Status"]["version"]
        .as_str()
        .expect("a version")
        .to_owned()
}

#[test]
fn each_version_stores_and_returns_a_value() {
    for version in Version::ALL {
        let etcd = etcd::shared(version);
        assert!(server_version(etcd).starts_with(version.number()));
        let key = format!("{}key", etcd::unique_prefix("put_get"));
        etcd.etcdctl_ok(&["put", &key, "v1"]);
        let value = etcd.etcdctl_ok(&["get", "--print-value-only", &key]);
        assert_eq!(value.trim(), "v1", "etcd {}", version.number());
    }
}

#[test]
fn shared_gives_one_server_per_version() {
    let (a, b) = (etcd::shared(Version::V3_4), etcd::shared(Version::V3_5));
    assert!(std::ptr::eq(a, etcd::shared(Version::V3_4)));
    assert_ne!(a.addr(), b.addr());
    assert_ne!(etcd::unique_prefix("x"), etcd::unique_prefix("x"));
}

#[test]
fn killed_server_restarts_on_its_data_and_ports() {
    let mut etcd = Etcd::start(Version::V3_4);
    let (endpoint, pid) = (etcd.endpoint(), etcd.pid());
    etcd.etcdctl_ok(&["put", "kept", "yes"]);
    etcd.kill();
    // A dead endpoint fails after --command-timeout; --dial-timeout does not bound it.
    let refused = etcd.etcdctl(&["--command-timeout=500ms", "get", "kept"]);
    assert!(!refused.status.success(), "a killed etcd answered");
    etcd.restart();
    assert_eq!(etcd.endpoint(), endpoint);
    assert_ne!(etcd.pid(), pid);
    assert_eq!(
        etcd.etcdctl_ok(&["get", "--print-value-only", "kept"])
            .trim(),
        "yes"
    );
}

#[test]
fn proxy_in_pass_mode_carries_a_put() {
    let etcd = etcd::shared(Version::V3_5);
    let proxy = Proxy::start(etcd.addr());
    let key = format!("{}key", etcd::unique_prefix("proxy_pass"));
    assert_ok(&Version::V3_5.etcdctl_at(&proxy.endpoint(), &["put", &key, "via"]));
    assert_eq!(
        etcd.etcdctl_ok(&["get", "--print-value-only", &key]).trim(),
        "via"
    );
}

#[test]
fn blackhole_makes_calls_time_out_and_pass_heals_them() {
    let etcd = etcd::shared(Version::V3_4);
    let proxy = Proxy::start(etcd.addr());
    let key = format!("{}key", etcd::unique_prefix("blackhole"));
    let put = [
        "--dial-timeout=1s",
        "--command-timeout=1s",
        "put",
        &key,
        "v",
    ];
    proxy.set_mode(Mode::Blackhole);
    let started = Instant::now();
    let out = Version::V3_4.etcdctl_at(&proxy.endpoint(), &put);
    assert!(!out.status.success(), "a put got through the blackhole");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    proxy.set_mode(Mode::Pass);
    assert_ok(&Version::V3_4.etcdctl_at(&proxy.endpoint(), &put));
}

#[test]
fn delayed_replies_slow_a_get_by_at_least_the_delay() {
    let etcd = etcd::shared(Version::V3_5);
    let proxy = Proxy::start(etcd.addr());
    proxy.set_mode(Mode::DelayReplies(Duration::from_millis(300)));
    let started = Instant::now();
    assert_ok(&Version::V3_5.etcdctl_at(&proxy.endpoint(), &["get", "anything"]));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "a get took only {took:?}"
    );
}

/// An upstream that echoes every byte back, to watch one live connection through mode changes.
fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n @ 1..) = conn.read(&mut buf) {
                    let _ = conn.write_all(&buf[..n]);
                }
            });
        }
    });
    addr
}

/// Reads what arrives within `bound`: empty if nothing does.
fn read_within(conn: &mut TcpStream, bound: Duration) -> Vec<u8> {
    conn.set_read_timeout(Some(bound)).unwrap();
    let mut buf = [0u8; 1024];
    match conn.read(&mut buf) {
        Ok(n) => buf[..n].to_vec(),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Vec::new(),
        Err(e) => panic!("read through the proxy: {e}"),
    }
}

#[test]
fn mode_changes_reach_a_live_connection_and_blackholed_bytes_are_lost() {
    let proxy = Proxy::start(echo_server());
    let mut conn = TcpStream::connect(proxy.addr()).unwrap();
    conn.write_all(b"one").unwrap();
    assert_eq!(read_within(&mut conn, Duration::from_secs(5)), b"one");
    proxy.set_mode(Mode::Blackhole);
    conn.write_all(b"lost").unwrap();
    assert!(read_within(&mut conn, Duration::from_millis(300)).is_empty());
    proxy.set_mode(Mode::DelayReplies(Duration::from_millis(200)));
    let sent = Instant::now();
    conn.write_all(b"two").unwrap();
    assert_eq!(read_within(&mut conn, Duration::from_secs(5)), b"two");
    assert!(
        sent.elapsed() >= Duration::from_millis(200),
        "{:?}",
        sent.elapsed()
    );
}

#[test]
fn delayed_replies_keep_their_order_and_each_waits_only_its_own_delay() {
    let proxy = Proxy::start(echo_server());
    let mut conn = TcpStream::connect(proxy.addr()).unwrap();
    let mut reference = TcpStream::connect(proxy.addr()).unwrap();
    let delay = Duration::from_millis(800);
    proxy.set_mode(Mode::DelayReplies(delay));
    let sent = Instant::now();
    for (i, chunk) in [b"a", b"b", b"c"].iter().enumerate() {
        // Paces the sender: chunk i leaves at i x 100 ms.
        let leave = sent + Duration::from_millis(100) * i as u32;
        thread::sleep(leave.saturating_duration_since(Instant::now()));
        conn.write_all(*chunk).unwrap();
    }
    let (arrivals, arrived) = mpsc::channel();
    let mut got = read_within(&mut conn, Duration::from_secs(5));
    // Sent once the first reply is through (due at 800 ms): due one delay later (1600 ms), after
    // the last chunk's own due time (1000 ms), and before it (2400 ms) if each reply waited out
    // the delay of the one before it as well as its own.
    reference.write_all(b"r").unwrap();
    let to_reference = arrivals.clone();
    thread::spawn(move || {
        let echoed = read_within(&mut reference, Duration::from_secs(5));
        let _ = to_reference.send(format!("reference {echoed:?}"));
    });
    while got.len() < 3 {
        got.extend(read_within(&mut conn, Duration::from_secs(5)));
    }
    arrivals.send("all three".to_owned()).unwrap();
    let took = sent.elapsed();
    assert_eq!(got, b"abc");
    assert!(took >= delay + Duration::from_millis(200), "{took:?}");
    let order: Vec<String> = arrived.iter().take(2).collect();
    assert_eq!(
        order,
        [
            "all three".to_owned(),
            format!("reference {:?}", b"r".to_vec())
        ],
        "the last chunk waited behind the delays of the chunks before it"
    );
}

#[test]
fn dropped_proxy_closes_its_connections() {
    let proxy = Proxy::start(echo_server());
    let mut conn = TcpStream::connect(proxy.addr()).unwrap();
    conn.write_all(b"x").unwrap();
    assert_eq!(read_within(&mut conn, Duration::from_secs(5)), b"x");
    let addr = proxy.addr();
    drop(proxy);
    assert!(read_within(&mut conn, Duration::from_secs(5)).is_empty());
    assert!(
        TcpStream::connect(addr).is_err(),
        "the listener is still open"
    );
}

fn cluster_elects_a_new_leader_when_the_leader_is_killed(version: Version) {
    let mut cluster = Cluster::start(version);
    assert_eq!(cluster.endpoints().split(',').count(), Cluster::SIZE);
    let leader = cluster.leader_index();
    cluster.etcdctl_ok(&["put", "k", "before"]);
    cluster.kill(leader);
    let next = cluster.leader_index();
    assert_ne!(next, leader);
    cluster.etcdctl_ok(&["put", "k", "after"]);
    cluster.restart(leader);
    let out = version.etcdctl_at(&cluster.endpoint(leader), &["get", "k"]);
    assert!(assert_ok(&out).contains("after"));
}

#[test]
fn cluster_3_4_elects_a_new_leader_when_the_leader_is_killed() {
    cluster_elects_a_new_leader_when_the_leader_is_killed(Version::V3_4);
}

#[test]
fn cluster_3_5_elects_a_new_leader_when_the_leader_is_killed() {
    cluster_elects_a_new_leader_when_the_leader_is_killed(Version::V3_5);
}

#[test]
fn tls_server_serves_a_client_that_trusts_the_ca() {
    for version in Version::ALL {
        let etcd = Etcd::start_tls(version);
        assert!(etcd.endpoint().starts_with("https://"));
        etcd.etcdctl_ok(&["put", "secure", "yes"]);
        let ca = format!("--cacert={}", etcd.tls().unwrap().ca.display());
        let get = [ca.as_str(), "get", "--print-value-only", "secure"];
        let out = version.etcdctl_at(&etcd.endpoint(), &get);
        assert_eq!(assert_ok(&out).trim(), "yes", "etcd {}", version.number());
    }
}

#[test]
fn mtls_server_refuses_a_client_without_a_certificate() {
    let etcd = Etcd::start_mtls(Version::V3_5);
    etcd.etcdctl_ok(&["put", "secure", "yes"]);
    let ca = format!("--cacert={}", etcd.tls().unwrap().ca.display());
    let get = [ca.as_str(), "--command-timeout=1s", "get", "secure"];
    assert!(!Version::V3_5
        .etcdctl_at(&etcd.endpoint(), &get)
        .status
        .success());
}

#[test]
fn auth_confines_a_user_to_its_prefix() {
    for version in Version::ALL {
        let etcd = Etcd::start(version);
        etcd.enable_auth("rootpw");
        etcd.add_user("alice", "alicepw", "jobs/");
        etcd.etcdctl_ok(&["--user=alice:alicepw", "put", "jobs/a", "1"]);
        let outside = etcd.etcdctl(&["--user=alice:alicepw", "put", "other", "1"]);
        assert!(String::from_utf8_lossy(&outside.stderr).contains("permission denied"));
        let anonymous = version.etcdctl_at(&etcd.endpoint(), &["get", "jobs/a"]);
        assert!(!anonymous.status.success(), "etcd {}", version.number());
    }
}

#[test]
fn proxy_stamps_each_request_a_client_sends_and_forgets_them_when_cleared() {
    let etcd = etcd::shared(Version::V3_4);
    let proxy = Proxy::start(etcd.addr());
    let key = format!("{}key", etcd::unique_prefix("proxy_stamps"));
    let before = Instant::now();
    assert_ok(&Version::V3_4.etcdctl_at(&proxy.endpoint(), &["put", &key, "v"]));
    let stamps = proxy.requests();
    assert_eq!(stamps.len(), 1, "one put, stamped {stamps:?}");
    assert!(stamps[0] >= before);
    proxy.clear_requests();
    assert!(proxy.requests().is_empty());
}

#[test]
fn metrics_count_the_requests_the_server_received() {
    let etcd = etcd::shared(Version::V3_5);
    let scrape = || crate::bench_prom::Scrape::parse(&etcd.metrics());
    let before = scrape();
    let key = format!("{}key", etcd::unique_prefix("metrics"));
    etcd.etcdctl_ok(&["put", &key, "v"]);
    let delta = scrape().counters_since(&before);
    let puts = delta.get("msg_received[Put]").copied().unwrap_or(0.0);
    assert!(puts >= 1.0, "no Put counted: {delta:?}");
}
