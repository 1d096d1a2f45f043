#!/bin/sh
# Cassandra node entrypoint: writes cassandra.yaml from CASSANDRA_* environment variables, then runs
# CassandraDaemon in the foreground as this container's main process.
#   entrypoint.sh          write the config to $CASSANDRA_CONF_DIR/cassandra.yaml and start the node
#   entrypoint.sh render   print the config on stdout and exit (for tests and debugging)
set -eu

: "${CASSANDRA_CONF_DIR:=/etc/cassandra}"
: "${CASSANDRA_HOME:=/opt/cassandra}"
: "${RINGSNAP_DIR:=/opt/ringsnap}"
: "${CASSANDRA_CLUSTER_NAME:=ringsnap-sandbox}"
: "${CASSANDRA_NUM_TOKENS:=16}"
: "${CASSANDRA_AUTO_BOOTSTRAP:=false}"
: "${CASSANDRA_HEAP:=512M}"
: "${CASSANDRA_JMX_PORT:=7199}"
: "${CASSANDRA_STORAGE_PORT:=7000}"
: "${CASSANDRA_NATIVE_PORT:=9042}"
: "${CASSANDRA_ENDPOINT_SNITCH:=SimpleSnitch}"
# A directory put first on the classpath (Cassandra reads commitlog_archiving.properties from the
# classpath): the ringsnap sandbox keeps it on the commit-log volume, where the agent writes it.
: "${CASSANDRA_EXTRA_CLASSPATH:=}"
# Empty: no Jolokia. Else Jolokia (JMX over HTTP) listens on the node's address at this port.
: "${CASSANDRA_JOLOKIA_PORT:=}"
# quick: the JIT's first tier only (C1): about half the CPU to start a node, for test and
# playground nodes that start often and serve little. full: the JVM's default, for benchmarks.
: "${CASSANDRA_JIT:=full}"

die() {
    echo "entrypoint: $*" >&2
    exit 64
}

require() {
    # require NAME: the variable must be set and non-empty.
    eval "value=\${$1:-}"
    [ -n "$value" ] || die "$1 must be set"
}

# Values go into YAML unquoted-or-double-quoted: allow only characters that cannot break it.
check() {
    # check NAME PATTERN-DESCRIPTION: reject anything but letters, digits and . _ - / , :
    eval "value=\${$1}"
    case "$value" in
        *[!A-Za-z0-9._/,:-]*) die "$1 has characters that are not allowed: '$value'" ;;
    esac
}

check_number() {
    eval "value=\${$1}"
    case "$value" in
        ''|*[!0-9]*) die "$1 must be a number: '$value'" ;;
    esac
}

require CASSANDRA_LISTEN_ADDRESS
require CASSANDRA_DATA_DIR
require CASSANDRA_COMMITLOG_DIR
: "${CASSANDRA_RPC_ADDRESS:=$CASSANDRA_LISTEN_ADDRESS}"
: "${CASSANDRA_SEEDS:=$CASSANDRA_LISTEN_ADDRESS}"
: "${CASSANDRA_SAVED_CACHES_DIR:=$CASSANDRA_DATA_DIR/../saved_caches}"
: "${CASSANDRA_HINTS_DIR:=$CASSANDRA_DATA_DIR/../hints}"

for name in CASSANDRA_CLUSTER_NAME CASSANDRA_LISTEN_ADDRESS CASSANDRA_RPC_ADDRESS CASSANDRA_SEEDS \
        CASSANDRA_DATA_DIR CASSANDRA_COMMITLOG_DIR CASSANDRA_SAVED_CACHES_DIR CASSANDRA_HINTS_DIR \
        CASSANDRA_ENDPOINT_SNITCH CASSANDRA_HEAP CASSANDRA_EXTRA_CLASSPATH; do
    check "$name"
done
for name in CASSANDRA_NUM_TOKENS CASSANDRA_JMX_PORT CASSANDRA_STORAGE_PORT CASSANDRA_NATIVE_PORT; do
    check_number "$name"
done
JOLOKIA_FLAG=""
if [ -n "$CASSANDRA_JOLOKIA_PORT" ]; then
    check_number CASSANDRA_JOLOKIA_PORT
    JOLOKIA_FLAG="-javaagent:/opt/jolokia/jolokia-agent.jar=host=${CASSANDRA_LISTEN_ADDRESS},port=${CASSANDRA_JOLOKIA_PORT},discoveryEnabled=false"
