"""The package as a user gets it: a wheel built from the repository, installed into a fresh
virtualenv, used by a new ``django-admin startproject`` project.

The virtualenv reuses the dependencies already installed for this test run (Django, psycopg
and what they need) through a ``.pth`` file that lists a directory of links to exactly those
distributions, so the test needs no network and never sees the repository on ``sys.path``.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.database import conninfo
from tests.support.processes import REPO

pytestmark = [pytest.mark.slow]


def _run(*argv: str | Path, cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(map(str, argv))} failed:\n{output}"
    return output


def _dependency_closure(name: str) -> list[metadata.Distribution]:
    """The installed distributions ``name`` needs (its own excluded), by its metadata."""
    environment = {**default_environment(), "extra": ""}
    found: dict[str, metadata.Distribution] = {}
    todo = [Requirement(r) for r in metadata.requires(name) or []]
    todo = [r for r in todo if r.marker is None or r.marker.evaluate(environment)]
    extras_wanted = {e for r in todo for e in r.extras}
    while todo:
        requirement = todo.pop()
        key = canonicalize_name(requirement.name)
        if key in found:
            continue
        dist = metadata.distribution(requirement.name)
        found[key] = dist
        for text in dist.requires or []:
            nested = Requirement(text)
            for extra in {"", *requirement.extras, *extras_wanted}:
                if nested.marker is None or nested.marker.evaluate({**environment, "extra": extra}):
                    todo.append(nested)
                    break
    return list(found.values())


def _link_dependencies(target: Path) -> None:
    """Links in ``target`` to every top-level file and directory of awa-django's
    dependencies, as installed for this test run."""
    target.mkdir()
    for dist in _dependency_closure("awa-django"):
        for file in dist.files or []:
            top = Path(file).parts[0]
            if top == ".." or (target / top).exists():
                continue
            source = Path(str(dist.locate_file(top)))
            if source.exists():
                (target / top).symlink_to(source)


def _clean_env(**extra: str) -> dict[str, str]:
    drop = {"DJANGO_SETTINGS_MODULE", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("AWA_")}
    return {**env, "PYTHONNOUSERSITE": "1", **extra}


SHOP_JOBS = """
from awa_django import job


@job(queue="emails")
def welcome(name: str) -> str:
    return f"welcome {name}"
"""


def test_a_wheel_built_from_the_repository_works_in_a_new_project(tmp_path: Path) -> None:
    env = _clean_env()
    # Build the wheel from a copy of the sources (the build writes next to them).
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(
        REPO / "awa_django", source / "awa_django", ignore=shutil.ignore_patterns("__pycache__")
    )
    dist = tmp_path / "dist"
    _run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", dist, source, cwd=tmp_path, env=env
    )
    [wheel] = dist.glob("awa_django-*.whl")
    packaged = set(zipfile.ZipFile(wheel).namelist())
    shipped = {
        p.relative_to(REPO).as_posix()
        for pattern in ("sql/**/*.sql", "templates/**/*", "migrations/*.py", "py.typed")
        for p in (REPO / "awa_django").glob(pattern)
        if p.is_file()
    }
    assert shipped - packaged == set(), "files missing from the wheel"

    # A fresh virtualenv: the wheel, plus links to the dependencies already installed here.
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path, env=env)
    python = venv / "bin" / "python"
    site = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
             cwd=tmp_path, env=env).strip()
    )  # fmt: skip
    _link_dependencies(tmp_path / "deps")
    (site / "awa_test_dependencies.pth").write_text(f"{tmp_path / 'deps'}\n")
    _run(python, "-m", "pip", "install", "--no-index", wheel, cwd=tmp_path, env=env)
    where = _run(python, "-c", "import awa_django, sys; print(awa_django.__file__)",
                 cwd=tmp_path, env=env)  # fmt: skip
    assert where.strip().startswith(str(site)), where
    paths = json.loads(_run(python, "-c", "import json, sys; print(json.dumps(sys.path))",
                            cwd=tmp_path, env=env))  # fmt: skip
    assert str(REPO) not in paths

    # A new project on its own database, set up as the README says.
    project = tmp_path / "project"
    project.mkdir()
    _run(python, "-m", "django", "startproject", "mysite", ".", cwd=project, env=env)
    manage = [python, project / "manage.py"]
    _run(*manage, "startapp", "shop", cwd=project, env=env)
    (project / "shop" / "jobs.py").write_text(textwrap.dedent(SHOP_JOBS))
    db = dict(settings.DATABASES["default"])
    name = f"{db['NAME']}_wheel"
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        **{k: db[k] for k in ("USER", "PASSWORD", "HOST", "PORT") if db.get(k)},
    }
    with (project / "mysite" / "settings.py").open("a") as f:
        f.write('\nINSTALLED_APPS += ["awa_django", "shop"]\n')
        f.write(f"DATABASES = {{'default': {database!r}}}\n")
    server = psycopg.conninfo.make_conninfo(conninfo(), dbname="postgres")
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        _run(*manage, "migrate", "-v", "0", cwd=project, env=env)
        checked = _run(*manage, "check", "--database", "default", cwd=project, env=env)
        assert "System check identified no issues" in checked
        enqueued = _run(
            *manage, "shell", "-c",
            "from shop.jobs import welcome; print('job', welcome.enqueue('ada').id)",
            cwd=project, env=env,
        )  # fmt: skip
        job_id = enqueued.split("job ", 1)[1].split()[0]
        _run(*manage, "awa_worker", "--burst", "-v", "0", cwd=project, env=env, timeout=120)
        shown = json.loads(_run(*manage, "awa_job", "show", job_id, cwd=project, env=env))
        assert (shown["state"], shown["result"]) == ("completed", "welcome ada")
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
