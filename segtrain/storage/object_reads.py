"""Whole-object reads from S3 through obstore (Rust's ``object_store``): the loader's image reads.

Why: s3fs signs each request and parses each response in Python (botocore), on the same cores that decode the
images; obstore does both in Rust. With an image per request, that is the difference between a loader that keeps
up with a distant store and one that is CPU-bound (docs/storage.md has the figures and the script).

Optional (``pip install -e '.[storage]'`` brings it): without obstore, or where it cannot honour what s3fs
would, :func:`usable` says no and :mod:`segtrain.storage.object_store` reads through s3fs as before. obstore reads
the same environment as botocore (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
``AWS_REGION`` or ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL``, which the ``storage.endpoint_url`` key sets);
credentials only botocore resolves (profiles, SSO, instance roles) keep the reads on s3fs. Requests have the
``storage.*`` bounds (:mod:`segtrain.storage.limits`: obstore's ``connect_timeout`` and ``read_timeout``) and are
retried here, not inside obstore (its ``RetryConfig`` makes one attempt), so that each retry says its line: 5xx,
throttling, timeouts and dropped connections, ``storage.retries`` times with exponential backoff, as s3fs's
botocore does.

One client per process: obstore's runtime (tokio) does not survive a fork, so it is started only in the loader's
worker processes, which fork nothing (a main process that read through it would leave its workers, forked later,
without a client: the doctor measures 0 workers before 2), and a process whose parent had started it anyway
(``SEGTRAIN_S3_READER=obstore`` forces it in any process) reads through s3fs (:func:`usable`).

Errors come back as the builtin types s3fs raises (:class:`FileNotFoundError` for a missing key or bucket,
:class:`PermissionError` for a denied request, :class:`OSError` else), with the store's error code as their
text, so :func:`segtrain.storage.errors.storage_error` words them alike for both clients.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import segtrain.storage.limits as storage_limits

#: ``SEGTRAIN_S3_READER``: ``auto`` (obstore in loader workers), ``obstore`` (in any process), ``fsspec`` (never:
#: a comparison, or a store obstore cannot talk to).
READER_VARIABLE = "SEGTRAIN_S3_READER"
#: The environment a store depends on: a change (a test pointing at another endpoint) makes a new client.
_ENV_KEYS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
)
#: obstore's own retries are off: :func:`_get` retries, announcing each (:func:`segtrain.storage.limits.retrying`).
_RETRY: dict[str, Any] = {
    "max_retries": 0,
    "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=10), "base": 2},
    "retry_timeout": timedelta(seconds=1),
}
_CODE = re.compile(r"<Code>([^<]+)</Code>")

_STORES: dict[tuple[str, ...], Any] = {}
_LOOP: tuple[int, asyncio.AbstractEventLoop] | None = None
_LOCK = threading.Lock()
#: The process that started obstore's runtime (None: not started). A forked child inherits this value.
_STARTED_BY: int | None = None


class ObjectTooLarge(ValueError):
    """The object is larger than the caller's limit (known from the response's headers, before its body)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"{size} bytes, more than {limit}")
        self.size, self.limit = size, limit


