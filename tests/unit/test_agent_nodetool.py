"""nodetool output parsing and command handling. Outputs captured from Cassandra 5.0.7 (test bed)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from ringsnap.agent.errors import AlreadyExists, CommandFailed, CommandTimeout, NotFound
from ringsnap.agent.nodetool import (
    ClusterFacts,
    Nodetool,
    parse_cluster_name,
    parse_info,
    parse_native_address,
    parse_version,
)
from ringsnap.agent.process import excerpt, run
from ringsnap.errors import ValidationError

INFO = """\
ID                     : 1b2affd4-b87b-432d-8bb8-05b00bad78de
Gossip active          : true
Native Transport active: true
Load                   : 117.52 KiB
Uncompressed load      : 162.08 KiB
Generation No          : 1795304199
Uptime (seconds)       : 105
Heap Memory (MB)       : 96.32 / 512.00
Off Heap Memory (MB)   : 0.00
Data Center            : datacenter1
Rack                   : rack1
Exceptions             : 0
Key Cache              : entries 38, size 3.3 KiB, capacity 25 MiB, 139 hits, 170 requests, 0.818 recent hit rate, 14400 save period in seconds
Network Cache          : size 8 MiB, overflow size: 0 bytes, capacity 32 MiB
Percent Repaired       : 100.0%
Token                  : -9185737398894658109
Token                  : -8998789130531221267
Token                  : 7687684756891384346
Bootstrap state        : COMPLETED
Bootstrap failed       : false
"""

INFO_WITHOUT_TOKENS = """\
ID                     : 9bbd690d-6f99-4511-bfb4-554cfa48df0e
Gossip active          : false
Native Transport active: false
Data Center            : dc2
Rack                   : r7
Token                  : (invoke with -T/--tokens to see all 16 tokens)
"""

DESCRIBECLUSTER = """\
Cluster Information:
\tName: ringsnap-agentdev
\tSnitch: org.apache.cassandra.locator.SimpleSnitch
\tDynamicEndPointSnitch: enabled
\tPartitioner: org.apache.cassandra.dht.Murmur3Partitioner
\tSchema versions:
\t\td03783d7-b468-3c1a-82f1-8e30b2edde8b: [127.0.124.1, 127.0.124.2, 127.0.124.3]

Stats for all nodes:
\tLive: 3
"""

GOSSIPINFO = """\
/127.0.124.1
  generation:1795304199
  heartbeat:114
  STATUS:47:NORMAL,-2402003559965205643
  RPC_ADDRESS:4:127.0.124.1
  HOST_ID:2:1b2affd4-b87b-432d-8bb8-05b00bad78de
  RPC_READY:54:true
  NATIVE_ADDRESS_AND_PORT:3:127.0.124.1:9042
  TOKENS:45:<hidden>
/127.0.124.2
  generation:1795304198
  HOST_ID:2:9bbd690d-6f99-4511-bfb4-554cfa48df0e
  NATIVE_ADDRESS_AND_PORT:3:127.0.124.2:9042
localhost/127.0.0.9:7000
  HOST_ID:2:00000000-0000-0000-0000-000000000009
  RPC_ADDRESS:4:10.1.2.9
