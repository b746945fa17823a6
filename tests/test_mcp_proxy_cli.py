"""`botbouncer mcp-proxy` as a command (docs/mcp-proxy.md): what it takes
on its command line, and stdin and stdout that are not pipes (/dev/null, a
regular file, a terminal), as a shell or a script gives them. The proxy is
always the real command (`python -m gateway mcp-proxy`, a process of its
own); no MCP is spoken here, the lines are relayed as they came.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time
from argparse import _SubParsersAction
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import build_parser

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
PROXY = [PY, "-m", "gateway", "mcp-proxy"]
WAIT = 20.0  # seconds: a proxy that never ends fails the test instead of hanging it
LINES = b'{"jsonrpc":"2.0","method":"notifications/a"}\n{"jsonrpc":"2.0","method":"b"}\n'
# A server that reads its stdin to the end, writes back what it read, and
# exits with a status of its own.
ECHO_ALL = "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read()); sys.exit(3)"


def proxy(*args: str, stdin: Any, stdout: Any) -> tuple[int, bytes, str]:
    """Exit status, stdout (when piped) and stderr of one proxy run."""
    res = subprocess.run([*PROXY, *args], cwd=ROOT, stdin=stdin, stdout=stdout,
                         stderr=subprocess.PIPE, timeout=WAIT)  # fmt: skip
    return res.returncode, res.stdout or b"", res.stderr.decode()


@pytest.mark.parametrize("stdout", ["a pipe", "/dev/null", "a file"])
@pytest.mark.parametrize("stdin", ["/dev/null", "a file"])
def test_stdin_and_stdout_that_are_not_pipes_are_relayed(
    tmp_path: Path, stdin: str, stdout: str
) -> None:
    # Breaks if the proxy hands /dev/null (a character device, which epoll
    # refuses) to the event loop as a pipe: an asyncio traceback, and the
    # end of its input never seen, so a server reading to the end of its
    # input ran for ever. A regular file is the same, either way round.
    source = tmp_path / "in"
    source.write_bytes(LINES)
    sink = tmp_path / "out"
    with (
        open(os.devnull if stdin == "/dev/null" else source, "rb") as given,
        open(os.devnull if stdout == "/dev/null" else sink, "wb") as taken,
    ):
        out = subprocess.PIPE if stdout == "a pipe" else taken
        code, piped, err = proxy("--", PY, "-c", ECHO_ALL, stdin=given, stdout=out)
    assert code == 3, err
    assert "Traceback" not in err and err == ""
    sent = b"" if stdin == "/dev/null" else LINES
    if stdout == "a pipe":
        assert piped == sent
    elif stdout == "a file":
        assert sink.read_bytes() == sent


def test_a_proxy_on_a_terminal_ends_with_its_server_and_leaves_the_terminal_as_it_was() -> None:
    # Breaks if the proxy hands its terminal to the event loop, which makes
    # it non-blocking for every program on it (the shell after the proxy),
    # or if a read from the terminal, which nothing will answer, keeps the
    # proxy from ending once its server has, or if the terminal is not relayed.
    main, side = pty.openpty()
    try:
        started = time.monotonic()
        code, _, err = proxy("--", PY, "-c", "print('ready'); exit(4)", stdin=side, stdout=side)
        assert code == 4, err
        assert "Traceback" not in err
        assert time.monotonic() - started < WAIT / 2
        assert os.get_blocking(side)
        assert b"ready" in os.read(main, 1000)
        # A line typed on the terminal reaches the server, and its answer the terminal.
        reply = "import sys; print(sys.stdin.readline().strip() + '!'); exit(5)"
        process = subprocess.Popen([*PROXY, "--", PY, "-c", reply], cwd=ROOT, stdin=side,
                                   stdout=side, stderr=subprocess.PIPE)  # fmt: skip
        try:
            os.write(main, b"hello\n")
            assert process.wait(WAIT) == 5
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            assert process.stderr is not None
            process.stderr.close()
        seen = b""
        while b"hello!" not in seen:
            seen += os.read(main, 1000)
    finally:
        os.close(main)
        os.close(side)


@pytest.mark.parametrize(
    ("args", "says", "not_said"),
    [
        ((), ["no MCP server given", "-- CMD ARGS", "--upstream URL"], "not both"),
        (("--listen", "127.0.0.1:9", "--", "cat"), ["--listen", "--upstream URL"], "not both"),
        (("--listen", "127.0.0.1:9", "--upstream", "http://127.0.0.1:9/mcp", "--", "cat"),
         ["not both"], "no MCP server given"),
    ],
    ids=["nothing", "--listen without --upstream", "both"],
)  # fmt: skip
def test_a_server_missing_or_a_listen_without_upstream_exits_2_saying_so(
    args: tuple[str, ...], says: list[str], not_said: str
) -> None:
    # Breaks if --listen is taken, and ignored, for a server started over
    # stdio, or if nothing given is answered as if too much were ("not both").
    code, out, err = proxy(*args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert code == 2
    assert out == b""  # stdout is the protocol: never a word of the proxy's own
    assert len(err.splitlines()) == 1, err
    for words in says:
        assert words in err, err
    assert not_said not in err


def test_the_usage_line_names_every_option() -> None:
    # Breaks if the usage line leaves out an option the command takes.
    commands = next(a for a in build_parser()._actions if isinstance(a, _SubParsersAction))
    mcp = commands.choices["mcp-proxy"]
    usage = mcp.format_usage()
    for action in mcp._actions:
        if action.option_strings and action.dest != "help":
            assert any(f"{o} " in usage for o in action.option_strings), action.option_strings


def test_without_the_mcp_extra_it_says_what_to_install() -> None:
    # Breaks if the proxy imports the MCP SDK's types unguarded: on an install
    # without the `mcp` extra the user saw a ModuleNotFoundError traceback.
    without_mcp = (
        "import sys\n"
        "sys.modules['mcp_types'] = sys.modules['mcp'] = None  # as if not installed\n"
        "from gateway.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    res = subprocess.run([PY, "-c", without_mcp, "mcp-proxy", "--", PY, "-c", "pass"], cwd=ROOT,
                         stdin=subprocess.DEVNULL, capture_output=True, timeout=WAIT)  # fmt: skip
    err = res.stderr.decode()
    assert res.returncode == 2, err
    assert "mcp-proxy needs 'mcp_types', which is not installed: pip install 'botbouncer[mcp]'" in (
        err
    )
    assert "Traceback" not in err
