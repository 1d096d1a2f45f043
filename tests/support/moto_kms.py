"""moto's server on 127.0.0.1 as a KMS (and S3) that checks IAM: every request after the setup is
authorized against the caller's IAM policy, so a node's credentials allowed `kms:Encrypt` only
are refused `kms:Decrypt` as AWS would refuse them.

moto authorizes every request once `INITIAL_NO_AUTH_ACTION_COUNT` unauthenticated ones were made:
the setup below makes exactly that many (keys, users, their policies and access keys).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

REGION = "us-east-1"
#: Who may do what with KMS (every user may use S3: the copies' bucket is on the same server).
#: moto's IAM matches no KMS key ARN in a policy's Resource (it allows on "*" only), so the
#: rights are per action here, not per key.
USERS: dict[str, list[str]] = {
    "node": ["kms:Encrypt"],  # the nodes and the coordinator: wrap only
    "restore": ["kms:Decrypt"],  # a restore allowed to decrypt
    "other": [],  # a principal that may not use KMS at all
}
_SETUP_CALLS = 2 + 3 * len(USERS)


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str

    def files(self, directory: Path, name: str) -> tuple[str, str]:
        """The two secret files a `[s3]` or `[s3.encryption]` table names."""
        access, secret = directory / f"{name}.id", directory / f"{name}.secret"
        access.write_text(self.access_key_id)
        secret.write_text(self.secret_access_key)
        return str(access), str(secret)


@dataclass(frozen=True)
class MotoKms:
    url: str
    #: Key label -> ARN ("a", "b").
    keys: dict[str, str]
    users: dict[str, Credentials]

    def client(self, service: str, user: str) -> Any:
        who = self.users[user]
        return boto3.client(
            service,
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=who.access_key_id,
            aws_secret_access_key=who.secret_access_key,
        )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120  # a loaded 2-core machine starts it slowly
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto_server exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.1)
    raise RuntimeError("moto_server did not answer on 127.0.0.1 within 120 s")


@contextlib.contextmanager
def running_moto_kms() -> Iterator[MotoKms]:
    port = _free_port()
    server = Path(sys.executable).with_name("moto_server")
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_SETUP_CALLS)}
    process = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait(port, process)
        url = f"http://127.0.0.1:{port}"
        setup = {
            # One attempt each: a retried call would use up one of the unauthenticated requests.
            "config": Config(retries={"total_max_attempts": 1}, read_timeout=300),
            "endpoint_url": url,
            "region_name": REGION,
            "aws_access_key_id": "setup",
            "aws_secret_access_key": "setup",
        }
        kms, iam = boto3.client("kms", **setup), boto3.client("iam", **setup)
        keys = {label: kms.create_key()["KeyMetadata"]["Arn"] for label in ("a", "b")}
        users = {}
        for user, actions in USERS.items():
            iam.create_user(UserName=user)
            policy = {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": ["s3:*", *actions], "Resource": "*"}],
            }
            iam.put_user_policy(UserName=user, PolicyName="p", PolicyDocument=json.dumps(policy))
            made = iam.create_access_key(UserName=user)["AccessKey"]
            users[user] = Credentials(made["AccessKeyId"], made["SecretAccessKey"])
        yield MotoKms(url, keys, users)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
