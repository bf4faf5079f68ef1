"""What the handlers of several areas answer alike: a change's documented outcomes, a
missing live query, and a change's wait options."""

from __future__ import annotations

from cep_service.api import models as m
from cep_service.api.state import ApiConfig

NOT_LIVE = (m.Error, "no live query of that name")


def outcomes(created: bool = False) -> dict[int, tuple[type[m.Outcome], str]]:
    """A change's answers (each an Outcome)."""
    return {201 if created else 200: (m.Outcome, "applied"),
            202: (m.Outcome, "queued, or sent (not waited for)"),
            404: (m.Outcome, "nothing of that name is live"),
            409: (m.Outcome, "refused: live already, or by the splitter"),
            422: (m.Outcome, "does not check (errors with line, column); nothing was "
                  "written"),
            504: (m.Outcome, "no outcome in time")}


def wait_args(body: m.WaitOptions, config: ApiConfig) -> tuple[bool, float]:
    given = body.model_fields_set
    return body.wait, body.timeout_s if "timeout_s" in given else float(config.timeout_s)
