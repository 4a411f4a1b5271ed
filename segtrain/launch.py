"""``python -m segtrain.launch [torchrun arguments] -m segtrain.train ...``: torchrun, quiet on user errors.

torchrun's launcher process reports every worker that exits non-zero with a ``ChildFailedError``
traceback and failure table (about 45 lines), also after a user error whose one line already said
everything; none of segtrain's code runs in that process to stop it. This wrapper runs the same
launcher (``torch.distributed.run``, the same arguments and behaviour) and, when the job failed only
because of user errors (workers exiting with status 2, the others stopped by the launcher), exits
with status 2 and leaves the worker's one line as the whole output. Any other failure keeps the
launcher's full report.

SIGTERM or Ctrl-C: torchrun's agent passes the signal on to the workers, waits up to 30 s while they finish
their step and save last.pt, then ends with a ``SignalException`` traceback and status 1. Here the workers'
one line is the whole output and the status is 75 (preempted), as without torchrun.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import signal
import socket
import sys

from segtrain.core.errors import EXIT_PREEMPTED, EXIT_USER_ERROR, ConfigError


def user_error_only(exitcodes: list[int]) -> bool:
    """A failure is a user error when some worker exited with status 2 and every other failed worker was
    stopped by the launcher (SIGTERM/SIGKILL) or also exited with status 2."""
    stopped = (-signal.SIGTERM, -signal.SIGKILL)
    return EXIT_USER_ERROR in exitcodes and all(c in (EXIT_USER_ERROR, *stopped) for c in exitcodes)


class _QuietShutdown(logging.Filter):
    """After the launcher received SIGTERM/SIGINT: drops the agent's lines about passing it on to the workers
    (they say it themselves, once) and notes whether a worker had to be killed (it did not save in time)."""

    def __init__(self) -> None:
        super().__init__()
        self.killed = False

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        if text.startswith("Unable to shutdown process"):
            self.killed = True
            return True
        return not text.startswith(("Received %s death signal", "Sending process %s closing signal"))


def preempted_only(exitcodes: list[int]) -> bool:
    """A signal that reached the workers and not the launcher (SIGTERM, SIGUSR1, e.g. from SLURM) stopped them
    after the same step and last.pt is saved: some worker exited with status 75, and every other failed worker
    also did, or was stopped by the launcher once the first had exited (a worker that already handled the signal
    ignores the launcher's SIGTERM until its save is written, so only one past it dies of it)."""
    return EXIT_PREEMPTED in exitcodes and all(c in (EXIT_PREEMPTED, -signal.SIGTERM) for c in exitcodes)


class _QuietAfterUserError(logging.Filter):
    """Drops the agent's lines about a worker that exited with status 2 (a user error) or 75 (preempted, saved)
    and the workers it stops then: the worker's one line said it."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        quiet = (
            f"(exitcode: {EXIT_USER_ERROR})",
            f"(exitcode: {EXIT_PREEMPTED})",
            "closing signal",
            "no error file defined for parent",
        )
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


def _wait_for_workers(shutdown: _QuietShutdown) -> None:
    """A second signal while the agent waited for the workers to save ends the agent's wait early, leaving them
    running on their own (each worker has its own session, so a terminal's Ctrl-C reaches only the launcher):
    wait for them as the agent would have, 30 s, and kill what is left."""
    import psutil

    _, alive = psutil.wait_procs(psutil.Process().children(), timeout=30)
    for w in alive:
        shutdown.killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(w.pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
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
    shutdown = _QuietShutdown()
    for name in ("multiprocessing.api", "agent.server.api"):
        logging.getLogger(f"torch.distributed.elastic.{name}").addFilter(shutdown)
    try:
        torchrun_main(args)
    except ChildFailedError as e:
        codes = [f.exitcode for f in e.failures.values()]
        if user_error_only(codes):
            sys.exit(EXIT_USER_ERROR)
        if preempted_only(codes):
            sys.exit(EXIT_PREEMPTED)
        raise
    except SignalException as e:
        # The agent passed the signal on to every worker and waited for them: they finished their step, saved
        # last.pt and said so in one line (segtrain.runtime.preemption); torchrun itself would add its traceback,
        # status 1.
        _wait_for_workers(shutdown)
        if shutdown.killed:
            print(
                f"error: a worker did not stop within torchrun's 30 s after {signal.Signals(e.sigval).name} and was "
                "killed: resume=auto continues from the newest whole checkpoint",
                file=sys.stderr,
                flush=True,
            )
            sys.exit(128 + int(e.sigval))
        sys.exit(EXIT_PREEMPTED)


if __name__ == "__main__":
    main()
