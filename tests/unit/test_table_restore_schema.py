"""The schema a backup captured (`DESCRIBE KEYSPACE k WITH INTERNALS` rows) and the CQL that
recreates a table from it: with its old id, its dropped columns and its indexes, or renamed."""

from __future__ import annotations

import pytest

from ringsnap.coordinator.backup.schema import (
    KeyspaceSchema,
    SchemaRow,
    split_statements,
    without_table_id,
)
from ringsnap.errors import ValidationError

TABLE_ID = "5a1c395e-b41f-11e5-9f22-ba0be0483c18"

CREATE_TABLE = f"""CREATE TABLE shop.orders (
    id int PRIMARY KEY,
    note text,
    old text
) WITH ID = {TABLE_ID}
    AND additional_write_policy = '99p'
    AND comment = 'orders; keep ''forever'''
    AND compaction = {{'class': 'org.apache.cassandra.db.compaction.SizeTieredCompactionStrategy'}}
    AND gc_grace_seconds = 864000;
ALTER TABLE shop.orders DROP old USING TIMESTAMP 1732400000000000;"""

ROWS = (
    SchemaRow(
        "keyspace",
        "shop",
        "CREATE KEYSPACE shop WITH replication = {'class': 'SimpleStrategy',"
        " 'replication_factor': '3'} AND durable_writes = true;",
    ),
    SchemaRow("type", "address", "CREATE TYPE shop.address (\n    street text\n);"),
    SchemaRow("table", "orders", CREATE_TABLE),
    SchemaRow("index", "orders_note", "CREATE INDEX orders_note ON shop.orders (note);"),
    SchemaRow(
        "table",
        "other",
        "CREATE TABLE shop.other (id int PRIMARY KEY) WITH ID = "
        "00000000-0000-0000-0000-000000000001;",
    ),
    SchemaRow(
        "materialized_view",
        "orders_by_note",
        "CREATE MATERIALIZED VIEW shop.orders_by_note AS SELECT * FROM shop.orders WHERE note IS"
        " NOT NULL AND id IS NOT NULL PRIMARY KEY (note, id);",
    ),
)
SCHEMA = KeyspaceSchema("shop", ROWS)


def test_statements_split_outside_strings_comments_and_bodies() -> None:
    text = "A 'x;y' ; B \"q;\" -- c;\n; C $$ a; b $$; /* ; */ D"
    assert split_statements(text) == ["A 'x;y'", 'B "q;"', "C $$ a; b $$", "D"]


def test_a_dropped_table_is_recreated_with_its_id_and_dropped_columns() -> None:
    statements = SCHEMA.recreate_table("orders")
    assert statements[0].startswith("CREATE TABLE shop.orders (")
    assert f"WITH ID = {TABLE_ID}" in statements[0]
    assert "comment = 'orders; keep ''forever'''" in statements[0]
    assert statements[1] == "ALTER TABLE shop.orders DROP old USING TIMESTAMP 1732400000000000"
    assert statements[2] == "CREATE INDEX orders_note ON shop.orders (note)"
    assert SCHEMA.table_id("orders") == TABLE_ID


def test_as_a_new_table_the_id_goes_and_every_name_follows() -> None:
    statements = SCHEMA.recreate_table("orders", as_keyspace="shop", as_table="orders_copy")
    assert statements[0].startswith("CREATE TABLE shop.orders_copy (")
    assert "ID =" not in statements[0]
    assert "WITH additional_write_policy = '99p'" in statements[0]
    assert statements[1].startswith("ALTER TABLE shop.orders_copy DROP old USING TIMESTAMP")
    assert statements[2] == "CREATE INDEX orders_copy_orders_note ON shop.orders_copy (note)"


def test_the_keyspace_types_and_views_are_found() -> None:
    assert SCHEMA.keyspace_statement().startswith("CREATE KEYSPACE shop WITH replication")
    assert SCHEMA.type_statements() == ["CREATE TYPE shop.address (\n    street text\n)"]
    assert SCHEMA.tables() == ["orders", "other"]
    assert SCHEMA.views_on("orders") == ["orders_by_note"]
    assert SCHEMA.views_on("other") == []


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        (
            f"CREATE TABLE a.b (id int PRIMARY KEY) WITH ID = {TABLE_ID}",
            "CREATE TABLE a.b (id int PRIMARY KEY)",
        ),
        (
            f"CREATE TABLE a.b (id int PRIMARY KEY) WITH comment = 'x' AND ID = {TABLE_ID}",
            "CREATE TABLE a.b (id int PRIMARY KEY) WITH comment = 'x'",
        ),
        (
            f"CREATE TABLE a.b (id int PRIMARY KEY) WITH ID = {TABLE_ID}\n    AND comment = 'x'",
            "CREATE TABLE a.b (id int PRIMARY KEY) WITH comment = 'x'",
        ),
    ],
)
def test_the_table_id_option_is_removed_wherever_it_stands(statement: str, expected: str) -> None:
    assert without_table_id(statement) == expected


def test_a_table_not_in_the_schema_is_named_with_those_that_are() -> None:
    with pytest.raises(ValidationError, match=r"shop\.missing is not in the schema.*orders, other"):
        SCHEMA.recreate_table("missing")


def test_a_schema_without_internals_has_no_table_id() -> None:
    schema = KeyspaceSchema(
        "shop", (SchemaRow("table", "t", "CREATE TABLE shop.t (id int PRIMARY KEY);"),)
    )
    with pytest.raises(ValidationError, match="WITH INTERNALS"):
        schema.table_id("t")


def test_an_invalid_new_name_is_refused() -> None:
    with pytest.raises(ValidationError, match="invalid table name"):
        SCHEMA.recreate_table("orders", as_table="bad name;")
