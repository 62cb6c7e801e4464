"""``medallion-assets check``: gate a CI job on the asset checks, with a JUnit XML report.

The command builds a throwaway lake from a sample landing (the simulator's
noisy TPC-H delivery, or a folder the user names), materializes everything the
definitions hold (or a ``--select``\\ ion of it) with its asset checks in ONE
in-process Dagster run, and reports every check evaluation of that run: a
table on stdout and, with ``--junit-xml``, a JUnit file CI systems render.

Dagster's own commands are not enough for this: ``dagster asset materialize``
and ``dg launch`` start a run but report no check results, and a failed
non-blocking ERROR check leaves the run successful, so their exit status says
nothing about the checks. The run here is Dagster's ``materialize``; this module
only prepares the lake, reads the run's events and turns them into a report
and an exit code (:data:`EXIT_PASSED` and the others below).

Nothing here runs at import.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dagster import AssetKey, AssetSelection, DagsterError, DagsterEventType, DagsterInstance, materialize

from medallion_assets.definitions import build_definitions
from medallion_assets.jobs import all_partitions_tags
from medallion_assets.project import pipeline_hooks, pipeline_modules
from medallion_assets.settings import SettingsError, read_settings

if TYPE_CHECKING:
    from dagster import AssetSelection, Definitions, ExecuteInProcessResult

#: No ERROR check failed and the run succeeded (failed WARN checks do not count).
EXIT_PASSED = 0
#: At least one check of severity ERROR failed; stderr names each.
EXIT_CHECK_FAILED = 1
#: The command was used wrongly (argparse's own code too): a bad option, a selection that selects nothing,
#: a setting the project cannot use (named as the definitions name it).
EXIT_USAGE = 2
#: The run itself failed (a step raised, Spark did not start, the sample could not be built);
#: the JUnit file is still written with what the run reported.
EXIT_RUN_FAILED = 3

#: The error Dagster raises in a step whose blocking check failed with severity ERROR: a
#: check failure the report already holds, not a failure of the run.
BLOCKING_CHECK_FAILED = "DagsterAssetCheckFailedError"

#: Scale factor of the simulated sample: the smallest whose TPC-H keys are unique (at 0.001
#: tpchgen repeats partsupp keys, which the blocking key check rightly refuses).
DEFAULT_SCALE_FACTOR = 0.01
#: Seed of the simulated sample's noise.
DEFAULT_SEED = 7

#: The function a pipeline module defines to offer a sample landing: ``land_sample(landing,
#: *, scale_factor, seed)`` fills the empty folder ``landing`` with files of its feeds, every
#: batch at once (TPC-H's is the simulator's whole delivery).
SAMPLE_HOOK = "land_sample"

#: The JUnit suite that holds the run's own errors (failed steps), beside one suite per asset.
RUN_SUITE = "dagster run"

Status = Literal["passed", "failed", "not evaluated"]


class CheckGateUsageError(ValueError):
    """An option of ``medallion-assets check`` that cannot work; the message names it, its value and the fix."""


@dataclass(frozen=True)
class CheckOutcome:
    """What became of one asset check in the run.

    Attributes:
        asset: The asset key, as Dagster writes it (``silver/orders``).
        check: The check's name.
        severity: ``ERROR`` or ``WARN``, as the evaluation said; ``None`` for a check that did not run.
        status: ``passed``, ``failed``, or ``not evaluated`` (its step did not run: an upstream failed or was blocked).
        metadata: The evaluation's metadata, each value as text (``failing_rows``, ``passing_rows``, ...).
        description: The check's own description, if it has one.
    """

    asset: str
    check: str
    severity: str | None
    status: Status
    metadata: Mapping[str, str]
    description: str | None = None

    @property
    def fails_the_gate(self) -> bool:
        """Whether this outcome makes the command fail: a failed check of severity ERROR."""
        return self.status == "failed" and self.severity == "ERROR"

    def details(self) -> str:
        """The single-line metadata on one line, ``key=value, ...``; multi-line values are :meth:`tables`."""
        return ", ".join(f"{key}={value}" for key, value in self.metadata.items() if "\n" not in value.strip())

    def tables(self) -> str:
        """The multi-line metadata values (Markdown tables), each under its key, indented; empty if none."""
        return "\n".join(
            f"  {key}:\n" + "\n".join(f"    {line}" for line in value.strip().splitlines())
            for key, value in self.metadata.items()
            if "\n" in value.strip()
        )


@dataclass(frozen=True)
class StepError:
    """A step of the run that raised (anything but a blocked check).

    Attributes:
        step: Dagster's step key (the asset's op, e.g. ``silver__orders_and_lineitem``), or ``run`` for the run itself.
        error_type: The exception's class name.
        message: The exception's message.
        trace: The error as Dagster recorded it, with its stack and causes.
    """

    step: str
    error_type: str
    message: str
    trace: str


@dataclass(frozen=True)
class GateReport:
    """Every check outcome of one run and the run's own errors.

    Attributes:
        outcomes: One per check the run was to evaluate, sorted by asset and check.
        step_errors: The steps that raised, in the order the run reported them.
        seconds: Wall time of the run.
    """

    outcomes: tuple[CheckOutcome, ...]
    step_errors: tuple[StepError, ...]
    seconds: float

    @property
    def exit_code(self) -> int:
        """:data:`EXIT_RUN_FAILED` if a step raised, else :data:`EXIT_CHECK_FAILED` if an ERROR check failed, else 0."""
        if self.step_errors:
            return EXIT_RUN_FAILED
        if any(outcome.fails_the_gate for outcome in self.outcomes):
            return EXIT_CHECK_FAILED
        return EXIT_PASSED

    def count(self, status: Status, *, severity: str | None = None) -> int:
        """How many outcomes have ``status`` (and ``severity``, when given)."""
        return sum(1 for o in self.outcomes if o.status == status and severity in (None, o.severity))


# ---------------------------------------------------------------- the lake and the run


def prepare_landing(
    lake_root: Path, *, landing: Path | None, scale_factor: float, seed: int, samples: Sequence[Callable]
) -> None:
    """Fill ``<lake_root>/landing``: a copy of ``landing``, or the pipelines' samples (the simulator's whole delivery).

    Args:
        lake_root: The lake being built; its ``landing`` folder must not exist yet.
        landing: A landing folder laid out as the landing contract says, copied as it is;
            ``None`` for the pipelines' samples.
        scale_factor: TPC-H scale factor of the simulator's sample.
        seed: Seed of the sample's noise.
        samples: The pipelines' :data:`SAMPLE_HOOK` functions, each called when ``landing`` is ``None``.
    """
    target = lake_root / "landing"
    if landing is not None:
        shutil.copytree(landing, target)
        return
    for land_sample in samples:
        land_sample(target, scale_factor=scale_factor, seed=seed)


def resolve_selection(definitions: Definitions, *, select: str | None) -> AssetSelection:
    """``select`` (Dagster's asset selection syntax) as an :class:`AssetSelection`; every asset when ``None``.

    The selection is widened to whole steps: an asset of a step that writes several
    tables at once (a silver table and its quarantine) brings the step's other tables,
    since Dagster cannot run part of such a step.

    Raises:
        CheckGateUsageError: The text does not parse, or selects no asset of the definitions.
    """
    if select is None:
        return AssetSelection.all()
    try:
        selection = AssetSelection.from_string(select)
        selected = selection.resolve(definitions.get_repository_def().asset_graph)
    except (DagsterError, ValueError) as error:
        raise CheckGateUsageError(
            f"--select {select!r} is not an asset selection ({error}); write it in Dagster's selection syntax, "
            "e.g. 'key:\"silver/orders\"+' or 'group:gold'"
        ) from error
    if not selected:
        raise CheckGateUsageError(
            f"--select {select!r} selects no asset of the definitions; `dagster asset list -m "
            "medallion_assets.definitions` lists their keys"
        )
    return selection | selection.required_multi_asset_neighbors()


def partition_range_tags(definitions: Definitions, *, selection: AssetSelection) -> dict[str, str]:
    """Run tags that make the one run cover every partition of the selected partitioned assets (none if none is).

    Raises:
        CheckGateUsageError: The selected assets are partitioned in more than one way, which one run cannot cover.
    """
    graph = definitions.get_repository_def().asset_graph
    partitioned = {
        key.to_user_string(): partitions
        for key in selection.resolve(graph)
        if (partitions := graph.get(key).partitions_def) is not None
    }
    kinds = {repr(p) for p in partitioned.values()}
    if len(kinds) > 1:
        raise CheckGateUsageError(
            f"the selected assets are partitioned in {len(kinds)} different ways ({', '.join(sorted(partitioned))}), "
            "and one run covers only one partitions definition; narrow --select to one of them"
        )
    return all_partitions_tags(next(iter(partitioned.values()))) if partitioned else {}


def run_checks(definitions: Definitions, *, selection: AssetSelection) -> GateReport:
    """Materialize ``selection`` of ``definitions`` with its asset checks in one in-process run, and report them.

    The run uses an ephemeral Dagster instance and the definitions' own
    resources (so the lake is whatever ``MEDALLION_LAKE_ROOT`` says while it runs).

    Args:
        definitions: The project's definitions (:func:`medallion_assets.definitions.build_definitions`).
        selection: What to materialize (:func:`resolve_selection`).

    Returns:
        The outcome of every check the selection holds, and the steps that raised.
    """
    graph = definitions.get_repository_def().asset_graph
    planned = {key: graph.get_check_spec(key) for key in selection.resolve_checks(graph)}
    tags = partition_range_tags(definitions, selection=selection)
    started = time.monotonic()
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            # The project's definitions hold no cacheable assets, the one kind materialize does not take.
            [*(definitions.assets or ()), *(definitions.asset_checks or ())],  # type: ignore[list-item]
            resources=definitions.resources,
            instance=instance,
            selection=selection,
            tags=tags,
            raise_on_error=False,
            # The run's log on stderr from INFO up: what the steps say, not Dagster's every event.
            run_config={"loggers": {"console": {"config": {"log_level": "INFO"}}}},
        )
    return report_of(result, planned=planned, seconds=time.monotonic() - started)


def report_of(result: ExecuteInProcessResult, *, planned: Mapping[Any, Any], seconds: float) -> GateReport:
    """The :class:`GateReport` of a finished run.

    Args:
        result: What ``materialize`` returned.
        planned: Check key -> :class:`dagster.AssetCheckSpec` of every check the run was to evaluate;
            one without an evaluation is reported ``not evaluated``.
        seconds: Wall time of the run.
    """
    outcomes: dict[Any, CheckOutcome] = {}
    for evaluation in result.get_asset_check_evaluations():
        spec = planned.get(evaluation.asset_check_key)
        outcomes[evaluation.asset_check_key] = CheckOutcome(
            asset=evaluation.asset_key.to_user_string(),
            check=evaluation.check_name,
            severity=evaluation.severity.value,
            status="passed" if evaluation.passed else "failed",
            metadata={key: _text(value.value) for key, value in evaluation.metadata.items()},
            description=evaluation.description or (spec.description if spec is not None else None),
        )
    for key, spec in planned.items():
        if key not in outcomes:
            outcomes[key] = CheckOutcome(
                asset=key.asset_key.to_user_string(),
                check=key.name,
                severity=None,
                status="not evaluated",
                metadata={},
                description=spec.description,
            )
    errors = []
    for event in result.all_events:
        if event.event_type == DagsterEventType.STEP_FAILURE:
            error = event.step_failure_data.error
            if error is not None and error.cls_name != BLOCKING_CHECK_FAILED:
                errors.append(
                    StepError(
                        step=event.step_key or "run",
                        error_type=error.cls_name or "Error",
                        message=error.message.strip(),
                        trace=error.to_string(),
                    )
                )
    if not result.success and not errors and not any(o.status == "failed" for o in outcomes.values()):
        # The run failed outside any step (e.g. it could not start); name what Dagster said.
        failure = next((e for e in result.all_events if e.event_type == DagsterEventType.RUN_FAILURE), None)
        message = failure.message if failure is not None and failure.message else "the run failed outside its steps"
        errors.append(StepError(step="run", error_type="RunFailure", message=message, trace=message))
    ordered = tuple(sorted(outcomes.values(), key=lambda o: (o.asset, o.check)))
    return GateReport(outcomes=ordered, step_errors=tuple(errors), seconds=seconds)


def _text(value: Any) -> str:
    """A metadata value (``MetadataValue.value``) as text.

    JSON for numbers and containers, an asset key as Dagster writes it.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, AssetKey):
        return value.to_user_string()
    if value is None or isinstance(value, (bool, int, float, list, dict)):
        return json.dumps(value, default=str)
    return str(value)


