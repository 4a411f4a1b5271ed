"""Mistakes at the command line: a leaked rank environment, launcher arguments torchrun
would trip over, config mistakes (interpolations, YAML errors, tags, an alias bomb) and Hydra's own flags,
each through the real entry point: one line naming the key or file and the fix, no traceback, no hang."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cases import Case, Result, run_cases
from tests.helpers.proc_utils import one_line_error, run_module


# --------------------------------------------------------------------------- hangs
@pytest.mark.slow
def test_a_leaked_rank_environment_times_out_naming_the_variables(tmp_path: Path):
    from tests.helpers.proc_utils import child_env, free_port

    env = child_env(
        tmp_path / "cache",
        RANK="1",
        WORLD_SIZE="2",
        LOCAL_RANK="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )
    args = ["experiment=cpu_smoke", "trainer.ddp.rendezvous_timeout_s=3", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run_module("segtrain.train", args, tmp_path, tmp_path / "cache", check=False, env=env, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "frame #" not in proc.stderr, proc.stderr
    assert "[rank 1] waiting up to 3 s" in proc.stderr, proc.stderr
    error = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert len(error) == 1 and "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1" in error[0] and "not started by torchrun" in error[0]


#: (segtrain.launch's arguments, what its one line names); ``{port}`` stands for a port in use
LAUNCH_MISTAKES = [
    (["--nproc_per_node", "0"], ["--nproc_per_node 0", "1 or more"]),
    (["--nproc_per_node", "abc"], ["--nproc_per_node abc", "auto"]),
    (
        ["--nproc_per_node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:{port}"],
        ["{port}", "in use"],
    ),
    (["--nproc_per_node", "1", "--master-port", "{port}"], ["{port}", "in use"]),
]


@pytest.fixture(scope="module")
def launch_mistakes(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Result]]:
    """(the busy port, each of LAUNCH_MISTAKES through segtrain.launch's real main, all in one fresh process)."""
    import socket

    root = tmp_path_factory.mktemp("launch")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        cases = [
            Case(
                "segtrain.launch",
                [*(a.replace("{port}", port) for a in args), "-m", "segtrain.train", "experiment=cpu_smoke"],
                str(root),
                {},
            )
            for args, _ in LAUNCH_MISTAKES
        ]
        return port, run_cases(cases, root / "c")


@pytest.mark.parametrize(("case", "launch_args", "names"), [(i, *c) for i, c in enumerate(LAUNCH_MISTAKES)])
def test_launch_says_what_torchrun_would_trip_over(
    launch_mistakes: tuple[str, list[Result]], case: int, launch_args: list[str], names: list[str]
):
    port, results = launch_mistakes
    one_line_error(results[case], *(n.replace("{port}", port) for n in names))


# --------------------------------------------------------------------------- one line instead of a traceback
BOMB = "a0: &a0 [1, 2, 3, 4, 5, 6, 7, 8, 9]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10)
)


#: A user's config files, each with one mistake: a primary config with a YAML error, one with a tag, a YAML
#: alias bomb (9 levels of 9), and primary configs that are a list and a single value rather than a mapping.
USER_FILES = {
    "broken": "defaults:\n  - train\ntrainer: [1\n",
    "tagged": "x: !!python/object/apply:os.system ['echo owned']\n",
    "bomb": BOMB,
    "listed": "- train\n- trainer: {epochs: 2}\n",
    "scalar": "train\n",
}


def _user_configs(root: Path, *extra: str) -> Path:
    """A user's config folder with a preset of their own (``experiment=mine``) and the ``extra`` files."""
    (root / "experiment").mkdir(parents=True)
    (root / "experiment" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - cpu_smoke\ntrainer:\n  epochs: 7\n"
    )
    for name in extra:
        (root / f"{name}.yaml").write_text(USER_FILES[name])
    return root


