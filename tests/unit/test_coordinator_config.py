"""The coordinator's config file: what it accepts, and errors that name the file and the key."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from ringsnap.config import redacted
from ringsnap.coordinator.cluster_clients import node_local_agent
from ringsnap.coordinator.config import CoordinatorConfig, load_config
from ringsnap.coordinator.model import QuiesceMode, SnapshotKind, VolumeRole
from ringsnap.coordinator.retention import RetentionPolicy
from ringsnap.coordinator.scheduler import Schedule
from ringsnap.errors import ConfigError

EXAMPLE = Path(__file__).parents[2] / "systemd" / "coordinator.example.toml"


@pytest.fixture
def files(tmp_path: Path) -> Path:
    for name in ("coordinator.crt", "ca.crt"):
        (tmp_path / name).write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "coordinator.key").write_text("-----BEGIN PRIVATE KEY-----\nkey-material\n")
    (tmp_path / "cql.password").write_text("hunter2\n")
    return tmp_path


def valid(files: Path) -> str:
    return f"""
[coordinator]
freeze_budget_seconds = 1.2

[tls]
cert_file = "{files}/coordinator.crt"
key_file = "{files}/coordinator.key"
ca_file = "{files}/ca.crt"

[arrays.a1]
driver = "ontap"
endpoint = "https://fas1"
password_file = "/etc/ringsnap/does-not-exist-yet"
nested = {{ anything = [1, 2] }}

[[clusters]]
name = "c1"
contact_points = ["127.0.0.1", "127.0.0.2:9043"]
cql_username = "ringsnap"
cql_password_file = "{files}/cql.password"

[[clusters.nodes]]
name = "n1"
agent = "127.0.0.1:7443"
volumes = [
  {{ array = "a1", volume = "n1_data", role = "data" }},
  {{ array = "a1", volume = "n1_log", role = "commitlog" }},
]

[[clusters.nodes]]
name = "n2"
agent = "127.0.0.2:7443"
volumes = [{{ array = "a1", volume = "n2_all", role = "data+commitlog" }}]

[[schedules]]
name = "hourly"
cluster = "c1"
cron = "0 * * * *"
policy = "standard"

[retention.standard]
hourly = 24
daily = 7
max_age_days = 2
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "coordinator.toml"
    path.write_text(text)
    return path


def test_a_valid_config_loads_into_typed_values(files: Path) -> None:
    config = load_config(write(files, valid(files)))
    assert config.coordinator.catalog == Path("/var/lib/ringsnap/catalog.db")
    assert config.coordinator.listen == "127.0.0.1:7444"
    assert config.freeze_budget_seconds("c1") == 1.2
    assert config.coordinator.lease_seconds == 1.0
    cluster = config.cluster("c1")
    assert cluster.quiesce is QuiesceMode.FREEZE and not cluster.allow_partial
    assert cluster.canary_keyspace == "ringsnap"
    assert cluster.write_timeout_seconds == 2.0
    assert cluster.nodes[1].volumes[0].role is VolumeRole.DATA_AND_COMMITLOG
    assert cluster.cql_password_file is not None
    assert cluster.cql_password_file.get_secret_value() == "hunter2"
    assert config.tls.key_file.get_secret_value().endswith("key-material")
    # Array tables go to their driver untouched, secrets references included.
    assert config.arrays["a1"].table() == {
        "driver": "ontap",
        "endpoint": "https://fas1",
        "password_file": "/etc/ringsnap/does-not-exist-yet",
        "nested": {"anything": [1, 2]},
    }
    assert config.schedule_list() == [Schedule("hourly", "c1", "0 * * * *", "standard", "UTC")]
    assert config.retention_policy("standard") == RetentionPolicy(
        hourly=24, daily=7, max_age=timedelta(days=2)
    )
    dumped = str(redacted(config))
    assert "hunter2" not in dumped and "key-material" not in dumped