def gate(
    *,
    lake_root: Path,
    select: str | None = None,
    landing: Path | None = None,
    scale_factor: float = DEFAULT_SCALE_FACTOR,
    seed: int = DEFAULT_SEED,
) -> GateReport:
    """Build a lake at ``lake_root`` from a sample landing and run the checks on it.

    The definitions are the project's (:func:`~medallion_assets.definitions.build_definitions`
    for the environment's settings, Kafka feeds only where Kafka is configured, without the demo's landing simulator
    asset, since the landing is filled here), built and run with the settings of the environment,
    ``MEDALLION_LAKE_ROOT`` replaced by ``lake_root``.

    Args:
        lake_root: An empty or missing folder for the lake; left as the run leaves it.
        select: Dagster asset selection text; everything when ``None``.
        landing: A landing folder to copy, instead of the pipelines' samples (:data:`SAMPLE_HOOK`;
            required without one, as with ``MEDALLION_DEMO=off``: the simulator's is TPC-H's).
        scale_factor: TPC-H scale factor of the simulator's sample.
        seed: Seed of the sample's noise.

    Raises:
        CheckGateUsageError: ``select`` selects nothing or cannot run in one run; no ``landing``
            and no pipeline's sample (as with ``MEDALLION_DEMO=off``).
    """
    # The settings checked as the definitions check them (SettingsError names a wrong one);
    # the demo's simulator asset is left out whatever MEDALLION_SIMULATOR says: the landing is filled here.
    settings = read_settings(overrides={"MEDALLION_LAKE_ROOT": str(lake_root)})
    samples = pipeline_hooks(pipeline_modules(settings.pipeline_packages), SAMPLE_HOOK)
    if landing is None and not samples:
        raise CheckGateUsageError(
            f"no pipeline offers a sample landing ({SAMPLE_HOOK}(); the project's own do, and MEDALLION_DEMO=off "
            "leaves them out): give --landing DIR, a landing folder your feeds' files are in"
        )
    definitions = build_definitions(
        settings.deployment,
        simulator=False,
        kafka=settings.kafka,
        pipelines=settings.pipeline_packages,
        settings=settings,
    )
    selection = resolve_selection(definitions, select=select)
    partition_range_tags(definitions, selection=selection)  # refuse before the sample is built
    lake_root.mkdir(parents=True, exist_ok=True)
    prepare_landing(lake_root, landing=landing, scale_factor=scale_factor, seed=seed, samples=samples)
    return run_checks(definitions, selection=selection)


