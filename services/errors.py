"""Errors from outside the program that commands report as one clean message (exit 1)."""

from __future__ import annotations

from cep_core.errors import Category


class CleanError(Exception):
    """Printed by the CLI as `error: message`, exit status 1, no traceback."""


class MissingExtra(CleanError, ImportError):
    """An optional feature whose extra (pyproject's optional-dependencies) is not installed."""


class DeliveryFailed(CleanError, RuntimeError):
    """Messages that were produced did not reach the broker."""


class BrokerUnreachable(CleanError, RuntimeError):
    """The Kafka broker did not answer."""

    category = Category.UNAVAILABLE
