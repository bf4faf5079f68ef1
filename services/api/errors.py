"""The API's refusals (an HTTP status and a message), shared by its handlers."""

from __future__ import annotations


class Refused(Exception):
    """A request answered with `status` and the JSON `body` (the middleware sends it)."""

    def __init__(self, status: int, body: dict):
        super().__init__(body)
        self.status, self.body = status, body
