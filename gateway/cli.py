"""The `botbouncer` command (README.md). `python -m gateway` is the same program."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from contextlib import nullcontext
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from gateway.config import Config, ConfigError, load_config
from gateway.redact import redact

EXIT_USAGE = 2
EXIT_SIGPIPE = 141  # as a shell shows a writer stopped by SIGPIPE (128 + 13)
MCP_LISTEN = "127.0.0.1:8090"  # mcp-proxy --upstream's default --listen


def _fail(message: str) -> int:
    # Not a log line, so no log filter sees it: mask the loaded secrets here.
    print(f"botbouncer: {redact(message)}", file=sys.stderr)
    return EXIT_USAGE


def _check_config(args: argparse.Namespace) -> int:
    from gateway.backends.python import PythonBackendError, importable, load_callable

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        return _fail(f"{args.config}: invalid configuration\n{exc}")
    # A python backend is imported as the daemon would: a module that is
    # not there fails here, not at start.
    importable(args.config)
    problems = []
    for i, bot in enumerate(config.bots):
        if bot.backend is not None and bot.backend.type == "python":
            try:
                load_callable(bot.backend.callable)
            except PythonBackendError as exc:
                problems.append(f"bots[{i}].backend.callable: {exc}")
    if problems:
        return _fail(f"{args.config}: invalid configuration\n" + "\n".join(problems))
    print(f"{args.config}: ok - store {config.store.scheme}, {config.served()}")
    for note in notes(config):
        print(f"note: {note}")
    return 0


def notes(config: Config) -> list[str]:
    """Valid settings worth a second look (check-config prints them, exit 0)."""
    out = []
    for where, turns in [("defaults", config.defaults.turns)] + [
        (f"bots[{b.name}]", b.turns) for b in config.bots
    ]:
        if turns.soft_limit >= turns.hard_limit:
            out.append(
                f"{where}.turns: soft_limit ({turns.soft_limit}) >= hard_limit "
                f"({turns.hard_limit}): the hard limit stops a loop first and the "
                "soft limit never warns (a hard stop only)"
            )
    return out


def _run(args: argparse.Namespace) -> int:
    from gateway.logs import setup_logging

    handler = setup_logging(args.log_level, args.log_format)
    try:
        return _serve(args)
    finally:
        logging.getLogger().removeHandler(handler)


def _serve(args: argparse.Namespace) -> int:
    from gateway.backends.python import importable
    from gateway.daemon import serve
    from gateway.errors import StartupError

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        return _fail(f"{args.config}: invalid configuration\n{exc}")
    importable(args.config)
    try:
        asyncio.run(serve(config, path=args.config))
    except StartupError as exc:
        _fail(str(exc))
        return exc.exit_status
    return 0


def _replay(args: argparse.Namespace) -> int:
    from gateway.backends.python import importable
    from gateway.daemon import build_gateway, context_size
    from gateway.outbound import Outbound
    from gateway.replay import ReplayError, replay, replay_clock
    from gateway.store import MemoryStore

    try:
        config = load_config(args.config) if args.config else Config.default()
    except ConfigError as exc:
        return _fail(f"{args.config}: invalid configuration\n{exc}")
    importable(args.config)
    name = args.as_bot or config.bots[0].name
    try:
        bot = config.bot(name)
    except KeyError as exc:
        return _fail(str(exc.args[0]) if exc.args else str(exc))
    # Whatever open() reads is a transcript: a pipe (`<(cmd)`, a fifo) as
    # much as a file. Its error names what is wrong (missing, a directory...).
    # Read as bytes: replay decodes each line, so a bad byte names its line.
    stdin: IO[Any] = getattr(sys.stdin, "buffer", sys.stdin)
    try:
        source = stdin if args.transcript == "-" else open(args.transcript, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        return _fail(f"{args.transcript}: {(exc.strerror or str(exc)).lower()}")
    clock = replay_clock()
    # A fresh memory store: a replay never touches the state of a running daemon.
    store = MemoryStore(
        state_ttl_seconds=config.store.state_ttl_seconds,
        settings_ttl_seconds=config.store.settings_ttl_seconds,
        context_size=context_size(config),
        max_chats=config.store.max_chats,
    )
    outbound = Outbound()
    # The classifier runs when the config enables it; a backend never does.
    gateway = build_gateway(bot, store, outbound, dry_run=True, clock=clock)

    async def run(source: IO[Any]) -> None:
        try:
            await replay(source, gateway, clock, sys.stdout)
        finally:
            await outbound.close()

    try:
        with source if source is not stdin else nullcontext(source):
            asyncio.run(run(source))
    except ReplayError as exc:
        return _fail(f"{args.transcript}: {exc}")
    except UnicodeDecodeError as exc:  # a text stdin (no .buffer)
        return _fail(f"{args.transcript}: not UTF-8 text ({exc.reason})")
    except BrokenPipeError:
        # The reader of our output went away (`| head`): nothing is wrong
        # with the transcript. Whatever is still buffered goes nowhere, not
        # to a second BrokenPipeError at exit.
        _discard_stdout()
        return EXIT_SIGPIPE
    except OSError as exc:
        return _fail(f"{args.transcript}: {exc.strerror}")
    return 0


def _discard_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor (a captured stdout)
        pass


def _init(args: argparse.Namespace) -> int:
    """Write the starter config (the commented example, which runs as it is:
    memory store, one HTTP echo bot, no tokens) for a pip user without the
    repository."""
    from importlib import resources

    path = Path(args.path)
    if path.exists() and not args.force:
        return _fail(f"{path}: already exists; pass --force to overwrite it")
    text = (resources.files("gateway") / "config.example.yml").read_text(encoding="utf-8")
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        return _fail(f"{path}: {(exc.strerror or str(exc)).lower()}")
    print(f"wrote {path}: every key with its default, commented; it runs as it is.")
    print(f"next: botbouncer check-config -c {path}   then   botbouncer run -c {path}")
    return 0


def mcp_defaults() -> Config:
    """The MCP proxy's built-in settings: memory, the default profile without
    its step ceilings. A client keeps its proxy (its session) for as long as
    it runs, days for an editor; the ceilings are budgets for one agent run
    (docs/mcp-proxy.md). The loop rules stay as they are."""
    from gateway.fields import MAX_COUNT

    steps = {"max_steps": MAX_COUNT, "max_per_tool": MAX_COUNT}
    return Config.model_validate(
        {"mcp_proxy": {}, "guard": {"profiles": {"default": {"steps": steps}}}}
    )


def _mcp_proxy(args: argparse.Namespace) -> int:
    from gateway.config.process import _split_listen
    from gateway.errors import StartupError
    from gateway.fields import check_http_url
    from gateway.guard.requests import GuardInputError, check_session
    from gateway.logs import setup_logging

    command = args.server[1:] if args.server[:1] == ["--"] else args.server
    if not command and not args.upstream:
        return _fail("mcp-proxy: no MCP server given: the server to start (-- CMD ARGS...) "
                     "or --upstream URL")  # fmt: skip
    if command and args.upstream:
        return _fail("mcp-proxy: give the server to start (-- CMD ARGS...) or --upstream URL, "
                     "not both")  # fmt: skip
    if args.listen is not None and not args.upstream:
        return _fail("mcp-proxy: --listen goes with --upstream URL; a server started with "
                     "-- CMD ARGS is spoken to over the proxy's stdin and stdout")  # fmt: skip
    try:
        config = load_config(args.config) if args.config else mcp_defaults()
    except ConfigError as exc:
        return _fail(f"{args.config}: invalid configuration\n{exc}")
    try:
        listen = _split_listen(args.listen or MCP_LISTEN)
        if args.upstream:
            check_http_url(args.upstream)
        if args.session is not None:
            check_session(args.session)
    except GuardInputError as exc:
        return _fail(f"--session: {str(exc).partition(': ')[2]}")
    except ValueError as exc:
        return _fail(f"--{'upstream' if args.upstream and 'URL' in str(exc) else 'listen'}: {exc}")
    try:
        from gateway.mcpproxy.main import serve
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("gateway"):
            raise
        return _fail(f"mcp-proxy needs {exc.name!r}, which is not installed: "
                     "pip install 'botbouncer[mcp]' (or botbouncer[all])")  # fmt: skip
    handler = setup_logging(args.log_level, "text")  # stderr: stdout is the protocol

    try:
        return asyncio.run(serve(config, command, session=args.session, profile=args.profile,
                                 upstream=args.upstream, listen=listen))  # fmt: skip
    except (StartupError, FileNotFoundError, GuardInputError) as exc:
        _fail(f"mcp-proxy: {exc}")
        return exc.exit_status if isinstance(exc, StartupError) else EXIT_USAGE
    finally:
        logging.getLogger().removeHandler(handler)


def _demo(args: argparse.Namespace) -> int:
    from gateway.demo import run_demo

    return run_demo(delay=args.delay, color=not args.no_color)


def _version() -> str:
    try:
        return metadata.version("botbouncer")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="botbouncer",
        description="A gateway in front of chat bots that stops bot loops early.",
    )
    parser.add_argument("--version", action="version", version=f"botbouncer {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("-c", "--config", required=True, metavar="FILE",
                     help="the YAML configuration (config.example.yml runs as it is)")  # fmt: skip
    run.add_argument("--log-level", default="info",
                     choices=["debug", "info", "warning", "error"])  # fmt: skip
    run.add_argument("--log-format", default="text", choices=["text", "json"],
                     help="text lines (default) or one JSON object per line")  # fmt: skip
    run.set_defaults(func=_run)

    check = sub.add_parser("check-config", help="validate a configuration file")
    check.add_argument(
        "-c", "--config", required=True, metavar="FILE",
        help="the YAML configuration to check (exit 0, or 2 naming each problem)",
    )  # fmt: skip
    check.set_defaults(func=_check_config)

    rep = sub.add_parser("replay", help="run a JSONL chat transcript through the pipeline")
    rep.add_argument("transcript", metavar="TRANSCRIPT.jsonl", help="a file, or - for stdin")
    rep.add_argument("-c", "--config", metavar="FILE", help="default: built-in defaults")
    rep.add_argument(
        "--as",
        dest="as_bot",
        metavar="BOT",
        help="the bot the gateway plays (default: the first configured bot)",
    )
    rep.set_defaults(func=_replay)

    init = sub.add_parser("init", help="write a starter config (every key, commented)")
    init.add_argument("path", nargs="?", default="botbouncer.yml", metavar="FILE",
                      help="where to write it (default: botbouncer.yml)")  # fmt: skip
    init.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    init.set_defaults(func=_init)

    mcp = sub.add_parser(
        "mcp-proxy",
        help="the agent guard in front of an MCP server (stdio, or streamable HTTP)",
        usage="botbouncer mcp-proxy [-c FILE] [--session S] [--profile P] [--log-level LEVEL] "
        "(-- CMD ARGS... | --upstream URL [--listen HOST:PORT])",
    )
    mcp.add_argument("-c", "--config", metavar="FILE",
                     help="store, guard, mcp_proxy (default: built-in defaults)")  # fmt: skip
    mcp.add_argument("--session", metavar="S",
                     help="the guard session (default: one per client connection)")  # fmt: skip
    mcp.add_argument(
        "--profile", metavar="P", help="the guard profile (default: mcp_proxy.profile)"
    )
    mcp.add_argument("--upstream", metavar="URL",
                     help="a streamable HTTP MCP server's URL, to serve in front of")  # fmt: skip
    mcp.add_argument("--listen", metavar="HOST:PORT",
                     help=f"with --upstream: where to listen (default {MCP_LISTEN})")  # fmt: skip
    mcp.add_argument("--log-level", default="warning", metavar="LEVEL",
                     choices=["debug", "info", "warning", "error"],
                     help="debug, info, warning (default) or error; on stderr")  # fmt: skip
    mcp.add_argument("server", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                     help="the stdio MCP server to start and relay to")  # fmt: skip
    mcp.set_defaults(func=_mcp_proxy)

    demo = sub.add_parser("demo", help="watch two bots loop and botbouncer stop them")
    demo.add_argument("--delay", type=float, metavar="SECONDS",
                      help="pause between lines (default: 0.35 on a terminal, else 0)")  # fmt: skip
    demo.add_argument("--no-color", action="store_true", help="plain text, even on a terminal")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
