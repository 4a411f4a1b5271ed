"""Make every TCPStore(...) call in Debian's torch.distributed follow USE_LIBUV (docker/build_standin.sh).

Debian builds torch without libuv, but TCPStore asks for libuv by default and torchrun's rendezvous and the
workers' stores do not all pass the USE_LIBUV setting on, so torchrun cannot start there. NGC's torch has
libuv. Each call without a use_libuv keyword gets one that reads USE_LIBUV (the stand-in sets it to 0).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

KEYWORD = 'use_libuv=__import__("os").environ.get("USE_LIBUV", "1") == "1"'


def patch(path: Path) -> int:
    """Adds the keyword, last, to the calls in ``path``; returns how many."""
    text = path.read_text()
    calls = [
        node
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) == "TCPStore" or getattr(node.func, "attr", None) == "TCPStore")
        and not any(k.arg == "use_libuv" for k in node.keywords)
        and not any(k.arg is None for k in node.keywords)  # **kwargs may carry it already
    ]
    data = text.encode()  # ast's columns count UTF-8 bytes
    starts = [0]
    for line in data.split(b"\n"):  # as ast counts lines (splitlines would also split at form feeds)
        starts.append(starts[-1] + len(line) + 1)
    closing = sorted(starts[(c.end_lineno or 1) - 1] + (c.end_col_offset or 1) - 1 for c in calls)
    for at in reversed(closing):  # the last call first: earlier offsets stay valid
        assert data[at : at + 1] == b")", (path, at)
        before = data[:at].rstrip()
        sep = b"" if before.endswith((b",", b"(")) else b", "
        data = before + sep + KEYWORD.encode() + data[at:]
    if calls:
        path.write_bytes(data)
    return len(calls)


if __name__ == "__main__":
    total = sum(patch(p) for p in sorted(Path(sys.argv[1]).rglob("*.py")))
    print(f"standin_libuv: {total} TCPStore calls follow USE_LIBUV")
    sys.exit(0 if total else 1)
