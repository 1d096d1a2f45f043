"""The S3Proxy test server's configuration: its storage backend."""

from __future__ import annotations

from pathlib import Path

from ringsnap.sandbox.s3proxy import _properties


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
