"""torchrun / python target for tests: the real `segtrain.train`, with faults chosen by environment:

- SEGTRAIN_TEST_SLEEP=S: each training step takes S seconds more (so a signal lands mid-epoch);
- SEGTRAIN_TEST_NAN_AT=N: the images of step N are NaN (a diverging step that is not a logging step);
- SEGTRAIN_TEST_HOLD_AT=N with SEGTRAIN_TEST_HOLD=PATH: before step N, create PATH and wait there (up to
  10 minutes) for the test to kill the run: a run certainly in progress, however slow the machine;
- SEGTRAIN_TEST_HOLD_SAVE=NAME@N with SEGTRAIN_TEST_HOLD=PATH: the same, inside the save of step N, just before
  the file NAME (e.g. best_weights.pt) is written: a kill between the files of one save;
- SEGTRAIN_TEST_TERM_AT=N: before step N every rank receives SIGTERM (what torchrun forwards from SLURM or
  Kubernetes), at a known step however slow the machine;
- SEGTRAIN_TEST_TERM_AFTER=N: when step N's computation has ended (its all_reduce long past), the rank sends
  itself SIGTERM: a signal that arrives in the middle of a step;
- SEGTRAIN_TEST_RECORD=DIR: each rank appends one JSON line per step to DIR/<pid>.jsonl: epoch, step, rank,
  world size and the record indices of its batch (what the data-order tests count);
- SEGTRAIN_TEST_EXIT_STATE=DIR: when the entry point returns (or exits), each rank writes DIR/<pid>.json: whether
  a process group is still initialised, how many DistributedDataParallel models are still alive (no collection
  first) and the names of live non-daemon threads other than the main one: what interpreter finalisation
  would otherwise have to tear down.
"""

import gc
import json
import os
import signal
import threading
import time
from pathlib import Path

import torch

from segtrain.checkpoint import io
from segtrain.engine.trainer import Trainer
from segtrain.train import main

_real = Trainer.run_step
SLEEP = float(os.environ.get("SEGTRAIN_TEST_SLEEP", "0"))
NAN_AT = int(os.environ.get("SEGTRAIN_TEST_NAN_AT", "0"))
HOLD_AT = int(os.environ.get("SEGTRAIN_TEST_HOLD_AT", "0"))
HOLD = os.environ.get("SEGTRAIN_TEST_HOLD", "")
HOLD_SAVE = os.environ.get("SEGTRAIN_TEST_HOLD_SAVE", "")
TERM_AT = int(os.environ.get("SEGTRAIN_TEST_TERM_AT", "0"))
TERM_AFTER = int(os.environ.get("SEGTRAIN_TEST_TERM_AFTER", "0"))
RECORD = os.environ.get("SEGTRAIN_TEST_RECORD", "")
EXIT_STATE = os.environ.get("SEGTRAIN_TEST_EXIT_STATE", "")
_real_save = io.atomic_save


def _held_save(obj, path):
    name, _, step = HOLD_SAVE.partition("@")
    if Path(path).name == name and obj.get("step") == int(step):
        open(HOLD, "w").close()
        time.sleep(600)
    return _real_save(obj, path)


if HOLD_SAVE:
    io.atomic_save = _held_save


def _faulty_step(self, batch):
    if HOLD_AT and self.state.step + 1 == HOLD_AT:
        open(HOLD, "w").close()
        time.sleep(600)
    if TERM_AT and self.state.step + 1 == TERM_AT:
        os.kill(os.getpid(), signal.SIGTERM)
    if RECORD:
        row = {
            "epoch": self.state.epoch,
            "step": self.state.step + 1,
            "rank": self.dist.rank,
            "world": self.dist.world_size,
            "indices": batch["index"].tolist(),
        }
        with open(Path(RECORD) / f"{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
    if SLEEP:
        time.sleep(SLEEP)
    if NAN_AT and self.state.step + 1 == NAN_AT:
        batch = {**batch, "image": torch.full(batch["image"].shape, float("nan"))}
    losses = _real(self, batch)
    if TERM_AFTER and self.state.step == TERM_AFTER:
        os.kill(os.getpid(), signal.SIGTERM)
    return losses


# fault injection into every Trainer the real entry point builds
Trainer.run_step = _faulty_step  # type: ignore[method-assign]


def _write_exit_state() -> None:
    ddp = torch.nn.parallel.DistributedDataParallel
    state = {
        "rank": int(os.environ.get("RANK", "0")),
        "group": torch.distributed.is_initialized(),
        "ddp_models": sum(isinstance(o, ddp) for o in gc.get_objects()),
        "threads": [t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()],
    }
    (Path(EXIT_STATE) / f"{os.getpid()}.json").write_text(json.dumps(state))


if __name__ == "__main__":
    try:
        main()
    finally:
        if EXIT_STATE:
            _write_exit_state()
