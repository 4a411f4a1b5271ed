"""A run directory on an object store belongs to one run: a lock object with its owner and a lease.

An object store has no ``flock`` and no process that dies with its holder, so ownership is an object,
``<dir>/.lock``: JSON naming the owner (host, pid, run id, local run directory) and when its lease ends. The
owner renews the lease from a thread while it runs and deletes the object when it ends. A second run meets
a live lease and is refused with one line naming the owner (as a local run directory refuses a second run);
a lease that ran out belongs to a run that died without releasing it (SIGKILL, a lost node), and is taken over
with a line saying so. Creating the object is conditional (``If-None-Match: *``) and taking one over replaces
only the expired version read (``If-Match``), so two runs starting at once cannot both win; on a store
without conditional writes the lock is read back after writing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from segtrain import storage
from segtrain.config import ConfigError

log = logging.getLogger("segtrain.run_dir")

LOCK_NAME = ".lock"
#: How long a lease lasts without renewal: a dead run's directory is free again after this.
LEASE_S = float(os.environ.get("SEGTRAIN_LEASE_S", "120"))


class LeaseLock:
    """``<dir>/.lock`` on an object store, held with a renewed lease (``acquire``, ``release``)."""

    def __init__(self, folder: Any, local_dir: Any = None, lease_s: float = LEASE_S) -> None:
        self.path = storage.join(folder, LOCK_NAME)
        self.lease_s = float(lease_s)
        self.owner = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "run_id": uuid.uuid4().hex[:12],
            "run_dir": str(local_dir) if local_dir is not None else None,
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.held = False

    def _content(self) -> bytes:
        now = time.time()
        return json.dumps({**self.owner, "since": round(now, 3), "expires": round(now + self.lease_s, 3)}).encode()

    def _read(self) -> tuple[dict[str, Any] | None, str | None]:
        """(the lock's content, its ETag), (None, None) when there is no lock."""
        meta = storage.info(self.path)
        if meta is None:
            return None, None
        try:
            content = json.loads(storage.read_bytes(self.path, what="run lock"))
        except (ValueError, storage.StorageError):
            content = {}
        return (content if isinstance(content, dict) else {}), str(meta.get("ETag") or "") or None

    def _put(self, **condition: Any) -> bool:
        """Write our lock under ``condition`` (IfNoneMatch/IfMatch); False when the store says it no longer holds."""
        loc = self.path
        try:
            if condition.get("IfNoneMatch"):
                loc.fs.pipe_file(loc.path, self._content(), mode="create")
            else:
                loc.fs.pipe_file(loc.path, self._content(), **condition)
        except (FileExistsError, PermissionError) as e:
            if isinstance(e, PermissionError):
                raise storage.storage_error(loc, e, "run lock") from None
            return False
        except (TypeError, NotImplementedError, ValueError):  # a store without conditional writes
            storage.write_bytes(loc, self._content())
        except storage.client_failures() as e:
            if "PreconditionFailed" in str(e) or "412" in str(e):
                return False
            raise storage.storage_error(loc, e, "run lock") from None
        storage.invalidate(loc)
        content, _ = self._read()
        return content is not None and content.get("run_id") == self.owner["run_id"]

    def acquire(self) -> LeaseLock:
        """Hold the lock, or raise :class:`ConfigError` naming the live owner; takes over an expired lease."""
        for _ in range(3):  # lost a race: read again
            content, etag = self._read()
            if content is None:
                if self._put(IfNoneMatch="*"):
                    break
                continue
            expires = float(content.get("expires") or 0)
            if expires > time.time():
                raise ConfigError(
                    f"{self.path.parent} is in use by {describe_owner(content)} (its lease runs until "
                    f"{time.strftime('%H:%M:%S', time.localtime(expires))}, renewed while it runs): two runs must not "
                    "write into one run directory. Wait for it to finish, or choose another trainer.checkpoint.dir"
                )
            if self._put(**({"IfMatch": etag} if etag else {})):
                log.warning(
                    "%s: took over the run lock of %s, whose lease expired at %s without renewal (that run ended "
                    "without releasing it)",
                    self.path.parent,
                    describe_owner(content),
                    time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(expires)),
                )
                break
        else:
            raise ConfigError(f"{self.path}: another run took the run lock at the same time; try again")
        self.held = True
        self._thread = threading.Thread(target=self._renew, name="segtrain-lease", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 4):
            try:
                storage.write_bytes(self.path, self._content())
            except storage.StorageError as e:  # the store is unreachable for a while: keep trying
                log.warning("could not renew the run lock %s: %s", self.path, e)

    def release(self) -> None:
        """Stop renewing and delete the lock object, if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if not self.held:
            return
        self.held = False
        if storage.unreachable():  # the store stopped answering: the lease expires on its own
            return
        with contextlib.suppress(storage.StorageError):
            content, _ = self._read()
            if content is not None and content.get("run_id") == self.owner["run_id"]:
                storage.remove(self.path)


def describe_owner(content: dict[str, Any]) -> str:
    """``segtrain pid 123 on node-7 (run 3f2a...), since 10:02:11``."""
    since = content.get("since")
    when = f", since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(float(since)))}" if since else ""
    who = f"segtrain pid {content.get('pid', '?')} on {content.get('host', '?')}"
    return f"{who} (run {content.get('run_id', '?')}){when}"
