"""The row format of the log, under the name it had when only the SQLite store used it:
:mod:`flowscope.store.codec` (both SQL stores write it)."""

from ..codec import Builder, EventNotSerializableError, Row, builder_source, decode, encode

__all__ = ["EventNotSerializableError", "Row", "Builder", "encode", "decode", "builder_source"]