#: (the command line's mistake, what its one line names); ``{name}`` stands for the user's folder holding it
CONFIG_MISTAKES = [
    (["trainer.epochs=${nope}"], ["trainer.epochs", "nope", "interpolation"]),
    (["trainer.epochs=${trainer.epochs}"], ["trainer.epochs", "Recursive"]),
    (["dataset.root=${oc.env:SEGTRAIN_NOPE}"], ["dataset.root", "SEGTRAIN_NOPE", "${oc.env:VAR,default}"]),
    (["dataset.root=/data/café"], ["dataset.root=/data/café", "quoted", "\"dataset.root='/data/café'\""]),
    (["--config-dir", "{broken}", "-cn", "broken"], ["broken.yaml, line 4", "not valid YAML"]),
    (["--config-dir", "{tagged}"], ["tagged.yaml, line 1", "!!python/object/apply"]),
    (["--config-dir", "{listed}", "--config-name", "listed"], ["listed.yaml", "is a list", "must be a mapping"]),
    (["--config-dir", "{scalar}", "-cn", "scalar.yaml"], ["scalar.yaml", "a single value", "must be a mapping"]),
    (["hydra.searchpath=[file://{bomb}]"], ["bomb.yaml", "100,000 values"]),
    (
        ["dataset=labelme", "dataset.train.dir=tr", "dataset.val.dir=va", "hydra.job.chdir=true"],
        ["hydra.job.chdir=true", "relative paths"],
    ),
]


@pytest.fixture(scope="module")
def config_mistakes(tmp_path_factory: pytest.TempPathFactory) -> list[Result]:
    """Each of CONFIG_MISTAKES through segtrain.train's real main, all in one fresh process
    (tests/helpers/cases.py): config mistakes end before training, so the process start is most of each case."""
    root = tmp_path_factory.mktemp("mistakes")
    (root / "tr").mkdir()
    cases = []
    for i, (args, _) in enumerate(CONFIG_MISTAKES):
        extra = [name for name in USER_FILES if any(f"{{{name}}}" in a for a in args)]
        cfg = _user_configs(root / f"mine{i}", *extra)  # the case's own folder: only its mistake in it
        args = [a.replace(f"{{{name}}}", str(cfg)) for a in args for name in extra or [""]]
        cases.append(
            Case("segtrain.train", ["experiment=cpu_smoke", *args, f"hydra.run.dir={root / f'run{i}'}"], str(root), {})
        )
    return run_cases(cases, root / "c")


@pytest.mark.slow
@pytest.mark.parametrize(("case", "args", "names"), [(i, *c) for i, c in enumerate(CONFIG_MISTAKES)])
def test_config_mistakes_are_one_line(config_mistakes: list[Result], case: int, args: list[str], names: list[str]):
    one_line_error(config_mistakes[case], *names)


@pytest.mark.slow
def test_hydra_flags_after_the_overrides_and_a_users_own_preset(tmp_path: Path):
    cfg = _user_configs(tmp_path / "mine")
    run = ["segtrain.train"]
    # Hydra's flags after the overrides and the user's own preset: segtrain.train's real main, in one process
    shown, helped, mine, searched = run_cases(
        [
            Case(run[0], argv, str(tmp_path), {})
            for argv in (
                ["experiment=cpu_smoke", "trainer.epochs=2", "--cfg", "job"],
                ["trainer.epochs=2", "--help"],
                ["--config-dir", str(cfg), "experiment=mine", "--cfg", "job"],
                [f"hydra.searchpath=[file://{cfg}]", "experiment=mine", "--cfg", "job"],
            )
        ],
        tmp_path / "c",
    )
    assert [r.returncode for r in (shown, helped, mine, searched)] == [0, 0, 0, 0], (shown, helped, mine, searched)
    assert "epochs: 2" in shown.stdout and "output_subdir" not in shown.stdout
    assert "Powered by Hydra" in helped.stdout or "override" in helped.stdout.lower(), helped.stdout[-500:]
    assert "epochs: 7" in mine.stdout
    assert "epochs: 7" in searched.stdout
    swept = run_module(
        run[0],
        [
            "experiment=cpu_smoke",
            "trainer.max_steps=1",
            "trainer.epochs=1",
            "trainer.seed=0,1",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            "-m",
        ],
        tmp_path,
        tmp_path / "c",
        timeout=600,
    )
    logs = sorted((tmp_path / "sweep").glob("*/train.log"))
    assert len(logs) == 2, swept.stderr[-2000:]
    first = logs[0].read_text()
    assert "run finished" in first and "#1 :" not in first, "job 0's train.log holds a line of job 1"
