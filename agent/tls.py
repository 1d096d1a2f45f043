"""The agent's allow-list: only client certificates naming an allow-listed identity reach any
handler.

The TLS handshake (`ringsnap.grpcauth.server_credentials`) already refuses clients without a
certificate or with one from another CA. The interceptor then compares the certificate's subject
common name and subject alternative names with the allow-list, before the handler runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
import grpc.aio

from ringsnap import logs
from ringsnap.grpcauth import CheckingInterceptor, Context, client_identities, server_credentials

__all__ = ["AllowListInterceptor", "server_credentials"]

log = logs.get_logger(__name__)


class AllowListInterceptor(CheckingInterceptor):
    """Refuses every call whose client certificate names no allow-listed identity."""

    def __init__(self, allowed: Iterable[str]) -> None:
        self._allowed = frozenset(allowed)

    async def check(self, context: Context, method: str, request: Any) -> None:
        security, names = client_identities(context)
        if security != "ssl" or not names:
            log.warning(
                "refused: no client certificate identity", method=method, peer=context.peer()
            )
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "a client certificate with a subject common name or alternative name is required",
            )
        if self._allowed.isdisjoint(names):
            log.warning("refused: client not allowed", method=method, identities=names)
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"client identity {', '.join(names)} is not on this agent's allow-list",
            )
