"""A MERGE's ``WHEN`` clauses: the language every engine and the deltalake writer take a merge in.

Below both the engines (:mod:`medallion_assets.storage.engines`), which run a
MERGE, and the merge strategies (:mod:`medallion_assets.storage.changes`), which
write its clauses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class MergeClause:
    """One ``WHEN`` clause of a MERGE into a target aliased ``t`` from a source aliased ``s``.

    Attributes:
        action: ``delete`` and ``update`` apply to matched rows, ``insert`` to unmatched ones.
        condition: SQL over ``t.`` and ``s.`` columns, or None for every row.
        assignments: target column -> SQL expression (update and insert).
    """

    action: Literal["delete", "update", "insert"]
    condition: str | None = None
    assignments: Mapping[str, str] | None = None


def with_unacted_matches_kept(clauses: Sequence[MergeClause], *, column: str) -> list[MergeClause]:
    """``clauses``, ending with an update that keeps as it is a matched row no other clause acts on.

    For MERGEs delta-rs runs. A matched row that none of the ``WHEN MATCHED``
    clauses acts on (a stale change: a redelivered row whose stored sequence
    is not older) made deltalake 1.6.6's MERGE hold about twice the memory
    (docs/decisions/0001-small-writes-by-deltalake.md). With the last clause the
    files written are the same, but delta-rs counts such a row as updated rather
    than copied. The clause is added only when
    every matched clause has a condition.

    Args:
        clauses: the MERGE's ``WHEN`` clauses, in order.
        column: a column the target table has: the last clause sets it to its stored value.

    Example:
        >>> with_unacted_matches_kept([MergeClause("update", "s.seq > t.seq", {"v": "s.v"})], column="id")[-1]
        MergeClause(action='update', condition=None, assignments={'id': 't.`id`'})
    """
    matched = [clause for clause in clauses if clause.action != "insert"]
    if not matched or not all(clause.condition for clause in matched):
        return list(clauses)
    return [*clauses, MergeClause("update", None, {column: f"t.`{column}`"})]
