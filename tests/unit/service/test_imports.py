"""A user's ``use = "module:Attr"``: errors that say how to fix it (make the module importable;
rename a module that singleton's own package shadows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from singleton.errors import ConfigurationError
from singleton.service.registry import job_function, listener_kind


@pytest.mark.parametrize(
    "spec", ["listeners:OrdersToFile", "listeners.orders:OrdersToFile", "singleton:Mine"]
)
def test_a_module_shadowed_by_singleton_s_own_package_is_named_with_the_fix(spec: str) -> None:
    """``listeners.py`` of the user's: ``listeners`` is singleton's package, which has no
    ``OrdersToFile`` (the error used to say only that)."""
    top = spec.partition(".")[0].partition(":")[0]
    with pytest.raises(ConfigurationError) as listener:
        listener_kind(spec)
    with pytest.raises(ConfigurationError) as job:
        job_function(spec)
    for exc in (listener, job):
        message = str(exc.value)
        assert f"is shadowed by singleton's own {top!r} package" in message
        assert f"rename yours (e.g. my_{top}.py)" in message


def test_a_missing_module_says_how_to_make_it_importable() -> None:
    with pytest.raises(ConfigurationError) as exc:
        job_function("nosuch_module_here:report")
    message = str(exc.value)
    assert "No module named 'nosuch_module_here'" in message
    assert "--app-dir DIR" in message and "PYTHONPATH" in message


def test_a_module_whose_own_import_fails_is_not_told_to_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The module was found; what it imports was not: no --app-dir advice."""
    (tmp_path / "needs_more.py").write_text("import nosuch_dependency_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigurationError) as exc:
        job_function("needs_more:report")
    message = str(exc.value)
    assert "No module named 'nosuch_dependency_here'" in message and "--app-dir" not in message
