"""A feed declared in YAML: the Dagster component ``medallion_assets.components.FeedComponent``.

A ``defs.yaml`` whose ``type`` is this component declares one feed with the
attributes of :class:`~medallion_assets.feeds.Feed` (see docs/adding-a-feed.md)::

    type: medallion_assets.components.FeedComponent
    attributes:
      name: payments_raw
      description: Payment events from landing/payments, one JSON object per line.
      source:
        landing_files: {folder: payments, format: ndjson}
      fields:
        - {name: payment_id, description: The payment's id.}
        - {name: amount, type: decimal(12,2), description: Amount paid.}
        - {name: paid_at, type: timestamp, description: When it was paid, UTC.}
      silver:
        apply_changes: {table: payments, keys: [payment_id], sequence_by: [paid_at]}
      expectations:
        - {name: payments_amount_positive, condition: amount > 0, action: drop}

The attributes become the very :class:`~medallion_assets.feeds.Feed` the
Python declaration makes (:meth:`FeedComponent.feed`): the source and silver
settings are passed by name to the same dataclasses, whose validation is the
only one. Only what YAML cannot say is translated here: type names
(:data:`TYPE_NAMES`), masks, and lists into tuples.

The project finds these files in its pipeline packages' folders
(:func:`yaml_feeds`), and their feeds join the Python ones in
:func:`~medallion_assets.project.project_feeds`, so a YAML feed gets its bronze,
silver, quarantine, checks and sensors from the same factories, once, with the
project-wide pieces (landing sensor, freshness sensor, jobs). ``build_defs``
builds the feed's own pieces from those factories for a Dagster project that
loads its ``defs/`` folder itself. docs/architecture.md says why.

This module is the project's ``dg`` registry module (``[tool.dg.project]
registry_modules``), so ``dg list components`` shows the component and ``dg
scaffold defs medallion_assets.components.FeedComponent <name>`` writes a
template. Nothing here runs at import.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import dagster as dg
import yaml
from dagster.components import Scaffolder, ScaffoldRequest, scaffold_component
from pydantic import ValidationError
from pyspark.sql.types import DateType, DecimalType, IntegerType, LongType, StringType, TimestampType

from medallion_assets.assets.bronze import bronze_assets
from medallion_assets.assets.checks import feed_checks
from medallion_assets.assets.silver import silver_assets
from medallion_assets.expectations import Expectation
from medallion_assets.feeds import (
    ApplyChanges,
    Feed,
    FeedDeclarationError,
    Field,
    KafkaTopic,
    LandingFiles,
    LandingSnapshots,
    MaskDigits,
    Replace,
)
from medallion_assets.sensors import stream_health_checks, stream_sensors

#: The ``type`` of a feed's ``defs.yaml``.
COMPONENT_TYPE = "medallion_assets.components.FeedComponent"

#: The field type names YAML may use, and the Spark type each stands for (``decimal(p,s)`` besides).
TYPE_NAMES = ("string", "long", "int", "decimal(p,s)", "date", "timestamp")

_DECIMAL = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")

#: The file names a component folder declares itself in (Dagster's).
DEFS_FILE_NAMES = ("defs.yaml", "defs.yml")


class FeedYamlError(FeedDeclarationError):
    """A feed's ``defs.yaml`` that cannot be read as a feed: the message names the file, the field and the fix."""


class FieldModel(dg.Model):
    """One delivered field (:class:`~medallion_assets.feeds.Field`)."""

    name: str
    type: str = "string"
    description: str = ""
    nullable: bool = False
    values: list[str] = []
    mask: str | dict[str, Any] | None = None


class ExpectationModel(dg.Model):
    """One expectation (:class:`~medallion_assets.expectations.Expectation`): a Spark SQL condition on silver's rows."""

    name: str
    condition: str
    action: Literal["warn", "drop", "fail"]
    description: str = ""


class FeedScaffolder(Scaffolder):
    """``dg scaffold defs medallion_assets.components.FeedComponent <name>``: a ``defs.yaml`` to edit."""

    def scaffold(self, request: ScaffoldRequest) -> None:
        name = re.sub(r"\W", "_", Path(request.target_path).name) or "my_feed"
        scaffold_component(
            request,
            {
                "name": f"{name}_raw",
                "description": f"What {name} delivers, one JSON object per line, as delivered.",
                "source": {"landing_files": {"folder": name, "format": "ndjson"}},
                "fields": [
                    {"name": "id", "description": "What identifies a record."},
                    {"name": "changed_at", "type": "timestamp", "description": "When it changed, UTC."},
                ],
                "silver": {"apply_changes": {"table": name, "keys": ["id"], "sequence_by": ["changed_at"]}},
                "expectations": [],
            },
        )


