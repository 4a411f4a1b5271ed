"""Objects in a store (``s3://``, ``gs://``) through fsspec: the object-store half of :mod:`segtrain.storage`.

A URL becomes a ``UPath`` (universal-pathlib over fsspec), with the methods a :class:`pathlib.Path` has (``/``,
``name``, ``exists``, ``iterdir``). Object stores need the ``storage`` extra (s3fs, gcsfs); without it a URL is
one line naming ``pip install -e '.[storage]'``, and local paths never import any of it.

Credentials are the libraries' own (``AWS_ACCESS_KEY_ID``/``AWS_PROFILE``, ``GOOGLE_APPLICATION_CREDENTIALS``):
none ever pass through a config, a log or a checkpoint. An S3-compatible store of a team's own (MinIO, Ceph) is
named by the standard ``AWS_ENDPOINT_URL`` or the ``storage.endpoint_url`` config key (:func:`configure`).

Requests are bounded (:mod:`segtrain.storage.limits`, the ``storage.*`` timeouts and retries): botocore retries
5xx, throttling, timeouts and dropped connections with backoff, each retry one warning, and s3fs adds no retry
loop of its own on top; a missing object, a denied request or a store that never answered is one line naming
the URL (:func:`segtrain.storage.errors.storage_error`). Only ``s3://``, ``gs://`` and local paths are accepted
(:data:`segtrain.storage.urls.SCHEMES`). Each process has its own client: fsspec keys its instance cache on the
process id, so a loader worker forked from the main process never shares the parent's connections or event loop.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import segtrain.storage.limits as storage_limits
import segtrain.storage.object_reads as object_reads
from segtrain.storage.errors import StorageError, client_failures, describe, storage_error
from segtrain.storage.urls import SCHEMES, is_remote, scheme_of

#: Connections: as many as reads in flight (botocore's default pool of 10 would queue the rest).
#: The package each protocol needs, for the one-line message when it is absent.
_NEEDS = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}
_POOL_CONNECTIONS = int(os.environ.get("SEGTRAIN_READ_AHEAD", "16")) + 4
INSTALL_HINT = "pip install -e '.[storage]'"
#: The parent's fsspec file systems, held for the life of a forked child (:func:`_hold_inherited_clients`).
_INHERITED: list[Any] = []


def _hold_inherited_clients() -> None:
    """In a forked child (a loader worker): keep the parent's fsspec file systems alive for good.

    Why: fsspec forgets them at its first use in the child (its instance cache is per process), and the garbage
    collector, run at whatever moment, would then call s3fs's (gcsfs's) finalizer, which closes the session on
    the parent's event loop: that loop's thread did not survive the fork, so the finalizer waits out its timeout,
    a second or two per session, in whichever thread collected (a worker's result queue, stalling its batches).
    A child ends with ``os._exit``, which never runs such finalizers; the connections were the parent's anyway.
    """
    fsspec = sys.modules.get("fsspec")
    if fsspec is None:  # no client was ever made: nothing inherited
        return
    classes = [fsspec.AbstractFileSystem]
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        _INHERITED.extend(cls.__dict__.get("_cache", {}).values())


os.register_at_fork(after_in_child=_hold_inherited_clients)


def configure(
    endpoint_url: str | None = None,
    connect_timeout_s: float | None = None,
    read_timeout_s: float | None = None,
    retries: int | None = None,
) -> None:
    """Apply the ``storage`` config group: ``endpoint_url`` becomes ``AWS_ENDPOINT_URL``, which botocore reads,
    and the bounds their ``SEGTRAIN_STORAGE_*`` variables, so loader workers and child processes use the same
    store, with the same patience, without a client being handed to them."""
    if endpoint_url:
        os.environ["AWS_ENDPOINT_URL"] = str(endpoint_url)
    storage_limits.configure(connect_timeout_s, read_timeout_s, retries)


def _options(scheme: str) -> dict[str, Any]:
    """The client options of ``scheme``: for S3, the ``storage.*`` timeouts and botocore's standard retry mode
    making ``retries + 1`` attempts in all (5xx, throttling, timeouts, dropped connections, with backoff)."""
    if scheme in ("s3", "s3a"):
        limits = storage_limits.current()
        options: dict[str, Any] = {
            "config_kwargs": {
                "connect_timeout": limits.connect_timeout_s,
                "read_timeout": limits.read_timeout_s,
                "retries": {"total_max_attempts": limits.attempts, "mode": "standard"},
                "max_pool_connections": _POOL_CONNECTIONS,
            }
        }
        endpoint = os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:  # part of the client's identity: another endpoint (storage.endpoint_url) is another client
            options["endpoint_url"] = endpoint
        return options
    return {}


def _tuned(fs: Any) -> Any:
    """``fs`` (an fsspec file system) with segtrain's retry policy, once per instance: s3fs's own retry loop
    (5 tries of each of botocore's attempts, the 15-minute silence) reduced to one try, and each of botocore's
    retries announced in a line (:func:`segtrain.storage.limits.observe_botocore_attempt`)."""
    if getattr(fs, "_segtrain_tuned", False) or type(fs).__name__ != "S3FileSystem":
        return fs
    fs.retries = 1
    if getattr(fs, "session", None) is None:  # the session its clients are made from: observe their retries
        from aiobotocore.session import AioSession

        session = AioSession()
        session.register("needs-retry.s3", storage_limits.observe_botocore_attempt)
        session.register("before-send.s3", _without_expect_continue)
        fs.session = session
        fs._session_is_owned = False  # a refreshed client (new credentials) is made from it too, with the handlers
    fs._segtrain_tuned = True
    return fs


def _without_expect_continue(request: Any = None, **_: Any) -> None:
    """Send a PUT's body at once, without ``Expect: 100-continue`` (not a signed header): aiohttp starts its read
    timeout only once the body is sent, so a store that never answers the header held an upload forever."""
    if request is not None and "Expect" in request.headers:
        del request.headers["Expect"]


def location(url: Any) -> Any:
    """The ``UPath`` of ``url`` (a URL, or already a ``UPath``), its client tuned (:func:`_tuned`); one line when
    the scheme is refused or its package is not installed.

    Typed ``Any`` because a ``UPath`` is a ``PathBase``, not a ``Path``: callers use the methods both have."""
    if hasattr(url, "fs"):
        return url
    url = str(url)
    scheme = scheme_of(url) or ""
    if scheme not in SCHEMES:
        raise StorageError(
            f"{url}: {scheme}:// is not supported; segtrain reads and writes s3:// and gs:// URLs and local paths "
            "(docs/storage.md). Copy it to one of those"
        )
    try:
        from upath import UPath

        found = UPath(url, **_options(scheme))
        _tuned(found.fs)
        return found
    except ImportError as e:
        needs = _NEEDS.get(scheme, "the fsspec implementation for it")
        raise StorageError(
            f"{url} is a {scheme}:// URL, which needs {needs} ({INSTALL_HINT}): {e.name or e} is not installed"
        ) from None
    except ValueError as e:  # fsspec: "Protocol not known"
        raise StorageError(f"{url}: {e}") from None


def read_bytes(path: Any, what: str = "object", max_bytes: int | None = None) -> bytes:
    """The whole content of the object at ``path`` in one GET (one line on failure, see :func:`storage_error`),
    served from the read-ahead of :func:`prefetch` when it was asked for."""
    ahead = _AHEAD.pop(str(path), None)
    if ahead is not None:
        try:
            data = ahead.result()
        except object_reads.ObjectTooLarge as e:
            raise StorageError(
                f"{what} {describe(path)} is {e.size:,} bytes, more than the limit of {e.limit:,}"
            ) from None
        except StorageError:
            raise
        except client_failures() as e:  # from obstore's reads (s3fs's come here as StorageError already)
            raise storage_error(path, e, what) from None
        if max_bytes is not None and len(data) > max_bytes:  # read ahead without knowing this caller's limit
            raise StorageError(f"{what} {describe(path)} is {len(data):,} bytes, more than the limit of {max_bytes:,}")
        return data
    return _read_remote(path, what, max_bytes)


def _client(path: Any) -> tuple[Any, str]:
    """This process's client for ``path``'s protocol and the path within it. fsspec keeps one instance per
    process and options (a forked loader worker makes its own: an async client's event loop does not survive a
    fork), so a read costs no client creation and no path object."""
    import fsspec

    text = str(path)
    scheme = scheme_of(text) or "file"
    fs = _tuned(fsspec.filesystem(scheme, **_options(scheme)))
    return fs, fs._strip_protocol(text)


def _checked(data: Any, path: Any, what: str, max_bytes: int | None) -> bytes:
    if max_bytes is not None and len(data) > max_bytes:
        raise StorageError(f"{what} {describe(path)} is more than the limit of {max_bytes:,} bytes")
    return bytes(data)


def _read_remote(path: Any, what: str, max_bytes: int | None) -> bytes:
    """One GET, always a ranged one (``bytes=0-max_bytes``, or ``bytes=0-`` without a limit): neither the limit
    nor the client's own size check (s3fs asks for the size first to split a plain GET of a large object into
    parts) then costs a HEAD, a second round trip to the store per image."""
    fs, key = _client(path)
    if getattr(fs, "async_impl", False):  # the coroutine below, on the client's own event loop
        from fsspec.asyn import sync

        return bytes(sync(fs.loop, _read_async, fs, key, path, what, max_bytes))
    try:
        try:
            data = fs.cat_file(key, start=0, end=None if max_bytes is None else max_bytes + 1)
        except OSError as e:
            if "range" not in str(e).lower():  # an empty object has no byte 0 to start a range at
                raise
            data = fs.cat_file(key)
        return _checked(data, path, what, max_bytes)
    except StorageError:
        raise
    except client_failures() as e:
        raise storage_error(path, e, what) from None


async def _read_async(fs: Any, key: str, path: Any, what: str, max_bytes: int | None) -> bytes:
    """:func:`_read_remote` as a coroutine of an async client (s3fs, gcsfs): many run in one event loop, with no
    thread per request."""
    try:
        try:
            data = await fs._cat_file(key, start=0, end=None if max_bytes is None else max_bytes + 1)
        except OSError as e:
            if "range" not in str(e).lower():
                raise
            data = await fs._cat_file(key)
        return _checked(data, path, what, max_bytes)
    except StorageError:
        raise
    except client_failures() as e:
        raise storage_error(path, e, what) from None


async def _read_all(fs: Any, reads: list[tuple[Any, Future[bytes]]], what: str, max_bytes: int | None) -> None:
    """Issue ``reads`` together on the client's event loop (its connection pool bounds how many are on the wire)
    and hand each result, or its one-line error, to its future."""

    async def one(path: Any, future: Future[bytes]) -> None:
        try:
            future.set_result(await _read_async(fs, fs._strip_protocol(str(path)), path, what, max_bytes))
        except BaseException as e:  # noqa: BLE001 - the reader of the path gets it
            future.set_exception(e)

    await asyncio.gather(*(one(p, f) for p, f in reads))


#: Reads in flight per process: the size of the clients' connection pools (and of the thread pool of a client
#: without an event loop).
READ_AHEAD_THREADS = int(os.environ.get("SEGTRAIN_READ_AHEAD", "16"))
_POOL: tuple[int, ThreadPoolExecutor] | None = None
_AHEAD: dict[str, Future[bytes]] = {}
_AHEAD_PID = os.getpid()


def prefetch(paths: Iterable[Any], what: str = "image file", max_bytes: int | None = None, native: bool = True) -> int:
    """Start reading the remote ones of ``paths`` now: a store with 20-50 ms per request then serves a whole batch
    in about one round trip, while the caller decodes the first images. ``s3://`` objects go through obstore
    where :func:`segtrain.storage.object_reads.usable` allows (a fraction of s3fs's CPU per request); other async
    clients (s3fs, gcsfs) issue them together as coroutines in their one event loop (no thread, no client per request);
    any other runs them in this process's thread pool. :func:`read_bytes` takes the result (or its error) when
    the path is read. ``native=False`` keeps obstore out of this process: one that forks loader workers later
    (reading annotation files) must not start its runtime, which a fork does not carry over.
    Returns how many were started."""
    global _POOL, _AHEAD_PID
    if os.getpid() != _AHEAD_PID:  # reads started before a fork have no event loop or thread here
        _AHEAD.clear()
        _AHEAD_PID = os.getpid()
    batches: dict[int, tuple[Any, list[tuple[Any, Future[bytes]]]]] = {}
    direct: list[tuple[str, Future[bytes]]] = []
    started = 0
    for path in paths:
        if path is None or not is_remote(path) or str(path) in _AHEAD:
            continue
        if native and object_reads.usable(str(path)):
            future: Future[bytes] = Future()
            direct.append((str(path), future))
            _AHEAD[str(path)] = future
            started += 1
            continue
        fs, _ = _client(path)
        if getattr(fs, "async_impl", False):
            future = Future()
            batches.setdefault(id(fs), (fs, []))[1].append((path, future))
        else:
            if _POOL is None or _POOL[0] != os.getpid():
                _POOL = (os.getpid(), ThreadPoolExecutor(READ_AHEAD_THREADS, thread_name_prefix="segtrain-read"))
            future = _POOL[1].submit(_read_remote, path, what, max_bytes)
        _AHEAD[str(path)] = future
        started += 1
    object_reads.start(direct, max_bytes)
    for fs, reads in batches.values():
        asyncio.run_coroutine_threadsafe(_read_all(fs, reads, what, max_bytes), fs.loop)
    while len(_AHEAD) > 4 * READ_AHEAD_THREADS:  # read ahead and never used (a skipped item): forget the oldest
        _AHEAD.pop(next(iter(_AHEAD)))
    return started


def reading_ahead(paths: Sequence[Any], what: str, max_bytes: int | None = None) -> Iterator[Any]:
    """``paths`` in order, each remote one's read started a window ahead (:func:`prefetch`), so that reading a
    folder of annotation files from a store takes about one round trip per window, not one per file. Local
    paths pass through untouched."""
    window = 2 * READ_AHEAD_THREADS
    for k, path in enumerate(paths):
        if k % READ_AHEAD_THREADS == 0:
            prefetch(paths[k : k + window], what, max_bytes, native=False)
        yield path


def write_bytes(path: Any, data: bytes) -> None:
    """Replace the remote object at ``path`` with ``data``, all or nothing.

    One PUT of the whole object (or, above the client's part size, a multipart upload that is completed last):
    an object store never shows a partial object under its name, so a reader sees the old object or the new one,
    also when the writer is killed mid-upload. Nothing is written beside it (no temporary name to leave behind)."""
    loc = location(path)
    try:
        loc.fs.pipe_file(loc.path, bytes(data))
    except client_failures() as e:
        raise storage_error(loc, e, "writing") from None
    invalidate(loc)


def remove(path: Any) -> None:
    """Delete one remote object; a missing one is not an error."""
    loc = location(path)
    try:
        loc.fs.rm_file(loc.path)
    except FileNotFoundError:
        pass
    except client_failures() as e:
        raise storage_error(loc, e, "deleting") from None
    invalidate(loc)


def invalidate(loc: Any) -> None:
    """Forget the client's cached listing of ``loc``'s folder (it lists again after a write or delete)."""
    fs = getattr(loc, "fs", None)
    if fs is not None and hasattr(fs, "invalidate_cache"):
        fs.invalidate_cache(loc.parent.path)


def names_in(folder: Any) -> list[str]:
    """The names of the objects directly under a remote folder (prefix); empty when there are none."""
    loc = location(folder)
    invalidate(loc / "x")
    try:
        entries = loc.fs.ls(loc.path, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    except client_failures() as e:
        raise storage_error(loc, e, "listing") from None
    return sorted(str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries)


def files_under(folder: Any, depth: int | None = None) -> dict[str, dict[str, Any]]:
    """Every object under a remote folder (prefix), by its path relative to the folder, with the store's metadata
    (size, ETag): one listing request per 1000 objects, where a walk would list each sub-folder. ``depth``: only
    the objects at most that many levels down (1: directly in the folder), still from the one listing."""
    loc = location(folder)
    root = str(loc.path).rstrip("/") + "/"
    try:
        found = loc.fs.find(root, detail=True)
    except FileNotFoundError:
        return {}
    except client_failures() as e:
        raise storage_error(loc, e, "listing") from None
    return {
        name[len(root) :]: dict(meta)
        for name, meta in found.items()
        if name.startswith(root) and (depth is None or name[len(root) :].count("/") < depth)
    }


def info(path: Any) -> dict[str, Any] | None:
    """The store's metadata of one object (size, ETag, version), None when it does not exist."""
    loc = location(path)
    try:
        return dict(loc.fs.info(loc.path))
    except FileNotFoundError:
        return None
    except client_failures() as e:
        raise storage_error(loc, e) from None


def fingerprint(path: Any, listed: dict[str, Any] | None = None) -> tuple[str, int]:
    """(version, size) identifying an object's content without reading it: its VersionId on a versioned bucket,
    else its ETag (S3, MinIO, Ceph), generation (GCS) or modification time. Index caches key on it. ``listed``:
    what a listing said of the object (:func:`files_under`), which then costs no request."""
    meta = listed or info(path)
    if meta is None:
        raise StorageError(f"{location(path)} not found (no such object): check the URL")
    for key in ("VersionId", "version_id", "generation", "ETag", "etag", "md5Hash", "LastModified", "mtime"):
        value = meta.get(key)
        if value not in (None, "", "null"):
            return f"{key}:{str(value).strip(chr(34))}", int(meta.get("size") or 0)
    return "size", int(meta.get("size") or 0)
