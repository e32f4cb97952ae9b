#!/usr/bin/env python3
"""Benchmarks of SPEC §10: leasewrap against `etcdctl lock` (etcd 3.4) and `flock(1)`.

    scripts/bench.py --quick            smoke run: small n, prints the table, writes nothing
    scripts/bench.py                    full run, writes BENCHMARKS.md
    scripts/bench.py --wait-quiet 45m   first wait (up to 45 min) for a 1-minute load below 0.7

Standard library only. The script starts its own etcd 3.4 (/usr/bin/etcd) on free loopback ports in a
temp dir and SIGKILLs it by its pid at the end. Every process it starts runs in a session of its own
and the script is a child subreaper, so orphans (an `etcdctl lock` child whose parent was killed) come
back to it; at the end of every iteration, and on any way out, every process left in those sessions is
SIGKILLed and reaped.

Where it matters, the tools are run alternately in the same loop (A B, then B A), so a drift in machine
load hits both. How each instant is observed:

- a child's start: inotify IN_OPEN on a private copy of the child's binary, which execve() raises when
  it opens the file; the harness sits in poll() and stamps CLOCK_MONOTONIC when it wakes;
- a child's exit: a pidfd (pidfd_open) of the child, readable once it has exited;
- a holder's last renewal: the holder talks to etcd through a small TCP proxy in this script, which
  stamps each HTTP/2 DATA frame from client to server (keepalive requests are the only ones while the
  child runs); the same proxy blackholes traffic for the partition figure.
"""

import argparse
import base64
import ctypes
import hashlib
import json
import os
import platform
import random
import re
import resource
import select
import selectors
import shlex
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"
FLOCK = "/usr/bin/flock"
CHILD_PATH = "/usr/local/bin:/usr/bin:/bin"
MS = 1e6  # ns per ms

libc = ctypes.CDLL(None, use_errno=True)
IN_OPEN = 0x20
PR_SET_CHILD_SUBREAPER = 36


def mono():
    return time.monotonic_ns()


class BenchError(Exception):
    pass


# --------------------------------------------------------------------------------------------------
# processes


class Procs:
    """Every process the harness starts: spawned into a session of its own, killed by session."""

    def __init__(self, env):
        self.env = env
        self.sessions = set()  # session ids (= leader pids) we created and have not swept yet
        self.status = {}  # pid -> wait status, for pids reaped by a sweep
        self.devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        self.me = os.getpid()

    def spawn(self, argv, env=None, stdout=None, stderr=None, track=True):
        fa = [
            (os.POSIX_SPAWN_DUP2, self.devnull, 0),
            (os.POSIX_SPAWN_DUP2, stdout if stdout is not None else self.devnull, 1),
            (os.POSIX_SPAWN_DUP2, stderr if stderr is not None else self.devnull, 2),
        ]
        pid = os.posix_spawn(argv[0], argv, env or self.env, file_actions=fa, setsid=True)
        if track:
            self.sessions.add(pid)
        return pid

    def wait(self, pid, timeout=None):
        """The wait status of `pid`, or None if it is still running after `timeout` seconds."""
        if pid in self.status:
            return self.status.pop(pid)
        if timeout is not None:
            try:
                pfd = os.pidfd_open(pid)
            except ProcessLookupError:
                return self.status.pop(pid, None)
            try:
                p = select.poll()
                p.register(pfd, select.POLLIN)
                if not p.poll(max(0, int(timeout * 1000))):
                    return None
            finally:
                os.close(pfd)
        try:
            _, st = os.waitpid(pid, 0)
            return st
        except ChildProcessError:
            return self.status.pop(pid, None)

    def reap(self):
        """Reap every ended child (orphans come to us: we are a subreaper); ECHILD: none left."""
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.status[pid] = st

    def ours(self, pid, ppid_of):
        """Whether `pid` descends from the harness (every descendant stays below us)."""
        seen = 0
        while pid > 1 and seen < 64:
            if pid == self.me:
                return True
            pid = ppid_of.get(pid, 0)
            seen += 1
        return False

    def kill_sessions(self, sids, limit=10.0):
        """SIGKILL every process of these sessions (ours only), reap, until none is left."""
        sids = set(sids)
        end = time.monotonic() + limit
        while True:
            table = proc_table()
            ppid_of = {p: t[1] for p, t in table.items()}
            live = [
                p
                for p, (state, _ppid, sid) in table.items()
                if sid in sids and state != "Z" and p != self.me and self.ours(p, ppid_of)
            ]
            for p in live:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.reap()
            if not live:
                self.sessions -= sids
                return
            if time.monotonic() > end:
                raise BenchError(f"processes {live} survive SIGKILL")
            time.sleep(0.005)

    def kill_all(self, keep=()):
        self.kill_sessions(self.sessions - set(keep))


def proc_table():
    """pid -> (state, ppid, session) for every process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rindex(b")") + 2 :].split()
        out[int(d)] = (rest[0].decode(), int(rest[1]), int(rest[3]))
    return out


def cpu_ticks(pid):
    """utime + stime of `pid` in clock ticks, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rindex(b")") + 2 :].split()
    return int(rest[11]) + int(rest[12])


def cpu_ns(pid):
    """CPU time of every thread of `pid` in ns (schedstat: exact, unlike the 10 ms ticks of
    /proc/PID/stat), and the thread count; None when it is gone."""
    total, threads = 0, 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
            threads += 1
    except OSError:
        return None
    return total, threads