# ---------------------------------------------------------------- reports


def junit_xml(report: GateReport) -> ET.ElementTree:
    """The report as JUnit XML: one ``<testsuite>`` per asset, one ``<testcase>`` per check.

    A failed ERROR check is a ``<failure>``; a failed WARN check and a check that
    did not run are ``<skipped>`` with a message saying which (CI test reports show
    skipped cases, and do not fail on them); a step that raised is an ``<error>``
    in the suite :data:`RUN_SUITE`. Each evaluated check's metadata is its
    ``<system-out>`` (a failure's, its body).
    """
    root = ET.Element("testsuites", name="medallion-assets check")
    by_asset: dict[str, list[CheckOutcome]] = {}
    for outcome in report.outcomes:
        by_asset.setdefault(outcome.asset, []).append(outcome)
    for asset, outcomes in by_asset.items():
        suite = ET.SubElement(root, "testsuite", name=asset)
        for outcome in outcomes:
            case = ET.SubElement(suite, "testcase", classname=asset, name=outcome.check)
            if outcome.fails_the_gate:
                failure = ET.SubElement(
                    case, "failure", type="ERROR", message=f"ERROR check failed: {outcome.details()}"
                )
                failure.text = _describe(outcome)
            elif outcome.status == "failed":
                ET.SubElement(
                    case, "skipped", message=f"WARN check failed (does not fail the gate): {outcome.details()}"
                )
            elif outcome.status == "not evaluated":
                ET.SubElement(
                    case,
                    "skipped",
                    message="not evaluated: its step did not run (see the run's errors and failed checks)",
                )
            if outcome.status != "not evaluated" and not outcome.fails_the_gate:
                ET.SubElement(case, "system-out").text = _describe(outcome)
        _count(suite)
    if report.step_errors:
        suite = ET.SubElement(root, "testsuite", name=RUN_SUITE)
        for step_error in report.step_errors:
            case = ET.SubElement(suite, "testcase", classname=RUN_SUITE, name=step_error.step)
            error = ET.SubElement(case, "error", type=step_error.error_type, message=step_error.message)
            error.text = step_error.trace
        _count(suite)
    _count(root, suites=True)
    root.set("time", f"{report.seconds:.1f}")
    ET.indent(root)
    return ET.ElementTree(root)


