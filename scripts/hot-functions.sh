#!/usr/bin/env bash
# Writes build/hot-functions.txt: the functions of leasewrap that runs execute, grouped by the
# backends that execute them, which build.rs has the linker place first in a release binary's
# text. A run then touches about 1 MiB of the text, packed, where the same functions lay spread
# over 3.5 MiB of it (BENCHMARKS.md, "Peak RSS"). Run it again after a change that moves much
# code; names that no longer exist are skipped by the linker.
#
# Each argument is one backend, as leasewrap is given it, on servers the caller runs:
#   scripts/hot-functions.sh local "--endpoints http://127.0.0.1:2379" \
#       "--zookeeper 127.0.0.1:2181" "--database postgresql://job@%2Ftmp%2Fpg/app" \
#       "--database mariadb://job@localhost/app?socket=/tmp/mariadb.sock"
# ("local" is the local backend; a database role must be tied to `hot-functions*`). For each it
# traces, under gdb (Debian's package), a holder that renews twice, that holder's watchdog, and
# a waiter behind a holder: scripts/hot-functions.py stops once at each function of the release
# binary, whose addresses come from the link map build.rs asks the linker for.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v gdb >/dev/null; then
    echo "hot-functions: needs gdb (Debian package gdb)" >&2
    exit 1
fi
if [ "$#" -eq 0 ]; then
    echo "usage: scripts/hot-functions.sh local|\"--endpoints URL\"|... (one argument a backend)" >&2
    exit 64
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
LEASEWRAP_LINK_MAP="$work/map" cargo build --release --locked
lw=target/release/leasewrap
# Each function's section in the map: its address and its (mangled) name.
awk '/:\(\.text\./ {
    s = $NF
    sub(/.*:\(\.text\.(unlikely\.|hot\.|startup\.|exit\.)?/, "", s)
    sub(/\)$/, "", s)
    print $1, s
}' "$work/map" >"$work/functions"

# trace OUT FOLLOW ARGS...: leasewrap ARGS under gdb, the functions reached written to OUT.
trace() {
    local out=$1 follow=$2
    shift 2
    if ! HOT_OUT="$out" HOT_FOLLOW="$follow" HOT_FUNCTIONS="$work/functions" \
        timeout 300 gdb -batch -x scripts/hot-functions.py --args "$lw" "$@" >"$out.log" 2>&1; then
        cat "$out.log" >&2
        exit 1
    fi
}

n=0
for backend in "$@"; do
    n=$((n + 1))
    args=()
    [ "$backend" = local ] || read -r -a args <<<"$backend"
    name="hot-functions-$n"
    echo "tracing $backend"
    trace "$work/$n.holder" parent "${args[@]}" --name "$name" --ttl 3s -- sleep 2.5
    trace "$work/$n.watchdog" child "${args[@]}" --name "$name" --ttl 3s -- sleep 1.5
    "$lw" "${args[@]}" --name "$name" -- sh -c "touch '$work/held'; sleep 2" &
    holder=$!
    for _ in $(seq 100); do
        [ -e "$work/held" ] && break
        sleep 0.1
    done
    trace "$work/$n.waiter" parent "${args[@]}" --name "$name" -- true
    wait "$holder"
    rm -f "$work/held"
done

# The watchdog's functions first (it maps only what it runs after the fork), then those every
# backend reaches, then those fewer reach, each set of backends together.
python3 - "$work" "$n" >build/hot-functions.txt <<'PY'
import collections
import sys

work, backends = sys.argv[1], int(sys.argv[2])
watchdog, reached = set(), collections.defaultdict(set)
for b in range(1, backends + 1):
    for run in ("holder", "watchdog", "waiter"):
        for line in open(f"{work}/{b}.{run}"):
            mark, _, name = line.strip().rpartition(" ")
            if mark == "W":
                watchdog.add(name)
            reached[name].add(b)
groups = collections.defaultdict(list)
for name, by in reached.items():
    if name not in watchdog:
        groups[frozenset(by)].append(name)
print("\n".join(sorted(watchdog)))
for by in sorted(groups, key=lambda s: (-len(s), sorted(s))):
    print("\n".join(sorted(groups[by])))
PY
echo "build/hot-functions.txt: $(wc -l <build/hot-functions.txt) functions"
