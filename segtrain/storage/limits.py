"""How long segtrain waits for an object store and how often it tries again (the ``storage.*`` keys), and the
one line a retry or a failure says.

Why: the clients' own defaults wait for minutes without a word. A store that accepts a connection and never
answers held a run silent for 15 minutes (s3fs retries each of botocore's retries), a store that drops
connections for 5. Both clients get the same bounds: ``connect_timeout_s`` to open a connection,
``read_timeout_s`` for each answer, and ``retries`` more attempts after a failed one (timeouts, refused or
dropped connections, 5xx, throttling), with exponential backoff. Each retry is one warning naming the store and
what it waited for; running out of attempts is one line naming the URL (:func:`segtrain.storage.errors.storage_error`).

The settings travel in the environment (``SEGTRAIN_STORAGE_*``, written by :func:`configure`), as the endpoint
does in ``AWS_ENDPOINT_URL``: loader workers and child processes read the same values.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("segtrain.storage")


@dataclass(frozen=True)
class Limits:
    """The bounds of one request to a store; the defaults are ``StorageConfig``'s."""

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    retries: int = 3

    @property
    def attempts(self) -> int:
        return self.retries + 1

    def backoff_s(self, failed: int) -> float:
        """Seconds before the attempt after the ``failed``-th one: 0.2, 0.4, 0.8 ... at most 10."""
        return min(0.1 * 2**failed, 10.0)


#: The environment variable of each setting (children and loader workers read them).
ENV = {
    "connect_timeout_s": "SEGTRAIN_STORAGE_CONNECT_TIMEOUT_S",
    "read_timeout_s": "SEGTRAIN_STORAGE_READ_TIMEOUT_S",
    "retries": "SEGTRAIN_STORAGE_RETRIES",
}


def current() -> Limits:
    """The settings in force: the environment's, else the defaults (a value that is not a number is ignored)."""
    values: dict[str, Any] = {}
    for name, var in ENV.items():
        text = os.environ.get(var, "").strip()
        if not text:
            continue
        try:
            value = int(text) if name == "retries" else float(text)
        except ValueError:
            continue
        if value >= (0 if name == "retries" else 1e-3):
            values[name] = value
    return Limits(**values)


def configure(connect_timeout_s: float | None, read_timeout_s: float | None, retries: int | None) -> None:
    """Apply the ``storage`` config group's bounds to this process and every process it starts."""
    for name, value in (
        ("connect_timeout_s", connect_timeout_s),
        ("read_timeout_s", read_timeout_s),
        ("retries", retries),
    ):
        if value is not None:
            os.environ[ENV[name]] = str(value)


def endpoint() -> str:
    """The store requests go to, as a user would name it."""
    return os.environ.get("AWS_ENDPOINT_URL") or "AWS S3 (no AWS_ENDPOINT_URL or storage.endpoint_url)"


def why(err: BaseException | None, status: int | None = None) -> str:
    """What a failed attempt waited for or met, in words, with the key that bounds it."""
    limits = current()
    if status is not None:
        return f"it answered HTTP {status}"
    text = f"{type(err).__name__}: {err}".lower()
    if "connect" in text and ("timeout" in text or "timed out" in text):
        return f"no connection within {limits.connect_timeout_s:g} s (storage.connect_timeout_s)"
    if "timeout" in text or "timed out" in text:
        return f"no answer within {limits.read_timeout_s:g} s (storage.read_timeout_s)"
    if "refused" in text or "could not connect" in text or "connect call failed" in text:
        return "the connection was refused (nothing listens there)"
    if any(w in text for w in ("closed", "reset", "incomplete", "disconnect", "broken pipe", "error sending request")):
        return "the connection was closed before the answer was complete"
    first = str(err).splitlines()[0][:160] if err is not None and str(err) else type(err).__name__
    return first


# --------------------------------------------------------------------------- one line per retry
_LOCK = threading.Lock()
_SAID: dict[str, int] = {}  # store -> the highest attempt announced in its current run of failures
#: Whether a request spent its attempts without an answer, and none was answered since: what a run does on its
#: way out (copying its logs, releasing its lock) is skipped rather than waiting out the retries again.
_UNREACHABLE = threading.Event()


def mark_unreachable() -> None:
    _UNREACHABLE.set()


def unreachable() -> bool:
    """True after a request gave up on the store (:func:`mark_unreachable`) until another one was answered."""
    return _UNREACHABLE.is_set()


def retrying(store: str, failed: int, reason: str) -> None:
    """Say (once per store and attempt, however many reads failed together) that attempt ``failed`` failed and
    another follows."""
    limits = current()
    with _LOCK:
        if _SAID.get(store, 0) >= failed:
            return
        _SAID[store] = failed
    log.warning(
        "object store %s: %s; trying again (attempt %d of %d, storage.retries=%d)",
        store,
        reason,
        failed + 1,
        limits.attempts,
        limits.retries,
    )


def answered(store: str) -> None:
    """A request to ``store`` succeeded: its next failure is announced again."""
    _UNREACHABLE.clear()
    if _SAID:
        with _LOCK:
            _SAID.pop(store, None)


def observe_botocore_attempt(
    attempts: int | None = None,
    response: Any = None,
    caught_exception: BaseException | None = None,
    endpoint: Any = None,
    **_: Any,
) -> None:
    """botocore's ``needs-retry`` event (s3fs's requests): announce a failed attempt that botocore retries.
    Returns None, so botocore's own retry handler decides."""
    store = str(getattr(endpoint, "host", "") or os.environ.get("AWS_ENDPOINT_URL") or "s3")
    status = None
    if caught_exception is None and response is not None:
        code = getattr(response[0], "status_code", 200) if isinstance(response, tuple) else 200
        if code < 500 and code != 429:
            answered(store)
            return
        status = code
    if attempts is not None and attempts < current().attempts:
        retrying(store, attempts, why(caught_exception, status))
