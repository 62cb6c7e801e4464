"""A snapshot feed with keys is a change feed: each new snapshot applied as inserts, updates and deletes.

One declared feed, ``plans``, as ``docs/adding-a-feed.md`` declares it
(Parquet snapshots written by pyarrow, keys, ``history=True``, a masked
field, an ``expect_or_drop``), two Dagster runs:
run 1 takes two snapshots in one go, run 2 a third, plus a late snapshot (its
name sorts before the last applied one) and a replayed one (an applied name
landed again), both ignored. Silver, its history and the quarantine are read
back with deltalake and DuckDB and compared with what plain Python derives
from the snapshots.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import AssetKey, DagsterInstance, materialize

from medallion_assets.feeds import Feed
from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb

PAGE = Path(__file__).resolve().parents[1] / "docs" / "adding-a-feed.md"


def _page_declaration() -> Feed:
    """The snapshot feed the adding-a-feed page declares (its ``py`` block with ``LandingSnapshots``)."""
    [code] = [
        block for block in re.findall(r"```py\n(.*?)```", PAGE.read_text(), flags=re.S) if "LandingSnapshots(" in block
    ]
    namespace: dict = {}
    exec(compile(code, str(PAGE), "exec"), namespace)
    [feed] = [value for value in namespace.values() if isinstance(value, Feed)]
    return feed


COLUMNS = ("plan_id", "name", "price", "seats", "owner")
ARROW_SCHEMA = pa.schema(
    [
        ("plan_id", pa.string()),
        ("name", pa.string()),
        ("price", pa.decimal128(10, 2)),
        ("seats", pa.int64()),
        ("owner", pa.string()),
        ("note", pa.string()),
    ]
)


def _plan(plan_id: str, name: str, price: str, seats: int) -> tuple:
    return plan_id, name, Decimal(price), seats, f"{plan_id.lower()}@example.com"


#: The snapshots in the order they are applied, and the run that takes each in.
SNAPSHOTS = {
    "snap-001.parquet": [
        _plan("P1", "basic", "10.00", 1),
        _plan("P2", "pro", "20.00", 5),
        _plan("P3", "team", "30.00", 10),
    ],
    # P2 updated, P3 absent (deleted), P4 new, P1 unchanged.
    "snap-002.parquet": [
        _plan("P1", "basic", "10.00", 1),
        _plan("P2", "pro", "25.00", 5),
        _plan("P4", "enterprise", "99.00", 50),
    ],
    # P1's update has seats 0 (dropped: silver keeps its first row), P3 back after its delete, P4 deleted.
    "snap-003.parquet": [
        _plan("P1", "basic", "12.00", 0),
        _plan("P2", "pro", "25.00", 5),
        _plan("P3", "team", "35.00", 10),
    ],
}
RUNS = [["snap-001.parquet", "snap-002.parquet"], ["snap-003.parquet"]]
#: Landed in run 2 and ignored: a late snapshot, and an applied one landed again with other rows.
LATE = {"snap-0015.parquet": [_plan("P9", "late", "1.00", 1)], "snap-001.parquet": [_plan("P8", "replayed", "1.00", 1)]}


def _land(folder: Path, name: str, rows: list[tuple]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    # An undeclared column rides along: ignored.
    table = pa.Table.from_pylist(
        [{**dict(zip(COLUMNS, row, strict=False)), "note": "x"} for row in rows], schema=ARROW_SCHEMA
    )
    aside = folder / f".{name}.tmp"
    pq.write_table(table, aside)
    os.replace(aside, folder / name)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _expected(applied_at: dict[str, object], runs: list[list[str]] = RUNS):
    """Silver, history and dropped rows by the rules, in plain Python: each snapshot diffed with the one
    before; per run, each key's last change applied unless it is an upsert with seats <= 0."""
    changes = []  # (snapshot, key, row or None for a delete)
    before: dict[str, tuple] = {}
    for name in [n for run in runs for n in run]:
        now = {row[0]: row for row in SNAPSHOTS[name]}
        changes += [(name, k, row) for k, row in now.items() if before.get(k) != row]
        changes += [(name, k, None) for k in before if k not in now]
        before = now
    silver: dict[str, tuple] = {}
    adopted: dict[str, str] = {}
    dropped = []
    for run in runs:
        last = {k: (name, row) for name, k, row in changes if name in run}
        for k, (name, row) in last.items():
            if row is not None and row[3] <= 0:
                dropped.append(row)
                continue
            adopted[k] = name
            if row is None:
                silver.pop(k, None)
            else:
                silver[k] = row
    history = []
    for k in sorted({k for _, k, _ in changes}):
        entered = [
            (name, row)
            for name, kk, row in changes
            if kk == k and (row is None or row[3] > 0) and k in adopted and name <= adopted[k]
        ]
        for i, (name, row) in enumerate(entered):
            following = applied_at[entered[i + 1][0]] if i + 1 < len(entered) else None
            history.append((k, row[1:4] if row else None, applied_at[name], following, following is None, row is None))
    return silver, sorted(history, key=lambda r: (r[0], r[2])), dropped


