"""Names fixed by the landing contract (shared/LANDING_CONTRACT.md), shared by its producer and consumers.

The simulator writes files with these columns and the bronze transforms read
them; keeping one definition means a change to the contract is made once.
"""

from __future__ import annotations

#: Columns of the customer change CSV files, in header order.
CUSTOMER_CSV_COLUMNS: tuple[str, ...] = (
    "op",
    "c_custkey",
    "c_name",
    "c_address",
    "c_nationkey",
    "c_phone",
    "c_acctbal",
    "c_mktsegment",
    "c_comment",
    "updated_at",
)

#: Reference tables landed as full Parquet snapshots under landing/reference/<table>/.
REFERENCE_TABLES: tuple[str, ...] = ("nation", "region", "part", "supplier", "partsupp")
