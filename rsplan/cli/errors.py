"""Turn RsplanError into click's one-line ``Error: ...`` exit, in one place."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from rsplan.errors import RsplanError

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(func: F) -> F:
    """Decorator for command bodies: an RsplanError becomes ``Error: <message>`` and exit code 1."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except RsplanError as exc:
            raise click.ClickException(str(exc).replace("\n", " ")) from None

    return wrapper  # type: ignore[return-value]
