"""Every third-party module the docs' Python examples and examples/ import is installed by
compactlog itself or by an extra that the same page tells the user to install (issue 24,
item 8), and the README's "Install" says how: `pip install '.[query]'` and the rest."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from support.paths import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
USER_EXTRAS = ("query", "clients")  # `iceberg` is kept empty: pyiceberg is core
# `pip install '.[query]'`, `'/path/to/compactlog[query,clients]'`, `'compactlog[iceberg]'`
NAMED_EXTRA = re.compile(r"pip install '[^'\s]*\[([a-z,]+)\]'")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(specs: list[str]) -> dict[str, Requirement]:
    parsed = [Requirement(spec) for spec in specs]
    return {normalized(req.name): req for req in parsed}


PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CORE = requirements(PROJECT["dependencies"])
EXTRAS = {name: requirements(specs) for name, specs in PROJECT["optional-dependencies"].items()}
DISTRIBUTIONS = importlib.metadata.packages_distributions()


def imported_modules(code: str) -> set[str]:
    """Top-level modules an absolute import in `code` names."""
    modules = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    return modules


def third_party(modules: set[str], local: set[str] = frozenset()) -> dict[str, str]:
    """Each module that is neither the standard library, compactlog nor `local`, and the
    distribution that installs it here."""
    found = {}
    for module in modules - set(sys.stdlib_module_names) - {"compactlog"} - local:
        dists = DISTRIBUTIONS.get(module)
        assert dists, f"module {module!r} is installed by no distribution in this venv"
        found[module] = normalized(dists[0])
    return found


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_each_pages_imports_are_in_compactlog_or_an_extra_the_page_names(page: Path) -> None:
    text = page.read_text()
    named = {extra for group in NAMED_EXTRA.findall(text) for extra in group.split(",")}
    assert named <= set(EXTRAS), f"{page.name} names extras that do not exist: {named}"
    offered = set(CORE).union(*(EXTRAS[extra] for extra in named))
    for block in python_blocks(page):
        for module, dist in third_party(imported_modules(block)).items():
            assert dist in offered, (
                f"{page.name} imports {module} ({dist}), which neither compactlog nor an "
                f"extra the page names ({sorted(named) or 'none'}) installs")


def test_the_pages_that_import_outside_compactlog_are_the_ones_checked() -> None:
    """The test above reads real imports: the query and client examples are found."""
    needed = {dist for page in PAGES for block in python_blocks(page)
              for dist in third_party(imported_modules(block)).values()} - set(CORE)
    assert {"duckdb", "polars", "confluent-kafka", "kafka-python"} <= needed


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_examples_import_only_what_compactlog_installs(example: Path) -> None:
    local = {path.stem for path in EXAMPLES}
    for module, dist in third_party(imported_modules(example.read_text()), local).items():
        assert dist in CORE, f"examples/{example.name} imports {module} ({dist})"


def test_the_readme_says_how_to_install_each_user_extra() -> None:
    readme = (ROOT / "README.md").read_text()
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "not published on PyPI" in install
    assert "pip install .  " in install
    for extra in USER_EXTRAS:
        assert f"pip install '.[{extra}]'" in install, extra


@pytest.mark.parametrize("extra", USER_EXTRAS)
def test_user_extras_pin_what_the_tests_run(extra: str) -> None:
    """The dev extra (what the tests run) pins each package of a user extra the same."""
    for name, requirement in EXTRAS[extra].items():
        assert str(EXTRAS["dev"][name].specifier) == str(requirement.specifier), name
