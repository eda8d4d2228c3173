"""The operator's side of the command line: `--version`, help on every option with a pointer to
the settings, one-line errors for bad `PRESENCE_*` values, warnings for unknown ones, and
`presence config` with secrets redacted."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from importlib.metadata import version as dist_version
from pathlib import Path

import pytest

from cluster import cli
from cluster.config import REDACTED, SettingsError, effective, load_settings, redact_url, unknown_env_names

ROOT = Path(__file__).resolve().parents[2]


def test_version_comes_from_the_installed_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"presence {dist_version('presence-cluster')}"


def test_every_option_has_help_and_every_command_points_to_the_settings() -> None:
    parser = cli.build_parser()
    assert "presence config" in (parser.epilog or "")
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, p in sub.choices.items():
        assert "PRESENCE_" in (p.epilog or ""), name
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"presence {name} {action.option_strings or action.dest} has no help"


def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRESENCE_SHARDS", "four")
    with pytest.raises(SettingsError) as e:
        load_settings()
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("PRESENCE_SHARDS='four': ") and "integer" in message


def test_every_bad_value_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRESENCE_TOKEN_TTL_S", "soon")
    monkeypatch.setenv("PRESENCE_SHARDS", "x")
    with pytest.raises(SettingsError) as e:
        load_settings()
    assert "PRESENCE_TOKEN_TTL_S" in str(e.value) and "PRESENCE_SHARDS" in str(e.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [("PRESENCE_WS_PORT", "70000"), ("PRESENCE_INTERNAL_PORT", "-1"), ("PRESENCE_SHARDS", "0")],
)
def test_out_of_range_values_are_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    """A port past 65535 was taken modulo 65536 (70000 listened on 4464) and `--shards 0` started
    every server before a traceback: an operator's pass."""
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as e:
        load_settings()
    assert str(e.value).startswith(f"{name}='{value}': ")


@pytest.mark.parametrize("secret", ["s3cret", "x" * 31, "é" * 15])
def test_a_token_secret_shorter_than_hs256_wants_is_refused_without_showing_it(
    monkeypatch: pytest.MonkeyPatch, secret: str
) -> None:
    """RFC 7518 3.2: at least 32 bytes (of UTF-8; 15 two-byte letters are 30). Before, a short
    one was taken, and only PyJWT's warning said so, at the first token."""
    monkeypatch.setenv("PRESENCE_TOKEN_SECRET", secret)
    with pytest.raises(SettingsError) as e:
        load_settings()
    assert str(e.value).startswith(f"PRESENCE_TOKEN_SECRET={REDACTED}: ")
    assert "at least 32 bytes" in str(e.value) and secret not in str(e.value)


def test_a_token_secret_of_32_bytes_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRESENCE_TOKEN_SECRET", "x" * 32)
    assert load_settings().token_secret == "x" * 32


@pytest.mark.parametrize("ttl", ["0", "-5"])
def test_a_token_that_would_be_born_expired_is_refused(
    ttl: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["token", "alice", "--ttl", ttl, "--data-dir", str(tmp_path)]) == 2
    assert "--ttl must be a positive number of seconds" in capsys.readouterr().err


