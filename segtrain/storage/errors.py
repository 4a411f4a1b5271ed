"""Why an object store failed, in one line naming the URL: missing, denied, no credentials, or unreachable.

Both clients (s3fs and obstore, :mod:`segtrain.storage.object_reads`) raise builtin types or their own; every
one is worded here, so a failing store reads alike whichever client met it.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import segtrain.storage.limits as storage_limits
from segtrain.core.errors import UserError


class StorageError(UserError, OSError):
    """A remote object is missing, denied, or its store unreachable; the message names the URL.

    One that says the store could not be reached marks it so in the process that raises it, also when a loader
    worker's error is raised again in the main process (made anew from its text): the run's way out then skips
    the requests that would wait out the retries again (:func:`segtrain.storage.limits.unreachable`)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        if args and isinstance(args[0], str) and UNREACHABLE_WORDS in args[0]:
            storage_limits.mark_unreachable()


#: HTTP 403 in a client's text ("An error occurred (403)"), not three digits of a port or an address (":34035").
_STATUS_403 = re.compile(r"(?<![\d:.])403(?!\d)")
#: How :func:`storage_error` begins the line of a store that did not answer.
UNREACHABLE_WORDS = "cannot reach "


def client_failures() -> tuple[type[BaseException], ...]:
    """What a client raises when a store fails: builtin OSError/ValueError (s3fs's translations, obstore's via
    :func:`segtrain.storage.object_reads.error_of`) and botocore's/aiohttp's own errors (a refused port, a read timeout,
    a dropped connection), which are neither."""
    found: list[type[BaseException]] = [OSError, ValueError]
    for module, name in (("botocore.exceptions", "BotoCoreError"), ("aiohttp", "ClientError")):
        loaded = sys.modules.get(module)
        if loaded is not None:
            found.append(getattr(loaded, name))
    return tuple(found)


def describe(path: Any) -> str:
    """The path as the user wrote it: ``s3://bucket/key`` for a remote one."""
    return str(path)


def storage_error(path: Any, err: BaseException, what: str = "object") -> StorageError:
    """One line for a failed remote operation on ``path``: missing, denied, or (else) unreachable."""
    name = describe(path)
    subject = f"{name} ({what})" if what in ("writing", "deleting", "listing") else f"{what} {name}".strip()
    text = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
    if isinstance(err, FileNotFoundError):
        detail = "the bucket does not exist" if "bucket" in text.lower() else "no such object"
        return StorageError(f"{subject} not found ({detail}): check the URL")
    if isinstance(err, PermissionError) or "AccessDenied" in text or "Forbidden" in text or _STATUS_403.search(text):
        return StorageError(
            f"access to {name} denied ({text}): check the credentials the environment gives "
            "(AWS_ACCESS_KEY_ID/AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS) and the bucket's policy"
        )
    if "NoCredentials" in type(err).__name__ or "Unable to locate credentials" in text:
        return StorageError(
            f"no credentials for {subject}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the "
            "environment"
        )
    limits = storage_limits.current()
    return StorageError(
        f"{UNREACHABLE_WORDS}{subject}: {storage_limits.why(err)}, {limits.attempts} attempt(s) "
        f"(storage.retries={limits.retries}) at {storage_limits.endpoint()}. Check that the store is up and that "
        "AWS_ENDPOINT_URL/storage.endpoint_url names it (raise storage.read_timeout_s for a slow one)"
    )


#: Where a store client's code lives: an error raised through it is the store's, not a local file's.
_CLIENT_CODE = ("/s3fs/", "/gcsfs/", "/botocore/", "/aiobotocore/", "/obstore/", "/upath/", "/fsspec/", "/aiohttp/")


def client_failure(err: BaseException) -> StorageError | None:
    """The one line for an error a store client raised outside segtrain's own wrappers (a ``UPath`` method such as
    ``exists()`` called on a URL), None for any other error: a failure of botocore's or aiohttp's own types, or an
    OSError raised from a client's code, names the store and what failed."""
    if isinstance(err, UserError):
        return None
    own = type(err).__module__.split(".")[0] in ("botocore", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "obstore")
    tb = err.__traceback__
    while not own and tb is not None:
        own = any(part in tb.tb_frame.f_code.co_filename for part in _CLIENT_CODE)
        tb = tb.tb_next
    if not own or not isinstance(err, client_failures()):
        return None
    return storage_error(f"the object store at {storage_limits.endpoint()}", err, "")