def pids_by_exe(path):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.readlink(f"/proc/{d}/exe") == path:
                    out.append(int(d))
            except OSError:
                pass
    return out


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def kb_field(path, field):
    """A `Field:  N kB` line of a /proc file, in kB; 0 when it is gone."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def exit_code(st):
    return None if st is None else os.waitstatus_to_exitcode(st)


# --------------------------------------------------------------------------------------------------
# observing starts (inotify on exec) and exits (pidfd)


class Events:
    """Child starts and exits, stamped with CLOCK_MONOTONIC when poll() returns."""

    def __init__(self):
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise BenchError(f"inotify_init1: {os.strerror(ctypes.get_errno())}")
        self.labels = {}  # inotify watch descriptor -> label
        self.pidfds = {}  # pidfd -> label
        self.backlog = []  # (label, t, wakeup) seen but not yet taken
        self.wakeups = 0  # poll() returns so far: two events of one wakeup were stamped together
        self.seen_in = {}  # label -> wakeup number of the event last taken

    def watch_exec(self, path, label):
        wd = libc.inotify_add_watch(self.fd, path.encode(), IN_OPEN)
        if wd < 0:
            raise BenchError(f"inotify_add_watch {path}: {os.strerror(ctypes.get_errno())}")
        self.labels[wd] = label

    def watch_exit(self, pid, label):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.backlog.append((label, mono(), -1))
            return
        self.pidfds[fd] = label

    def forget_exits(self):
        for fd in self.pidfds:
            os.close(fd)
        self.pidfds.clear()

    def drain(self):
        self.poll(0)
        self.backlog.clear()

    def poll(self, timeout_s):
        p = select.poll()
        p.register(self.fd, select.POLLIN)
        for fd in self.pidfds:
            p.register(fd, select.POLLIN)
        ready = p.poll(max(0, int(timeout_s * 1000)))
        t = mono()
        self.wakeups += 1
        for fd, _ in ready:
            if fd == self.fd:
                self._read_inotify(t)
            else:
                self.backlog.append((self.pidfds.pop(fd), t, self.wakeups))
                os.close(fd)

    def _read_inotify(self, t):
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        off = 0
        while off < len(data):
            wd, mask, _cookie, ln = struct.unpack_from("iIII", data, off)
            off += 16 + ln
            if mask & IN_OPEN and wd in self.labels:
                self.backlog.append((self.labels[wd], t, self.wakeups))

    def take(self, label):
        for i, (lab, t, wakeup) in enumerate(self.backlog):
            if lab == label:
                del self.backlog[i]
                self.seen_in[label] = wakeup
                return t
        return None

    def together(self, a, b):
        """Whether the last `a` and `b` taken were stamped by one wakeup (their gap is then unknown)."""
        return self.seen_in.get(a, -2) == self.seen_in.get(b, -3)

    def wait_for(self, label, timeout_s):
        """The instant of the next `label` event, or None after `timeout_s`."""
        end = mono() + timeout_s * 1e9
        while True:
            t = self.take(label)
            if t is not None:
                return t
            left = (end - mono()) / 1e9
            if left <= 0:
                return None
            self.poll(min(left, 0.5))

    def wait_all(self, labels, timeout_s):
        """label -> instant for each of `labels` that comes within `timeout_s`."""
        got = {}
        end = mono() + timeout_s * 1e9
        while True:
            for lab in labels:
                if lab not in got:
                    t = self.take(lab)
                    if t is not None:
                        got[lab] = t
            left = (end - mono()) / 1e9
            if len(got) == len(labels) or left <= 0:
                return got
            self.poll(min(left, 0.5))


# --------------------------------------------------------------------------------------------------
# etcd and the proxy


def free_port(taken):
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken and port not in (2379, 2380):
            taken.add(port)
            return port


class Etcd:
    def __init__(self, procs, tmp, taken_ports):
        self.procs = procs
        self.client = free_port(taken_ports)
        self.peer = free_port(taken_ports)
        self.endpoint = f"http://127.0.0.1:{self.client}"
        self.data = os.path.join(tmp, "etcd-data")
        self.log = os.path.join(tmp, "etcd.log")
        peer = f"http://127.0.0.1:{self.peer}"
        argv = [
            ETCD,
            "--name=bench",
            f"--data-dir={self.data}",
            f"--listen-client-urls={self.endpoint}",
            f"--advertise-client-urls={self.endpoint}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=bench={peer}",
            f"--initial-cluster-token=bench-{os.getpid()}",
            "--initial-cluster-state=new",
            "--logger=zap",
            "--log-outputs=stderr",
            "--log-level=warn",
        ]
        logfd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self.pid = procs.spawn(argv, stderr=logfd, stdout=logfd, track=False)
        os.close(logfd)
        self._wait_healthy(30)

    def _wait_healthy(self, limit):
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if self.procs.wait(self.pid, 0) is not None:
                raise BenchError(f"etcd exited at start; see {self.log}:\n{tail(self.log)}")
            try:
                with urllib.request.urlopen(self.endpoint + "/health", timeout=1) as r:
                    if json.load(r).get("health") == "true":
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise BenchError(f"etcd not healthy within {limit}s; see {self.log}")

    def post(self, path, body):
        req = urllib.request.Request(
            self.endpoint + path, data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.load(r)

    def count(self, prefix):
        p = prefix.encode()
        end = p[:-1] + bytes([p[-1] + 1])
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        resp = self.post("/v3/kv/range", {"key": b64(p), "range_end": b64(end), "count_only": True})
        return int(resp.get("count", 0))

    def watchers(self, both=False):
        """etcd's gauge of registered watchers (and of those not yet synced, with `both`)."""
        m = self.metrics()
        total = m.get("etcd_debugging_mvcc_watcher_total", 0)
        slow = m.get("etcd_debugging_mvcc_slow_watcher_total", 0)
        return (total, slow) if both else total

    def version(self):
        with urllib.request.urlopen(self.endpoint + "/version", timeout=2) as r:
            return json.load(r).get("etcdserver", "?")

    def metrics(self):
        with urllib.request.urlopen(self.endpoint + "/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, val = line.rpartition(" ")
                try:
                    out[key] = float(val)
                except ValueError:
                    pass
        return out

    def stop(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.procs.wait(self.pid, 10)


class Proxy:
    """TCP proxy to etcd: stamps client->server HTTP/2 DATA frames; can blackhole everything."""

    PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

    def __init__(self, upstream_port, taken_ports):
        self.upstream = ("127.0.0.1", upstream_port)
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(1024)
        self.port = self.lsock.getsockname()[1]
        taken_ports.add(self.port)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.blackhole = False
        self.data_times = []  # CLOCK_MONOTONIC of each client->server DATA frame
        self.lock = threading.Lock()
        self.stopping = False
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.lsock, selectors.EVENT_READ, None)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def reset(self):
        with self.lock:
            self.data_times = []

    def last_data_before(self, t):
        with self.lock:
            earlier = [x for x in self.data_times if x <= t]
        return max(earlier) if earlier else None

    def _loop(self):
        while not self.stopping:
            if self.blackhole:
                time.sleep(0.002)  # read nothing, accept nothing: bytes wait in the kernel
                continue
            for key, _ in self.sel.select(timeout=0.01):
                if key.data is None:
                    self._accept()
                else:
                    self._pump(*key.data)

    def _accept(self):
        try:
            c, _ = self.lsock.accept()
        except OSError:
            return
        try:
            u = socket.create_connection(self.upstream, timeout=2)
        except OSError:
            c.close()
            return
        for s in (c, u):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(5)
        state = {"buf": b"", "preface": False, "peer": None}
        self.sel.register(c, selectors.EVENT_READ, (c, u, state))
        self.sel.register(u, selectors.EVENT_READ, (u, c, None))

    def _pump(self, src, dst, state):
        try:
            data = src.recv(65536)
        except OSError:
            data = b""
        if data:
            if state is not None:
                self._frames(state, data, mono())
            try:
                dst.sendall(data)
                return
            except OSError:
                pass
        for s in (src, dst):
            try:
                self.sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    def _frames(self, state, data, t):
        buf = state["buf"] + data
        if not state["preface"]:
            if len(buf) < len(self.PREFACE):
                state["buf"] = buf
                return
            buf = buf[len(self.PREFACE) :]
            state["preface"] = True
        stamps = []
        while len(buf) >= 9:
            length = int.from_bytes(buf[0:3], "big")
            if len(buf) < 9 + length:
                break
            if buf[3] == 0 and length > 0:  # DATA
                stamps.append(t)
            buf = buf[9 + length :]
        state["buf"] = buf
        if stamps:
            with self.lock:
                self.data_times.extend(stamps)

    def stop(self):
        self.stopping = True
        self.thread.join(2)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()


# --------------------------------------------------------------------------------------------------
# statistics and the table


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary(xs):
    return {
        "n": len(xs),
        "median": statistics.median(xs) if xs else float("nan"),
        "p10": pct(xs, 10),
        "p90": pct(xs, 90),
        "p99": pct(xs, 99),
        "min": min(xs) if xs else float("nan"),
        "max": max(xs) if xs else float("nan"),
    }


def fmt_dist(xs, unit="ms", digits=2):
    if not xs:
        return "—"
    s = summary(xs)
    f = f"{{:.{digits}f}}"
    return (
        f"{f.format(s['median'])} {unit} "
        f"(p10–p90 {f.format(s['p10'])}–{f.format(s['p90'])}, "
        f"min–max {f.format(s['min'])}–{f.format(s['max'])}, n={s['n']})"
    )


def tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


# --------------------------------------------------------------------------------------------------
# the bench


class Bench:
    def __init__(self, args, tmp):
        self.args = args
        self.tmp = tmp
        self.quick = args.quick
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCDCTL_", "LEASEWRAP_"))}
        env["PATH"] = CHILD_PATH
        env["ETCDCTL_API"] = "3"
        env.pop("NOTIFY_SOCKET", None)
        self.env = env
        self.procs = Procs(env)
        self.events = Events()
        self.ports = set()
        self.lw = args.leasewrap
        self.rows = []  # (figure, leasewrap, baseline, ratio, goal, verdict)
        self.details = []  # extra lines per figure
        self.results = {}
        self.together = 0  # handover samples whose two events came in one wakeup of the harness
        self.bin = os.path.join(tmp, "bin")
        os.makedirs(self.bin)
        # private copies of the children's binaries: an exec of one is a start we can see
        for name, src in [
            ("hold", "/bin/cat"),
            ("next", "/bin/true"),
            ("hsleep", "/bin/sleep"),
            ("wsleep", "/bin/sleep"),
            ("chain", "/bin/cat"),
            ("lsleep", "/bin/sleep"),
        ]:
            path = os.path.join(self.bin, name)
            shutil.copy2(src, path)
            self.events.watch_exec(path, name)
        self.logs = os.path.join(tmp, "logs")
        os.makedirs(self.logs)
        self.etcd = None
        self.proxy = None
        self.watch_base = 0  # etcd's watcher count with none of ours running

    def p(self, name):
        return os.path.join(self.bin, name)

    def log(self, msg):
        print(msg, flush=True)

    def logfd(self, name):
        return os.open(
            os.path.join(self.logs, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644
        )

    def spawn(self, argv, logname):
        """Start `argv` with its stderr appended to logs/`logname`."""
        fd = self.logfd(logname)
        try:
            return self.procs.spawn(argv, stderr=fd)
        finally:
            os.close(fd)

    # commands -------------------------------------------------------------------------------------

    def cmd(self, tool, name, child, endpoint=None, ttl=None):
        ep = endpoint or self.etcd.endpoint
        if tool == "leasewrap":
            ttl_args = ["--ttl", f"{ttl}s"] if ttl else []
            return [self.lw, "--endpoints", ep, "--name", name, *ttl_args, "--", *child]
        if tool == "etcdctl":
            ttl_args = [f"--ttl={ttl}"] if ttl else []
            return [ETCDCTL, f"--endpoints={ep}", "lock", *ttl_args, name, *child]
        raise ValueError(tool)

    def prefix(self, tool, name):
        return f"leasewrap/{name}/" if tool == "leasewrap" else f"{name}/"

    def wait_queued(self, tool, name, count, pids, watchers, limit=15):
        """Wait until `count` keys are under the lock's prefix and etcd has `watchers` watchers, all
        synced. A waiter watches the key ahead of it. A watch that starts at a revision etcd already
        has (etcdctl's does) is "unsynced" until etcd's sync loop, every 100 ms, catches it up; an
        event in the meantime waits for that loop. A waiter queued for long is synced: so is ours."""
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if self.etcd.count(self.prefix(tool, name)) >= count:
                total, slow = self.etcd.watchers(both=True)
                if total >= watchers and slow == 0:
                    return
            for pid in pids:
                st = self.procs.wait(pid, 0)
                if st is not None:
                    raise BenchError(f"{tool} {name}: exited {exit_code(st)} while queueing")
            time.sleep(0.01)
        raise BenchError(
            f"{tool} {name}: not {count} keys and {watchers} watchers within {limit}s "
            f"(keys {self.etcd.count(self.prefix(tool, name))}, watchers {self.etcd.watchers()})"
        )

    def watching(self, tool, waiters):
        """etcd's watcher count once `waiters` wait: each watches the key ahead; a leasewrap holder
        also watches its own key, an etcdctl holder nothing."""
        return self.watch_base + waiters + (1 if tool == "leasewrap" else 0)

    def start_child_pid(self, label, timeout=15, pids=()):
        """Wait for the exec of `label`'s binary; return its instant and the pid now running it."""
        t = self.events.wait_for(label, timeout)
        if t is None:
            for pid in pids:
                st = self.procs.wait(pid, 0)
                if st is not None:
                    raise BenchError(f"{label}: its supervisor exited {exit_code(st)} before it ran")
            raise BenchError(f"{label} did not start within {timeout}s")
        for _ in range(200):
            live = pids_by_exe(self.p(label))
            if len(live) > 1:
                raise BenchError(f"{label}: {len(live)} processes run it at once, {live}")
            if live:
                return t, live
            time.sleep(0.001)
        raise BenchError(f"{label} started but no process runs it")

    def finish(self, pids, limit=15, expect=0):
        """Wait for `pids` to end; their exit codes."""
        codes = []
        for pid in pids:
            st = self.procs.wait(pid, limit)
            if st is None:
                raise BenchError(f"pid {pid} did not end within {limit}s")
            codes.append(exit_code(st))
        if expect is not None and any(c != expect for c in codes):
            raise BenchError(f"exit codes {codes}, expected {expect}")
        return codes

    def sweep(self):
        """Kill what the last iteration left, and wait until etcd has dropped its watchers."""
        self.events.forget_exits()
        self.procs.kill_all(keep=())
        self.events.drain()
        if self.etcd:
            end = time.monotonic() + 10
            while self.etcd.watchers() > self.watch_base and time.monotonic() < end:
                time.sleep(0.01)

    # figure 1 and 2: whole-process wall time -------------------------------------------------------

    def timed(self, argv, logname):
        fd = self.logfd(logname)
        try:
            t0 = mono()
            pid = self.procs.spawn(argv, stderr=fd, stdout=fd)
            st = self.procs.wait(pid, 30)
            t1 = mono()
        finally:
            os.close(fd)
        if st is None:
            self.procs.kill_all()
            raise BenchError(f"{argv} did not end within 30s")
        if exit_code(st) != 0:
            raise BenchError(f"{argv} exited {exit_code(st)}; log:\n{tail(os.path.join(self.logs, logname))}")
        self.procs.sessions.discard(pid)
        return (t1 - t0) / MS

    def alternate(self, runs, n, warmup=3):
        """runs: label -> argv factory(i). Interleaved, order flipped every iteration."""
        labels = list(runs)
        out = {k: [] for k in labels}
        for i in range(warmup + n):
            order = labels if i % 2 == 0 else labels[::-1]
            for lab in order:
                ms = self.timed(runs[lab](i), f"{lab}.log")
                if i >= warmup:
                    out[lab].append(ms)
        return out

    def fig_true(self):
        n = 5 if self.quick else self.args.n
        self.log(f"[1] uncontended -- true on etcd, n={n}")
        res = self.alternate(
            {
                "leasewrap": lambda i: self.cmd("leasewrap", "x", ["true"]),
                "etcdctl": lambda i: self.cmd("etcdctl", "x", ["true"]),
                "true": lambda i: ["/bin/true"],
            },
            n,
        )
        self.results["true"] = res
        lw, ec = statistics.median(res["leasewrap"]), statistics.median(res["etcdctl"])
        self.rows.append(
            (
                "1. `-- true` uncontended, etcd (whole process)",
                fmt_dist(res["leasewrap"]),
                "etcdctl lock: " + fmt_dist(res["etcdctl"]),
                f"{lw / ec:.2f}",
                "≤ 0.4 × etcdctl",
                "met" if lw <= 0.4 * ec else "MISSED",
            )
        )
        self.details.append(
            f"Harness floor for figures 1–2 (posix_spawn + waitpid of `/bin/true`): {fmt_dist(res['true'])}."
        )

    def fig_local(self):
        n = 5 if self.quick else self.args.n
        d = os.path.join(self.tmp, "local")
        os.makedirs(d, mode=0o700)  # leasewrap refuses a state directory others can write
        self.log(f"[2] -- true on the local backend vs flock(1), n={n}")
        res = self.alternate(
            {
                "leasewrap-local": lambda i: [self.lw, "--local-dir", d, "--name", "x", "--", "true"],
                "flock": lambda i: [FLOCK, os.path.join(d, "x.lock"), "true"],
            },
            n,
        )
        self.results["local"] = res
        lw, fl = statistics.median(res["leasewrap-local"]), statistics.median(res["flock"])
        self.rows.append(
            (
                "2. `-- true` local backend (whole process)",
                fmt_dist(res["leasewrap-local"]),
                "flock(1): " + fmt_dist(res["flock"]),
                f"{lw / fl:.2f}",
                "≤ 2 × flock",
                "met" if lw <= 2 * fl else "MISSED",
            )
        )
        self.details.append(f"fdatasync of a 2-byte rewrite in the local dir: {fmt_dist(fsync_cost(d), digits=3)}.")

    # figure 9: what --once adds to `-- true` ------------------------------------------------------

    def fig_once(self):
        """--once KEY with a KEY not yet done: one read before the child, one guarded write after
        it (on etcd the record's lease is granted while the child runs). Each iteration a new KEY."""
        n = 5 if self.quick else self.args.n
        d = os.path.join(self.tmp, "once")
        os.makedirs(d)
        self.log(f"[9] --once on -- true, etcd and local, n={n}")
        plain_local = [self.lw, "--local-dir", d, "--name", "plain", "--", "true"]
        res = self.alternate(
            {
                "etcd": lambda i: self.cmd("leasewrap", "plain", ["true"]),
                "etcd --once": lambda i: [self.lw, "--once", f"k{i}", *self.cmd("leasewrap", "once", ["true"])[1:]],
                "local": lambda i: plain_local,
                "local --once": lambda i: [self.lw, "--once", f"k{i}", *plain_local[1:4], "once", "--", "true"],
            },
            n,
        )
        self.results["once"] = res
        for backend in ("etcd", "local"):
            plain, once = res[backend], res[f"{backend} --once"]
            extra = statistics.median(once) - statistics.median(plain)
            self.rows.append(
                (
                    f"9. `--once KEY -- true`, {backend}, KEY not yet done (a read and a guarded write)",
                    fmt_dist(once),
                    "leasewrap without --once: " + fmt_dist(plain),
                    f"{statistics.median(once) / statistics.median(plain):.2f}",
                    "— (reported: +{:.2f} ms)".format(extra),
                    "—",
                )
            )

    # figure 3: handover --------------------------------------------------------------------------

    def handover_once(self, tool, name):
        fifo = os.path.join(self.tmp, f"fifo-{name}")
        os.mkfifo(fifo)
        self.events.drain()
        holder = self.spawn(self.cmd(tool, name, [self.p("hold"), fifo]), f"{tool}-ho.log")
        _, [hchild] = self.start_child_pid("hold", pids=[holder])
        waiter = self.spawn(self.cmd(tool, name, [self.p("next")]), f"{tool}-ho.log")
        self.wait_queued(tool, name, 2, [holder, waiter], self.watching(tool, 1))
        self.events.watch_exit(hchild, "exit")
        fd = os.open(fifo, os.O_WRONLY)  # the holder's child (cat) has it open: EOF on close
        os.close(fd)
        got = self.events.wait_all(["exit", "next"], 15)
        if len(got) < 2:
            raise BenchError(f"{tool} handover: saw only {sorted(got)}")
        if self.events.together("exit", "next"):
            self.together += 1
        self.finish([holder, waiter])
        os.unlink(fifo)
        self.sweep()
        return (got["next"] - got["exit"]) / MS

    def fig_handover(self):
        n = 3 if self.quick else self.args.n
        self.log(f"[3] handover, child exit -> next child exec, n={n}")
        res = {"leasewrap": [], "etcdctl": []}
        self.together = 0
        for i in range(n):
            for tool in (("leasewrap", "etcdctl") if i % 2 == 0 else ("etcdctl", "leasewrap")):
                res[tool].append(self.handover_once(tool, f"ho{i}"))
        self.results["handover"] = res
        lw, ec = statistics.median(res["leasewrap"]), statistics.median(res["etcdctl"])
        self.rows.append(
            (
                "3. handover: holder's child exits → waiter's child execs",
                fmt_dist(res["leasewrap"]),
                "etcdctl lock: " + fmt_dist(res["etcdctl"]),
                f"{lw / ec:.2f}",
                "≤ 2 ms",
                "met" if lw <= 2.0 else "MISSED",
            )
        )
        self.details.append(
            "Handover is measured from the holder's child's exit (its pidfd turns readable) to the waiter's child's "
            "execve (inotify IN_OPEN on its binary), both stamped by the harness waking in poll(); samples where both "
            f"came in one wakeup (so the gap is unknown and counted as ~0): {self.together} of {2 * n}."
        )

    # figure 4: takeover after SIGKILL ---------------------------------------------------------------

    def takeover_once(self, tool, name, ttl):
        self.events.drain()
        self.proxy.reset()
        argv = self.cmd(tool, name, [self.p("hsleep"), "1000"], endpoint=self.proxy.endpoint, ttl=ttl)
        holder = self.spawn(argv, f"{tool}-takeover.log")
        t_start, [hchild] = self.start_child_pid("hsleep", pids=[holder])
        waiter = self.spawn(self.cmd(tool, name, [self.p("wsleep"), "1000"], ttl=ttl), f"{tool}-takeover.log")
        self.wait_queued(tool, name, 2, [holder, waiter], self.watching(tool, 1))
        self.events.watch_exit(hchild, "old-exit")
        # kill at a random phase of the renewal period, at least one renewal after the start
        time.sleep(max(0.0, (t_start - mono()) / 1e9 + ttl / 3 + 0.1 + random.random() * ttl / 3))
        t_kill = mono()
        os.kill(holder, signal.SIGKILL)
        got = self.events.wait_all(["wsleep", "old-exit"], ttl + 6)
        last = self.proxy.last_data_before(t_kill)
        if "wsleep" not in got:
            raise BenchError(f"{tool} ttl {ttl}: no takeover within {ttl + 6}s")
        t_new = got["wsleep"]
        old_exit = got.get("old-exit")
        r = {
            "from_kill": (t_new - t_kill) / 1e9,
            "from_renewal": (t_new - last) / 1e9 if last else None,
            "kill_after_renewal": (t_kill - last) / 1e9 if last else None,
            "old_exit_after_kill": (old_exit - t_kill) / 1e9 if old_exit else None,
            "orphan_at_takeover": old_exit is None or old_exit > t_new,
        }
        self.sweep()
        return r

    def fig_takeover(self):
        n = 1 if self.quick else self.args.n_slow
        self.log(f"[4] takeover after SIGKILL of the holder, TTL 2 s and 5 s, n={n}")
        res = {}
        for ttl in (2, 5):
            for tool in ("leasewrap", "etcdctl"):
                res[(tool, ttl)] = []
            for i in range(n):
                for tool in (("leasewrap", "etcdctl") if i % 2 == 0 else ("etcdctl", "leasewrap")):
                    res[(tool, ttl)].append(self.takeover_once(tool, f"to{ttl}-{i}", ttl))
        self.results["takeover"] = {f"{k[0]}@{k[1]}": v for k, v in res.items()}
        for ttl in (2, 5):
            lw, ec = res[("leasewrap", ttl)], res[("etcdctl", ttl)]
            lw_r = [r["from_renewal"] for r in lw if r["from_renewal"] is not None]
            ec_r = [r["from_renewal"] for r in ec if r["from_renewal"] is not None]
            lw_orph = sum(r["orphan_at_takeover"] for r in lw)
            ec_orph = sum(r["orphan_at_takeover"] for r in ec)
            ok = lw_r and max(lw_r) <= ttl + 0.6 and lw_orph == 0
            self.rows.append(
                (
                    f"4. takeover after holder SIGKILL, TTL {ttl} s (from last renewal)",
                    fmt_dist(lw_r, "s", 3) + f"; old child alive at takeover {lw_orph}/{len(lw)}",
                    "etcdctl lock: " + fmt_dist(ec_r, "s", 3) + f"; old child alive at takeover {ec_orph}/{len(ec)}",
                    f"{statistics.median(lw_r) / statistics.median(ec_r):.2f}" if lw_r and ec_r else "—",
                    f"≤ TTL + 0.6 s = {ttl + 0.6:.1f} s, no orphan",
                    "met" if ok else "MISSED",
                )
            )
            self.details.append(
                f"Takeover TTL {ttl} s measured from the kill instant instead: leasewrap "
                f"{fmt_dist([r['from_kill'] for r in lw], 's', 3)}; etcdctl "
                f"{fmt_dist([r['from_kill'] for r in ec], 's', 3)}. The holder was killed "
                f"{fmt_dist([r['kill_after_renewal'] for r in lw + ec if r['kill_after_renewal'] is not None], 's', 3)} "
                f"after its last renewal (both tools). leasewrap's old child died "
                f"{fmt_dist([r['old_exit_after_kill'] * 1000 for r in lw if r['old_exit_after_kill'] is not None])} "
                f"after the kill (its watchdog saw leasewrap's socket close); etcdctl's old children still running at the end: "
                f"{sum(r['old_exit_after_kill'] is None for r in ec)}/{len(ec)}."
            )

    # figure 5: overlap while the holder is stopped or partitioned ---------------------------------------

    def overlap_once(self, tool, name, fault, ttl):
        self.events.drain()
        self.proxy.reset()
        argv = self.cmd(tool, name, [self.p("hsleep"), "1000"], endpoint=self.proxy.endpoint, ttl=ttl)
        holder = self.spawn(argv, f"{tool}-overlap.log")
        _, [hchild] = self.start_child_pid("hsleep", pids=[holder])
        waiter = self.spawn(self.cmd(tool, name, [self.p("wsleep"), "1000"], ttl=ttl), f"{tool}-overlap.log")
        self.wait_queued(tool, name, 2, [holder, waiter], self.watching(tool, 1))
        self.events.watch_exit(hchild, "old-exit")
        time.sleep(0.3)
        t_fault = mono()
        if fault == "SIGSTOP":
            os.kill(holder, signal.SIGSTOP)  # leasewrap alone, not its watchdog; etcdctl itself
        else:
            self.proxy.blackhole = True
        got = self.events.wait_all(["wsleep", "old-exit"], 2 * ttl)
        t_heal = mono()
        if fault == "SIGSTOP":
            os.kill(holder, signal.SIGCONT)
        else:
            self.proxy.blackhole = False
        got.update(self.events.wait_all([k for k in ("wsleep", "old-exit") if k not in got], 1.0))
        t_end = mono()
        holder_st = self.procs.wait(holder, 3)
        new, old = got.get("wsleep"), got.get("old-exit")
        if new is None:
            overlap, unbounded = 0.0, False
        else:
            overlap = max(0.0, ((old if old is not None else t_end) - new) / 1e9)
            unbounded = old is None
        r = {
            "overlap": overlap,
            "unbounded": unbounded,
            "new_started_after_fault": (new - t_fault) / 1e9 if new else None,
            "old_killed_after_fault": (old - t_fault) / 1e9 if old else None,
            "holder_exit": exit_code(holder_st),
            "window": (t_end - t_fault) / 1e9,
            "heal_at": (t_heal - t_fault) / 1e9,
        }
        self.sweep()
        return r

    def fig_overlap(self):
        n = 1 if self.quick else self.args.n_overlap
        ttl = 2
        self.log(f"[5] overlap while the holder is SIGSTOPped / partitioned for 2 x TTL (TTL {ttl} s), n={n}")
        res = {}
        for fault in ("SIGSTOP", "partition"):
            for tool in ("leasewrap", "etcdctl"):
                res[(tool, fault)] = []
            for i in range(n):
                for tool in (("leasewrap", "etcdctl") if i % 2 == 0 else ("etcdctl", "leasewrap")):
                    res[(tool, fault)].append(self.overlap_once(tool, f"ov{fault[:4]}{i}", fault, ttl))
        self.results["overlap"] = {f"{k[0]}@{k[1]}": v for k, v in res.items()}

        def show(rs):
            worst = max(r["overlap"] for r in rs)
            unb = sum(r["unbounded"] for r in rs)
            if unb:
                return (
                    f"old child never killed in {unb}/{len(rs)} runs: overlap ≥ {worst * 1000:.0f} ms, "
                    f"cut short when the harness killed both 1 s after the fault ended"
                )
            return f"max {worst * 1000:.0f} ms over {len(rs)} runs"

        for fault in ("SIGSTOP", "partition"):
            lw, ec = res[("leasewrap", fault)], res[("etcdctl", fault)]
            ok = all(r["overlap"] == 0 for r in lw)
            what = (
                "holder SIGSTOPped for 2 × TTL (leasewrap only, not its watchdog; etcdctl itself)"
                if fault == "SIGSTOP"
                else "holder partitioned from etcd for 2 × TTL (the proxy passes no byte)"
            )
            self.rows.append(
                (
                    f"5. overlap of old and new child, {what}, TTL {ttl} s",
                    show(lw),
                    "etcdctl lock: " + show(ec),
                    "—",
                    "0",
                    "met" if ok else "MISSED",
                )
            )
            self.details.append(
                f"{fault}: leasewrap's old child was killed "
                f"{fmt_dist([r['old_killed_after_fault'] for r in lw if r['old_killed_after_fault']], 's', 3)} "
                f"after the fault began, the new child started "
                f"{fmt_dist([r['new_started_after_fault'] for r in lw if r['new_started_after_fault']], 's', 3)} "
                f"after it; leasewrap holder exit codes {[r['holder_exit'] for r in lw]}; "
                f"etcdctl new child started "
                f"{fmt_dist([r['new_started_after_fault'] for r in ec if r['new_started_after_fault']], 's', 3)} "
                f"after the fault, etcdctl holder exit codes {[r['holder_exit'] for r in ec]} "
                f"(None: still running when the harness killed it)."
            )

    # figure 6: peak RSS ---------------------------------------------------------------------------------

    def rss_once(self, tool, name):
        self.events.drain()
        if tool == "leasewrap-local":
            d = os.path.join(self.tmp, "local-rss")
            argv = [self.lw, "--local-dir", d, "--name", name, "--ttl", "3s", "--", self.p("lsleep"), "1000"]
        else:
            argv = self.cmd(tool, name, [self.p("lsleep"), "1000"], ttl=3)
        pid = self.spawn(argv, f"{tool}-rss.log")
        t, [child] = self.start_child_pid("lsleep", pids=[pid])
        time.sleep(max(0.0, (t - mono()) / 1e9 + 1.5))  # past the first renewal (TTL/3 = 1 s)
        pids = [pid]
        if tool.startswith("leasewrap"):
            pids += [c for c in children(pid) if c != child]
            if len(pids) != 2:
                raise BenchError(f"leasewrap {pid}: expected one watchdog, children {children(pid)}")
        hwm = [kb_field(f"/proc/{x}/status", "VmHWM") for x in pids]
        pss = [kb_field(f"/proc/{x}/smaps_rollup", "Pss") for x in pids]
        self.sweep()
        self.pss.setdefault(tool, []).append(sum(pss) / 1024)
        return sum(hwm) / 1024, [h / 1024 for h in hwm]

    def fig_rss(self):
        n = 1 if self.quick else 5
        self.log(f"[6] peak RSS while the child runs, n={n}")
        res = {"leasewrap": [], "etcdctl": [], "leasewrap-local": []}
        parts = []
        self.pss = {}
        for i in range(n):
            for tool in res:
                total, each = self.rss_once(tool, f"rss{i}")
                res[tool].append(total)
                if tool == "leasewrap":
                    parts.append(each)
        self.results["rss"] = res
        lw, ec = statistics.median(res["leasewrap"]), statistics.median(res["etcdctl"])
        self.rows.append(
            (
                "6. peak RSS (VmHWM), leasewrap + watchdog, etcd backend",
                fmt_dist(res["leasewrap"], "MiB", 1),
                "etcdctl lock: " + fmt_dist(res["etcdctl"], "MiB", 1),
                f"{lw / ec:.2f}",
                "≤ 8 MB",
                "met" if lw <= 8e6 / 2**20 else ("met as 8 MiB, missed as 8·10⁶ B" if lw <= 8 else "MISSED"),
            )
        )
        self.details.append(
            f"Peak RSS split (leasewrap, watchdog) in MiB: {[tuple(round(x, 1) for x in p) for p in parts]}; "
            f"local backend, leasewrap + watchdog: {fmt_dist(res['leasewrap-local'], 'MiB', 1)}. "
            f"VmHWM counts the pages of the binary and of libc in both processes; their proportional share "
            f"(Pss from smaps_rollup, summed, at the same instant) is {fmt_dist(self.pss['leasewrap'], 'MiB', 1)} "
            f"for leasewrap + watchdog and {fmt_dist(self.pss['etcdctl'], 'MiB', 1)} for etcdctl."
        )

    # figure 7: many waiters on one lease -------------------------------------------------------------------

    METRICS = [
        ("grpc_server_started_total", "grpc_method"),
        ("grpc_server_msg_received_total", "grpc_method"),
        ("etcd_debugging_mvcc_range_total", None),
        ("etcd_debugging_mvcc_put_total", None),
        ("etcd_debugging_mvcc_delete_total", None),
        ("etcd_debugging_mvcc_txn_total", None),
        ("etcd_debugging_mvcc_events_total", None),
    ]

    def metric_delta(self, before, after):
        out = {}
        for key, val in after.items():
            base = key.split("{")[0]
            for name, label in self.METRICS:
                if base != name:
                    continue
                if label:
                    m = re.search(label + r'="([^"]*)"', key)
                    if not m:
                        continue
                    k = f"{name.replace('grpc_server_', '').replace('_total', '')}[{m.group(1)}]"
                else:
                    k = name.replace("etcd_debugging_mvcc_", "mvcc_").replace("_total", "")
                d = val - before.get(key, 0.0)
                if d:
                    out[k] = out.get(k, 0.0) + d
        return out

    def chain(self, waiters):
        """One holder and `waiters` queued behind it on one lease; each child exits on a trigger."""
        name = f"chain{waiters}"
        fifo = os.path.join(self.tmp, f"fifo-{name}")
        os.mkfifo(fifo)
        self.events.drain()
        argv = self.cmd("leasewrap", name, [self.p("chain"), fifo])
        log = self.logfd("chain.log")
        first = self.procs.spawn(argv, stderr=log)
        self.start_child_pid("chain", pids=[first])
        pids = [first]
        batch = 20
        for b in range(0, waiters, batch):
            for _ in range(min(batch, waiters - b)):
                pids.append(self.procs.spawn(argv, stderr=log))
            self.wait_queued("leasewrap", name, len(pids), pids, self.watching("leasewrap", len(pids) - 1), limit=60)
        os.close(log)
        time.sleep(1.0)  # the waiters' start-up is over before the counters are read
        before = self.etcd.metrics()
        t_begin = mono()
        handovers = []
        for k in range(waiters):
            live = pids_by_exe(self.p("chain"))
            if len(live) != 1:
                raise BenchError(f"chain: {len(live)} children hold the lease at once")
            self.events.watch_exit(live[0], "exit")
            fd = os.open(fifo, os.O_WRONLY)
            os.close(fd)
            got = self.events.wait_all(["exit", "chain"], 15)
            if len(got) < 2:
                raise BenchError(f"chain handover {k}: saw only {sorted(got)}")
            handovers.append((got["chain"] - got["exit"]) / MS)
            if self.events.together("exit", "chain"):
                self.together += 1
            time.sleep(0.02)  # the new holder settles (as in figure 3) before its child is told to end
        t_end = mono()
        after = self.etcd.metrics()
        fd = os.open(fifo, os.O_WRONLY)  # the last holder
        os.close(fd)
        codes = self.finish(pids, limit=30, expect=None)
        bad = [c for c in codes if c != 0]
        if bad:
            raise BenchError(f"chain: exit codes {bad}")
        os.unlink(fifo)
        self.sweep()
        delta = self.metric_delta(before, after)
        per = {k: v / waiters for k, v in sorted(delta.items())}
        return handovers, per, (t_end - t_begin) / 1e9

    def fig_waiters(self):
        sizes = (3, 20) if self.quick else (10, 200)
        self.log(f"[7] waiters on one lease: chains of {sizes[0]} and {sizes[1]} handovers")
        out = {}
        self.together = 0
        for w in sizes:
            out[w] = self.chain(w)
        self.results["waiters"] = {
            str(w): {"handover_ms": h, "per_handover": per, "seconds": s} for w, (h, per, s) in out.items()
        }
        small, big = sizes
        hb, perb, secs = out[big]
        hs, pers, _ = out[small]
        sb, ss = summary(hb), summary(hs)
        ok = sb["p99"] <= 10.0 and sb["median"] <= 1.5 * ss["median"] + 0.5
        self.rows.append(
            (
                f"7. {big} waiters on one lease: handover",
                f"p50 {sb['median']:.2f} ms, p99 {sb['p99']:.2f} ms (min–max {sb['min']:.2f}–{sb['max']:.2f}, n={sb['n']})",
                f"leasewrap with {small} waiters: p50 {ss['median']:.2f} ms, p99 {ss['p99']:.2f} ms",
                f"{sb['median'] / ss['median']:.2f}",
                "p99 ≤ 10 ms; cost independent of the number of waiters",
                "met" if ok else "MISSED",
            )
        )
        keys = sorted(set(perb) | set(pers))
        lines = [f"| etcd counter, per handover | {small} waiters | {big} waiters |", "|---|---|---|"]
        for k in keys:
            lines.append(f"| `{k}` | {pers.get(k, 0):.2f} | {perb.get(k, 0):.2f} |")
        self.details.append(
            f"Requests per handover (etcd /metrics, deltas over the handover phase only, divided by the number of "
            f"handovers; keepalives of the queued waiters fall into the window, {secs:.1f} s for {big} handovers; "
            f"samples seen in one wakeup: {self.together} of {small + big}):\n\n"
            + "\n".join(lines)
        )

    # figure 8: many leases held at once -----------------------------------------------------------------------

    def fig_many(self):
        count = 50 if self.quick else self.args.leases
        window = 5.0 if self.quick else self.args.window
        self.log(f"[8] {count} leases held at once, CPU over {window:.0f} s")
        self.events.drain()
        log = self.logfd("many.log")
        pids = []
        batch = 25
        t0 = time.monotonic()
        for b in range(0, count, batch):
            k = min(batch, count - b)
            for i in range(k):
                pids.append(self.procs.spawn(self.cmd("leasewrap", f"many{b + i}", [self.p("lsleep"), "3600"]), stderr=log))
            # inotify merges identical events that queue up: count the children in /proc instead
            end = time.monotonic() + 60
            while len(pids_by_exe(self.p("lsleep"))) < b + k and time.monotonic() < end:
                time.sleep(0.2)
            started = len(pids_by_exe(self.p("lsleep")))
            if started < b + k:
                raise BenchError(f"many: only {started} of {count} children started")
        os.close(log)
        startup = time.monotonic() - t0
        time.sleep(3.0)  # let the start-up work end before the window
        wds = []
        for pid in pids:
            cs = [c for c in children(pid) if os.readlink(f"/proc/{c}/exe") == os.path.realpath(self.lw)]
            if len(cs) != 1:
                raise BenchError(f"many: leasewrap {pid} has children {children(pid)}")
            wds.append(cs[0])
        watched = pids + wds
        a = [cpu_ns(p) for p in watched]
        ea = cpu_ticks(self.etcd.pid)
        ta = time.monotonic()
        time.sleep(window)
        b2 = [cpu_ns(p) for p in watched]
        eb = cpu_ticks(self.etcd.pid)
        tb = time.monotonic()
        if any(x is None for x in a + b2):
            raise BenchError("many: a leasewrap or watchdog ended during the window")
        if any(x[1] != y[1] for x, y in zip(a, b2)):
            raise BenchError("many: a thread came or went during the window: its time would be lost")
        tick = os.sysconf("SC_CLK_TCK")
        secs = tb - ta
        lw_cpu = sum(y[0] - x[0] for x, y in zip(a[: len(pids)], b2[: len(pids)])) / 1e9
        wd_cpu = sum(y[0] - x[0] for x, y in zip(a[len(pids) :], b2[len(pids) :])) / 1e9
        threads = sum(x[1] for x in a)
        etcd_cpu = (eb - ea) / tick
        per_lease = (lw_cpu + wd_cpu) / count / secs * 100
        self.sweep()
        self.results["many"] = {
            "leases": count,
            "window_s": secs,
            "leasewrap_cpu_s": lw_cpu,
            "watchdog_cpu_s": wd_cpu,
            "etcd_cpu_s": etcd_cpu,
            "per_lease_pct": per_lease,
            "startup_s": startup,
        }
        self.rows.append(
            (
                f"8. {count} leases held at once on one etcd: CPU per lease",
                f"{per_lease:.4f} % of a core (leasewrap {lw_cpu * 1000:.0f} ms + watchdogs {wd_cpu * 1000:.0f} ms "
                f"of CPU over {secs:.1f} s)",
                f"etcd: {etcd_cpu / secs * 100:.1f} % of a core",
                "—",
                "< 0.1 % of a core per lease",
                "met" if per_lease < 0.1 else "MISSED",
            )
        )
        self.details.append(
            f"{count} leases: starting them (batches of {batch}, each waiting for its children) took {startup:.1f} s; "
            f"leasewrap CPU is the run time in /proc/PID/task/TID/schedstat (ns), summed over all {len(pids)} "
            f"leasewrap and {len(wds)} watchdog processes ({threads} threads), default TTL 10 s; etcd's is "
            f"utime+stime from /proc/PID/stat (tick {1000 / tick:.0f} ms)."
        )

    # all --------------------------------------------------------------------------------------------------

    FIGURES = {
        1: "fig_true",
        2: "fig_local",
        3: "fig_handover",
        4: "fig_takeover",
        5: "fig_overlap",
        6: "fig_rss",
        7: "fig_waiters",
        8: "fig_many",
        9: "fig_once",
    }

    def run(self, only):
        self.etcd = Etcd(self.procs, self.tmp, self.ports)
        self.proxy = Proxy(self.etcd.client, self.ports)
        self.watch_base = self.etcd.watchers()
        self.log(f"etcd {self.etcd.version()} at {self.etcd.endpoint} (pid {self.etcd.pid}); proxy at {self.proxy.endpoint}")
        for k in sorted(only):
            t = time.monotonic()
            try:
                getattr(self, self.FIGURES[k])()
            finally:
                self.sweep()
            self.log(f"    done in {time.monotonic() - t:.1f} s")

    def close(self):
        try:
            self.events.forget_exits()
            self.procs.kill_all()
        finally:
            if self.proxy:
                self.proxy.stop()
            if self.etcd:
                self.etcd.stop()
            self.procs.reap()


def fsync_cost(d, n=50):
    path = os.path.join(d, "fsync-probe")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    out = []
    try:
        for i in range(n):
            t = mono()
            os.pwrite(fd, f"{i % 10}\n".encode(), 0)
            os.fdatasync(fd)
            out.append((mono() - t) / MS)
    finally:
        os.close(fd)
        os.unlink(path)
    return out


# --------------------------------------------------------------------------------------------------
# the machine, the report


def sh(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        return "?"


def machine(tmp):
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    fs = "?"
    best = ""
    with open("/proc/mounts") as f:
        for line in f:
            dev, mnt, typ = line.split()[:3]
            if tmp.startswith(mnt) and len(mnt) > len(best):
                best, fs = mnt, f"{typ} on {dev} ({mnt})"
    return {
        "nproc": sh(["nproc"]),
        "cpu": model,
        "kernel": platform.release(),
        "etcd": sh([ETCD, "--version"]).splitlines()[0],
        "etcdctl": sh([ETCDCTL, "version"]).splitlines()[0],
        "flock": sh([FLOCK, "--version"]),
        "python": platform.python_version(),
        "fs": fs,
    }


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def cpu_busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def parse_duration(s):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(s|m|h)?", s)
    if not m:
        raise argparse.ArgumentTypeError(f"bad duration {s!r}")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


def wait_quiet(limit, threshold=0.7, every=30):
    """Poll the 1-minute load every `every` s until it is below `threshold`; False after `limit` s."""
    end = time.monotonic() + limit
    while True:
        load = float(loadavg()[0])
        print(f"load {load:.2f} (want < {threshold})", flush=True)
        if load < threshold:
            return True
        if time.monotonic() + every > end:
            return False
        time.sleep(every)


def ensure_binary(path, build):
    """Build target/release/leasewrap (a no-op when it is fresh). A build that fails keeps an existing
    binary, which is then measured as it is; the report says so."""
    if not build:
        if not os.access(path, os.X_OK):
            sys.exit(f"bench: {path} is not an executable file")
        return ""
    print("cargo build --release", flush=True)
    r = subprocess.run(["cargo", "build", "--release"], cwd=ROOT)
    if r.returncode == 0 and os.access(path, os.X_OK):
        return ""
    if not os.access(path, os.X_OK):
        sys.exit("bench: cargo build --release failed and there is no target/release/leasewrap")
    built = time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(path)))
    print(f"bench: cargo build --release failed; measuring the binary built {built}", file=sys.stderr)
    return f"; cargo build --release failed at the run, so this is the binary built {built}"


def binary_info(path):
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    commit = sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    dirty = sh(["git", "-C", ROOT, "status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock"])
    size = os.path.getsize(path)
    return f"`{os.path.relpath(path, ROOT)}`, {size / 2**20:.1f} MiB, sha256 {digest}…, built from {commit}" + (
        " with uncommitted changes under src/" if dirty else ""
    )


# Everything after this line in the output file is written by hand and kept across runs.
KEEP = "<!-- Below: analysis written by hand; scripts/bench.py keeps it when it rewrites the file. -->"


def render(bench, info, meta):
    lines = [
        "# Benchmarks",
        "",
        "Made by `scripts/bench.py` (SPEC §10). Medians, with p10–p90 and min–max; ratios are leasewrap's",
        "median over the baseline's, both measured in the same run, interleaved iteration by iteration.",
        "",
        "Command:",
        "",
        f"    {meta['command']}",
        "",
        "| figure | leasewrap | baseline | ratio | goal | goal met? |",
        "|---|---|---|---|---|---|",
    ]
    for row in bench.rows:
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "## Notes on the figures", ""]
    for d in bench.details:
        lines += [d if d.startswith("|") or "\n" in d else "- " + d, ""]
    lines += [
        "## Machine and run",
        "",
        f"- CPUs: {info['nproc']} × {info['cpu']}; kernel {info['kernel']}; Python {info['python']}",
        f"- etcd: {info['etcd']} (`{ETCD}`, one member, default fsync, on {info['fs']}); {info['etcdctl']}; {info['flock']}",
        f"- leasewrap: {meta['binary']}",
        f"- children run with PATH={CHILD_PATH}; stderr of the tools goes to log files in the temp dir",
        f"- date: {meta['date']}; duration {meta['duration']:.0f} s",
        f"- load average (1, 5, 15 min) at the start: {' '.join(meta['load_start'])}, at the end: {' '.join(meta['load_end'])}",
        f"- machine CPU busy during the run (all processes, /proc/stat): {meta['busy']:.0f} % of {info['nproc']} CPUs",
        f"- quiet machine: {meta['quiet']}",
        "",
    ]
    return "\n".join(lines)