@dg.scaffold_with(FeedScaffolder)
class FeedComponent(dg.Component, dg.Resolvable, dg.Model):
    """A feed of the medallion lake: its source, typed fields and what silver makes of it.

    The attributes are those of ``medallion_assets.feeds.Feed``. ``source`` has one
    key: ``landing_files`` (folder, format ndjson/csv, suffix, options),
    ``kafka_topic`` (topic) or ``landing_snapshots`` (folder). ``silver`` has one:
    ``apply_changes`` (table, keys, sequence_by, delete_when, except_fields,
    history, max_rejected_share, deletion_vectors, filtered_by) or ``replace``
    (table, keys). A field's ``type`` is string (default), long, int,
    decimal(p,s), date or timestamp; ``mask`` is sha256, digits, or
    {digits: {keep: n}}. Each expectation has a name, a Spark SQL condition and
    an action: warn, drop or fail. Bronze, silver, quarantine, their checks and
    sensors are built from it as from a Python declaration.
    """

    name: str
    description: str
    source: dict[str, dict[str, Any]]
    fields: list[FieldModel]
    silver: dict[str, dict[str, Any]] | None = None
    expectations: list[ExpectationModel] = []
    allow_full_refresh: bool = False

    def feed(self, where: str = "defs.yaml"):
        """The :class:`~medallion_assets.feeds.Feed` these attributes declare.

        Args:
            where: the file, for errors.

        Raises:
            FeedYamlError: an attribute that is not the feed's, or a setting the
                declaration refuses (its :class:`FeedDeclarationError`, with the file).
        """
        source = _one_of(
            where,
            "source",
            self.source,
            {"landing_files": LandingFiles, "kafka_topic": KafkaTopic, "landing_snapshots": LandingSnapshots},
        )
        silver = (
            None
            if self.silver is None
            else _one_of(where, "silver", self.silver, {"apply_changes": ApplyChanges, "replace": Replace})
        )
        fields = tuple(
            Field(
                f.name,
                spark_type(f.type, where=where, setting=f"fields[{f.name}].type"),
                description=f.description,
                nullable=f.nullable,
                values=tuple(f.values),
                mask=_mask(f.mask, where, f"fields[{f.name}].mask"),
            )
            for f in self.fields
        )
        try:
            expectations = tuple(Expectation(e.name, e.condition, e.action, e.description) for e in self.expectations)
            return Feed(
                name=self.name,
                description=self.description,
                source=source,
                fields=fields,
                silver=silver,
                expectations=expectations,
                allow_full_refresh=self.allow_full_refresh,
            )
        except FeedYamlError:
            raise
        except FeedDeclarationError as error:
            raise FeedYamlError(f"{where}: {error}") from error
        except ValueError as error:  # an expectation's name or action
            raise FeedYamlError(f"{where}: expectations: {error}") from error

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        """The feed's own pieces, from the factories a Python declaration goes through.

        For a Dagster project that loads its ``defs/`` folder itself; this project's
        definitions read the feed through :func:`yaml_feeds` instead, and build it once.
        The resources (``spark``, ``lake``, ``kafka``, ``io_manager``) are the top-level
        Definitions' (:func:`medallion_assets.definitions.resources_for`), as for any
        component of a defs folder.
        """
        feeds = (self.feed(str(context.path)),)
        return dg.Definitions(
            assets=[*bronze_assets(feeds, landed_by={}), *silver_assets(feeds)],
            asset_checks=[*feed_checks(feeds), *stream_health_checks(feeds)],
            sensors=stream_sensors(feeds),
        )


def spark_type(name: str, *, where: str = "defs.yaml", setting: str = "type"):
    """The Spark type a YAML type name stands for (:data:`TYPE_NAMES`).

    Raises:
        FeedYamlError: any other name, with the file, the setting and the names to use.

    Example:
        >>> spark_type("decimal(12, 2)")
        DecimalType(12,2)
    """
    simple = {"string": StringType, "long": LongType, "int": IntegerType, "date": DateType, "timestamp": TimestampType}
    text = str(name).strip().lower()
    if text in simple:
        return simple[text]()
    decimal = _DECIMAL.match(text)
    if decimal and 0 < int(decimal[1]) <= 38 and int(decimal[2]) <= int(decimal[1]):
        return DecimalType(int(decimal[1]), int(decimal[2]))
    raise FeedYamlError(
        f"{where}: {setting} = {name!r} is not a field type: use one of {', '.join(TYPE_NAMES)} "
        "(decimal precision p from 1 to 38, scale s at most p)"
    )


