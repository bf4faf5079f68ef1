"""Where the product writes: CEP_HOME or the XDG folders, created with their parents."""

from __future__ import annotations

import pytest

from cep_core import home


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in ("CEP_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "CEP_KERNEL_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))  # does not exist yet
    return tmp_path


def test_fresh_home_gets_its_folders_with_parents(clean_env):
    assert home.state_dir("faust") == clean_env / "empty-home/.local/state/cep/faust"
    assert home.cache_dir("parser") == clean_env / "empty-home/.cache/cep/parser"
    assert home.kernel_cache_dir() == clean_env / "empty-home/.cache/cep/kernels"
    for folder in ("faust",):
        assert (clean_env / "empty-home/.local/state/cep" / folder).is_dir()
    assert (clean_env / "empty-home/.cache/cep/kernels").is_dir()


def test_cep_home_holds_everything(clean_env, monkeypatch):
    monkeypatch.setenv("CEP_HOME", str(clean_env / "a" / "b"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(clean_env / "xdg"))  # CEP_HOME wins
    assert home.cache_dir("kernels") == clean_env / "a/b/cache/kernels"
    assert home.state_dir("logs") == clean_env / "a/b/state/logs"
    assert not (clean_env / "xdg").exists()


def test_xdg_folders(clean_env, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(clean_env / "c"))
    monkeypatch.setenv("XDG_STATE_HOME", str(clean_env / "s"))
    assert home.kernel_cache_dir() == clean_env / "c/cep/kernels"
    assert home.state_dir() == clean_env / "s/cep"


def test_kernel_cache_variable_wins(clean_env, monkeypatch):
    monkeypatch.setenv("CEP_HOME", str(clean_env / "h"))
    monkeypatch.setenv("CEP_KERNEL_CACHE", str(clean_env / "k" / "deep"))
    assert home.kernel_cache_dir() == clean_env / "k/deep"
    assert (clean_env / "k/deep").is_dir()


def test_a_folder_that_cannot_be_made_is_named(clean_env, monkeypatch):
    blocker = clean_env / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("CEP_HOME", str(blocker))
    with pytest.raises(home.HomeError, match="cannot create .*not-a-folder/state/logs.*CEP_HOME"):
        home.state_dir("logs")


def test_a_service_whose_folder_cannot_be_made_says_so_at_once(tmp_path):
    """`cep serve splitter` makes its Faust folder before it looks for a broker (none
    listens here), and names the folder in a clean error."""
    import os
    import subprocess
    import sys

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    done = subprocess.run([sys.executable, "-m", "cep_service.cli.main", "serve", "splitter",
                           "--bootstrap", "127.0.0.1:9", "--web-port", "0"],
                          env={**os.environ, "CEP_HOME": str(blocker)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"error: cannot create {blocker}/state/faust" in done.stderr
    assert "Traceback" not in done.stderr
