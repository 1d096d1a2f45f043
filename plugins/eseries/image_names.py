"""Names of consistency-group images, kept in the web services' key-value store (E-Series images
have no names): `ringsnap.<cg ref>.<sequence>` holds `{"name", "state"}` (as JSON text, POSTed
raw as the vendor's own client writes its values: the store keeps the body verbatim), and
`ringsnap.<cg ref>.pending` the create in flight, so that a retry after a lost answer adopts the
image instead of taking a second one."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from ringsnap.plugins.eseries.client import EseriesClient

KEY_PREFIX = "ringsnap"
ACTIVE = "active"
#: Deleted for ringsnap, still on the array until every older image is gone.
DELETING = "deleting"
#: Removed by the array itself (its repository filled, policy purgepit).
PURGED = "purged"


@dataclass
class ImageName:
    key: str
    name: str
    state: str


class ImageNames:
    def __init__(self, client: EseriesClient) -> None:
        self._client = client

    @staticmethod
    def key(cg: str, sequence: int) -> str:
        return f"{KEY_PREFIX}.{cg}.{sequence}"

    @staticmethod
    def pending_key(cg: str) -> str:
        return f"{KEY_PREFIX}.{cg}.pending"

    def of_group(self, cg: str) -> dict[int, ImageName]:
        return self.read(cg)[0]

    def read(self, cg: str) -> tuple[dict[int, ImageName], dict[str, Any] | None]:
        """The names of the group's images, and the pending create (if any), in one request."""
        prefix = f"{KEY_PREFIX}.{cg}."
        names: dict[int, ImageName] = {}
        pending: dict[str, Any] | None = None
        for item in self._client.get("/key-values"):
            key = str(item.get("key", ""))
            suffix = key.removeprefix(prefix)
            if key == suffix:
                continue
            try:
                value = json.loads(item.get("value") or "{}")
            except ValueError:
                continue
            if not isinstance(value, dict):
                continue
            if suffix == "pending":
                pending = value
            elif suffix.isdigit():
                names[int(suffix)] = ImageName(
                    key, str(value.get("name", "")), str(value.get("state", ACTIVE))
                )
        return names, pending

    def set(self, cg: str, sequence: int, name: str, state: str) -> None:
        self._client.post_text(
            f"/key-values/{self.key(cg, sequence)}", json.dumps({"name": name, "state": state})
        )

    def forget(self, cg: str, sequence: int) -> None:
        self._client.delete(f"/key-values/{self.key(cg, sequence)}")

    def mark_pending(self, cg: str, name: str, after: int) -> None:
        """Before asking for an image: which name it gets, and the newest sequence before it."""
        self._client.post_text(
            f"/key-values/{self.pending_key(cg)}",
            json.dumps({"name": name, "after": after, "at": time.time()}),
        )

    def clear_pending(self, cg: str) -> None:
        self._client.delete(f"/key-values/{self.pending_key(cg)}")
