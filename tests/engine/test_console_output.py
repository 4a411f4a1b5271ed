"""Console output in a terminal: progress bars (training, validation) and log lines never share a line.

The real run happens under a pseudo-terminal (bars are only drawn when stderr is a TTY); what it writes
is replayed on a small terminal model (carriage return, line feed, cursor up) and the screen is read
back the way a user would see it."""

from __future__ import annotations

import io
import logging
import os
import re
import select
import struct
import subprocess
import sys
import time
import warnings

import pytest
from tqdm import tqdm

from segtrain.engine.recorder import ConsoleHandler
from tests.helpers.proc_utils import child_env

LOG_LINE = re.compile(r"\d\d:\d\d:\d\d (INFO|WARNING|ERROR) [\w.]+: ")
BAR = re.compile(r"\d+%\|")  # tqdm's "  50%|████" part
CSI = re.compile(r"\x1b\[(\d*)([A-Za-z])")
COLUMNS = 100


def screen(raw: str) -> list[str]:
    """The lines a terminal shows after receiving ``raw``: text overwrites at the cursor, ``\\r`` goes to
    column 0, ``\\n`` one row down (same column), ``ESC[nA`` n rows up; other escapes are ignored."""
    rows: list[list[str]] = [[]]
    r = c = 0
    i = 0
    while i < len(raw):
        ch = raw[i]
        m = CSI.match(raw, i) if ch == "\x1b" else None
        if m:
            if m.group(2) == "A":
                r = max(0, r - int(m.group(1) or 1))
            i = m.end()
            continue
        if ch == "\r":
            c = 0
        elif ch == "\n":
            r += 1
            while len(rows) <= r:
                rows.append([])
        else:
            line = rows[r]
            line.extend(" " * (c + 1 - len(line)))
            line[c] = ch
            c += 1
        i += 1
    return ["".join(line).rstrip() for line in rows]


def check_console(raw: str) -> list[str]:
    """Fail if a log line shares a terminal line with a bar or anything else (written after a bar's text,
    or over a longer bar that was not cleared); returns the screen."""
    written = set()
    for segment in re.split(r"[\r\n]", raw):  # what is written between two cursor-to-column-0 moves
        found = LOG_LINE.search(segment)
        if found:
            assert not BAR.search(segment[: found.start()]), f"log line written after a bar: {segment!r}"
            written.add(segment[found.start() :].rstrip())
    shown = screen(raw)
    for line in shown:
        if LOG_LINE.search(line):
            assert line in written, f"log line shares its terminal line with other text: {line!r}"
    return shown


def test_screen_model_sees_the_old_failure():
    """The terminal model itself: a log line written from a bar's last column (as before the fix) is caught."""
    bar = "\rtrain: 100%|████| 4/4 [00:06<00:00]"
    val = "\n\rval: 100%|██| 2/2\x1b[A\n\r" + " " * 40 + "\x1b[A"
    broken = bar + val + "12:00:00 INFO segtrain.trainer: epoch 0 step 4 val miou 0.2\n"
    assert "train: 100%|████| 4/4 [00:06<00:00]" in screen(broken)[0]
    with pytest.raises(AssertionError, match="shares its terminal line"):
        check_console(broken)
    with pytest.raises(AssertionError, match="written after a bar"):
        check_console(bar + "12:00:00 INFO segtrain: x\n")
    with pytest.raises(AssertionError, match="shares its terminal line"):
        check_console(bar + "\r12:00:00 INFO segtrain: x\n")  # starts its line, but the bar's tail stays


def test_console_handler_clears_and_redraws_an_open_bar():
    buf = io.StringIO()
    handler = ConsoleHandler(buf)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"))
    logger = logging.getLogger("segtrain.test_console")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        with tqdm(total=4, desc="train", file=buf, ncols=COLUMNS, mininterval=0) as bar:
            bar.update(2)
            with tqdm(total=2, desc="val", file=buf, ncols=COLUMNS, mininterval=0, leave=False) as val:
                val.update(1)
                logger.warning("during validation")
            logger.info("after validation")
            bar.update(2)
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    shown = check_console(buf.getvalue())
    logs = [line for line in shown if LOG_LINE.match(line)]
    assert [line.split(": ", 1)[1] for line in logs] == ["during validation", "after validation"]
    assert not any(line.startswith("val:") for line in shown), f"the finished val bar stays on screen: {shown}"
    assert [line for line in shown if line][-1].startswith("train: 100%"), "the bar is drawn again below the lines"


def test_python_warnings_become_log_lines(tmp_path, capsys):
    from segtrain.engine.recorder import setup_logging

    root = logging.getLogger()
    before = list(root.handlers)
    try:
        with warnings.catch_warnings():  # pytest records warnings; inside this block they take their normal path
            warnings.simplefilter("always")
            logging.captureWarnings(False)  # forget any capture an earlier test set up (pytest has undone it)
            setup_logging(tmp_path, 0, "w.log")
            warnings.warn("mind the gap", UserWarning, stacklevel=1)
            logging.captureWarnings(False)
    finally:
        for h in list(root.handlers):
            if h not in before:
                root.removeHandler(h)
                h.close()
    err = capsys.readouterr().err
    assert LOG_LINE.search(err) and "WARNING py.warnings" in err and "mind the gap" in err
    assert "mind the gap" in (tmp_path / "w.log").read_text()


def run_in_terminal(args: list[str], cwd, env: dict[str, str], timeout: float = 300) -> tuple[int, str]:
    """``python args`` with stdin/stdout/stderr on a pseudo-terminal COLUMNS wide; (exit status, output)."""
    import fcntl
    import pty
    import termios

    try:
        master, slave = pty.openpty()
    except OSError as e:  # no pseudo-terminals in this container
        pytest.skip(f"no pseudo-terminal: {e}")
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, COLUMNS, 0, 0))
    proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        else:
            proc.kill()
            raise AssertionError(f"no end after {timeout}s:\n{b''.join(chunks).decode(errors='replace')}")
        return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")
    finally:
        os.close(master)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_training_in_a_terminal_keeps_bars_and_log_lines_apart(tmp_path):
    run_dir = tmp_path / "run"
    env = {**child_env(tmp_path / "cache"), "TERM": "xterm"}
    env.pop("COLUMNS", None)
    # two epochs of 4 steps: a validation in the middle of the run (the train bar goes on after it) and one at its end
    args = ["-m", "segtrain.train", "experiment=cpu_smoke", "trainer.progress=true", "trainer.max_steps=8"]
    rc, raw = run_in_terminal([*args, f"hydra.run.dir={run_dir}"], tmp_path, env)
    assert rc == 0, raw
    assert re.search(r"\rtrain: +\d+%\|", raw) and re.search(r"\rval: +\d+%\|", raw), f"no bars drawn:\n{raw!r}"
    shown = check_console(raw)
    val_lines = [line for line in shown if " val miou " in line]
    assert len(val_lines) == 2, "\n".join(shown)
    assert not any(line.startswith("val:") for line in shown), "a finished validation bar stays on screen"
    assert any("run finished after 8 steps" in line for line in shown), "\n".join(shown)
    assert (run_dir / "train.log").read_text().count(" loss ") == 8, "loss lines still reach train.log"
