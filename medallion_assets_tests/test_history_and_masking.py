"""A declaration keeps its promises: the history is silver's, and nothing it masks is stored unmasked.

Two Dagster runs of two declared feeds on the generic change step:
``subscriptions`` (NDJSON, ``history=True``, a masked ``email``, an
``expect_or_drop``, a warn-only ``expect``, deletes) and ``members`` (CSV, a
masked ``email``). Run 1 lands good changes and every kind of reject, each
carrying an email; run 2 lands a dropped update, a delete, a late older
change and two changes of one key whose last fails. Files are written with
plain Python; the tables are read with deltalake and DuckDB.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize
from pyspark.sql.types import LongType, TimestampType

from medallion_assets.expectations import expect, expect_or_drop
from medallion_assets.feeds import ApplyChanges, Feed, Field, LandingFiles
from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb

SUBSCRIPTIONS = Feed(
    name="subscriptions_raw",
    description="Subscription changes, one JSON object per line.",
    source=LandingFiles(folder="subscriptions", format="ndjson"),
    fields=(
        Field("op", values=("U", "D")),
        Field("sub_id"),
        Field("email", mask="sha256"),
        Field("plan", values=("basic", "pro", "legacy")),
        Field("seats", LongType()),
        Field("updated_at", TimestampType()),
    ),
    # WARN only (max_rejected_share=None): the files are mostly bad lines on purpose, which the
    # default would call a broken delivery and block the history with.
    silver=ApplyChanges(
        table="subscriptions",
        keys=("sub_id",),
        sequence_by=("updated_at",),
        delete_when=("op", "D"),
        except_fields=("op",),
        history=True,
        max_rejected_share=None,
    ),
    expectations=(
        expect_or_drop("subscriptions_seats_positive", "seats > 0"),
        expect("subscriptions_plan_current", "plan <> 'legacy'"),
    ),
)

MEMBERS = Feed(
    name="members_raw",
    description="Member changes, CSV.",
    source=LandingFiles(folder="members", format="csv"),
    fields=(
        Field("member_id"),
        Field("email", mask="sha256"),
        Field("tier"),
        Field("referrer", values=("web", "shop"), mask="sha256"),
        Field("updated_at", TimestampType()),
    ),
    silver=ApplyChanges(table="members", keys=("member_id",), sequence_by=("updated_at",), max_rejected_share=None),
)


def _at(hour: int) -> str:
    return f"2026-03-01T{hour:02d}:00:00Z"


def _change(sub_id: str, seats, hour: int, *, op: str = "U", plan: str = "basic") -> str:
    return json.dumps(
        {
            "op": op,
            "sub_id": sub_id,
            "email": f"{sub_id.lower()}-{hour}@example.com",
            "plan": plan,
            "seats": str(seats),
            "updated_at": _at(hour),
        }
    )


def _delete(sub_id: str, hour: int) -> str:
    return json.dumps({"op": "D", "sub_id": sub_id, "updated_at": _at(hour)})


def _land(folder: Path, name: str, data: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    aside = folder / f".{name}.tmp"
    aside.write_bytes(data)
    aside.rename(folder / name)


def _lines(*lines: str | bytes) -> bytes:
    return b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


#: Rejects of run 1, each with an email: (line, reason).
NOT_JSON = '{"op": "U", "sub_id": "S9", "email": "bad4@example.com",'
JSON_REJECTS = [
    (
        json.dumps(
            {
                "op": "U",
                "sub_id": "S9",
                "email": "bad1@example.com",
                "plan": "basic",
                "seats": "ten",
                "updated_at": _at(1),
            }
        ),
        "seats is not an integer: 'ten'",
    ),
    (
        json.dumps({"op": "U", "sub_id": "S9", "email": "bad2@example.com", "seats": "1", "updated_at": _at(1)}),
        "missing plan",
    ),
    (
        json.dumps(
            {"op": "U", "sub_id": "S9", "email": "bad3@example.com", "plan": "gold", "seats": "1", "updated_at": _at(1)}
        ),
        "plan is not basic, pro or legacy: 'gold'",
    ),
    (NOT_JSON, "not valid JSON"),
    ('["bad5@example.com"]', "not a JSON object"),
]
INVALID_UTF8 = (
    b'{"op": "U", "sub_id": "S9", "email": "bad6@example.com", "plan": "basic\xff", "seats": "1", '
    b'"updated_at": "2026-03-01T01:00:00Z"}'
)
CSV_LINES = [
    b"member_id,email,tier,referrer,updated_at",
    b"M1,m1@example.com,gold,web,2026-03-01T01:00:00Z",
    b"M2,m2@example.com,gold,web,yesterday",  # bad value: split, masked
    b"M3,m3@example.com,web,2026-03-01T01:00:00Z",  # too few fields: malformed, digest only
    b"M4,m4\xff@example.com,gold,web,2026-03-01T01:00:00Z",  # not UTF-8: digest only
    b"M5,m5@example.com,gold,m6@example.com,2026-03-01T01:00:00Z",  # out of set: the reason quotes it masked
]


def _tables(lake: Path) -> dict[str, Path]:
    """Every Delta table under the lake root but bronze's: layer/table -> folder."""
    return {
        str(log.parent.relative_to(lake)): log.parent
        for log in lake.rglob("_delta_log")
        if log.parent.relative_to(lake).parts[0] != "bronze"
    }


