"""A keyspace's schema as a backup captured it, and the CQL that recreates one of its tables.

Captured at backup time as the rows of `DESCRIBE KEYSPACE k WITH INTERNALS` (Cassandra 4.0+ runs
DESCRIBE itself): one row per element (keyspace, type, function, table, index, view), each with its
CQL. With INTERNALS a table's CQL carries `WITH ID = <table id>` and, for every dropped column, the
column in the definition followed by `ALTER TABLE ... DROP c USING TIMESTAMP t`: a table recreated
from it has the old id (its data directory and the backed-up SSTables match again) and knows the
dropped columns the SSTables may still hold cells of.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ringsnap.errors import ValidationError
from ringsnap.names import keyspace_name, table_name

_TABLE_ID = re.compile(
    r"\bID\s*=\s*([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"
)
#: `WITH ID = x AND a = b` → `WITH a = b`; `... AND ID = x` → `...`; `WITH ID = x;` → nothing.
_WITH_ID_AND = re.compile(r"\bWITH\s+ID\s*=\s*[0-9a-fA-F-]{36}\s+AND\s+", re.IGNORECASE)
_AND_ID = re.compile(r"\s+AND\s+ID\s*=\s*[0-9a-fA-F-]{36}", re.IGNORECASE)
_WITH_ID_ONLY = re.compile(r"\s+WITH\s+ID\s*=\s*[0-9a-fA-F-]{36}\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class SchemaRow:
    """One row of `DESCRIBE KEYSPACE k WITH INTERNALS`."""

    type: str
    name: str
    statement: str


def split_statements(text: str) -> list[str]:
    """CQL statements of `text`, without their `;`, split outside strings, quoted names, `$$`
    bodies and comments."""
    statements: list[str] = []
    current: list[str] = []
    index = 0
    length = len(text)
    while index < length:
        char = text[index]
        if char in ("'", '"'):
            end = index + 1
            while end < length:
                if text[end] == char:
                    if end + 1 < length and text[end + 1] == char:  # '' or "" inside
                        end += 2
                        continue
                    break
                end += 1
            current.append(text[index : end + 1])
            index = end + 1
        elif text.startswith("$$", index):
            end = text.find("$$", index + 2)
            end = length if end < 0 else end + 2
            current.append(text[index:end])
            index = end
        elif text.startswith("--", index) or text.startswith("//", index):
            end = text.find("\n", index)
            index = length if end < 0 else end
        elif text.startswith("/*", index):
            end = text.find("*/", index + 2)
            index = length if end < 0 else end + 2
        elif char == ";":
            statement = "".join(current).strip()
            if statement:
                statements.append(statement)
            current = []
            index += 1
        else:
            current.append(char)
            index += 1
    statement = "".join(current).strip()
    if statement:
        statements.append(statement)
    return statements


def _name_pattern(keyspace: str, table: str) -> str:
    return rf'"?{re.escape(keyspace)}"?\s*\.\s*"?{re.escape(table)}"?(?=[\s(]|$)'


def _rename(statement: str, keyspace: str, table: str, new_keyspace: str, new_table: str) -> str:
    """`statement` with every `keyspace.table` (quoted or not) replaced by the new name."""
    pattern = re.compile(_name_pattern(keyspace, table), re.IGNORECASE)
    return pattern.sub(f"{new_keyspace}.{new_table}", statement)


def without_table_id(statement: str) -> str:
    """A CREATE TABLE statement without its `ID = ...` option (Cassandra then picks a new id)."""
    statement = _WITH_ID_AND.sub("WITH ", statement, count=1)
    statement = _AND_ID.sub("", statement, count=1)
    return _WITH_ID_ONLY.sub("", statement, count=1)


@dataclass(frozen=True)
class KeyspaceSchema:
    keyspace: str
    rows: tuple[SchemaRow, ...]

    def _rows(self, kind: str) -> list[SchemaRow]:
        return [row for row in self.rows if row.type == kind]

    def keyspace_statement(self) -> str:
        for row in self._rows("keyspace"):
            for statement in split_statements(row.statement):
                if statement.upper().startswith("CREATE KEYSPACE"):
                    return statement
        raise ValidationError(
            f"the captured schema of keyspace {self.keyspace} has no CREATE KEYSPACE statement"
        )

    def tables(self) -> list[str]:
        return [row.name for row in self._rows("table")]

    def has_table(self, table: str) -> bool:
        return table in self.tables()

    def table_statements(self, table: str) -> list[str]:
        """CREATE TABLE (with its ID) and the ALTER TABLE statements of its dropped columns."""
        for row in self._rows("table"):
            if row.name == table:
                statements = split_statements(row.statement)
                break
        else:
            raise ValidationError(
                f"table {self.keyspace}.{table} is not in the schema the backup captured"
                f" (its tables: {', '.join(self.tables()) or 'none'})"
            )
        if not statements or not statements[0].upper().startswith("CREATE TABLE"):
            raise ValidationError(
                f"the captured schema of {self.keyspace}.{table} does not start with CREATE TABLE"
            )
        # Dropped columns may come as rows of their own in some versions: keep them with the table.
        name = re.compile(r"^ALTER\s+TABLE\s+" + _name_pattern(self.keyspace, table), re.IGNORECASE)
        for row in self.rows:
            if row.type != "table":
                statements.extend(
                    s
                    for s in split_statements(row.statement)
                    if name.match(s) and s not in statements
                )
        return statements

    def table_id(self, table: str) -> str:
        match = _TABLE_ID.search(self.table_statements(table)[0])
        if match is None:
            raise ValidationError(
                f"the captured schema of {self.keyspace}.{table} has no table id (WITH ID = ...):"
                " it was not captured WITH INTERNALS"
            )
        return match.group(1).lower()

    def index_statements(self, table: str) -> list[str]:
        on_table = re.compile(r"\bON\s+" + _name_pattern(self.keyspace, table), re.IGNORECASE)
        return [
            statement
            for row in self._rows("index")
            for statement in split_statements(row.statement)
            if on_table.search(statement)
        ]

    def type_statements(self) -> list[str]:
        return [s for row in self._rows("type") for s in split_statements(row.statement)]

    def views_on(self, table: str) -> list[str]:
        base = re.compile(r"\bFROM\s+" + _name_pattern(self.keyspace, table), re.IGNORECASE)
        return [row.name for row in self._rows("materialized_view") if base.search(row.statement)]

    def recreate_table(self, table: str, *, as_keyspace: str = "", as_table: str = "") -> list[str]:
        """Statements that create `table` as it was: with its old id, or, renamed (`--as`), with
        a new id; then its dropped columns and its secondary indexes (renamed too)."""
        statements = self.table_statements(table)
        statements += self.index_statements(table)
        if not as_table:
            return statements
        new_keyspace = keyspace_name(as_keyspace or self.keyspace)
        new_table = table_name(as_table)
        renamed = [_rename(s, self.keyspace, table, new_keyspace, new_table) for s in statements]
        renamed[0] = without_table_id(renamed[0])
        indexes = len(statements) - len(self.index_statements(table))
        # An index name is per keyspace: the copy's indexes get the new table's name in front.
        for position in range(indexes, len(renamed)):
            renamed[position] = re.sub(
                r"^CREATE\s+(CUSTOM\s+)?INDEX\s+(IF\s+NOT\s+EXISTS\s+)?\"?(\w+)\"?",
                lambda m: (
                    f"CREATE {m.group(1) or ''}INDEX {m.group(2) or ''}{new_table}_{m.group(3)}"
                ),
                renamed[position],
                count=1,
                flags=re.IGNORECASE,
            )
        return renamed


def schema_of(keyspace: str, rows: Iterable[SchemaRow]) -> KeyspaceSchema:
    return KeyspaceSchema(keyspace, tuple(rows))


def rows_from_describe(result: Sequence[object]) -> list[SchemaRow]:
    """Rows of a DESCRIBE result (driver rows with type, name, create_statement)."""
    return [
        SchemaRow(str(row.type), str(row.name), str(row.create_statement))  # type: ignore[attr-defined]
        for row in result
    ]
