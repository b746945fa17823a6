"""The `botbouncer` command line (README.md): check-config, help and usage.

`check-config -c FILE` exits 0, or 2 with a message naming the key path and
what is wrong - never a traceback. `python -m gateway` is the same program.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.cli import main

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "config.example.yml"

BOT = """\
bots:
  - name: helper
    platform: http
    backend: {type: echo}
"""


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # config.example.yml reads these with defaults; a stray value must not change the outcome
    for name in (
        "BOTBOUNCER_ADMIN_TOKEN",
        "REPLY_DECISION_ENDPOINT",
        "REPLY_DECISION_API_KEY",
        "REPLY_DECISION_MODEL",
    ):
        monkeypatch.delenv(name, raising=False)


def check(capsys: pytest.CaptureFixture[str], path: Path | str) -> Result:
    capsys.readouterr()
    code = main(["check-config", "-c", str(path)])
    cap = capsys.readouterr()
    return Result(code, cap.out, cap.err)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yml"
    path.write_text(text, encoding="utf-8")
    return path


def run_cli(*args: str) -> Result:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


# --------------------------------------------------------------------------
# check-config, in process
# --------------------------------------------------------------------------


def test_example_config_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    res = check(capsys, EXAMPLE)
    assert res.code == 0, res.err
    assert res.err == ""
    assert "ok" in res.out


def test_minimal_config_is_valid(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    res = check(capsys, write(tmp_path, BOT))
    assert res.code == 0, res.err
    assert "helper" in res.out


def test_bad_value_names_the_key_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    res = check(capsys, write(tmp_path, BOT + "    rate_cap: {max_replies: 0}\n"))
    assert res.code == 2
    assert res.out == ""
    assert "bots[0].rate_cap.max_replies: must be >= 1" in res.err
    assert "Traceback" not in res.err


def test_bad_default_is_reported_once_at_defaults(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    res = check(capsys, write(tmp_path, "defaults:\n  rate_cap: {max_replies: 0}\n" + BOT))
    assert res.code == 2
    assert "defaults.rate_cap.max_replies: must be >= 1" in res.err
    assert "bots[0].rate_cap" not in res.err
    assert "Traceback" not in res.err


def test_unknown_key_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    res = check(capsys, write(tmp_path, BOT + "    colour: red\n"))
    assert res.code == 2
    assert "bots[0].colour" in res.err
    assert "Traceback" not in res.err


def test_every_problem_is_reported(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    res = check(capsys, write(tmp_path, BOT + "    rate_cap: {max_replies: 0}\n    colour: red\n"))
    assert res.code == 2
    assert "bots[0].rate_cap.max_replies: must be >= 1" in res.err
    assert "bots[0].colour" in res.err


def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "absent.yml"
    res = check(capsys, path)
    assert res.code == 2
    assert res.out == ""
    assert "absent.yml" in res.err
    assert "no such file" in res.err.lower()
    assert "Traceback" not in res.err


def test_yaml_syntax_error_has_a_line_number(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = "bots:\n  - name: helper\n    platform: http\n   backend: {type: echo}\n"
    res = check(capsys, write(tmp_path, text))
    assert res.code == 2
    assert res.out == ""
    assert re.search(r"\bline 4\b", res.err), res.err
    assert "Traceback" not in res.err


def test_unclosed_bracket_has_a_line_number(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    res = check(capsys, write(tmp_path, "store:\n  url: [memory\n"))
    assert res.code == 2
    assert re.search(r"\bline \d+\b", res.err), res.err
    assert "Traceback" not in res.err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "bots"),
        ("- just\n- a list\n", "must be a mapping"),
        ("bots:\n  - name: x\n    platform: irc\n    backend: {type: echo}\n", "bots[0].platform"),
        ("bots:\n  - name: x\n    platform: telegram\n    backend: {type: echo}\n",
         "bots[0].token"),
        ("store: {url: 'redis:/x'}\n" + BOT, "store.url"),
    ],
    ids=["empty", "not-a-mapping", "bad-platform", "token-required", "bad-store-url"],
)  # fmt: skip
def test_invalid_configs_exit_2_without_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, expected: str
) -> None:
    res = check(capsys, write(tmp_path, text))
    assert res.code == 2
    assert expected in res.err
    assert "Traceback" not in res.err


def test_not_utf8(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "config.yml"
    path.write_bytes(b"bots: \xff\xfe\n")
    res = check(capsys, path)
    assert res.code == 2
    assert "Traceback" not in res.err


def test_directory_instead_of_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    res = check(capsys, tmp_path)
    assert res.code == 2
    assert "Traceback" not in res.err


def test_check_config_requires_c(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["check-config"])
    assert exc.value.code == 2
    assert "-c" in capsys.readouterr().err


def test_no_command_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


# --------------------------------------------------------------------------
# the real program, as a subprocess
# --------------------------------------------------------------------------


def test_python_m_gateway_help() -> None:
    res = run_cli("--help")
    assert res.code == 0
    assert res.out.startswith("usage: botbouncer")
    for command in ("check-config", "replay"):
        assert command in res.out


def test_replay_help_lists_its_options() -> None:
    res = run_cli("replay", "--help")
    assert res.code == 0
    for option in ("--as", "-c", "TRANSCRIPT.jsonl"):
        assert option in res.out


def test_no_command_exits_2_with_usage() -> None:
    res = run_cli()
    assert res.code == 2
    assert res.out == ""
    assert res.err.startswith("usage: botbouncer")
    assert "Traceback" not in res.err


def test_console_script_no_command() -> None:
    # the `botbouncer` console script installed into the venv is the same program
    script = Path(sys.executable).parent / "botbouncer"
    assert script.exists(), "run `pip install -e .` to install the console script"
    proc = subprocess.run([str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: botbouncer")


def test_subprocess_check_config_example() -> None:
    res = run_cli("check-config", "-c", str(EXAMPLE))
    assert res.code == 0, res.err
    assert res.err == ""


def test_subprocess_check_config_bad_value(tmp_path: Path) -> None:
    path = write(tmp_path, BOT + "    rate_cap: {max_replies: 0}\n")
    res = run_cli("check-config", "-c", str(path))
    assert res.code == 2
    assert "bots[0].rate_cap.max_replies: must be >= 1" in res.err
    assert "Traceback" not in res.err


def test_subprocess_check_config_missing_file(tmp_path: Path) -> None:
    res = run_cli("check-config", "-c", str(tmp_path / "absent.yml"))
    assert res.code == 2
    assert "absent.yml" in res.err
    assert "Traceback" not in res.err


def test_version_names_the_installed_package() -> None:
    from importlib import metadata

    res = subprocess.run([sys.executable, "-m", "gateway", "--version"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0
    assert res.stdout.strip() == f"botbouncer {metadata.version('botbouncer')}"


def test_replay_reads_a_pipe_as_a_transcript(tmp_path: Path) -> None:
    """`botbouncer replay <(cmd)` hands over /dev/fd/N, a pipe: whatever
    open() can read is a transcript, as is a fifo."""
    transcript = '{"chat": "c", "author": "ann", "text": "hi", "mentions": ["bot"]}\n'
    (tmp_path / "t.jsonl").write_text(transcript)
    res = subprocess.run(["bash", "-c", f'"{sys.executable}" -m gateway replay <(cat t.jsonl)'],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert '"action": "reply"' in res.stdout
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["bash", "-c", f"cat t.jsonl > {fifo}"], cwd=tmp_path)
    res = subprocess.run([sys.executable, "-m", "gateway", "replay", str(fifo)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    writer.wait(timeout=10)
    assert res.returncode == 0, res.stderr
    assert '"action": "reply"' in res.stdout


@pytest.mark.parametrize(("name", "error"), [("absent.jsonl", "no such file or directory"),
                                             (".", "is a directory")])  # fmt: skip
def test_replay_of_what_cannot_be_read_names_why(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, error: str
) -> None:
    code = main(["replay", str(tmp_path / name)])
    err = capsys.readouterr().err
    assert code == 2 and error in err and "Traceback" not in err


def test_a_python_backend_beside_the_config_imports_from_anywhere(tmp_path: Path) -> None:
    """`botbouncer` (the installed script) puts its own bin directory first on
    sys.path, not the working directory: a module beside the config file, or
    in the working directory, must import all the same; a missing one fails
    check-config naming where it looked."""
    bots = tmp_path / "bots"
    bots.mkdir()
    (bots / "mybot_beside.py").write_text("async def reply(msg):\n    return 'hi ' + msg.text\n")
    (bots / "c.yml").write_text(
        "bots:\n  - {name: bot, platform: http, backend: {type: python, "
        "callable: 'mybot_beside:reply'}}\n"
    )
    (bots / "missing.yml").write_text(
        "bots:\n  - {name: bot, platform: http, backend: {type: python, "
        "callable: 'no_such_mod_x:reply'}}\n"
    )
    script = Path(sys.executable).parent / "botbouncer"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for cwd, config in ((tmp_path, "bots/c.yml"), (bots, "c.yml")):
        res = subprocess.run([str(script), "check-config", "-c", config], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert res.returncode == 0, res.stderr
    transcript = '{"chat": "c", "author": "ann", "text": "yo", "mentions": ["bot"]}\n'
    res = subprocess.run([str(script), "replay", "-", "-c", "bots/c.yml"], cwd=tmp_path, env=env,
                         input=transcript, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0 and '"action": "reply"' in res.stdout, res.stderr
    res = subprocess.run([str(script), "check-config", "-c", "bots/missing.yml"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 2
    assert "bots[0].backend.callable: cannot import 'no_such_mod_x'" in res.stderr
    assert "config file's directory, the working directory" in res.stderr
    assert "Traceback" not in res.stderr


def test_init_writes_the_starter_config_that_runs_as_it_is(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A pip user has no repository: `botbouncer init` writes the commented
    example (shipped in the package), refuses to overwrite, and check-config
    takes what it wrote."""
    target = tmp_path / "botbouncer.yml"
    assert main(["init", str(target)]) == 0
    assert "botbouncer run -c" in capsys.readouterr().out
    assert target.read_text() == EXAMPLE.read_text()
    assert check(capsys, target).code == 0
    target.write_text("mine")
    assert main(["init", str(target)]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert target.read_text() == "mine"
    assert main(["init", str(target), "--force"]) == 0
    assert target.read_text() == EXAMPLE.read_text()


def test_the_example_config_ships_in_the_package() -> None:
    from importlib import resources

    shipped = (resources.files("gateway") / "config.example.yml").read_text(encoding="utf-8")
    assert shipped == EXAMPLE.read_text()  # the repository's is a link to it


LLM_ONLY = "llm_proxy:\n  openai: {}\n  anthropic: {path: /llm/claude}\n"


def test_check_config_says_an_llm_proxy_is_served(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Breaks if a config with only an llm_proxy section is said to serve
    # `bots: ` (nothing) instead of the proxy's routes.
    res = check(capsys, write(tmp_path, LLM_ONLY))
    assert res.code == 0, res.err
    assert res.out.endswith(": ok - store memory, llm proxy: /llm/openai, /llm/claude\n")
    res = check(capsys, write(tmp_path, BOT + LLM_ONLY))
    assert res.out.endswith(": ok - store memory, bots: helper (http); llm proxy: /llm/openai, "
                            "/llm/claude\n")  # fmt: skip
    res = check(capsys, write(tmp_path, "mcp_proxy: {}\n"))
    assert res.out.endswith(": ok - store memory, bots: none\n")


def test_the_daemon_says_at_start_that_its_llm_proxy_is_served(tmp_path: Path) -> None:
    # Breaks if the start-up line of a daemon serving only the LLM proxy
    # says `bots: ` (nothing) instead of the proxy's routes.
    from tests.redis_server import free_port

    config = write(tmp_path, LLM_ONLY + f"http: {{listen: '127.0.0.1:{free_port()}'}}\n")
    process = subprocess.Popen([sys.executable, "-m", "gateway", "run", "-c", str(config)],
                               cwd=REPO, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert process.stderr is not None
    try:
        line = process.stderr.readline()
        while line and "listening on" not in line:
            line = process.stderr.readline()
    finally:
        process.terminate()
        process.communicate(timeout=30)
    assert line.rstrip().endswith(" - store memory - llm proxy: /llm/openai, /llm/claude"), line


def test_make_install_remakes_a_virtualenv_that_has_no_pip(tmp_path: Path) -> None:
    """Without Debian's python3-venv, `python3 -m venv .venv` fails after
    leaving .venv/bin/python behind. Once the reader installs the package and
    runs `make run` again, the virtualenv is made again, not taken as it is
    (its pip would be missing, for good). Here the interpreters are stand-ins
    that log how they are called."""
    calls = tmp_path / "calls"
    (tmp_path / "Makefile").write_text((REPO / "Makefile").read_text())
    (tmp_path / "pyproject.toml").write_text("")
    venv_python = tmp_path / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    # the half-made virtualenv's python: no pip module until the venv is made again
    venv_python.write_text(
        "#!/bin/sh\n"
        f'echo "venv $*" >> {calls}\n'
        f'if [ "$*" = "-m pip --version" ] && ! [ -e {tmp_path}/pip-made ]; then exit 1; fi\n'
    )
    system_python = tmp_path / "python3"
    system_python.write_text(f'#!/bin/sh\necho "system $*" >> {calls}\ntouch {tmp_path}/pip-made\n')
    for script in (venv_python, system_python):
        script.chmod(0o755)
    res = subprocess.run(["make", "install", f"PYTHON={system_python}"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    logged = calls.read_text().splitlines()
    assert "system -m venv .venv" in logged
    assert logged[-1] == "venv -m pip install --quiet -e .[dev]"
