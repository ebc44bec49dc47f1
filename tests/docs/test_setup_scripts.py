"""The two commands install what they need, and no more (issue 24, item 3):
`scripts/demo.sh` installs compactlog alone (no test tools, no kcat, Node.js or the test
applications, nothing from apt), so that it works for a user without root;
`scripts/test.sh` still installs everything the tests use.

The scripts run on a copy of the repository's scripts and pyproject.toml, with stand-ins
on PATH for python, java, apt-get, kcat, node and npm that record how they were called
(nothing is installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from support.paths import ROOT

STAND_IN = """#!/usr/bin/env bash
# Records its call; `-m venv DIR` makes DIR/bin/{python,ruff,mypy,lint-imports} stand-ins too.
echo "$(basename "$0") $*" >> "$CALLS"
if [ "${1:-}" = "-m" ] && [ "${2:-}" = "venv" ]; then
  mkdir -p "$3/bin"
  for tool in python ruff mypy lint-imports; do cp "$STAND_IN" "$3/bin/$tool"; done
fi
if [ "$(basename "$0")" = java ]; then echo 'openjdk version "17.0.2"' >&2; fi
if [ "$(basename "$0")" = npm ] && [ "${1:-}" = ci ]; then mkdir -p node_modules; fi
exit 0
"""


SYSTEM_TOOLS = ("bash", "sha256sum", "cut", "cat", "mkdir", "cp", "basename", "dirname",
                "sed", "head", "id", "rm", "env", "chmod")


def sandbox(tmp_path: Path, with_tools: bool) -> tuple[Path, dict[str, str], Path]:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "scripts", repo / "scripts")
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    for app in ("quix", "faust"):
        (repo / "tests" / "apps" / app).mkdir(parents=True)
        shutil.copy(ROOT / "tests" / "apps" / app / "requirements.txt",
                    repo / "tests" / "apps" / app / "requirements.txt")
    (repo / "tests" / "apps" / "kafkajs").mkdir()
    for name in ("package.json", "package-lock.json"):
        shutil.copy(ROOT / "tests" / "apps" / "kafkajs" / name,
                    repo / "tests" / "apps" / "kafkajs" / name)
    (repo / "examples").mkdir()
    (repo / "examples" / "demo.py").write_text("")
    (repo / "src").mkdir()  # scripts/test.sh runs the import layers' check from there
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = tmp_path / "stand-in"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    tools = ["python3", "java", "apt-get", "sudo"]
    if with_tools:
        tools += ["kcat", "node", "npm"]
    for tool in tools:
        shutil.copy(stand_in, bin_dir / tool)
    # The system's tools the scripts use, and nothing else: no kcat, node or npm but
    # the stand-ins (when with_tools).
    for tool in SYSTEM_TOOLS:
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    calls = tmp_path / "calls"
    calls.touch()
    env = {"PATH": str(bin_dir), "CALLS": str(calls), "STAND_IN": str(stand_in),
           "HOME": str(tmp_path)}
    return repo, env, calls


def run_script(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", *args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_demo_installs_compactlog_alone(tmp_path: Path) -> None:
    repo, env, calls = sandbox(tmp_path, with_tools=False)
    done = run_script(repo, env, "scripts/demo.sh")
    assert done.returncode == 0, done.stderr
    log = calls.read_text()
    installs = [line for line in log.splitlines() if " pip install " in line]
    assert any(line.endswith(" -e .") for line in installs), log
    assert not any("[dev]" in line or "-r " in line for line in installs), log
    for tool in ("apt-get", "kcat", "npm", "node", "sudo"):
        assert not any(line.startswith(f"{tool} ") for line in log.splitlines()), log
    assert ".venv-apps" not in log
    assert "examples/demo.py" in log  # and then it runs the demo


def test_the_test_command_installs_everything(tmp_path: Path) -> None:
    repo, env, calls = sandbox(tmp_path, with_tools=True)
    done = run_script(repo, env, "scripts/test.sh", "-q")
    assert done.returncode == 0, done.stderr
    log = calls.read_text()
    assert '-e .[dev]' in log.replace('"', ""), log
    assert ".venv-apps/quix" in log and ".venv-apps/faust" in log, log
    assert "npm ci" in log, log
    assert "ruff check" in log and "mypy" in log and "lint-imports" in log, log
    assert "-m pytest -q" in log, log


def test_a_demo_after_the_tests_keeps_the_test_install(tmp_path: Path) -> None:
    """Running the demo in a checkout set up for the tests does not reinstall less."""
    repo, env, calls = sandbox(tmp_path, with_tools=True)
    assert run_script(repo, env, "scripts/test.sh").returncode == 0
    calls.write_text("")
    assert run_script(repo, env, "scripts/demo.sh").returncode == 0
    assert " pip install " not in calls.read_text()