@pytest.mark.slow
def test_history_is_silvers_and_no_table_but_bronze_holds_a_masked_value(spark, tmp_path, monkeypatch):
    from medallion_assets.assets.bronze import bronze_assets
    from medallion_assets.assets.silver import silver_assets
    from medallion_assets.definitions import resources_for

    lake = tmp_path / "lake"
    monkeypatch.setenv("MEDALLION_LAKE_ROOT", str(lake))
    landing = lake / "landing"
    feeds = [SUBSCRIPTIONS, MEMBERS]
    assets = [*bronze_assets(feeds), *silver_assets(feeds)]
    resources, instance = resources_for("local"), DagsterInstance.ephemeral()
    # The history reads silver: the graph has that edge.
    [history_asset] = [a for a in assets if [k.path for k in a.keys] == [["silver", "subscriptions_history"]]]
    assert ["silver", "subscriptions"] in [k.path for k in history_asset.dependency_keys]

    run1 = [
        _change("S1", 1, 1),
        _change("S2", 0, 1),  # S2: dropped (seats 0)
        _change("S3", 2, 2),
        _change("S4", 1, 1, plan="legacy"),
        _change("S5", 5, 1),  # S4: warned, kept
        *(line for line, _ in JSON_REJECTS),
        INVALID_UTF8,
    ]
    _land(landing / "subscriptions", "batch-00001.json", _lines(*run1))
    _land(landing / "members", "batch-00001.csv", _lines(*CSV_LINES))
    assert materialize(assets, resources=resources, instance=instance).success

    run2 = [
        _change("S1", 0, 2),  # dropped: silver keeps S1 of 01:00
        _change("S2", 4, 2),  # S2's first adopted change
        _change("S3", 7, 1),  # late and older: a past version of S3
        _delete("S4", 2),  # a delete, not judged
        _change("S5", 6, 2),
        _change("S5", -1, 3),  # the run's winner (03:00) fails: silver keeps 01:00
    ]
    _land(landing / "subscriptions", "batch-00002.json", _lines(*run2))
    assert materialize(assets, resources=resources, instance=instance).success

    # ---- 1. the history is silver's
    silver = {r["sub_id"]: r for r in read_with_deltalake(lake / "silver" / "subscriptions").to_pylist()}
    history = read_with_deltalake(lake / "silver" / "subscriptions_history").to_pylist()
    columns = ["sub_id", "email", "plan", "seats", "updated_at"]
    current = {r["sub_id"]: r for r in history if r["is_current"] and not r["is_deleted"]}
    assert {k: [r[c] for c in columns] for k, r in current.items()} == {
        k: [r[c] for c in columns] for k, r in silver.items()
    }
    assert len([r for r in history if r["is_current"]]) == len({r["sub_id"] for r in history})

    def t(hour):
        return dt.datetime(2026, 3, 1, hour)

    got = sorted(
        (
            (
                r["sub_id"],
                r["seats"],
                r["valid_from"].replace(tzinfo=None),
                r["valid_to"].replace(tzinfo=None) if r["valid_to"] else None,
                r["is_current"],
                r["is_deleted"],
            )
            for r in history
        ),
        key=lambda r: (r[0], r[2]),
    )
    assert got == [
        ("S1", 1, t(1), None, True, False),
        ("S2", 4, t(2), None, True, False),
        ("S3", 7, t(1), t(2), False, False),
        ("S3", 2, t(2), None, True, False),
        ("S4", 1, t(1), t(2), False, False),
        ("S4", None, t(2), None, True, True),
        ("S5", 5, t(1), None, True, False),
    ]
    # No dropped change, and none that lost its run to one, is in the history.
    assert not [r for r in history if r["seats"] is not None and r["seats"] <= 0]
    assert ("S5", 6) not in {(r["sub_id"], r["seats"]) for r in history}
    assert [r["email"] for r in history if r["sub_id"] == "S4" and r["is_deleted"]] == [None]
    assert {r["email"] for r in history if r["sub_id"] == "S3"} == {_sha("s3-1@example.com"), _sha("s3-2@example.com")}

    # ---- 2. no table but bronze holds a delivered email
    delivered = {
        e for line in [*run1, *run2, *CSV_LINES] for e in _emails(line if isinstance(line, bytes) else line.encode())
    }
    assert {"bad6@example.com", "m3@example.com", "m6@example.com"} <= delivered
    tables = _tables(lake)
    assert {
        "silver/subscriptions",
        "silver/subscriptions_history",
        "silver/subscriptions__tombstones",
        "quarantine/subscriptions",
        "silver/members",
        "quarantine/members",
    } <= set(tables)
    for name, folder in tables.items():
        text = " ".join(str(v) for row in read_with_duckdb(folder).to_pylist() for v in row.values())
        leaked = sorted(e for e in delivered if e in text)
        assert not leaked, f"{name} holds {leaked}"
    bronze = " ".join(r["value"] for r in read_with_deltalake(lake / "bronze" / "subscriptions_raw").to_pylist())
    assert "bad1@example.com" in bronze  # bronze is the delivery as delivered

    # Quarantine still has every rejected row, with its reason and file.
    quarantine = read_with_deltalake(lake / "quarantine" / "subscriptions").to_pylist()
    records = {r["reason"]: json.loads(r["record"]).get("value") for r in quarantine}
    assert sorted(records) == sorted(
        [*(reason for _, reason in JSON_REJECTS), "not valid UTF-8", "subscriptions_seats_positive: seats > 0"]
    )
    assert len(quarantine) == len(JSON_REJECTS) + 1 + 3  # S2 in run 1, S1 and S5 in run 2 dropped
    assert all(r["_source_file"].endswith(("batch-00001.json", "batch-00002.json")) for r in quarantine)
    for n, (_, reason) in enumerate(JSON_REJECTS[:3], start=1):  # JSON objects: declared fields, email masked
        assert json.loads(records[reason])["email"] == _sha(f"bad{n}@example.com")
    assert json.loads(records["missing plan"]) == {
        "op": "U",
        "sub_id": "S9",
        "email": _sha("bad2@example.com"),
        "seats": "1",
        "updated_at": _at(1),
    }
    assert records["not valid JSON"] == "sha256:" + _sha(NOT_JSON)
    assert records["not a JSON object"] == "sha256:" + _sha('["bad5@example.com"]')
    assert records["not valid UTF-8"] == "sha256:" + _sha(INVALID_UTF8.decode("utf-8", "replace"))
    members = {
        r["reason"]: json.loads(r["record"])["value"]
        for r in read_with_deltalake(lake / "quarantine" / "members").to_pylist()
    }
    assert members == {
        "updated_at is not a timestamp: 'yesterday'": f"M2,{_sha('m2@example.com')},gold,{_sha('web')},yesterday",
        "malformed CSV line": "sha256:" + _sha("M3,m3@example.com,web,2026-03-01T01:00:00Z"),
        "not valid UTF-8": "sha256:" + _sha("M4,m4\ufffd@example.com,gold,web,2026-03-01T01:00:00Z"),
        f"referrer is not web or shop: '{_sha('m6@example.com')}'": (
            f"M5,{_sha('m5@example.com')},gold,{_sha('m6@example.com')},2026-03-01T01:00:00Z"
        ),
    }


def _emails(line: bytes) -> set[str]:
    import re

    return {m.decode("utf-8", "replace") for m in re.findall(rb"[A-Za-z0-9.\-\xff]+@example\.com", line)}
