"""Secrets out of what a run records: logs, checkpoints' stored config, ``.hydra/``, trackers' parameters.

A URI may carry credentials (``https://user:password@host``, ``?token=...``, a presigned URL's
``X-Amz-Signature``), and the environment holds others (``AWS_SECRET_ACCESS_KEY``,
``MLFLOW_TRACKING_PASSWORD``, ``WANDB_API_KEY``...). Whatever segtrain writes down passes through
:func:`text` or :func:`tree`: the userinfo becomes ``***@``, a secret query value ``***``, and any literal
value of a secret environment variable ``***``. The live config keeps the real values: only the record is
masked. Imports no package of segtrain (every layer uses it).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"

#: Query parameters whose value is a credential (compared case-insensitively): tokens, signatures, keys.
SECRET_PARAMS = frozenset(
    {
        "token",
        "access_token",
        "auth",
        "auth_token",
        "api_key",
        "apikey",
        "key",
        "password",
        "passwd",
        "pwd",
        "secret",
        "sig",
        "signature",
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
        "x-goog-signature",
        "x-goog-credential",
    }
)

#: Environment variables whose values are secrets: a name holding one of these words.
SECRET_ENV = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|CREDENTIAL|PRIVATE_KEY|AUTH", re.I)
#: Shorter values are not searched for in text (``1``, ``true`` would mask unrelated words).
MIN_SECRET_LEN = 8
#: Values that are no secret though their variable's name says so: a path (``XAUTHORITY``, ``SSH_AUTH_SOCK``),
#: a plain lower-case word or a number (``AUTH_MODE=disabled``), which would mask ordinary words in the logs.
_NOT_SECRET = re.compile(r"[/~.].*|[a-z_-]+|[0-9.]+")

_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>\]\[,}{]+")


def uri(value: str) -> str:
    """``value`` (one URI) with its userinfo replaced by ``***@`` and secret query values by ``***``."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return value
    netloc, query = parts.netloc, parts.query
    if "@" in netloc:
        netloc = f"{MASK}@" + netloc.rsplit("@", 1)[1]
    if query and any(k.lower() in SECRET_PARAMS for k, _ in parse_qsl(query, keep_blank_values=True)):
        pairs = [(k, MASK if k.lower() in SECRET_PARAMS else v) for k, v in parse_qsl(query, keep_blank_values=True)]
        query = urlencode(pairs, safe="*/:")
    if (netloc, query) == (parts.netloc, parts.query):
        return value
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def environment_secrets() -> list[str]:
    """The values of this process's secret environment variables (longest first, so none masks a part of
    another)."""
    values = {
        v
        for k, v in os.environ.items()
        if SECRET_ENV.search(k) and len(v) >= MIN_SECRET_LEN and not _NOT_SECRET.fullmatch(v)
    }
    return sorted(values, key=len, reverse=True)


def text(value: str, secrets: list[str] | None = None) -> str:
    """``value`` with every URI in it masked (:func:`uri`) and every secret environment value replaced."""
    if "://" in value:
        value = _URI.sub(lambda m: uri(m.group(0)), value)
    for secret in environment_secrets() if secrets is None else secrets:
        if secret in value:
            value = value.replace(secret, MASK)
    return value


def tree(obj: Any) -> Any:
    """A copy of ``obj`` (dicts, lists, tuples, strings, scalars) with every string masked by :func:`text`."""
    secrets = environment_secrets()

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            return text(node, secrets)
        if isinstance(node, Mapping):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list | tuple):
            return type(node)(walk(v) for v in node) if isinstance(node, tuple) else [walk(v) for v in node]
        return node

    return walk(obj)


@contextlib.contextmanager
def masked_argv() -> Iterator[None]:
    """``sys.argv`` masked for the duration: a library that records the command line itself (W&B's run
    metadata) records it without credentials."""
    saved = sys.argv
    sys.argv = [text(a) for a in saved]
    try:
        yield
    finally:
        sys.argv = saved
