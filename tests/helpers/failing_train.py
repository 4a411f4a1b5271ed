"""torchrun target for tests: the real `segtrain.train`, except that rank 1 raises on entering its
first epoch (a deliberate fault, to check that the job fails fast and reports the traceback)."""

import os

from segtrain.engine.trainer import Trainer
from segtrain.train import main

_real = Trainer.train_steps


def _fail_on_rank_1(self, *args, **kwargs):
    if os.environ.get("RANK") == "1":
        raise RuntimeError("deliberate failure on rank 1")
    return _real(self, *args, **kwargs)


# fault injection into every Trainer the real entry point builds
Trainer.train_steps = _fail_on_rank_1  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
