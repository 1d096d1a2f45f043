"""The S3Proxy test server's configuration: its storage backend."""

from __future__ import annotations

from pathlib import Path

from ringsnap.sandbox.s3proxy import _properties, write_properties


def _parsed(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_the_default_backend_is_the_filesystem_one_tests_corrupt_objects_in() -> None:
    properties = _parsed(_properties(9000, "access", "secret", Path("/srv/objects")))
    assert properties["jclouds.provider"] == "filesystem"
    assert properties["jclouds.filesystem.basedir"] == "/srv/objects"
    assert "jclouds.identity" not in properties


def test_the_nio2_backend_gets_the_jclouds_keys_its_start_up_check_requires() -> None:
    properties = _parsed(
        _properties(9000, "access", "secret", Path("/srv/objects"), "filesystem-nio2")
    )
    assert properties["jclouds.provider"] == "filesystem-nio2"
    assert properties["jclouds.filesystem.basedir"] == "/srv/objects"
    # S3Proxy refuses to start this backend without them; the client's keys stay S3Proxy's own.
    assert properties["jclouds.identity"] and properties["jclouds.credential"]
    assert (properties["s3proxy.identity"], properties["s3proxy.credential"]) == (
        "access",
        "secret",
    )


def test_the_written_properties_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    """`ringsnap sandbox up` keeps them under the instance's services/ for later `up`s."""
    written = write_properties(tmp_path, 26001, "access", "secret", tmp_path / "objects")
    assert written.stat().st_mode & 0o777 == 0o600
    assert _parsed(written.read_text())["s3proxy.endpoint"] == "http://127.0.0.1:26001"
    assert (tmp_path / "objects").is_dir()