@pytest.mark.slow
def test_snapshots_become_changes_with_history_and_late_ones_are_ignored(spark, tmp_path, monkeypatch):
    from medallion_assets.assets.bronze import bronze_assets
    from medallion_assets.assets.silver import silver_assets
    from medallion_assets.definitions import resources_for

    lake = tmp_path / "lake"
    monkeypatch.setenv("MEDALLION_LAKE_ROOT", str(lake))
    folder = lake / "landing" / "plans"
    # The snapshots here are a handful of rows: the one row the expectation drops is a third of its
    # run, past the default max_rejected_share, which would (rightly) block the run as a broken
    # delivery. These runs are about applying snapshots, so the rejects stay a warning.
    page = _page_declaration()
    plans = dataclasses.replace(page, silver=dataclasses.replace(page.silver, max_rejected_share=None))
    assets = [*bronze_assets([plans]), *silver_assets([plans])]
    resources, instance = resources_for("local"), DagsterInstance.ephemeral()

    for name in RUNS[0]:
        _land(folder, name, SNAPSHOTS[name])
    assert materialize(assets, resources=resources, instance=instance).success
    first = {r["plan_id"]: r["price"] for r in read_with_deltalake(lake / "silver" / "plans").to_pylist()}
    # Snapshot 2 applied after snapshot 1 in the same run: P3 deleted, P2 updated.
    run1_expected, _, _ = _expected(dict.fromkeys(SNAPSHOTS), RUNS[:1])
    assert first == {k: row[2] for k, row in run1_expected.items()}
    assert "P3" not in first and first["P2"] == Decimal("25.00")

    for name, rows in LATE.items():
        _land(folder, name, rows)
    _land(folder, "snap-003.parquet", SNAPSHOTS["snap-003.parquet"])
    assert materialize(assets, resources=resources, instance=instance).success

    # Bronze: one commit per applied snapshot; the ignored ones said, by name.
    event = instance.get_latest_materialization_event(AssetKey(["bronze", "plans_raw"]))
    metadata = event.asset_materialization.metadata
    assert sorted(metadata["ignored_snapshots"].value) == sorted(LATE)
    assert list(metadata["applied_snapshots"].value) == ["snap-003.parquet"]
    assert metadata["last_applied_snapshot"].value == "snap-003.parquet"
    bronze = read_with_deltalake(lake / "bronze" / "plans_raw").to_pylist()
    assert {r["_snapshot"] for r in bronze} == {n for run in RUNS for n in run}  # nothing of the ignored ones
    applied_at = {r["_snapshot"]: r["_ingested_at"].replace(tzinfo=None) for r in bronze}
    assert len(set(applied_at.values())) == 3

    silver_expected, history_expected, dropped = _expected(applied_at)

    # Silver: the rules' state, the owner masked; DuckDB reads the same.
    silver = read_with_deltalake(lake / "silver" / "plans").to_pylist()
    assert {r["plan_id"]: (r["name"], r["price"], r["seats"], r["owner"]) for r in silver} == {
        k: (row[1], row[2], row[3], _sha(row[4])) for k, row in silver_expected.items()
    }
    by_duckdb = read_with_duckdb(lake / "silver" / "plans").to_pylist()
    assert sorted((r["plan_id"], r["price"]) for r in by_duckdb) == sorted(
        (k, row[2]) for k, row in silver_expected.items()
    )
    assert silver_expected["P1"][2] == Decimal("10.00") and "P3" in silver_expected and "P4" not in silver_expected

    # History: type 2, a delete as a row of its own, P3 back after its delete.
    history = read_with_deltalake(lake / "silver" / "plans_history").to_pylist()
    got = sorted(
        (
            (
                r["plan_id"],
                None if r["is_deleted"] else (r["name"], r["price"], r["seats"]),
                r["valid_from"].replace(tzinfo=None),
                r["valid_to"].replace(tzinfo=None) if r["valid_to"] else None,
                r["is_current"],
                r["is_deleted"],
            )
            for r in history
        ),
        key=lambda r: (r[0], r[2]),
    )
    assert got == history_expected
    assert [r[5] for r in got if r[0] == "P3"] == [False, True, False]
    assert {r["owner"] for r in history if r["owner"]} <= {_sha(row[4]) for rows in SNAPSHOTS.values() for row in rows}

    # The dropped row is quarantined once, with its reason and snapshot, its owner masked.
    quarantine = read_with_duckdb(lake / "quarantine" / "plans").to_pylist()
    assert [(r["reason"], r["_source_file"].rsplit("/", 1)[-1]) for r in quarantine] == [
        ("plans_seats_positive: seats > 0", "snap-003.parquet")
    ] * len(dropped)
    assert len(dropped) == 1 and _sha(dropped[0][4]) in quarantine[0]["record"]
    assert "p1@example.com" not in quarantine[0]["record"]
