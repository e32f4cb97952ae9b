"""A ZooKeeper lock as kazoo's users write one, for figure 12 of `cargo bench`: take kazoo's
Lock recipe, run COMMAND in a session of its own while holding it, and kill COMMAND's process
group as soon as the connection is SUSPENDED or the session LOST (the careful recipe: kazoo
itself never stops a holder's work).

Usage: kazoo_lock.py CONNECT LOCK_PATH SESSION_TIMEOUT_S -- COMMAND [ARG]...
Exits with COMMAND's status (128 + n when it died of signal n).
"""

import os
import signal
import subprocess
import sys
import threading

from kazoo.client import KazooClient, KazooState


def main(argv):
    if len(argv) < 6 or argv[4] != "--":
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 64
    connect, path, timeout, command = argv[1], argv[2], float(argv[3]), argv[5:]
    child = {}
    lock = threading.Lock()

    def on_state(state):
        # Called on kazoo's connection thread: kill at once, never block it.
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            with lock:
                pid = child.get("pid")
            if pid is not None:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    zk = KazooClient(hosts=connect, timeout=timeout)
    zk.add_listener(on_state)
    zk.start(timeout=15)
    held = zk.Lock(path)
    held.acquire()
    with lock:
        proc = subprocess.Popen(command, start_new_session=True)
        child["pid"] = proc.pid
    status = proc.wait()
    try:
        held.release()
    except Exception:  # the session may be gone: its node went with it
        pass
    zk.stop()
    zk.close()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