def usable(url: str, in_worker: bool | None = None) -> bool:
    """True when ``url`` (``s3://``) can be read through obstore in this process with the configuration s3fs
    would use: a loader worker (``in_worker``: as if, or not; None: this process), or
    ``SEGTRAIN_S3_READER=obstore``; obstore installed, credentials and region (or an endpoint) in the environment
    (what else botocore resolves stays with s3fs), and its runtime not inherited across a fork."""
    choice = os.environ.get(READER_VARIABLE, "auto").lower()
    if not url.startswith(("s3://", "s3a://")) or choice == "fsspec" or _STARTED_BY not in (None, os.getpid()):
        return False
    if choice != "obstore" and not (in_loader_worker() if in_worker is None else in_worker):
        return False
    env = os.environ
    if not env.get("AWS_ACCESS_KEY_ID") or not env.get("AWS_SECRET_ACCESS_KEY") or env.get("AWS_ENDPOINT_URL_S3"):
        return False
    if not (env.get("AWS_ENDPOINT_URL") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")):
        return False  # the bucket's region: botocore asks the store, object_store would not
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True


def in_loader_worker() -> bool:
    """True in a DataLoader's worker process (torch says so; torch is imported wherever a loader runs)."""
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


def split(url: str) -> tuple[str, str]:
    """(bucket, key) of an ``s3://bucket/key`` URL."""
    rest = url.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    return bucket, key


def _store(bucket: str) -> Any:
    """This process's client for ``bucket`` (one per bucket and configuration; its connections are pooled)."""
    limits = storage_limits.current()
    key = (bucket, *(os.environ.get(k, "") for k in _ENV_KEYS), str(limits))
    store = _STORES.get(key)
    if store is None:
        from obstore.store import S3Store

        endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
        options: dict[str, Any] = {
            "connect_timeout": timedelta(seconds=limits.connect_timeout_s),
            "read_timeout": timedelta(seconds=limits.read_timeout_s),
            # the whole request (30 s by default) bounds no more than a connection and an answer do
            "timeout": timedelta(seconds=limits.connect_timeout_s + limits.read_timeout_s),
        }
        if endpoint.startswith("http://"):
            options["allow_http"] = True  # as s3fs does for such a URL
        store = _STORES[key] = S3Store(bucket, client_options=options, retry_config=_RETRY)  # type: ignore[arg-type]
    return store


def _loop() -> asyncio.AbstractEventLoop:
    """This process's event loop for obstore's coroutines, in a daemon thread (a forked child makes its own)."""
    global _LOOP, _STARTED_BY
    with _LOCK:
        if _LOOP is None or _LOOP[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="segtrain-object-reads", daemon=True).start()
            _LOOP = (os.getpid(), loop)
            _STARTED_BY = os.getpid()
        return _LOOP[1]


def error_of(err: BaseException) -> OSError:
    """obstore's error as the builtin type s3fs would raise, its text the store's error code (one line)."""
    text = str(err)
    code = _CODE.search(text)
    short = code.group(1) if code else text.splitlines()[0][:200] if text else type(err).__name__
    if isinstance(err, FileNotFoundError) or (code and code.group(1) in ("NoSuchKey", "NoSuchBucket")):
        return FileNotFoundError(short)
    if isinstance(err, PermissionError) or "AccessDenied" in text or "403 Forbidden" in text:
        return PermissionError(short if code else "AccessDenied")
    return OSError(short if code else _transport_failure(text) or storage_limits.why(err))


def _transport_failure(text: str) -> str | None:
    """What a request that got no answer met, from object_store's debug text (its first line says only "error
    sending request"), in :func:`segtrain.storage.limits.why`'s words; None when the text names none."""
    limits = storage_limits.current()
    if "ConnectionRefused" in text:
        return "the connection was refused (nothing listens there)"
    if "kind: Timeout" in text or "TimedOut" in text:
        if "kind: Connect" in text:
            return f"no connection within {limits.connect_timeout_s:g} s (storage.connect_timeout_s)"
        return f"no answer within {limits.read_timeout_s:g} s (storage.read_timeout_s)"
    if any(w in text for w in ("IncompleteMessage", "ConnectionReset", "BrokenPipe", "ConnectionAborted")):
        return "the connection was closed before the answer was complete"
    return None


async def _get_once(url: str, max_bytes: int | None) -> bytes:
    import obstore

    bucket, key = split(url)
    try:
        result = await obstore.get_async(_store(bucket), key)  # one plain GET: no HEAD, no range to refuse
        size = int(result.meta["size"])
        if max_bytes is not None and size > max_bytes:
            raise ObjectTooLarge(size, max_bytes)
        return bytes(await result.bytes_async())
    except ObjectTooLarge:
        raise
    except Exception as e:  # noqa: BLE001 - obstore's errors, as builtin types
        raise error_of(e) from None


async def _get(url: str, max_bytes: int | None) -> bytes:
    """One object, in at most ``storage.retries + 1`` attempts: a missing, denied or too large object is final
    at once; anything else (a timeout, a refused or dropped connection, 5xx, throttling) is tried again after
    a backoff, with a line saying so."""
    limits = storage_limits.current()
    store = os.environ.get("AWS_ENDPOINT_URL") or "s3"
    for attempt in range(1, limits.attempts + 1):
        try:
            data = await _get_once(url, max_bytes)
        except (FileNotFoundError, PermissionError, ObjectTooLarge):
            raise
        except OSError as e:
            if attempt >= limits.attempts:
                raise
            storage_limits.retrying(store, attempt, storage_limits.why(e, _status_of(e)))
            await asyncio.sleep(limits.backoff_s(attempt))
            continue
        storage_limits.answered(store)
        return data
    raise AssertionError("unreachable: the last attempt returns or raises")


def _status_of(err: BaseException) -> int | None:
    """The HTTP status a failed request was answered with, when obstore's text names one (5xx, 429)."""
    found = re.search(r"\b(429|5\d\d)\b", str(err))
    return int(found.group(1)) if found and "status" in str(err).lower() else None


async def _get_all(reads: Sequence[tuple[str, Future[bytes]]], max_bytes: int | None) -> None:
    async def one(url: str, future: Future[bytes]) -> None:
        try:
            future.set_result(await _get(url, max_bytes))
        except BaseException as e:  # noqa: BLE001 - the reader of the URL gets it
            future.set_exception(e)

    await asyncio.gather(*(one(u, f) for u, f in reads))


def start(reads: Sequence[tuple[str, Future[bytes]]], max_bytes: int | None = None) -> None:
    """Issue a GET for each ``(url, future)`` now, all in flight together; each future gets the object's bytes,
    or :class:`FileNotFoundError`/:class:`PermissionError`/:class:`OSError`/:class:`ObjectTooLarge`."""
    if reads:
        asyncio.run_coroutine_threadsafe(_get_all(reads, max_bytes), _loop())


def read(url: str, max_bytes: int | None = None) -> bytes:
    """One object's bytes (a blocking :func:`start` of one read)."""
    future: Future[bytes] = Future()
    start([(url, future)], max_bytes)
    return future.result()