fi
case "$CASSANDRA_JIT" in
    quick) JIT_FLAG="-XX:TieredStopAtLevel=1" ;;
    full) JIT_FLAG="" ;;
    *) die "CASSANDRA_JIT must be quick or full: '$CASSANDRA_JIT'" ;;
esac
case "$CASSANDRA_AUTO_BOOTSTRAP" in
    true|false) ;;
    *) die "CASSANDRA_AUTO_BOOTSTRAP must be true or false: '$CASSANDRA_AUTO_BOOTSTRAP'" ;;
esac

render() {
    cat <<YAML
# Written by the ringsnap sandbox entrypoint from CASSANDRA_* environment variables.
cluster_name: "${CASSANDRA_CLUSTER_NAME}"
num_tokens: ${CASSANDRA_NUM_TOKENS}
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
auto_bootstrap: ${CASSANDRA_AUTO_BOOTSTRAP}
data_file_directories:
  - "${CASSANDRA_DATA_DIR}"
commitlog_directory: "${CASSANDRA_COMMITLOG_DIR}"
saved_caches_directory: "${CASSANDRA_SAVED_CACHES_DIR}"
hints_directory: "${CASSANDRA_HINTS_DIR}"
commitlog_sync: periodic
commitlog_sync_period: 10000ms
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "${CASSANDRA_SEEDS}"
listen_address: "${CASSANDRA_LISTEN_ADDRESS}"
rpc_address: "${CASSANDRA_RPC_ADDRESS}"
storage_port: ${CASSANDRA_STORAGE_PORT}
native_transport_port: ${CASSANDRA_NATIVE_PORT}
endpoint_snitch: ${CASSANDRA_ENDPOINT_SNITCH}
disk_failure_policy: stop
commit_failure_policy: stop
YAML
}

if [ "${1:-}" = "render" ]; then
    render
    exit 0
fi
[ $# -eq 0 ] || die "unknown arguments: $*"

mkdir -p "$CASSANDRA_CONF_DIR" "$CASSANDRA_CONF_DIR/triggers" /var/lib/cassandra /var/log/cassandra \
    "$CASSANDRA_DATA_DIR" "$CASSANDRA_COMMITLOG_DIR" "$CASSANDRA_SAVED_CACHES_DIR" "$CASSANDRA_HINTS_DIR"
render > "$CASSANDRA_CONF_DIR/cassandra.yaml"

JVM17_FLAGS=$(grep -v '^[[:space:]]*#' "$RINGSNAP_DIR/jvm17.options" | grep -v '^[[:space:]]*$' | tr '\n' ' ')
echo "entrypoint: starting Cassandra on ${CASSANDRA_LISTEN_ADDRESS}, JMX 127.0.0.1:${CASSANDRA_JMX_PORT}"
# Test-node start-up shortcuts: no wait for gossip to settle (all nodes start at once) and a small
# memtable overhead estimate (the default costs ~7 s of CPU per node at start).
# shellcheck disable=SC2086  # the flags are one word each
exec java \
    "-Xms${CASSANDRA_HEAP}" "-Xmx${CASSANDRA_HEAP}" -XX:+UseG1GC -XX:+ExitOnOutOfMemoryError \
    $JVM17_FLAGS $JOLOKIA_FLAG $JIT_FLAG \
    -Djava.net.preferIPv4Stack=true \
    "-Dcassandra.config=file://${CASSANDRA_CONF_DIR}/cassandra.yaml" \
    "-Dcassandra.jmx.local.port=${CASSANDRA_JMX_PORT}" \
    -Dcassandra-foreground=yes \
    -Dcassandra.storagedir=/var/lib/cassandra \
    -Dcassandra.logdir=/var/log/cassandra \
    -Dcassandra.skip_wait_for_gossip_to_settle=0 \
    -Dcassandra.memtable_row_overhead_computation_step=100 \
    "-Dcassandra.triggers_dir=${CASSANDRA_CONF_DIR}/triggers" \
    "-Dlogback.configurationFile=${RINGSNAP_DIR}/logback.xml" \
    -cp "${CASSANDRA_EXTRA_CLASSPATH:+${CASSANDRA_EXTRA_CLASSPATH}:}${CASSANDRA_HOME}/lib/*" \
    org.apache.cassandra.service.CassandraDaemon
