"""The captured driver environment: where the API key comes from, and that it stays hidden (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ray_wandb_nodes._config.secrets import Secret, capture_env


def test_key_comes_from_argument_then_file_then_env_then_netrc(tmp_path: Path) -> None:
    env = {"WANDB_API_KEY": "env" * 14, "WANDB_BASE_URL": "http://wb.example:8080"}
    key_file = tmp_path / "key"
    key_file.write_text("\n  file-key-0123456789012345678901234567890  \n")
    netrc = tmp_path / "netrc"
    netrc.write_text("machine wb.example login user password netrc-key\n")
    netrc.chmod(0o600)

    got = capture_env(env, api_key="arg", api_key_file=None, netrc_path=str(netrc))
    assert (got.api_key, got.api_key_source) == (Secret("arg"), "api_key")
    got = capture_env(env, api_key_file=str(key_file), netrc_path=str(netrc))
    assert (got.api_key, got.api_key_source) == (Secret("file-key-0123456789012345678901234567890"), "api_key_file")
    got = capture_env(env, netrc_path=str(netrc))
    assert (got.api_key, got.api_key_source) == (Secret("env" * 14), "WANDB_API_KEY")
    got = capture_env({"WANDB_BASE_URL": env["WANDB_BASE_URL"]}, netrc_path=str(netrc))
    assert (got.api_key, got.api_key_source) == (Secret("netrc-key"), "netrc")
    assert capture_env({}, netrc_path=str(tmp_path / "none")).api_key is None


def test_unreadable_or_empty_key_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"api_key_file=.*cannot be read"):
        capture_env({}, api_key_file=str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("\n\n")
    with pytest.raises(ValueError, match=r"api_key_file=.*is empty"):
        capture_env({}, api_key_file=str(tmp_path / "empty"))


def test_captured_env_holds_the_driver_settings() -> None:
    env = {
        "WANDB_BASE_URL": "http://127.0.0.1:9",
        "WANDB_PROJECT": "p",
        "WANDB_ENTITY": "e",
        "WANDB_MODE": "offline",
        "WANDB_DIR": "/d",
        "WANDB_API_KEY": "k" * 40,
    }
    got = capture_env(env)
    assert (got.base_url, got.project, got.entity, got.mode, got.dir) == (
        "http://127.0.0.1:9",
        "p",
        "e",
        "offline",
        "/d",
    )
    assert "k" * 40 not in repr(got) and "k" * 40 not in str(got.api_key)