"""


def test_info_with_tokens() -> None:
    identity = parse_info(INFO)
    assert identity.host_id == "1b2affd4-b87b-432d-8bb8-05b00bad78de"
    assert (identity.datacenter, identity.rack) == ("datacenter1", "rack1")
    assert identity.tokens == (
        "-9185737398894658109",
        "-8998789130531221267",
        "7687684756891384346",
    )
    assert identity.gossip_active and identity.native_transport_active


def test_info_without_tokens_and_inactive_transport() -> None:
    identity = parse_info(INFO_WITHOUT_TOKENS)
    assert identity.tokens == () and (identity.datacenter, identity.rack) == ("dc2", "r7")
    assert not identity.gossip_active and not identity.native_transport_active


def test_info_without_id_is_an_error() -> None:
    with pytest.raises(CommandFailed, match="no host ID"):
        parse_info("nodetool: Failed to connect to '127.0.0.1:7199'")


def test_version_cluster_name_and_native_address() -> None:
    assert parse_version("ReleaseVersion: 5.0.7\n") == "5.0.7"
    assert parse_cluster_name(DESCRIBECLUSTER) == "ringsnap-agentdev"
    assert parse_native_address(GOSSIPINFO, "9bbd690d-6f99-4511-bfb4-554cfa48df0e") == "127.0.124.2"
    assert parse_native_address(GOSSIPINFO, "00000000-0000-0000-0000-000000000009") == "10.1.2.9"
    assert parse_native_address(GOSSIPINFO, "not-there") == ""


def test_error_excerpt_prefers_error_lines_over_stack_traces() -> None:
    stderr = (
        "error: Snapshot t2 already exists.\n-- StackTrace --\njava.io.IOException: ...\n\tat x\n"
    )
    assert (
        excerpt("Requested creating snapshot(s)\n", stderr) == "error: Snapshot t2 already exists."
    )
    assert excerpt("nodetool: Keyspace [x] does not exist.\nSee 'nodetool help'", "") == (
        "nodetool: Keyspace [x] does not exist."
    )


def fake_nodetool(tmp_path: Path, stdout: str, stderr: str = "", code: int = 0) -> list[str]:
    """A stand-in nodetool that records its arguments and prints captured output."""
    script = tmp_path / "nodetool"
    (tmp_path / "out").write_text(stdout)
    (tmp_path / "err").write_text(stderr)
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > {tmp_path}/args\n'
        f"cat {tmp_path}/out; cat {tmp_path}/err >&2; exit {code}\n"
    )
    script.chmod(0o755)
    return [str(script), "-h", "127.0.0.1", "-p", "7199"]


def args(tmp_path: Path) -> list[str]:
    return (tmp_path / "args").read_text().splitlines()


def test_flush_snapshot_clear_argv(tmp_path: Path) -> None:
    nodetool = Nodetool(fake_nodetool(tmp_path, ""), timeout=10)
    asyncio.run(nodetool.flush())
    assert args(tmp_path) == ["-h", "127.0.0.1", "-p", "7199", "flush"]
    asyncio.run(nodetool.flush("shop", ["orders", "items"]))
    assert args(tmp_path)[4:] == ["flush", "--", "shop", "orders", "items"]
    asyncio.run(nodetool.snapshot("backup-1", ["shop"]))
    assert args(tmp_path)[4:] == ["snapshot", "-t", "backup-1", "--", "shop"]
    asyncio.run(nodetool.snapshot("backup-2"))
    assert args(tmp_path)[4:] == ["snapshot", "-t", "backup-2"]
    asyncio.run(nodetool.clear_snapshot("backup-1"))
    assert args(tmp_path)[4:] == ["clearsnapshot", "-t", "backup-1"]


@pytest.mark.parametrize(
    ("stdout", "stderr", "error", "message"),
    [
        (
            "nodetool: Keyspace [nosuchks] does not exist.\n",
            "",
            NotFound,
            "[nosuchks] does not exist",
        ),
        (
            "",
            "error: Unknown keyspace/cf pair (system_auth.x)\n-- StackTrace --\n",
            NotFound,
            "(system_auth.x)",
        ),
        (
            "Requested creating snapshot(s)\n",
            "error: Snapshot t2 already exists.\n",
            AlreadyExists,
            "t2 already",
        ),
        (
            "",
            "nodetool: Failed to connect to '127.0.0.1:7199'\n",
            CommandFailed,
            "Failed to connect",
        ),
    ],
)
def test_failures_are_typed_and_carry_the_message(
    tmp_path: Path, stdout: str, stderr: str, error: type[Exception], message: str
) -> None:
    nodetool = Nodetool(fake_nodetool(tmp_path, stdout, stderr, code=2), timeout=10)
    with pytest.raises(error) as caught:
        asyncio.run(nodetool.flush("ks"))
    assert message in str(caught.value) and "exit 2" in str(caught.value)


def test_invalid_names_never_reach_the_command(tmp_path: Path) -> None:
    nodetool = Nodetool(fake_nodetool(tmp_path, ""), timeout=10)
    for call in (
        nodetool.flush("-h evil"),
        nodetool.flush("ks", ["t;rm"]),
        nodetool.snapshot("../x"),
        nodetool.snapshot("ok", ["a b"]),
        nodetool.clear_snapshot("--all"),
    ):
        with pytest.raises(ValidationError):
            asyncio.run(call)
    assert not (tmp_path / "args").exists()


def test_facts_ask_only_info_while_the_node_runs_the_same_process(tmp_path: Path) -> None:
    script = tmp_path / "nodetool"
    outputs = {
        "info": INFO,
        "version": "ReleaseVersion: 5.0.7\n",
        "describecluster": DESCRIBECLUSTER,
    }
    outputs["gossipinfo"] = GOSSIPINFO
    for name, text in outputs.items():
        (tmp_path / name).write_text(text)
    script.write_text(f'#!/bin/sh\necho "$1" >> {tmp_path}/calls\ncat {tmp_path}/"$1"\n')
    script.chmod(0o755)
    nodetool = Nodetool([str(script)], timeout=10)

    def facts_and_calls() -> tuple[ClusterFacts, list[str]]:
        (tmp_path / "calls").write_text("")
        found = asyncio.run(nodetool.facts())
        return found, sorted((tmp_path / "calls").read_text().split())

    first, calls = facts_and_calls()
    assert first.cluster_name == "ringsnap-agentdev" and first.cassandra_version == "5.0.7"
    assert first.native_address == "127.0.124.1"
    assert calls == ["describecluster", "gossipinfo", "info", "version"]

    # Same process (same generation): one JVM; identity (tokens, states) is always fresh.
    (tmp_path / "info").write_text(
        INFO.replace("Gossip active          : true", "Gossip active          : false")
    )
    again, calls = facts_and_calls()
    assert calls == ["info"]
    assert again.cluster_name == first.cluster_name and not again.identity.gossip_active

    # Restarted (new generation), perhaps upgraded: everything is asked again.
    (tmp_path / "info").write_text(INFO.replace("1795304199", "1795309999"))
    (tmp_path / "version").write_text("ReleaseVersion: 5.0.8\n")
    upgraded, calls = facts_and_calls()
    assert calls == ["describecluster", "gossipinfo", "info", "version"]
    assert upgraded.cassandra_version == "5.0.8"

    # No generation printed: nothing is trusted across calls.
    (tmp_path / "info").write_text(INFO.replace("Generation No", "Generation"))
    facts_and_calls()
    _, calls = facts_and_calls()
    assert calls == ["describecluster", "gossipinfo", "info", "version"]


def test_timeout_kills_the_command() -> None:
    with pytest.raises(CommandTimeout, match=r"did not finish within 0\.3 s"):
        asyncio.run(run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.3))


def test_missing_program_is_a_command_failure() -> None:
    with pytest.raises(CommandFailed, match="cannot run"):
        asyncio.run(run(["/nonexistent/nodetool", "info"], timeout=5))
