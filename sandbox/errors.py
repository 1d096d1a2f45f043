"""The one error type of the test bed."""

from __future__ import annotations

from ringsnap.errors import RingsnapError


class SandboxError(RingsnapError):
    """The test bed could not be set up, used or torn down; the message says which step failed."""

    exit_code = 70  # EX_SOFTWARE
