"""Reading a config: YAML, `${VAR}` interpolation, validation."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.config.errors import ConfigError, KeyPath, describe, format_path
from gateway.config.schema import Config
from gateway.redact import remember

# A config file is a few kilobytes; these bounds make a huge file or a YAML
# alias bomb a quick, clear error instead of minutes of parsing or expanding.
MAX_FILE_BYTES = 1024 * 1024
MAX_VALUES = 100_000


_REFERENCE = re.compile(
    r"\$(?:(?P<dollar>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}"
    r"|(?P<bad>\{))"
)


def _interpolate(node: Any, env: Mapping[str, str], path: KeyPath, problems: list[str]) -> Any:
    if isinstance(node, str):
        return _interpolate_str(node, env, path, problems)
    if isinstance(node, dict):
        return {k: _interpolate(v, env, (*path, str(k)), problems) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, env, (*path, i), problems) for i, v in enumerate(node)]
    return node


def _interpolate_str(text: str, env: Mapping[str, str], path: KeyPath, problems: list[str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match["dollar"]:
            return "$"
        if match["bad"]:
            problems.append(
                f"{format_path(path)}: malformed reference: use ${{VAR}}, ${{VAR:-default}}"
                " or $$ for a literal $"
            )
            return ""
        name = match["name"]
        value = env.get(name)
        if match["default"] is not None:
            return value if value else match["default"]
        if value is None:
            problems.append(f"{format_path(path)}: environment variable {name} is not set")
            return ""
        return value

    return _REFERENCE.sub(replace, text)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys instead of keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):  # `!!map [1]`, `!!set 1`
            return super().construct_mapping(node, deep)  # "expected a mapping node"
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(
                key_node, yaml.ScalarNode
            ):
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (yaml.YAMLError, RecursionError):
            raise
        except Exception as exc:
            # A scalar PyYAML's constructors choke on (an int past Python's
            # 4300-digit limit, a 13th month, an empty `!!int`): a YAML error
            # at that scalar, not a traceback.
            kind = str(node.tag).rsplit(":", 1)[-1]
            problem = f"cannot read this value as {kind}"
            if isinstance(exc, ValueError | OverflowError):
                problem += f": {str(exc).split(';')[0]}"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None


def _parse_yaml(text: str, source: str) -> Any:
    loader: _StrictLoader | None = None
    try:
        loader = _StrictLoader(text)  # a SafeLoader subclass; its reader checks characters
        return loader.get_single_data()
    except yaml.reader.ReaderError as exc:
        # e.g. a NUL or another control character, which YAML does not allow
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        what = f"U+{exc.character:04X}" if isinstance(exc.character, int) else "this character"
        raise ConfigError(
            f"{source}: line {line}, column {column}: character {what} is not allowed in YAML"
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if mark is None:
            raise ConfigError(f"{source}: {problem}") from None
        raise ConfigError(
            f"{source}: line {mark.line + 1}, column {mark.column + 1}: {problem}"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    except Exception as exc:
        # PyYAML's own, outside any node: the scanner's chr() of an escape such
        # as "\UFFFFFFFF" past Unicode's end, ...: an error, never a traceback.
        where = ""
        if loader is not None:
            mark = loader.get_mark()
            where = f"line {mark.line + 1}, column {mark.column + 1}: "
        raise ConfigError(f"{source}: {where}cannot read this value: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _check_acyclic(
    node: Any, path: KeyPath, stack: set[int], sizes: dict[int, int] | None = None
) -> int:
    """How many values `node` holds once its aliases are expanded.

    YAML anchors can build a list that contains itself, or ("billion laughs")
    a few lines whose aliases expand to billions of values; refuse both up
    front. Each shared node is walked once (`sizes`), so this is linear in
    the file, not in the expansion."""
    if not isinstance(node, dict | list):
        return 1
    sizes = {} if sizes is None else sizes
    known = sizes.get(id(node))
    if known is not None:
        return known
    if id(node) in stack:
        raise ConfigError(f"{format_path(path)}: a recursive alias is not allowed")
    stack.add(id(node))
    total = 1
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        total += _check_acyclic(
            value, (*path, key if isinstance(key, int) else str(key)), stack, sizes
        )
        if total > MAX_VALUES:
            raise ConfigError(
                f"{format_path(path)}: holds more than {MAX_VALUES} values once its aliases"
                " are expanded; a configuration is far smaller"
            )
    stack.discard(id(node))
    sizes[id(node)] = total
    return total


def parse_config(
    text: str, source: str = "<config>", env: Mapping[str, str] | None = None
) -> Config:
    """Validate YAML text; `source` names it in YAML syntax errors."""
    data = _parse_yaml(text, source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("(top level): must be a mapping")
    try:
        _check_acyclic(data, (), set())
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    problems: list[str] = []
    data = _interpolate(data, os.environ if env is None else env, (), problems)
    if problems:
        raise ConfigError(problems)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe(exc, data)) from None


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Config:
    """Read, interpolate and validate a config file. Its secrets are remembered
    (gateway/redact.py), so that no later log line or error message shows them."""
    name = os.fspath(path)
    try:
        with Path(name).open("rb") as file:  # at most one byte past the limit: /dev/zero ends
            raw = file.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{name}: is a directory, not a file") from None
    except PermissionError:
        raise ConfigError(f"{name}: permission denied") from None
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(
            f"{name}: larger than {MAX_FILE_BYTES // 1024} KiB; a configuration file is far smaller"
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{name}: not UTF-8 text (bad byte at offset {exc.start})") from None
    config = parse_config(text, source=name, env=env)
    remember(config)
    return config
