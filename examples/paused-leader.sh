#!/usr/bin/env bash
# The opening case of leasewrap, replayed with real processes and a real etcd.
#
# Worker A holds the lease "report" (TTL 2 s) and reads report.csv to update it. Then:
#
#   part one: A's whole process tree (leasewrap, its watchdog, the child) is paused for 2 x TTL,
#             as a whole-host or VM pause would. Worker B takes over and writes. When A comes back,
#             its child gets its stale write in before anything else runs: fenced-write refuses
#             it (73), B's data stays, and A's watchdog kills A's child at once.
#   part two: only A's leasewrap is paused. The watchdog kills A's child by the deadline, before
#             B can start, so there is no stale writer at all.
#
# Usage: examples/paused-leader.sh [ENDPOINT [LEASEWRAP]]
#   ENDPOINT   etcd endpoint [env: LEASEWRAP_ENDPOINTS]; when none is given, an etcd of our own
#              is started on a free loopback port from /usr/bin/etcd (or $ETCD) and stopped at exit
#   LEASEWRAP  the leasewrap binary [env: LEASEWRAP_BIN; default: leasewrap on PATH]
#   The lease is "report" under $LEASEWRAP_PREFIX (default: a fresh paused-leader/... prefix).
#
# Exits 0 only when B's data survived and A's child is dead, in both parts.
set -euo pipefail

ENDPOINT=${1:-${LEASEWRAP_ENDPOINTS:-}}
LW=${2:-${LEASEWRAP_BIN:-$(command -v leasewrap || true)}}
TTL=2
PREFIX=${LEASEWRAP_PREFIX:-paused-leader/$$-$RANDOM/} # a prefix of its own on a shared etcd
BOUND=30 # seconds any one wait may take before the replay gives up

[[ -x $LW ]] || { echo "paused-leader: no leasewrap binary (give it as the second argument)" >&2; exit 2; }
LW=$(cd "$(dirname "$LW")" && pwd)/$(basename "$LW")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/paused-leader.XXXXXX")
EVENTS=$WORK/events
OWN_PIDS=() # processes (and -process groups) we started or paused: resumed and killed at exit
ETCD_PID=

cleanup() {
    local pid
    for pid in "${OWN_PIDS[@]}" $ETCD_PID; do kill -CONT -- "$pid" 2>/dev/null || true; done
    for pid in "${OWN_PIDS[@]}" $ETCD_PID; do kill -KILL -- "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true # reap quietly: no "Killed" notices
    rm -rf "$WORK"
}
trap cleanup EXIT

die() { echo "paused-leader: $*" >&2; exit 1; }
event() { echo "$EPOCHREALTIME $*" >>"$EVENTS"; }
micros() { echo "${EPOCHREALTIME/./}"; }
# since START_MICROS SECONDS: at least SECONDS have passed since START_MICROS.
since() { (($(micros) - $1 >= $2 * 1000000)); }

# wait_for WHAT COMMAND...: run COMMAND every 10 ms until it succeeds, for at most $BOUND s.
wait_for() {
    local what=$1 start
    start=$(micros)
    shift
    until "$@"; do
        ! since "$start" "$BOUND" || die "gave up after ${BOUND}s waiting for $what"
        sleep 0.01
    done
}

