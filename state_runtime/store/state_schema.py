"""Key and value schemas: Spark DDL strings or StructTypes, and their Arrow form.

DDL is parsed here, without a JVM, because stores are opened on executors and in maintenance
processes where no SparkContext exists. The grammar is Spark's for the types a state store
holds: primitives, ``decimal(p, s)``, ``array<>``, ``map<>``, ``struct<>`` and ``NOT NULL``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from state_runtime.errors import InvalidArgument

_PRIMITIVES: dict[str, DataType] = {
    "boolean": BooleanType(),
    "tinyint": ByteType(),
    "byte": ByteType(),
    "smallint": ShortType(),
    "short": ShortType(),
    "int": IntegerType(),
    "integer": IntegerType(),
    "bigint": LongType(),
    "long": LongType(),
    "float": FloatType(),
    "real": FloatType(),
    "double": DoubleType(),
    "string": StringType(),
    "binary": BinaryType(),
    "date": DateType(),
    "timestamp": TimestampType(),
    "timestamp_ltz": TimestampType(),
    "timestamp_ntz": TimestampNTZType(),
}
_TOKEN_RE = re.compile(r"\s*(?:(`[^`]+`|[A-Za-z_][A-Za-z0-9_]*|\d+)|(.))")


class _DDLParser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[str] = []
        for match in _TOKEN_RE.finditer(text):
            token = match.group(1) or match.group(2)
            if token and not token.isspace():
                self.tokens.append(token)
        self.pos = 0

    def fail(self, what: str) -> InvalidArgument:
        return InvalidArgument(f"cannot parse schema {self.text!r}: {what}")

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, what: str) -> str:
        """The next token; ``what`` names it for the error at the end of the input."""
        token = self.peek()
        if token is None:
            raise self.fail(f"unexpected end, expected {what}")
        self.pos += 1
        return token

    def expect(self, literal: str) -> None:
        token = self.take(repr(literal))
        if token.lower() != literal:
            raise self.fail(f"expected {literal!r}, found {token!r}")

    def schema(self) -> StructType:
        if self.peek() is not None and self.peek().lower() == "struct" and self._is_type_position():  # type: ignore[union-attr]
            result = self.data_type()
            if not isinstance(result, StructType):
                raise self.fail("expected a struct")
        else:
            result = StructType(self.fields(end=None))
        if self.peek() is not None:
            raise self.fail(f"unexpected {self.peek()!r}")
        return result

    def _is_type_position(self) -> bool:
        return self.pos + 1 < len(self.tokens) and self.tokens[self.pos + 1] == "<"

    def fields(self, end: str | None) -> list[StructField]:
        fields: list[StructField] = []
        while True:
            name = self.take("a field name")
            if not re.match(r"^(`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)$", name):
                raise self.fail(f"invalid field name {name!r}")
            name = name.strip("`")
            if self.peek() == ":":
                self.expect(":")
            dtype = self.data_type()
            nullable = True
            if self.peek() is not None and self.peek().lower() == "not":  # type: ignore[union-attr]
                self.expect("not")
                self.expect("null")
                nullable = False
            fields.append(StructField(name, dtype, nullable))
            if self.peek() == ",":
                self.expect(",")
                continue
            if self.peek() == end:
                return fields
            raise self.fail(f"unexpected {self.peek()!r}")

    def data_type(self) -> DataType:
        token = self.take("a type").lower()
        if token in _PRIMITIVES:
            return _PRIMITIVES[token]
        if token in {"decimal", "dec", "numeric"}:
            if self.peek() != "(":
                return DecimalType(10, 0)
            self.expect("(")
            precision = int(self.take("a precision"))
            scale = 0
            if self.peek() == ",":
                self.expect(",")
                scale = int(self.take("a scale"))
            self.expect(")")
            return DecimalType(precision, scale)
        if token == "array":
            self.expect("<")
            element = self.data_type()
            self.expect(">")
            return ArrayType(element, True)
        if token == "map":
            self.expect("<")
            key = self.data_type()
            self.expect(",")
            value = self.data_type()
            self.expect(">")
            return MapType(key, value, True)
        if token == "struct":
            self.expect("<")
            fields = self.fields(end=">")
            self.expect(">")
            return StructType(fields)
        raise self.fail(f"unknown type {token!r}")


def parse_schema(schema: str | StructType | dict[str, Any]) -> StructType:
    """A StructType from a Spark DDL string (``"user string, n bigint"``), a StructType, or
    Spark's JSON form of one (``StructType.jsonValue()``, as the catalog stores it)."""
    if isinstance(schema, dict):
        try:
            schema = StructType.fromJson(schema)
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidArgument(f"invalid JSON schema {schema!r}: {e}") from e
    if isinstance(schema, StructType):
        if not schema.fields:
            raise InvalidArgument("a schema needs at least one field")
        return schema
    if not isinstance(schema, str) or not schema.strip():
        raise InvalidArgument(f"invalid schema {schema!r}: expected a DDL string or StructType")
    parsed = _DDLParser(schema).schema()
    if not parsed.fields:
        raise InvalidArgument(f"invalid schema {schema!r}: no fields")
    return parsed


def schema_from_json(text: str) -> StructType:
    parsed = StructType.fromJson(json.loads(text))
    return parsed


@dataclass(frozen=True)
class StateSchema:
    """The key and value schemas of a store, in Spark and Arrow form."""

    key: StructType
    value: StructType

    @classmethod
    def of(
        cls, key: str | StructType | dict[str, Any], value: str | StructType | dict[str, Any]
    ) -> StateSchema:
        return cls(parse_schema(key), parse_schema(value))

    @cached_property
    def key_arrow(self) -> pa.StructType:
        return pa.struct(list(to_arrow_schema(self.key, timezone="UTC")))

    @cached_property
    def value_arrow(self) -> pa.StructType:
        return pa.struct(list(to_arrow_schema(self.value, timezone="UTC")))

    @cached_property
    def row_bytes(self) -> int:
        """Bytes a row (key and value) takes in Arrow at least: what a count of rows is
        weighed by against the spill threshold before the rows exist."""
        return _struct_bytes(self.key_arrow) + _struct_bytes(self.value_arrow)

    @property
    def key_arity(self) -> int:
        return len(self.key.fields)

    @property
    def value_arity(self) -> int:
        return len(self.value.fields)

    def describe(self) -> str:
        return f"key <{self.key.simpleString()[7:-1]}>, value <{self.value.simpleString()[7:-1]}>"


def _struct_bytes(struct: pa.StructType) -> int:
    """Bytes a row of ``struct`` decodes to at least: fixed-width fields at their width (one
    byte for a flag), others at 8 (an offset and some data)."""
    total = 0
    for field in struct:
        if pa.types.is_struct(field.type):
            total += _struct_bytes(field.type)
        else:
            try:
                total += max(1, field.type.bit_width // 8)
            except ValueError:
                total += 8
    return total
