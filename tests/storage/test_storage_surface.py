"""The log's public surface (compactlog/storage/__init__.py, issue 22): other packages
import the log from `compactlog.storage` (import-linter's contract keeps them there),
and each name there is what its home module defines.

A public name that were also a submodule's name would be wrong in a way no type check
sees: once the submodule is imported, Python sets the package's attribute of that name
to the module, and `from compactlog.storage import NAME` returns the module instead of
the function (PEP 562's `__getattr__` is asked only for attributes that do not exist).
`sweep` was one, and is `sweep_unreachable` now.
"""

from __future__ import annotations

import importlib
import pkgutil

import compactlog.storage as storage


def submodules() -> set[str]:
    return {info.name for info in pkgutil.iter_modules(storage.__path__)}


def test_no_public_name_is_also_a_submodule() -> None:
    assert not set(storage.__all__) & submodules()


def test_every_public_name_is_its_homes_object_whatever_was_imported_before() -> None:
    for name in submodules():
        importlib.import_module(f"compactlog.storage.{name}")  # the worst case above
    for name in storage.__all__:
        home = importlib.import_module(storage._HOMES[name])
        assert getattr(storage, name) is getattr(home, name), name
    assert sorted(storage.__all__) == sorted(storage._HOMES)