def _mask(mask: Any, where: str, setting: str):
    if mask is None or mask == "sha256":
        return mask
    if mask == "digits":
        return MaskDigits()
    keep = mask.get("digits", {}).get("keep") if isinstance(mask, Mapping) and len(mask) == 1 else None
    if isinstance(keep, int) and not isinstance(keep, bool) and keep >= 0 and len(mask["digits"]) == 1:
        return MaskDigits(keep=keep)
    raise FeedYamlError(
        f"{where}: {setting} = {mask!r} is not a mask: use sha256 (the value's SHA-256), digits "
        "(every digit as *), or {digits: {keep: n}} (the first n characters kept)"
    )


def _one_of(where: str, setting: str, given: Mapping[str, Mapping[str, Any]], kinds: Mapping[str, type]):
    """The one dataclass ``given`` names (``{kind: {attribute: value}}``), its lists as tuples."""
    if len(given) != 1 or next(iter(given)) not in kinds:
        raise FeedYamlError(
            f"{where}: {setting} = {dict(given)!r} cannot work: give exactly one of "
            f"{', '.join(kinds)}, e.g. {setting}: {{{next(iter(kinds))}: {{...}}}}"
        )
    [(kind, attributes)] = given.items()
    cls = kinds[kind]
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = [name for name in attributes or {} if name not in allowed]
    if unknown:
        raise FeedYamlError(
            f"{where}: {setting}.{kind} has no attribute {', '.join(unknown)}: use {', '.join(allowed)}"
        )
    try:
        return cls(
            **{name: tuple(value) if isinstance(value, list) else value for name, value in (attributes or {}).items()}
        )
    except TypeError as error:  # a required attribute left out
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
            and f.name not in (attributes or {})
        ]
        raise FeedYamlError(
            f"{where}: {setting}.{kind} needs {', '.join(missing) or 'other attributes'} ({error})"
        ) from error


def feed_from_yaml(path: Path):
    """The :class:`~medallion_assets.feeds.Feed` of the first ``FeedComponent`` in a ``defs.yaml``.

    Raises:
        FeedYamlError: the file declares no feed, or not one that can work (file, field, fix).
    """
    feeds = list(_feeds_in_file(Path(path)))
    if not feeds:
        raise FeedYamlError(f"{path}: declares no {COMPONENT_TYPE}: start it with 'type: {COMPONENT_TYPE}'")
    return feeds[0]


def yaml_feeds(folder: str | Path) -> Iterator[tuple[str, Any]]:
    """``(file, Feed)`` for every ``FeedComponent`` in the ``defs.yaml`` files under ``folder``, in path order.

    Other components' files are left alone (this project does not load them).

    Raises:
        FeedYamlError: a feed that cannot be read (file, field, fix).
    """
    for path in sorted(p for name in DEFS_FILE_NAMES for p in Path(folder).rglob(name)):
        for feed in _feeds_in_file(path):
            yield str(path), feed


def _feeds_in_file(path: Path) -> Iterator[Any]:
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as error:
        raise FeedYamlError(f"{path}: is not YAML ({error}): fix its syntax") from error
    for document in documents:
        if not isinstance(document, Mapping) or document.get("type") != COMPONENT_TYPE:
            continue
        attributes = document.get("attributes")
        if not isinstance(attributes, Mapping):
            raise FeedYamlError(
                f"{path}: attributes = {attributes!r} cannot work: give the feed's attributes "
                "(name, description, source, fields, silver, expectations) under 'attributes:'"
            )
        try:
            model = FeedComponent.model().model_validate(attributes)
        except ValidationError as error:
            raise FeedYamlError(_validation_message(path, error)) from error
        component = FeedComponent.resolve_from_model(dg.ResolutionContext.default(), model)
        yield component.feed(str(path))


def _validation_message(path: Path, error: ValidationError) -> str:
    # Dagster's models accept a template string wherever a list or mapping goes: that branch's
    # complaint ("should be a valid string") says nothing to a user who wrote a list.
    problems = [p for p in error.errors() if not (p["loc"] and p["loc"][-1] == "str" and len(error.errors()) > 1)]
    lines = []
    for problem in problems or error.errors():
        parts = [str(part) for part in problem["loc"] if not _TYPE_NAME.match(str(part))]
        setting = ".".join(parts) or "attributes"
        if problem["type"] == "extra_forbidden":
            lines.append(
                f"{path}: {setting} is not an attribute here: remove it or correct its spelling "
                "(docs/adding-a-feed.md lists the attributes; in {a: b, c: d} quote a value that holds a comma)"
            )
        elif problem["type"] == "missing":
            lines.append(f"{path}: {setting} is missing: add it (docs/adding-a-feed.md lists the attributes)")
        else:
            lines.append(f"{path}: {setting} = {problem.get('input')!r} cannot work: {problem['msg']}")
    return "\n".join(dict.fromkeys(lines))


_TYPE_NAME = re.compile(r"^(str|int|bool|float|list\[.*\]|dict\[.*\]|[A-Z]\w*Model|function-.*)$")