def _describe(outcome: CheckOutcome) -> str:
    lines = [f"{outcome.asset} {outcome.check}: {outcome.status} (severity {outcome.severity})"]
    if outcome.description:
        lines.append(outcome.description)
    lines.extend(f"{key}: {value}" for key, value in outcome.metadata.items())
    return "\n".join(lines)


def _count(element: ET.Element, *, suites: bool = False) -> None:
    cases = element.iter("testcase") if suites else element.findall("testcase")
    cases = list(cases)
    element.set("tests", str(len(cases)))
    for tag, attribute in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
        element.set(attribute, str(sum(1 for case in cases if case.find(tag) is not None)))


def write_junit(report: GateReport, *, path: Path) -> None:
    """Write :func:`junit_xml` of ``report`` to ``path`` (UTF-8, with an XML declaration), making its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    junit_xml(report).write(path, encoding="utf-8", xml_declaration=True)


def summary_table(report: GateReport) -> str:
    """The report as a short text table, one line per check, then the totals."""
    header = ("asset", "check", "severity", "result")
    rows = [
        (o.asset, o.check, o.severity or "-", o.status if o.status != "failed" else f"FAILED {o.details()}")
        for o in report.outcomes
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]
    lines = [
        "  ".join([*(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=False)), row[3]]).rstrip()
        for row in [header, *rows]
    ]
    lines.append(
        f"{len(report.outcomes)} checks: {report.count('passed')} passed, "
        f"{report.count('failed', severity='ERROR')} failed (ERROR), "
        f"{report.count('failed', severity='WARN')} failed (WARN), {report.count('not evaluated')} not evaluated; "
        f"{len(report.step_errors)} step errors; {report.seconds:.0f} s"
    )
    return "\n".join(lines)


def _run_error_report(error: BaseException, *, seconds: float) -> GateReport:
    """A report holding only ``error``, for a failure before or around the run (the sample, the definitions)."""
    trace = "".join(traceback.format_exception(error))
    return GateReport(
        outcomes=(),
        step_errors=(StepError(step="run", error_type=type(error).__name__, message=str(error), trace=trace),),
        seconds=seconds,
    )


# ---------------------------------------------------------------- command line


def add_check_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``check`` command to an argparse sub-parser collection.

    Args:
        subparsers: What ``ArgumentParser.add_subparsers()`` returned.

    Returns:
        The new parser; its ``func`` default is :func:`check_command`.
    """
    parser = subparsers.add_parser(
        "check",
        help="materialize everything on a throwaway lake and gate on the asset checks (JUnit XML)",
        description=(
            "Build a throwaway lake from a sample landing, materialize every asset with its checks in one "
            "in-process Dagster run, print each check's result and exit "
            f"{EXIT_PASSED} (no ERROR check failed), {EXIT_CHECK_FAILED} (an ERROR check failed), "
            f"{EXIT_USAGE} (bad options) or {EXIT_RUN_FAILED} (the run failed)."
        ),
    )
    parser.add_argument(
        "--junit-xml", type=Path, default=None, metavar="FILE", help="write every check's result to FILE as JUnit XML"
    )
    parser.add_argument(
        "--select",
        default=None,
        metavar="SELECTION",
        help="materialize only this Dagster asset selection (e.g. 'key:\"silver/orders\"+', "
        "'group:silver') with its checks; default: everything",
    )
    parser.add_argument(
        "--landing",
        type=Path,
        default=None,
        metavar="DIR",
        help="copy DIR (laid out as docs/landing-contract.md says) as the lake's landing, "
        "instead of the simulator's sample",
    )
    parser.add_argument(
        "--lake",
        type=Path,
        default=None,
        metavar="DIR",
        help="build the lake in DIR (empty or missing) and keep it; default: a temporary folder, removed at the end",
    )
    parser.add_argument(
        "--scale-factor",
        type=float,
        default=None,
        help=f"TPC-H scale factor of the simulator's sample (default {DEFAULT_SCALE_FACTOR})",
    )
    parser.add_argument("--seed", type=int, default=None, help=f"seed of the sample's noise (default {DEFAULT_SEED})")
    parser.set_defaults(func=check_command)
    return parser


