"""The playground's S3Proxy keeps one key pair per instance: made once, owner-only, reused by every
later `ringsnap sandbox up` (the agents' and the coordinator's `[s3]` name the same files)."""

from __future__ import annotations

from pathlib import Path

from ringsnap.sandbox.instance import InstanceLayout
from ringsnap.sandbox.s3_service import _keys, container_name, s3_directory


def test_the_key_pair_is_made_once_owner_only_and_reused(tmp_path: Path) -> None:
    access, secret = _keys(tmp_path)
    first = (access.read_text(), secret.read_text())
    assert all(value for value in first) and first[0] != first[1]
    assert access.stat().st_mode & 0o777 == secret.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "keys").stat().st_mode & 0o777 == 0o700
    again = _keys(tmp_path)
    assert (again[0].read_text(), again[1].read_text()) == first


def test_the_container_and_its_files_belong_to_the_instance(tmp_path: Path) -> None:
    layout = InstanceLayout("play", 7, tmp_path / "play")
    assert container_name(layout) == "ringsnap-sandbox-play-s3proxy"
    assert s3_directory(layout) == tmp_path / "play" / "services" / "s3"
