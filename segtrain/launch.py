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

import logging
import signal
import sys

from segtrain.errors import EXIT_USER_ERROR


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


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    args = list(sys.argv[1:] if argv is None else argv)
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