def print_table(bench):
    print()
    for row in bench.rows:
        print(f"{row[0]}\n    leasewrap: {row[1]}\n    baseline:  {row[2]}\n    ratio {row[3]}; goal {row[4]}: {row[5]}")
    print()
    for d in bench.details:
        print(d if "\n" in d else "- " + d)
        print()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small n, for a smoke run; writes no file unless --output")
    ap.add_argument("--output", help="markdown file for the table (default: BENCHMARKS.md, none with --quick)")
    ap.add_argument("--json", help="also write the raw measurements to this file")
    ap.add_argument("--only", default="1,2,3,4,5,6,7,8,9", help="figures to run, e.g. 1,2")
    ap.add_argument("--n", type=int, default=40, help="iterations for figures 1–3 (default 40)")
    ap.add_argument("--n-slow", type=int, default=5, help="iterations per TTL and tool for figure 4 (default 5)")
    ap.add_argument("--n-overlap", type=int, default=3, help="iterations per fault and tool for figure 5 (default 3)")
    ap.add_argument("--leases", type=int, default=500, help="leases held at once for figure 8 (default 500)")
    ap.add_argument("--window", type=float, default=20.0, help="CPU window of figure 8 in seconds (default 20)")
    default_binary = os.path.join(ROOT, "target/release/leasewrap")
    ap.add_argument("--leasewrap", default=default_binary, help="binary to measure (default: cargo build --release, then target/release/leasewrap)")
    ap.add_argument("--no-build", action="store_true", help="measure target/release/leasewrap as it is")
    ap.add_argument("--wait-quiet", type=parse_duration, metavar="DUR",
                    help="first wait up to DUR for a 1-minute load below 0.7 (polled every 30 s)")
    ap.add_argument("--time-limit", type=parse_duration, default=2400.0, metavar="DUR",
                    help="abort (and clean up) after this long (default 40m)")
    args = ap.parse_args()
    args.leasewrap = os.path.abspath(args.leasewrap)
    only = {int(x) for x in args.only.split(",") if x}
    output = args.output or (None if args.quick else os.path.join(ROOT, "BENCHMARKS.md"))
    command = "scripts/bench.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])

    for tool in (ETCD, ETCDCTL, FLOCK):
        if not os.access(tool, os.X_OK):
            sys.exit(f"bench: {tool} is missing (Debian: etcd-server, etcd-client, util-linux)")
    build_note = ensure_binary(args.leasewrap, build=not args.no_build and args.leasewrap == default_binary)

    quiet = "not waited for"
    if args.wait_quiet:
        quiet = (
            "yes: 1-minute load was below 0.7 when the run began"
            if wait_quiet(args.wait_quiet)
            else f"NO: the 1-minute load stayed at or above 0.7 for {args.wait_quiet / 60:.0f} min; run anyway"
        )

    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit("bench: prctl(PR_SET_CHILD_SUBREAPER) failed")
    # 500 leases: etcd and the harness need a descriptor per connection and per pidfd
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    def on_signal(sig, _frame):
        raise KeyboardInterrupt(f"signal {sig}")

    def on_alarm(_sig, _frame):
        raise BenchError(f"time limit of {args.time_limit:.0f} s reached")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(args.time_limit))

    tmp = tempfile.mkdtemp(prefix="leasewrap-bench-")
    bench = Bench(args, tmp)
    info = machine(tmp)
    load_start = loadavg()
    busy0, total0 = cpu_busy()
    t0 = time.monotonic()
    ok = False
    try:
        bench.run(only)
        ok = True
    except (BenchError, KeyboardInterrupt) as e:
        print(f"bench: {e}", file=sys.stderr)
    finally:
        signal.alarm(0)
        bench.close()
        busy1, total1 = cpu_busy()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"bench: logs kept in {tmp}", file=sys.stderr)
    meta = {
        "command": command,
        "binary": binary_info(args.leasewrap) + build_note,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "duration": time.monotonic() - t0,
        "load_start": load_start,
        "load_end": loadavg(),
        "busy": (busy1 - busy0) / max(1, total1 - total0) * 100,
        "quiet": quiet,
    }
    print_table(bench)
    if ok and args.json:
        with open(args.json, "w") as f:
            json.dump(bench.results, f, indent=1, default=str)
    if ok and output:
        kept = ""
        if os.path.exists(output):
            with open(output) as f:
                old = f.read()
            if KEEP in old:
                kept = "\n" + old[old.index(KEEP) :]
        with open(output, "w") as f:
            f.write(render(bench, info, meta) + kept)
        print(f"wrote {output}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
