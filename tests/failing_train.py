"""torchrun target for tests: the real `segtrain.train`, except that rank 1 raises on entering its
first epoch (a deliberate fault, to check that the job fails fast and reports the traceback)."""

import os

import segtrain.engine.trainer as trainer
from segtrain.train import main

_real = trainer.train_one_epoch


def _fail_on_rank_1(*args, **kwargs):
    if os.environ.get("RANK") == "1":
        raise RuntimeError("deliberate failure on rank 1")
    return _real(*args, **kwargs)


trainer.train_one_epoch = _fail_on_rank_1

if __name__ == "__main__":
    main()