def test_a_default_lifetime_over_the_maximum_names_the_setting_not_the_flag(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`PRESENCE_TOKEN_MAX_TTL_S=100 presence token a` said "--ttl may be at most 100" though no
    --ttl was given: the default lifetime (PRESENCE_TOKEN_TTL_S) was over it."""
    monkeypatch.setenv("PRESENCE_TOKEN_MAX_TTL_S", "100")
    assert cli.main(["token", "alice", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "PRESENCE_TOKEN_TTL_S (86400) may be at most 100 seconds" in err and "--ttl" not in err


def test_output_into_a_closed_pipe_is_no_traceback(tmp_path: Path) -> None:
    """`presence status | head -6`: what the reader did not take goes nowhere, quietly (an
    operator's pass saw a BrokenPipeError traceback). Here the reader is gone before the first
    write."""
    read, write = os.pipe()
    os.close(read)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "cluster.cli", "config", "--data-dir", str(tmp_path)],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
            timeout=60,
            cwd=ROOT,
        )
    finally:
        os.close(write)
    assert "Traceback" not in out.stderr and "BrokenPipeError" not in out.stderr, out.stderr


def test_the_command_exits_2_with_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "config", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PRESENCE_WS_PORT": "http", "PYTHONPATH": str(ROOT)},
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "presence: bad setting: PRESENCE_WS_PORT='http': "
        "Input should be a valid integer, unable to parse string as an integer"
    ]


def test_unknown_names_are_reported_with_the_closest_setting() -> None:
    env = {"PRESENCE_SHARDZ": "3", "PRESENCE_SHARDS": "2", "PRESENCE_XYZZY": "1", "RAY_ADDRESS": "auto"}
    assert unknown_env_names(env) == [("PRESENCE_SHARDZ", "PRESENCE_SHARDS"), ("PRESENCE_XYZZY", None)]


def test_unknown_names_warn_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PRESENCE_WS_PROT", "1")
    assert cli.main(["config", "--json"]) == 0
    err = capsys.readouterr().err
    assert "PRESENCE_WS_PROT is not a setting and is ignored (did you mean PRESENCE_WS_PORT?)" in err


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:hunter2@db:5432/p", f"postgresql://u:{REDACTED}@db:5432/p"),
        ("redis://:hunter2@r:6379/0", f"redis://:{REDACTED}@r:6379/0"),
        ("redis://r:6379/0", "redis://r:6379/0"),
        ("postgresql://u@db/p", "postgresql://u@db/p"),
        # A port that is no port: nothing shown, and no traceback (an operator's pass).
        ("postgresql://u:S3cretPW@127.0.0.1:notaport/db", REDACTED),
        ("redis://:pw@127.0.0.1:99999999/0", REDACTED),
    ],
)
def test_url_passwords_are_redacted(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_config_prints_every_setting_with_secrets_redacted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PRESENCE_TOKEN_SECRET", "hunter2-hunter2-hunter2-hunter2-x")
    monkeypatch.setenv("PRESENCE_DATABASE_URL", "postgresql://u:hunter2@db/p")
    monkeypatch.setenv("PRESENCE_SHARDS", "7")
    assert cli.main(["config", "--json"]) == 0
    out = capsys.readouterr().out
    assert "hunter2" not in out
    values = json.loads(out)
    assert values["token_secret"] == REDACTED
    assert values["database_url"] == f"postgresql://u:{REDACTED}@db/p"
    assert values["shards"] == 7
    assert set(values) == set(effective(load_settings()))
    assert cli.main(["config"]) == 0
    text = capsys.readouterr().out
    assert "hunter2" not in text
    assert "PRESENCE_SHARDS" in text and "7" in text


def test_config_shows_the_ports_the_running_service_listens_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`presence up --ws-port 48765 --internal-port 48766`: `presence config` showed 8765 and
    8766, the defaults (an operator's pass). A port set in the environment still wins."""
    from cluster.runtime import ClusterInfo, running_settings, write_info

    write_info(
        tmp_path,
        ClusterInfo(
            "postgresql://x",
            None,
            "127.0.0.1:1",
            "ns",
            "ws://127.0.0.1:48765/ws/presence",
            "http://127.0.0.1:48766",
            1,
        ),
    )
    for name in ("PRESENCE_WS_PORT", "PRESENCE_INTERNAL_PORT"):
        monkeypatch.delenv(name, raising=False)
    used, names = running_settings(load_settings(data_dir=tmp_path))
    assert (used.ws_port, used.internal_port) == (48765, 48766) and {"ws_port", "internal_port"} <= names
    monkeypatch.setenv("PRESENCE_WS_PORT", "9000")
    used, names = running_settings(load_settings(data_dir=tmp_path))
    assert used.ws_port == 9000 and "ws_port" not in names
