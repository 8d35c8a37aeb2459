"""The one failure of an authentication exchange, split as Kafka splits it.

Kafka sends a client the message of a `SaslAuthenticationException` (chosen to leak nothing, such as
"Client requested an authorization id that is different from username"), but only a generic message
for any other `SaslException`, whose detail (an unknown user, a bad proof) goes to the broker's log.
"""

from __future__ import annotations


class AuthenticationFailed(Exception):
    """`reason` is for the server's log (it may name the user, never a credential); `client_message`
    is sent to the client when set, otherwise the caller sends Kafka's generic message."""

    def __init__(self, reason: str, client_message: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.client_message = client_message
