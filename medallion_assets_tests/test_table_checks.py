"""The counts behind the table checks, on real Spark DataFrames: rows that fail, not only that all pass."""

from __future__ import annotations

from medallion_assets.assets.checks import count_duplicate_keys, count_orphans


def test_duplicate_and_null_keys_fail_the_key_check(spark):
    stored = spark.createDataFrame(
        [(1, 1, "a"), (1, 2, "b"), (2, 1, "c"), (2, 1, "d"), (2, 1, "e"), (None, 1, "f")],
        "k long, line long, note string",
    )
    # (2, 1) three times: 3 failing rows, one key; the null key: 1 row, one key.
    assert count_duplicate_keys(stored, ["k", "line"]) == (6, 4, 2)
    # On k alone: k=1 twice, k=2 three times, the null once.
    assert count_duplicate_keys(stored, ["k"]) == (6, 6, 3)
    assert count_duplicate_keys(stored.where("k = 1"), ["k", "line"]) == (2, 0, 0)


def test_orphans_and_null_foreign_keys_fail_the_reference_check(spark):
    # A parent key stored twice must not count its children twice.
    parent = spark.createDataFrame([(1, 10), (1, 10), (2, 20), (3, 30)], "pk long, pk2 long")
    child = spark.createDataFrame(
        [(1, 10, "ok"), (1, 10, "ok again"), (2, 20, "ok"), (2, 99, "no such pair"), (4, 40, "no such key"),
         (None, 10, "null key")],
        "fk long, fk2 long, note string",
    )
    assert count_orphans(child, ["fk"], parent, ["pk"]) == (6, 2)
    assert count_orphans(child, ["fk", "fk2"], parent, ["pk", "pk2"]) == (6, 3)
    assert count_orphans(child.where("note LIKE 'ok%'"), ["fk", "fk2"], parent, ["pk", "pk2"]) == (3, 0)
    assert count_orphans(child.limit(0), ["fk"], parent, ["pk"]) == (0, 0)