def test_the_shipped_example_is_valid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tls = tmp_path / "tls"
    tls.mkdir()
    for name in ("coordinator.crt", "ca.crt"):
        (tls / name).write_text("pem\n")
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "coordinator.key").write_text("key\n")
    (credentials / "prod.cql.password").write_text("pw\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    text = EXAMPLE.read_text().replace("/etc/ringsnap/tls/", f"{tls}/")
    config = load_config(write(tmp_path, text))
    assert [n.name for n in config.cluster("prod").nodes] == ["cass1", "cass2", "cass3"]
    assert config.arrays["pure1"].driver == "flasharray"
    assert config.retention_policy("standard").monthly == 12


@pytest.mark.parametrize(
    ("old", "new", "key", "problem"),
    [
        # unknown keys and wrong types
        ("[coordinator]\n", "[coordinator]\ncolour = 'red'\n", "coordinator.colour", "unknown key"),
        ('name = "c1"\n', 'name = "c1"\nseedz = []\n', "clusters.0.seedz", "unknown key"),
        ('name = "c1"\n', 'name = "c1"\nseeds = ["n9"]\n', "clusters.0", "seeds n9 are not nodes of cluster c1"),
        ('name = "c1"\n', 'name = "c1"\ncql_port = "many"\n', "clusters.0.cql_port", "integer"),
        ("hourly = 24", "hourly = -1", "retention.standard.hourly", "greater than or equal to 0"),
        ("role = \"data\"", "role = \"logs\"", "clusters.0.nodes.0.volumes.0.role", "'data'"),
        ('agent = "127.0.0.1:7443"', 'agent = "127.0.0.1"', "clusters.0.nodes.0.agent", "HOST:PORT"),
        ('name = "c1"\n', 'name = "c1"\ncanary_keyspace = "ring-snap"\n', "clusters.0.canary_keyspace", "invalid keyspace name"),
        ('driver = "ontap"\n', "", "arrays.a1.driver", "required key is missing"),
        # secrets and files
        ("/cql.password", "/missing.password", "clusters.0.cql_password_file", "does not exist"),
        ("/ca.crt", "/missing.crt", "tls.ca_file", "does not exist"),
        ('cql_password_file = "', 'unused = "', "clusters.0.unused", "unknown key"),
        # references across sections
        ('cluster = "c1"', 'cluster = "c9"', "schedules.0.cluster", "unknown cluster 'c9'; configured clusters: c1"),
        ('policy = "standard"', 'policy = "gold"', "schedules.0.policy", "add a [retention.gold] table"),
        ('name = "n2"', 'name = "n1"', "clusters.0.nodes.1.name", "duplicate node name 'n1'"),
        ('agent = "127.0.0.2:7443"', 'agent = "127.0.0.1:7443"', "clusters.0.nodes.1.agent", "already the agent of node c1/n1"),
        ('volume = "n2_all"', 'volume = "n1_data"', "clusters.0.nodes.1.volumes.0.volume", "already used by node n1"),
        ('{ array = "a1", volume = "n2_all"', '{ array = "a2", volume = "n2_all"', "clusters.0.nodes.1.volumes.0.array", "unknown array 'a2'; configured arrays: a1"),
        ('role = "commitlog"', 'role = "data"', "clusters.0.nodes.0", "no volume with role commitlog"),
        ('cron = "0 * * * *"', 'cron = "0 * * *"', "schedules.0.cron", "invalid cron expression"),
        ('policy = "standard"\n', 'policy = "standard"\ntimezone = "Mars/Olympus"\n', "schedules.0.timezone", "unknown time zone"),
        ("hourly = 24\ndaily = 7\nmax_age_days = 2\n", "failed_grace_days = 3\n", "retention.standard", "keeps nothing"),
        ('cql_username = "ringsnap"\n', "", "clusters.0", "set both cql_username and cql_password_file"),
        # the freeze budget against the cluster's write timeout
        ("freeze_budget_seconds = 1.2", "freeze_budget_seconds = 2.0", "coordinator.freeze_budget_seconds", "must be below the write timeout of cluster c1 (2 s)"),
        ('name = "c1"\n', 'name = "c1"\nwrite_timeout_seconds = 1.0\n', "coordinator.freeze_budget_seconds", "must be below the write timeout"),
        ('name = "c1"\n', 'name = "c1"\nfreeze_budget_seconds = 2.5\n', "clusters.0.freeze_budget_seconds", "(2.5 s) must be below"),
        ("freeze_budget_seconds = 1.2", "freeze_budget_seconds = 1.2\nlease_seconds = 3", "coordinator.lease_seconds", "must be below the write timeout"),
        ('name = "c1"\n', 'name = "c1"\npitr = true\n', "clusters.0.pitr", "needs [s3]"),
    ],
)  # fmt: skip
def test_bad_config_names_the_file_and_the_key(
    files: Path, old: str, new: str, key: str, problem: str
) -> None:
    text = valid(files)
    assert old in text, old
    path = write(files, text.replace(old, new, 1))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.file == str(path)
    assert caught.value.key == key
    assert problem in caught.value.problem
    assert "hunter2" not in str(caught.value)


def test_a_duplicate_cluster_is_refused(files: Path) -> None:
    text = valid(files)
    cluster = text[text.index("[[clusters]]") : text.index("[[schedules]]")]
    second = cluster.replace("n1", "m1").replace("n2", "m2").replace("127.0.0", "127.0.1")
    path = write(files, text.replace("[[schedules]]", second + "[[schedules]]"))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert (caught.value.key, caught.value.problem) == (
        "clusters.1.name",
        "duplicate cluster name 'c1'",
    )


def test_unreadable_missing_or_broken_files(files: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(files)  # a directory
    with pytest.raises(ConfigError, match="file not found"):
        load_config(files / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(files, "[coordinator\n"))
    with pytest.raises(ConfigError) as caught:
        load_config(write(files, valid(files).split("[[clusters]]")[0]))
    assert caught.value.key == "clusters"


def test_a_cross_reference_error_raised_outside_load_still_names_the_key(files: Path) -> None:
    import tomllib

    data = tomllib.loads(valid(files).replace('cluster = "c1"', 'cluster = "c9"'))
    with pytest.raises(ConfigError) as caught:
        CoordinatorConfig.model_validate(data)
    assert (caught.value.file, caught.value.key) == ("<config>", "schedules.0.cluster")


NATIVE_NODES = """
[[clusters.nodes]]
name = "n1"
agent = "127.0.0.1:7443"

[[clusters.nodes]]
name = "n2"
agent = "127.0.0.2:7443"
"""


def _native(files: Path, nodes: str = NATIVE_NODES) -> str:
    text = valid(files)
    head, _, tail = text.partition("[[clusters.nodes]]")
    schedules = tail[tail.index("[[schedules]]") :]
    return (
        head.replace('name = "c1"\n', 'name = "c1"\nsnapshots = "native"\n', 1) + nodes + schedules
    )


def test_a_native_cluster_needs_no_volumes(files: Path) -> None:
    config = load_config(write(files, _native(files)))
    cluster = config.cluster("c1")
    assert cluster.snapshots is SnapshotKind.NATIVE
    assert [node.volumes for node in cluster.nodes] == [[], []]
    assert config.cluster("c1").quiesce is QuiesceMode.FREEZE  # unused by native backups


def test_a_native_cluster_refuses_array_volumes_and_an_array_cluster_needs_them(
    files: Path,
) -> None:
    with_volumes = NATIVE_NODES.replace(
        'agent = "127.0.0.2:7443"\n',
        'agent = "127.0.0.2:7443"\nvolumes = [{ array = "a1", volume = "v", role = "data" }]\n',
    )
    with pytest.raises(ConfigError) as caught:
        load_config(write(files, _native(files, with_volumes)))
    assert caught.value.key == "clusters.0.nodes.1.volumes"
    assert "takes native snapshots" in caught.value.problem

    array = _native(files).replace('snapshots = "native"\n', "")
    with pytest.raises(ConfigError) as caught:
        load_config(write(files, array))
    assert caught.value.key == "clusters.0.nodes.0"
    assert "no volume with role data or commitlog" in caught.value.problem
    assert 'snapshots = "native"' in caught.value.problem


def _remote(files: Path, clients: str) -> str:
    return (
        valid(files)
        + f"""
[remote]
listen = "0.0.0.0:7445"
cert_file = "{files}/coordinator.crt"
key_file = "{files}/coordinator.key"
ca_file = "{files}/ca.crt"
{clients}
"""
    )


def test_the_remote_listener_has_an_allow_list_with_roles(files: Path) -> None:
    clients = (
        '[[remote.clients]]\nidentity = "alice@oncall"\nrole = "operator"\n'
        '[[remote.clients]]\nidentity = "bob@oncall"\nrole = "viewer"\n'
    )
    config = load_config(write(files, _remote(files, clients)))
    assert config.remote is not None and config.remote.listen == "0.0.0.0:7445"
    assert [(c.identity, c.role.value) for c in config.remote.clients] == [
        ("alice@oncall", "operator"),
        ("bob@oncall", "viewer"),
    ]
    assert "key-material" not in str(redacted(config))


@pytest.mark.parametrize(
    ("clients", "key", "problem"),
    [
        ("", "remote.clients", "required key is missing"),
        ('[[remote.clients]]\nidentity = "a"\nrole = "admin"\n', "remote.clients.0.role", "viewer"),
        (
            '[[remote.clients]]\nidentity = "a"\nrole = "viewer"\n'
            '[[remote.clients]]\nidentity = "a"\nrole = "operator"\n',
            "remote",
            "listed twice",
        ),
    ],
)
def test_a_bad_allow_list_names_the_key(files: Path, clients: str, key: str, problem: str) -> None:
    path = write(files, _remote(files, clients))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == key, caught.value
    assert problem in caught.value.problem


def _node_local(files: Path, array_table: str) -> str:
    """The valid config with n1's volumes on its own disks, snapshotted by its agent."""
    return (
        valid(files)
        .replace(
            """  {{ array = "a1", volume = "n1_data", role = "data" }},
  {{ array = "a1", volume = "n1_log", role = "commitlog" }},""".replace("{{", "{").replace(
                "}}", "}"
            ),
            """  { array = "n1-das", volume = "cass/data", role = "data" },
  { array = "n1-das", volume = "cass/commitlog", role = "commitlog" },""",
        )
        .replace("[[clusters]]", f"[arrays.n1-das]\n{array_table}\n\n[[clusters]]", 1)
    )


def test_node_local_snapshots_are_asked_of_the_node_s_own_agent(files: Path) -> None:
    text = _node_local(files, 'driver = "agent-lvm"\nnode = "n1"')
    config = load_config(write(files, text))
    assert node_local_agent(config, "n1-das", "<f>") == ("n1", "127.0.0.1:7443")


@pytest.mark.parametrize(
    ("table", "key", "problem"),
    [
        ('driver = "agent-lvm"', "arrays.n1-das.node", "name the node"),
        ('driver = "agent-lvm"\nnode = "n9"', "arrays.n1-das.node", "'n9' is no node"),
        (
            'driver = "agent-lvm"\nnode = "n1"\nendpoint = "x"',
            "arrays.n1-das.endpoint",
            "only node",
        ),
    ],
)
def test_a_node_local_array_names_a_known_node(
    files: Path, table: str, key: str, problem: str
) -> None:
    config = load_config(write(files, _node_local(files, table)))
    with pytest.raises(ConfigError) as refused:
        node_local_agent(config, "n1-das", "<f>")
    assert refused.value.key == key and problem in refused.value.problem


def test_array_host_names_each_hosts_object_on_the_array(files: Path) -> None:
    text = valid(files).replace(
        'agent = "127.0.0.1:7443"\n', 'agent = "127.0.0.1:7443"\narray_host = "ig_n1"\n', 1
    )
    config = load_config(write(files, text))
    assert [n.array_host for n in config.clusters[0].nodes] == ["ig_n1", None]


@pytest.mark.parametrize(
    ("n1", "n2", "key", "problem"),
    [
        ("bad host", None, "clusters.0.nodes.0.array_host", "is not an array host object name"),
        ("-x", None, "clusters.0.nodes.0.array_host", "starting with a letter or digit"),
        ("ig1", "IG1", "clusters.0", "array_host 'IG1' is named for node n1 and node n2"),
    ],
)
def test_a_bad_or_shared_array_host_is_refused_naming_the_key(
    files: Path, n1: str, n2: str | None, key: str, problem: str
) -> None:
    text = valid(files).replace(
        'agent = "127.0.0.1:7443"\n', f'agent = "127.0.0.1:7443"\narray_host = "{n1}"\n', 1
    )
    if n2 is not None:
        text = text.replace(
            'agent = "127.0.0.2:7443"\n', f'agent = "127.0.0.2:7443"\narray_host = "{n2}"\n', 1
        )
    path = write(files, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == key
    assert problem in caught.value.problem
