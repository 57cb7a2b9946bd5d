"""Configuration: packaged YAML defaults, user YAML, ``KEY=VALUE`` overrides, validation."""

from .loader import ConfigError, default_config, dump_config, load_config, parse_overrides, parse_value, require
from .schema import SCHEMA

__all__ = ["SCHEMA", "ConfigError", "default_config", "dump_config", "load_config", "parse_overrides", "parse_value", "require"]
