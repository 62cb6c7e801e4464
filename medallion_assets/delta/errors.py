"""The exceptions of :mod:`medallion_assets.delta`.

Every error names the table it concerns and the cause, so that a failed write or
read can be fixed from the message alone. All of them derive from
:class:`DeltaError`, so callers that do not care about the cause catch one class.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from deltalake.exceptions import CommitFailedError, DeltaProtocolError, TableNotFoundError
from deltalake.exceptions import DeltaError as _RsDeltaError
from deltalake.exceptions import SchemaMismatchError as _RsSchemaMismatchError

#: How an error tells the user to replace a table whole with a new schema: as a Spark write, and as an asset.
HOW_TO_REWRITE_WHOLE = (
    "(mode('overwrite') with option('overwriteSchema', 'true'); for an asset, one run with "
    "write_mode='overwrite' and schema_mode='overwrite')"
)
#: How an error tells the user to write a table with delta-spark instead of delta-rs.
HOW_TO_USE_DELTA_SPARK = "(a Spark DataFrame, MEDALLION_DELTA_ENGINE=delta-spark)"


class DeltaError(Exception):
    """Base class of every error raised by :mod:`medallion_assets.delta`.

    Args:
        message: what went wrong and how to fix it.
        table: the table's path or URI, when the error concerns one table.
    """

    def __init__(self, message: str, *, table: str | None = None) -> None:
        self.table = table
        self.message = message
        super().__init__(f"{message} (table: {table})" if table else message)

    def __reduce__(self):
        # Errors raised in Spark's Python workers are pickled back to the driver.
        return (_rebuild, (type(self), self.message, self.table))


def _rebuild(cls, message, table):
    return cls(message, table=table)


class NotADeltaTableError(DeltaError):
    """The path holds no Delta table (no ``_delta_log``), or not at that version."""


class DeltaOptionError(DeltaError, ValueError):
    """A reader or writer option is unknown, or its value is not valid."""


class UnsupportedTypeError(DeltaError, TypeError):
    """A column's type cannot be stored in a Delta table (interval, void, ...)."""


class SchemaMismatchError(DeltaError):
    """The data's schema does not fit the table's, and no schema option allows it."""


class UnsupportedFeatureError(DeltaError):
    """The table uses a reader or writer feature this package does not implement."""


class ConstraintViolationError(DeltaError):
    """Rows violate a CHECK constraint, a NOT NULL column or a ``replaceWhere``."""


class ConcurrentWriteError(DeltaError):
    """The commit lost to a concurrent writer whose changes conflict with it."""


@contextlib.contextmanager
def translated(table: str, action: str) -> Iterator[None]:
    """Turn delta-rs exceptions into this package's, naming the table and the cause."""
    try:
        yield
    except DeltaError:
        raise
    except CommitFailedError as exc:
        raise ConcurrentWriteError(
            f"{action} lost to a concurrent writer and committed nothing: {exc}. "
            "Re-run it against the new version of the table.",
            table=table,
        ) from exc
    except TableNotFoundError as exc:
        raise NotADeltaTableError(f"{action} failed, no Delta table here: {exc}", table=table) from exc
    except DeltaProtocolError as exc:
        raise UnsupportedFeatureError(f"{action} failed on the table's protocol: {exc}", table=table) from exc
    except _RsSchemaMismatchError as exc:
        raise SchemaMismatchError(f"{action} failed, schemas do not match: {exc}", table=table) from exc
    except (_RsDeltaError, ValueError, TypeError, OSError, RuntimeError) as exc:
        text = str(exc)
        # delta-rs raises its generic DeltaError for rows that break a CHECK constraint or
        # NOT NULL column ("Invalid data found: N rows failed validation check"), with no
        # exception type of its own: its message is all there is.
        if "failed validation check" in text:
            raise ConstraintViolationError(f"{action} failed: {text}", table=table) from exc
        grown = map_values_grown_error(exc, action=action, table=table)
        if grown is not None:
            raise grown from exc
        raise DeltaError(f"{action} failed: {text}", table=table) from exc


def map_values_grown_error(error: Exception, *, action: str, table: str) -> SchemaMismatchError | None:
    """The error to raise for a delta-rs failure on a map whose struct values grew; ``None`` for any other failure.

    deltalake 1.6.6 reads files written before a map's struct values gained
    fields, but cannot cast them for a MERGE, UPDATE, DELETE or OPTIMIZE. Its
    message names the column in its own words and says nothing of a way out.

    Args:
        error: what deltalake raised.
        action: the operation that failed, as the message should name it.
        table: the table's path or URI.
    """
    text = str(error)
    if "Cannot cast column" not in text or "Map(" not in text:
        return None
    return SchemaMismatchError(
        f"{action} failed: a map column's struct values gained fields after some of the table's files "
        f"were written, and delta-rs cannot change those files ({text}). To fix: rewrite the table whole "
        f"{HOW_TO_REWRITE_WHOLE}, or change it with delta-spark {HOW_TO_USE_DELTA_SPARK}",
        table=table,
    )
