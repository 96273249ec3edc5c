"""Configs are dataclasses built from plain data (parsed YAML, CLI flags) and checked at the edge: unknown,
missing or mistyped fields raise ``ConfigError`` with the field's dotted name."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal, get_args, get_origin

from embedlib.errors import UserError


class ConfigError(UserError, ValueError):
    """An invalid configuration; the message names the offending field."""


def _coerce(value: Any, annotation: Any, name: str) -> Any:
    """``value`` checked against (and converted to) ``annotation``; ``ConfigError`` naming ``name``."""
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _coerce(value, option, name)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{name}: {value!r} matches none of {options}")
    if origin is Literal:
        if value not in get_args(annotation):
            raise ConfigError(f"{name}: must be one of {list(get_args(annotation))}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{name}: must be a list, got {value!r}")
        item_types = get_args(annotation)
        if origin is tuple:
            if len(value) != len(item_types):
                raise ConfigError(f"{name}: must have {len(item_types)} items, got {value!r}")
            return tuple(
                _coerce(v, t, f"{name}[{i}]") for i, (v, t) in enumerate(zip(value, item_types, strict=True))
            )
        return [_coerce(v, item_types[0], f"{name}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(annotation):
        return from_dict(annotation, value, name)
    if annotation is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if annotation is Any or (
        isinstance(annotation, type)
        and isinstance(value, annotation)
        and not (annotation is int and isinstance(value, bool))
    ):
        return value
    raise ConfigError(f"{name}: must be {getattr(annotation, '__name__', annotation)}, got {value!r}")


def from_dict(cls: type, values: Any, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping: unknown, missing or mistyped fields are ``ConfigError``s."""
    if isinstance(values, cls):
        return values
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix or cls.__name__}: must be a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(
            f"{prefix + '.' if prefix else ''}{unknown[0]}: unknown field (known: {sorted(fields)})"
        )
    kwargs = {}
    for name, f in fields.items():
        full = f"{prefix}.{name}" if prefix else name
        if name in values:
            kwargs[name] = _coerce(values[name], hints[name], full)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{full}: required field is missing")
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise ConfigError(f"{prefix + '.' if prefix else ''}{err}") from err


@contextmanager
def naming_file(path_or_url: str) -> Iterator[None]:
    """A ``ConfigError`` raised inside is re-raised with the config file's (redacted) name in front."""
    from embedlib import storage

    try:
        yield
    except ConfigError as err:
        raise ConfigError(f"{storage.redact_url(path_or_url)}: {err}") from None


def read_yaml(path_or_url: str) -> dict[str, Any]:
    """A YAML config file (local path or any fsspec URL) as a mapping; a missing, unreadable or non-mapping
    file is a ``ConfigError`` naming it. An empty file is ``{}``."""
    import yaml

    from embedlib import storage

    where = storage.redact_url(path_or_url)
    try:
        values = yaml.safe_load(storage.read_bytes(path_or_url))
    except FileNotFoundError:
        raise ConfigError(f"{where}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{where}: is a folder, not a YAML config file") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML ({' '.join(str(err).split())})") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: must hold a mapping of config fields, got {type(values).__name__}")
    return values


def values_from_args(config_cls: type, args: Any) -> dict[str, Any]:
    """A job's config values: the ``--config`` YAML file (if any), then every command-line flag named like a
    field of ``config_cls`` over it, then ``--no-progress`` as ``show_progress: false``."""
    values = read_yaml(args.config) if getattr(args, "config", None) else {}
    for field in dataclasses.fields(config_cls):
        flag = getattr(args, field.name, None)
        if flag is not None:
            values[field.name] = flag
    if getattr(args, "no_progress", False):
        values["show_progress"] = False
    return values
