"""The API's refusals (an HTTP status and a message), shared by its handlers."""

from __future__ import annotations


class Refused(Exception):
    """A request answered with `status` and the JSON `body` (and `headers`: Retry-After);
    the middleware (services/api/guard.py) sends it."""

    def __init__(self, status: int, body: dict, headers: dict | None = None):
        super().__init__(body)
        self.status, self.body, self.headers = status, body, headers
