# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_leasewrap_global_optspecs
    string join \n name= c= ttl= n/no-wait w/wait= E/conflict-exit-code= kill-after= s/signal= margin= drift= lost-exit-code= max-runtime= once= once-per= keep= max-attempts= metrics-file= endpoints= zookeeper= database= prefix= cacert= cert= key= user= password-file= zk-auth= dial-timeout= local-dir= log-format= q/quiet v/verbose h/help V/version
end

function __fish_leasewrap_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_leasewrap_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_leasewrap_using_subcommand
    set -l cmd (__fish_leasewrap_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c leasewrap -n "__fish_leasewrap_needs_command" -l name -d 'Lease name: 1-128 ASCII letters, digits and . _ - @ : + = [default: file name of COMMAND; required with -c and when COMMAND is a shell or interpreter, such as sh, bash, env or python3: see CAVEATS in leasewrap(1)]' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -s c -d 'Run SHELL STRING through /bin/sh -c instead of COMMAND' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l ttl -d 'Lease TTL to ask for, at least 1s; the server may grant more (etcd: at least 2s)' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -s w -l wait -d 'Give up waiting for the lease after DUR (0 = --no-wait) [default: wait forever]' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -s E -l conflict-exit-code -d 'Exit status when the lease was not acquired (held, or the wait ran out)' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l kill-after -d 'Time between the stop signal and SIGKILL [default: min(2s, TTL/5)]' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -s s -l signal -d 'The stop signal sent to the child\'s process group' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l margin -d 'Slack for kill latency and scheduling [default: min(1s, TTL/10)]' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l drift -d 'Bound on how much faster the server\'s clock may run than ours (0.1 = 10 %)' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l lost-exit-code -d 'Exit status after the lease was lost and the child stopped' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l max-runtime -d 'Stop the child\'s whole tree after DUR (stop signal, --kill-after, SIGKILL), release the lease and exit 123' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l once -d 'Run COMMAND at most once successfully per KEY, across every host of the backend; a holder that finds KEY done starts nothing and exits with the conflict status' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l once-per -d 'As --once, with KEY the slot boundary nearest to the start time (UTC, RFC 3339): `--once-per 1d` runs once a day' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l keep -d 'How long a run record is kept after its run ends (only with --once or --once-per; without them it is refused, 64): 1s to 10y, and at least the --once-per slot [default: 7d, or twice the --once-per slot when that is longer]' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l max-attempts -d 'Give KEY up after N failed runs: later holders start nothing and exit with the conflict status [default: unlimited]' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l metrics-file -d 'After every run or skip, replace PATH with a node_exporter textfile-collector file (name it *.prom)' -r -F
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l endpoints -d 'etcd endpoints, comma separated; none means the local backend [env: LEASEWRAP_ENDPOINTS, ETCDCTL_ENDPOINTS]' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l zookeeper -d 'ZooKeeper instead of etcd: host:port,host:port[/chroot], as ZooKeeper tools take it [env: LEASEWRAP_ZOOKEEPER]' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l database -d 'PostgreSQL or MariaDB instead of etcd: postgresql://[USER@][HOST][:PORT][/DBNAME][?sslmode=verify-full&...] or mariadb://...; the password from --password-file, ~/.pgpass or ~/.my.cnf, never in the URL [env: LEASEWRAP_DATABASE]' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l prefix -d 'Key prefix; \'\' shares locks with `etcdctl lock NAME` [env: LEASEWRAP_PREFIX] [default: leasewrap/]' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l cacert -d 'CA bundle to verify etcd\'s certificate, or ZooKeeper\'s on its secure client port [env: LEASEWRAP_CACERT, ETCDCTL_CACERT]' -r -F
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l cert -d 'Client certificate for TLS; on ZooKeeper also the identity (x509) that owns what leasewrap creates [env: LEASEWRAP_CERT, ETCDCTL_CERT]' -r -F
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l key -d 'Client key for TLS [env: LEASEWRAP_KEY_FILE, ETCDCTL_KEY]' -r -F
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l user -d 'etcd or ZooKeeper user, or USER:PASSWORD as etcdctl takes it; on ZooKeeper the identity that owns what leasewrap creates [env: LEASEWRAP_USER, ETCDCTL_USER]' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l password-file -d 'File whose first line is the password [env: LEASEWRAP_PASSWORD_FILE; LEASEWRAP_PASSWORD, ETCDCTL_PASSWORD hold it directly]' -r -F
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l zk-auth -d 'How --user and --password-file authenticate to ZooKeeper: digest (addauth digest; ACL id digest:USER:HASH) or sasl (SASL DIGEST-MD5 with the servers\' JAAS users; ACL id sasl:USER) [env: LEASEWRAP_ZK_AUTH] [default: digest]' -r -f -a "digest\t''
sasl\t''"
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l dial-timeout -d 'Time to wait for etcd or ZooKeeper to answer before giving up with status 69 (each endpoint or member gets its share) [env: LEASEWRAP_DIAL_TIMEOUT, ETCDCTL_DIAL_TIMEOUT] [default: 2s]' -r
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l local-dir -d 'Local backend state directory, owned by you or root and writable by nobody else [default: /var/lib/leasewrap as root, else $XDG_STATE_HOME/leasewrap, or ~/.local/state/leasewrap without XDG_STATE_HOME]' -r -F
complete -c leasewrap -n "__fish_leasewrap_needs_command" -l log-format -d 'Log line format on stderr' -r -f -a "text\t''
json\t''"
complete -c leasewrap -n "__fish_leasewrap_needs_command" -s n -l no-wait -d 'Fail at once if the lease is held'
complete -c leasewrap -n "__fish_leasewrap_needs_command" -s q -l quiet -d 'Log errors only'
complete -c leasewrap -n "__fish_leasewrap_needs_command" -s v -l verbose -d 'Log more: -v what leasewrap does (INFO: acquired, released, waiting; a successful run is otherwise silent), -vv DEBUG, -vvv everything'
complete -c leasewrap -n "__fish_leasewrap_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leasewrap -n "__fish_leasewrap_needs_command" -s V -l version -d 'Print version'
complete -c leasewrap -n "__fish_leasewrap_needs_command" -a "status" -d 'Who holds NAME (or every lease under the prefix): holder, token, time left, waiters'
complete -c leasewrap -n "__fish_leasewrap_needs_command" -a "fenced-write" -d 'Atomically replace DEST with COMMAND\'s output or stdin, refusing a token lower than one DEST has seen'
complete -c leasewrap -n "__fish_leasewrap_needs_command" -a "fenced-put" -d 'Put KEY VALUE in etcd or ZooKeeper only while the lock key still has the given token'
complete -c leasewrap -n "__fish_leasewrap_needs_command" -a "fence-sql" -d 'Print the SQL that installs the database fence a job calls first in its transaction'
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l name -d 'The lease name, spelled as in the run form: the same as NAME' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l once -d 'Say whether KEY of NAME is done (exit 0) or not (exit 1), as --once KEY would find it' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l once-per -d 'Say which KEY a run with --once-per DUR would use now, and whether it is done (exit 0) or not (exit 1)' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l endpoints -d 'etcd endpoints, comma separated; none means the local backend [env: LEASEWRAP_ENDPOINTS, ETCDCTL_ENDPOINTS]' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l zookeeper -d 'ZooKeeper instead of etcd: host:port,host:port[/chroot], as ZooKeeper tools take it [env: LEASEWRAP_ZOOKEEPER]' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l database -d 'PostgreSQL or MariaDB instead of etcd: postgresql://[USER@][HOST][:PORT][/DBNAME][?sslmode=verify-full&...] or mariadb://...; the password from --password-file, ~/.pgpass or ~/.my.cnf, never in the URL [env: LEASEWRAP_DATABASE]' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l prefix -d 'Key prefix; \'\' shares locks with `etcdctl lock NAME` [env: LEASEWRAP_PREFIX] [default: leasewrap/]' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l cacert -d 'CA bundle to verify etcd\'s certificate, or ZooKeeper\'s on its secure client port [env: LEASEWRAP_CACERT, ETCDCTL_CACERT]' -r -F
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l cert -d 'Client certificate for TLS; on ZooKeeper also the identity (x509) that owns what leasewrap creates [env: LEASEWRAP_CERT, ETCDCTL_CERT]' -r -F
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l key -d 'Client key for TLS [env: LEASEWRAP_KEY_FILE, ETCDCTL_KEY]' -r -F
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l user -d 'etcd or ZooKeeper user, or USER:PASSWORD as etcdctl takes it; on ZooKeeper the identity that owns what leasewrap creates [env: LEASEWRAP_USER, ETCDCTL_USER]' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l password-file -d 'File whose first line is the password [env: LEASEWRAP_PASSWORD_FILE; LEASEWRAP_PASSWORD, ETCDCTL_PASSWORD hold it directly]' -r -F
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l zk-auth -d 'How --user and --password-file authenticate to ZooKeeper: digest (addauth digest; ACL id digest:USER:HASH) or sasl (SASL DIGEST-MD5 with the servers\' JAAS users; ACL id sasl:USER) [env: LEASEWRAP_ZK_AUTH] [default: digest]' -r -f -a "digest\t''
sasl\t''"
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l dial-timeout -d 'Time to wait for etcd or ZooKeeper to answer before giving up with status 69 (each endpoint or member gets its share) [env: LEASEWRAP_DIAL_TIMEOUT, ETCDCTL_DIAL_TIMEOUT] [default: 2s]' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l local-dir -d 'Local backend state directory [default: /var/lib/leasewrap as root, else $XDG_STATE_HOME/leasewrap, or ~/.local/state/leasewrap without XDG_STATE_HOME]' -r -F
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l log-format -d 'Log line format on stderr' -r -f -a "text\t''
json\t''"
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -l json -d 'Print JSON for scripts'
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -s q -l quiet -d 'Log errors only'
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -s v -l verbose -d 'Log more: -v what leasewrap does (INFO: acquired, released, waiting; a successful run is otherwise silent), -vv DEBUG, -vvv everything'
complete -c leasewrap -n "__fish_leasewrap_using_subcommand status" -s h -l help -d 'Print help'
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-write" -l token -d 'Fencing token of this write [default: $LEASEWRAP_FENCING_TOKEN, which leasewrap sets for its child]' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-write" -l log-format -d 'Log line format on stderr' -r -f -a "text\t''
json\t''"
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-write" -s q -l quiet -d 'Log errors only'
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-write" -s v -l verbose -d 'Log more: -v what leasewrap does (INFO: acquired, released, waiting; a successful run is otherwise silent), -vv DEBUG, -vvv everything'
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-write" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -l token -d 'Fencing token of this write [default: $LEASEWRAP_FENCING_TOKEN, which leasewrap sets for its child]' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -l lock-key -d 'The lock key whose create revision must equal the token [default: $LEASEWRAP_KEY, which leasewrap sets for its child]' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -l zookeeper -d 'ZooKeeper instead of etcd: host:port,host:port[/chroot], as ZooKeeper tools take it [env: LEASEWRAP_ZOOKEEPER]' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -l database -d 'PostgreSQL or MariaDB instead of etcd: postgresql://[USER@][HOST][:PORT][/DBNAME][?sslmode=verify-full&...] or mariadb://...; the password from --password-file, ~/.pgpass or ~/.my.cnf, never in the URL [env: LEASEWRAP_DATABASE]' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -l prefix -d 'Key prefix; \'\' shares locks with `etcdctl lock NAME` [env: LEASEWRAP_PREFIX] [default: leasewrap/]' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -l cacert -d 'CA bundle to verify etcd\'s certificate, or ZooKeeper\'s on its secure client port [env: LEASEWRAP_CACERT, ETCDCTL_CACERT]' -r -F
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -l cert -d 'Client certificate for TLS; on ZooKeeper also the identity (x509) that owns what leasewrap creates [env: LEASEWRAP_CERT, ETCDCTL_CERT]' -r -F
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -l key -d 'Client key for TLS [env: LEASEWRAP_KEY_FILE, ETCDCTL_KEY]' -r -F
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -l user -d 'etcd or ZooKeeper user, or USER:PASSWORD as etcdctl takes it; on ZooKeeper the identity that owns what leasewrap creates [env: LEASEWRAP_USER, ETCDCTL_USER]' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -l password-file -d 'File whose first line is the password [env: LEASEWRAP_PASSWORD_FILE; LEASEWRAP_PASSWORD, ETCDCTL_PASSWORD hold it directly]' -r -F
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -l zk-auth -d 'How --user and --password-file authenticate to ZooKeeper: digest (addauth digest; ACL id digest:USER:HASH) or sasl (SASL DIGEST-MD5 with the servers\' JAAS users; ACL id sasl:USER) [env: LEASEWRAP_ZK_AUTH] [default: digest]' -r -f -a "digest\t''
sasl\t''"
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -l dial-timeout -d 'Time to wait for etcd or ZooKeeper to answer before giving up with status 69 (each endpoint or member gets its share) [env: LEASEWRAP_DIAL_TIMEOUT, ETCDCTL_DIAL_TIMEOUT] [default: 2s]' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -l log-format -d 'Log line format on stderr' -r -f -a "text\t''
json\t''"
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -l endpoints -d 'etcd endpoints, comma separated; fenced-put needs etcd or ZooKeeper, it has no local backend [env: LEASEWRAP_ENDPOINTS, ETCDCTL_ENDPOINTS]' -r
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -s q -l quiet -d 'Log errors only'
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -s v -l verbose -d 'Log more: -v what leasewrap does (INFO: acquired, released, waiting; a successful run is otherwise silent), -vv DEBUG, -vvv everything'
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fenced-put" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leasewrap -n "__fish_leasewrap_using_subcommand fence-sql" -s h -l help -d 'Print help (see more with \'--help\')'