# alive PID: the process exists and is not a zombie.
alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    [[ ${stat##*) } != [ZX]* ]]
}
dead() { ! alive "$1"; }
stopped() { [[ $(cat "/proc/$1/stat" 2>/dev/null) == *") T "* ]]; }
ppid_of() { local stat; stat=$(cat "/proc/$1/stat"); set -- ${stat##*) }; echo "$2"; }
file_done() { [[ -s $1 ]]; }

# An etcd of our own when no endpoint was given, on a free loopback port, stopped by its pid.
start_etcd() {
    local etcd=${ETCD:-/usr/bin/etcd} client peer
    [[ -x $etcd ]] || die "no endpoint given and no etcd at $etcd (set ETCD or give an endpoint)"
    client=$(free_port)
    peer=$(free_port)
    ((client != peer)) || peer=$(free_port)
    "$etcd" --name replay --data-dir "$WORK/etcd" \
        --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "replay=http://127.0.0.1:$peer" >"$WORK/etcd.log" 2>&1 &
    ETCD_PID=$!
    ENDPOINT="http://127.0.0.1:$client"
    wait_for "etcd to answer on $ENDPOINT" etcd_healthy "$client"
}
free_port() {
    local port
    while :; do
        port=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
    done
}
etcd_healthy() {
    alive "$ETCD_PID" || die "etcd exited: $(tail -3 "$WORK/etcd.log")"
    local reply
    reply=$(exec 2>/dev/null 3<>"/dev/tcp/127.0.0.1/$1" && printf 'GET /health HTTP/1.0\r\n\r\n' >&3 && cat <&3) || return 1
    [[ $reply == *'"health":"true"'* ]]
}

# The child of worker A: announce the lease, read report.csv, work until told to write (or until
# killed), then write through fenced-write and note what it answered.
A_CHILD='
    dir=$1; cd "$dir"
    echo $$ >"$dir/a.pid.tmp" && mv "$dir/a.pid.tmp" "$dir/a.pid"
    echo "$(date +%s.%N) A gets the lease (token $LEASEWRAP_FENCING_TOKEN)" >>"$dir/events"
    exec 9>>"$dir/a.holds"; flock -x 9   # held until this process tree is dead
    read -r seen <"$dir/report.csv"
    echo "$(date +%s.%N) A reads report.csv (\"$seen\") and starts its update" >>"$dir/events"
    echo "$seen" >"$dir/a.read"
    i=0; while [ ! -e "$dir/go" ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i + 1)); done
    echo "$(date +%s.%N) A writes \"v2 (from A, built from $seen)\" with token $LEASEWRAP_FENCING_TOKEN" >>"$dir/events"
    if echo "v2 (from A, built from $seen)" | "$2" fenced-write report.csv 2>"$dir/a.err"; then rc=0; else rc=$?; fi
    why=$(sed "s/.*ERROR //" "$dir/a.err")
    echo "$(date +%s.%N) ... fenced-write answers $rc${why:+: $why}" >>"$dir/events"
    echo $rc >"$dir/a.write.tmp" && mv "$dir/a.write.tmp" "$dir/a.write"
    exec sleep 1000
'

# The child of worker B: note whether A's child still runs, then write through fenced-write.
B_CHILD='
    dir=$1; cd "$dir"
    a_alive=no; s=$(cat "/proc/$(cat "$dir/a.pid")/stat" 2>/dev/null) && case ${s##*) } in [ZX]*) ;; T*) a_alive=paused;; *) a_alive=yes;; esac
    if flock -n -x "$dir/a.holds" true; then a_holds=no; else a_holds=yes; fi
    echo "$a_alive $a_holds" >"$dir/b.saw"
    echo "$(date +%s.%N) B gets the lease (token $LEASEWRAP_FENCING_TOKEN); A'"'"'s child running: $a_alive" >>"$dir/events"
    echo "v2 (from B)" | "$2" fenced-write report.csv
    echo "$(date +%s.%N) B writes \"v2 (from B)\" through fenced-write: accepted" >>"$dir/events"
'

# worker NAME SCRIPT: start leasewrap for worker NAME in the background; its pid goes to NAME_PID.
worker() {
    "$LW" --endpoints "$ENDPOINT" --prefix "$PREFIX" --ttl "${TTL}s" --name report -q \
        -- sh -c "$2" sh "$WORK" "$LW" 2>>"$WORK/$1.log" &
    printf -v "$1_PID" %s $!
    OWN_PIDS+=($!)
}

# status_of PID: the exit status of a background leasewrap that has ended.
status_of() { local rc=0; wait "$1" || rc=$?; echo $rc; }

print_timeline() {
    local start=$1
    sort -n "$EVENTS" | awk -v s="$start" '{ t = $1 - s; $1 = ""; printf "t=%5.2f %s\n", t, $0 }'
}

# One replay. $1: "whole-tree" (part one) or "leasewrap-only" (part two). Returns 0 when B's
# data survived and A's child is dead.
replay() {
    local part=$1 start a_lw a_child a_wd stop_at a_status b_status
    rm -f "$WORK"/{a.*,b.*,go,events,report.csv.fence}
    echo "v1 (before)" >"$WORK/report.csv"
    start=$EPOCHREALTIME
    worker A "$A_CHILD"
    a_lw=$A_PID
    wait_for "A to read report.csv" file_done "$WORK/a.read"
    a_child=$(cat "$WORK/a.pid")
    a_wd=$(ppid_of "$a_child")
    OWN_PIDS+=("$a_wd" "-$a_child")
    [[ $(ppid_of "$a_wd") == "$a_lw" ]] || die "A's child is not under a watchdog of A's leasewrap"

    if [[ $part == whole-tree ]]; then
        kill -STOP -- "$a_lw" "$a_wd" "-$a_child"
        event "A's whole process tree is paused (leasewrap, watchdog, child: SIGSTOP) for 2 x TTL"
    else
        kill -STOP "$a_lw"
        event "only A's leasewrap is paused (SIGSTOP); its watchdog and child run on"
    fi
    stop_at=$(micros)
    wait_for "A to be stopped" stopped "$a_lw"

    if [[ $part == leasewrap-only ]]; then
        wait_for "A's watchdog to kill A's child" dead "$a_child"
        event "A's child is dead: its watchdog killed it by the deadline, without leasewrap"
    fi
    worker B "$B_CHILD"
    wait_for "B to finish" dead "$B_PID"
    b_status=$(status_of "$B_PID")
    [[ $b_status == 0 ]] || die "B exited $b_status: $(cat "$WORK/B.log")"
    wait_for "2 x TTL to pass since the pause" since "$stop_at" $((2 * TTL))
    touch "$WORK/go"

    if [[ $part == whole-tree ]]; then
        kill -CONT -- "-$a_child"
        event "A's child resumes first (the worst case); A's leasewrap and watchdog are still paused"
        wait_for "A's child to try its write" file_done "$WORK/a.write"
        kill -CONT "$a_wd" "$a_lw"
        event "A's watchdog and leasewrap resume"
        wait_for "A's watchdog to kill A's child" dead "$a_child"
        event "A's child is dead: killed by its watchdog as soon as it ran"
    else
        kill -CONT "$a_lw"
        event "A's leasewrap resumes"
    fi
    wait_for "A's leasewrap to exit" dead "$a_lw"
    a_status=$(status_of "$a_lw")
    case $a_status in
        124) event "A's leasewrap exits 124: lease lost, child stopped" ;;
        *) event "A's leasewrap exits $a_status (124, lease lost, was expected)" ;;
    esac

    print_timeline "$start"
    local content verdict=0 a_write=none
    content=$(cat "$WORK/report.csv")
    [[ -e $WORK/a.write ]] && a_write=$(cat "$WORK/a.write")
    echo
    echo "report.csv holds \"$content\" (token $(cat "$WORK/report.csv.fence") recorded in report.csv.fence)"
    if [[ $content == "v2 (from B)" ]]; then echo "  ok: B's data is intact"; else echo "  FAILED: B's data was overwritten"; verdict=1; fi
    case $part/$a_write in
        whole-tree/73) echo "  ok: A's stale write was refused (73)" ;;
        leasewrap-only/none) echo "  ok: A's child never wrote: it was dead before B started" ;;
        *) echo "  FAILED: A's write answered $a_write"; verdict=1 ;;
    esac
    if dead "$a_child"; then echo "  ok: A's child is dead"; else echo "  FAILED: A's child still runs"; verdict=1; fi
    if [[ $part == leasewrap-only && $(cat "$WORK/b.saw") != "no no" ]]; then
        echo "  FAILED: B started while A's child still ran or held its lock ($(cat "$WORK/b.saw"))"
        verdict=1
    fi
    return $verdict
}

[[ -n $ENDPOINT ]] || start_etcd
echo "etcd at $ENDPOINT, leasewrap $LW, TTL ${TTL}s"
echo
echo "== Part one: A's whole process tree is paused (the opening case) =="
one=0
replay whole-tree || one=1
echo
echo "== Part two: only A's leasewrap is paused =="
two=0
replay leasewrap-only || two=1
echo
if ((one == 0 && two == 0)); then
    echo "Both replays: B's update survived and A's child is dead."
else
    echo "FAILED: see the lines marked FAILED above."
    exit 1
fi
