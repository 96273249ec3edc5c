"""``UserError``: the base of every error a user can fix (a bad config, input, model path or output location).

Jobs catch it and print its message as one line with exit status 2, instead of a traceback (``run_job``).
Messages name the field, file or URL at fault, with any credentials redacted (``embedlib.storage.redact_url``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

USER_ERROR_STATUS = 2  # argparse's status for a bad command line: both mean "fix what you asked for"


class UserError(Exception):
    """A problem with what the user asked for, not a bug; the message is one line that says what to fix."""


def user_error_in(err: BaseException) -> UserError | None:
    """The ``UserError`` that ``err`` is or wraps, else ``None`` (a bug, to be reported with its traceback).

    A Ray task re-raises a worker's error as a ``RayTaskError`` whose ``cause`` is the original (its own
    message carries the remote traceback); explicit chaining (``raise ... from err``) is followed too.
    """
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        cause = getattr(err, "cause", None)
        if isinstance(cause, BaseException):  # a RayTaskError: look at the worker's own exception
            err = cause
        elif isinstance(err, UserError):
            return err
        else:
            err = err.__cause__
    return None


def one_line(err: BaseException) -> str:
    """``err``'s message on one line (lines joined), or its class name when it has none."""
    return " ".join(part.strip() for part in str(err).splitlines() if part.strip()) or type(err).__name__


def run_job(name: str, job: Callable[[], int | None]) -> int:
    """Run a job's body and return its exit status. A ``UserError`` (also one raised in a Ray task) is status 2
    and one line ``<name>: error: <message>`` on stderr, without a traceback; anything else is a bug and
    propagates with its traceback. Jobs end with ``sys.exit(main())``, ``main`` returning ``run_job(...)``."""
    try:
        return job() or 0
    except Exception as err:
        user_error = user_error_in(err)
        if user_error is None:
            raise
        print(f"{name}: error: {one_line(user_error)}", file=sys.stderr)
        return USER_ERROR_STATUS


@contextmanager
def storage_failures_as(error_cls: type[UserError], url: str, missing: str, unreadable: str) -> Iterator[None]:
    """Storage failures about ``url`` raised as ``error_cls`` with one-line messages that name the (redacted) URL:
    ``missing`` for a missing object, ``unreadable`` and the masked cause for any other failure."""
    from embedlib import storage

    where = storage.redact_url(url)
    try:
        yield
    except FileNotFoundError:
        raise error_cls(f"{where}: {missing}") from None
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - the cause's own text may hold the URL's credentials: masked, unchained
        raise error_cls(f"{where}: {unreadable} ({storage.error_text(err, url)})") from None