def _check_options(args: argparse.Namespace) -> None:
    if args.landing is not None:
        if not args.landing.is_dir():
            raise CheckGateUsageError(f"--landing {str(args.landing)!r} is not a folder; name a landing folder")
        if args.scale_factor is not None or args.seed is not None:
            raise CheckGateUsageError(
                "--scale-factor and --seed shape the simulator's sample, which --landing "
                f"{str(args.landing)!r} replaces; leave them out or drop --landing"
            )
    if args.lake is not None and args.lake.exists() and (not args.lake.is_dir() or any(args.lake.iterdir())):
        raise CheckGateUsageError(
            f"--lake {str(args.lake)!r} is not an empty folder; the gate builds a fresh lake: "
            "name a new or empty folder"
        )
    if args.scale_factor is not None and args.scale_factor <= 0:
        raise CheckGateUsageError(f"--scale-factor {args.scale_factor} must be positive, e.g. {DEFAULT_SCALE_FACTOR}")


def check_command(args: argparse.Namespace) -> int:
    """Run the ``check`` command; returns the process exit code (:data:`EXIT_PASSED` and the others)."""
    try:
        _check_options(args)
    except CheckGateUsageError as error:
        print(f"medallion-assets check: {error}", file=sys.stderr)
        return EXIT_USAGE
    lake_root = args.lake if args.lake is not None else Path(tempfile.mkdtemp(prefix="medallion-check-"))
    started = time.monotonic()
    try:
        report = gate(
            lake_root=lake_root.resolve(),
            select=args.select,
            landing=args.landing,
            scale_factor=args.scale_factor if args.scale_factor is not None else DEFAULT_SCALE_FACTOR,
            seed=args.seed if args.seed is not None else DEFAULT_SEED,
        )
    except (CheckGateUsageError, SettingsError) as error:
        print(f"medallion-assets check: {error}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as error:  # noqa: BLE001 - the sample or the definitions failed: reported like a failed run
        traceback.print_exc()
        report = _run_error_report(error, seconds=time.monotonic() - started)
    finally:
        if args.lake is None:
            shutil.rmtree(lake_root, ignore_errors=True)
    return _report(report, junit_path=args.junit_xml, kept_lake=args.lake)


def _report(report: GateReport, *, junit_path: Path | None, kept_lake: Path | None) -> int:
    print(summary_table(report), flush=True)
    if junit_path is not None:
        write_junit(report, path=junit_path)
        print(f"JUnit XML: {junit_path}")
    if kept_lake is not None:
        print(f"lake kept in {kept_lake}")
    for outcome in report.outcomes:
        if outcome.status == "failed" and outcome.tables():
            print(f"{outcome.asset} {outcome.check}:\n{outcome.tables()}")
    for outcome in report.outcomes:
        if outcome.fails_the_gate:
            print(
                f"medallion-assets check: ERROR check {outcome.asset} {outcome.check} failed: {outcome.details()}",
                file=sys.stderr,
            )
    for step_error in report.step_errors:
        print(
            f"medallion-assets check: step {step_error.step} failed: {step_error.error_type}: {step_error.message}",
            file=sys.stderr,
        )
    return report.exit_code
