"""Finding a Delta table by name in a Spark session's catalog."""

from __future__ import annotations

from urllib.parse import unquote, urlparse

from pyspark.sql import SparkSession

#: Where a table registered by name keeps its location for the delta-rs reader (the
#: first column's metadata): Spark 4.2 hands a Python data source the options of a
#: catalog table when the table is created, not when it is read.
LOCATION_METADATA = "medallion.location"


def quoted(name: str) -> str:
    """``db.table`` as ```db`.`table```."""
    return ".".join(f"`{part}`" for part in name.split("."))


def stored_location(spark: SparkSession, name: str) -> str:
    """Where the catalog says the table ``name`` lives (as stored: ``file:/...`` or a URI); "" if it says nowhere.

    Its Location (``DESCRIBE FORMATTED`` reads the catalog only, not the log), or for
    a table the delta-rs engine registered, the mark in its schema.
    """
    rows = spark.sql(f"DESCRIBE FORMATTED {quoted(name)}").collect()
    described = {str(row[0]).strip(): str(row[1]).strip() for row in rows if row[0]}
    if described.get("Location"):
        return described["Location"].rstrip("/")
    fields = spark.table(name).schema.fields
    return str((fields[0].metadata or {}).get(LOCATION_METADATA, "")) if fields else ""


def table_location(spark: SparkSession, name: str) -> str:
    """The location of the table registered as ``name``, as a path (local) or URI.

    Raises:
        LookupError: no such table, or its entry holds no location (a view, a managed table).
    """
    try:
        exists = spark.catalog.tableExists(name)
    except Exception as error:  # a malformed name
        raise LookupError(f"{name} is not a table name: {str(error).splitlines()[0]}") from None
    if not exists:
        raise LookupError(f"no table {name} in the session's catalog")
    location = stored_location(spark, name)
    if not location:
        raise LookupError(f"the catalog holds no location for {name} (a view, or not an external Delta table)")
    return unquote(urlparse(location).path) if location.startswith("file:") else location
