"""The API's refusals (a category, hence an HTTP status, and a JSON body), shared by its
handlers, and the one map from an error's category (cep_core/errors.py) to a status."""

from __future__ import annotations

from cep_core.errors import Category, Problem, Refusal
from cep_core.control_ops import Outcome

STATUS = {Category.MALFORMED: 400, Category.INVALID: 422, Category.NOT_FOUND: 404,
          Category.CONFLICT: 409, Category.ADMISSION: 429, Category.UNAVAILABLE: 503,
          Category.INTERNAL: 500}


class Refused(Exception):
    """A request answered with the status of `category` and the JSON `body` (and
    `headers`: Retry-After); the middleware (services/api/guard.py) sends it."""

    def __init__(self, category: Category, body: dict, headers: dict | None = None):
        super().__init__(body)
        self.category, self.body, self.headers = category, body, headers

    @property
    def status(self) -> int:
        return STATUS[self.category]


def problems(error: Refusal) -> list[dict]:
    """An error's problems as the `errors` of an answer (message, query, line, column,
    source_line), from its fields."""
    return [p.to_json() for p in error.problems]


def problem(message: str) -> list[dict]:
    """One problem located nowhere, as the `errors` of an answer."""
    return [Problem(message).to_json()]


def invalid(error: Refusal) -> tuple[int, dict]:
    """(status, body) of a change refused before it is sent."""
    return STATUS[error.category], {"outcome": Outcome.INVALID, "errors": problems(error),
                                    "changes": []}
