"""``python -m segtrain.launch [torchrun arguments] -m segtrain.train ...``: torchrun, quiet on user errors.

torchrun's launcher process reports every worker that exits non-zero with a ``ChildFailedError``
traceback and failure table (about 45 lines), also after a user error whose one line already said
everything; none of segtrain's code runs in that process to stop it. This wrapper runs the same
launcher (``torch.distributed.run``, the same arguments and behaviour) and, when the job failed only
because of user errors (workers exiting with status 2, the others stopped by the launcher), exits
with status 2 and leaves the worker's one line as the whole output. Any other failure keeps the
launcher's full report.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import signal
import socket
import sys

from segtrain.errors import EXIT_USER_ERROR, ConfigError


def user_error_only(exitcodes: list[int]) -> bool:
    """A failure is a user error when some worker exited with status 2 and every other failed worker was
    stopped by the launcher (SIGTERM/SIGKILL) or also exited with status 2."""
    stopped = (-signal.SIGTERM, -signal.SIGKILL)
    return EXIT_USER_ERROR in exitcodes and all(c in (EXIT_USER_ERROR, *stopped) for c in exitcodes)


class _QuietAfterUserError(logging.Filter):
    """Drops the agent's lines about a worker that exited with status 2 and the workers it stops then."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        quiet = (f"(exitcode: {EXIT_USER_ERROR})", "closing signal", "no error file defined for parent")
        return not any(q in text for q in quiet)


#: Words torchrun accepts for --nproc_per_node besides a number.
NPROC_WORDS = ("auto", "cpu", "gpu", "xpu")


def check_launch_args(args: argparse.Namespace) -> None:
    """What torchrun would meet with a traceback (``--nproc_per_node 0``: an AssertionError; ``abc``: a
    ValueError) or a silent wait (a rendezvous port another program listens on), said in one line first."""
    nproc = str(args.nproc_per_node)
    if not (nproc.isdigit() and int(nproc) >= 1) and nproc not in NPROC_WORDS:
        raise ConfigError(
            f"--nproc_per_node {nproc}: give the number of processes on this node (1 or more), or one of "
            f"{', '.join(NPROC_WORDS)}"
        )
    endpoint = rendezvous_endpoint(args)
    if endpoint is not None:
        check_port_free(*endpoint)


def rendezvous_endpoint(args: argparse.Namespace) -> tuple[str, int] | None:
    """(host, port) of the rendezvous store that torchrun would start on this node, or None when it picks a free
    port itself (``--standalone``, one node without a port), another node hosts it, or a c10d rendezvous of
    several nodes may find it already listening (another node's agent on this machine)."""
    if args.standalone:
        return None
    if args.rdzv_backend == "static" and not args.rdzv_endpoint:
        if args.master_port is None and str(args.nnodes).split(":")[-1] == "1":
            return None  # torchrun then takes localhost:0, a free port
        if int(args.node_rank) != 0:
            return None  # node 0 hosts it
        return str(args.master_addr), int(args.master_port or 29500)
    if str(args.nnodes).split(":")[-1] != "1":
        return None  # several nodes' agents on one machine share the host's store by design (c10d's fallback)
    host, _, port = str(args.rdzv_endpoint).rpartition(":")
    if not host or not port.isdigit():
        host, port = str(args.rdzv_endpoint), "29400"  # c10d's default port
    host = host.strip("[]")
    return (host, int(port)) if int(port) and _is_local(host) else None


def _is_local(host: str) -> bool:
    """Whether ``host`` names this machine (the node that would host the store on it)."""
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    own = {"127.0.0.1", "::1"}
    for name in (socket.gethostname(), socket.getfqdn()):
        with contextlib.suppress(OSError):
            own |= {str(info[4][0]) for info in socket.getaddrinfo(name, None)}
    return any(a in own or a.startswith("127.") for a in addresses)


def check_port_free(host: str, port: int) -> None:
    """torchrun's store on a port another program listens on connects to that program and waits for ever."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed connection's TIME_WAIT is no listener
        try:
            s.bind(("", port))
        except OSError as e:
            if e.errno not in (errno.EADDRINUSE, errno.EACCES):
                return
            raise ConfigError(
                f"the rendezvous port {port} ({host}:{port}) is in use by another program, so torchrun would wait "
                "for it without a word: choose a free port (--rdzv-endpoint HOST:PORT or --master-port PORT), or "
                "--standalone on one node"
            ) from None


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser
    from torch.distributed.run import main as torchrun_main

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        check_launch_args(get_args_parser().parse_args(args))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)
    for name in ("multiprocessing.api", "multiprocessing.errors.error_handler"):
        logging.getLogger(f"torch.distributed.elastic.{name}").addFilter(_QuietAfterUserError())
    try:
        torchrun_main(args)
    except ChildFailedError as e:
        if user_error_only([f.exitcode for f in e.failures.values()]):
            sys.exit(EXIT_USER_ERROR)
        raise


if __name__ == "__main__":
    main()
