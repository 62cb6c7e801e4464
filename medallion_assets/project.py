"""The project's pipelines: their packages, modules and hooks, and the feeds they declare.

A pipeline package's modules are read for :class:`~medallion_assets.feeds.Feed`
objects and, through :func:`medallion_assets.components.yaml_feeds`, for the
``defs.yaml`` feed components in its folders. This module sits above both
:mod:`medallion_assets.feeds` (the vocabulary) and :mod:`medallion_assets.components`
(the YAML form), so the vocabulary never imports what builds on it. Only the
edges call it: the definitions, the check gate, the command-line tools and the
continuous job's configuration, where a name from outside becomes a feed.

Nothing is read at import.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable, Iterable
from functools import cache
from types import ModuleType

from medallion_assets.components import yaml_feeds
from medallion_assets.feeds import Feed, FeedDeclarationError, KafkaTopic
from medallion_assets.settings import pipeline_packages

#: Packages of pipelines besides the project's own, comma-separated.
PIPELINES_VARIABLE = "MEDALLION_PIPELINES"


def feeds_in(modules: Iterable[ModuleType], yaml_folders: Iterable[str] = ()) -> tuple[Feed, ...]:
    """Every :class:`Feed` defined at the top level of ``modules``, then in the ``defs.yaml`` files under
    ``yaml_folders`` (:func:`medallion_assets.components.yaml_feeds`), each once, names unique.

    Raises:
        FeedDeclarationError: two feeds share a name, or two silver tables do; a ``defs.yaml``
            feed that cannot be read (:class:`~medallion_assets.components.FeedYamlError`).
    """
    declared = [
        (module.__name__, value) for module in modules for value in vars(module).values() if isinstance(value, Feed)
    ]
    declared += [found for folder in yaml_folders for found in yaml_feeds(folder)]
    found: dict[str, Feed] = {}
    tables: dict[str, str] = {}
    for origin, value in declared:
        if found.get(value.name) is value:
            continue
        if value.name in found:
            raise FeedDeclarationError(
                f"two feeds are named {value.name!r} (one in {origin}): rename one; "
                "the name is its bronze table and checkpoint"
            )
        found[value.name] = value
        if value.silver_table is not None:
            if value.silver_table in tables:
                raise FeedDeclarationError(
                    f"feeds {tables[value.silver_table]!r} and {value.name!r} "
                    f"both declare silver.{value.silver_table}: "
                    "give each feed its own silver table"
                )
            tables[value.silver_table] = value.name
    return tuple(found.values())


def pipeline_modules(packages: Iterable[str] | None = None) -> tuple[ModuleType, ...]:
    """The modules of the pipeline packages (sub-packages' modules too), imported.

    Raises:
        FeedDeclarationError: a package named in ``MEDALLION_PIPELINES`` cannot be imported.
    """
    modules = []
    for package in pipeline_packages() if packages is None else packages:
        try:
            root = importlib.import_module(package)
        except ModuleNotFoundError as error:
            raise FeedDeclarationError(
                f"{PIPELINES_VARIABLE} names the package {package!r}, which cannot be imported ({error}): "
                "install it or put its folder on PYTHONPATH"
            ) from error
        modules.append(root)
        for info in pkgutil.walk_packages(getattr(root, "__path__", []), prefix=f"{package}."):
            modules.append(importlib.import_module(info.name))
    return tuple(modules)


def pipeline_hooks(modules: Iterable[ModuleType], name: str) -> tuple[Callable, ...]:
    """The functions called ``name`` that ``modules`` define, each once.

    A hook is how the machinery asks the pipelines for something it must not
    name itself (a demo producer, a sample landing); a package that re-exports
    a module's hook still offers it once.
    """
    return tuple(dict.fromkeys(hook for module in modules if callable(hook := getattr(module, name, None))))


def package_folders(modules: Iterable[ModuleType]) -> tuple[str, ...]:
    """The folders of the packages among ``modules`` that are not inside another's.

    Where ``defs.yaml`` feeds are found.
    """
    folders = [folder for module in modules for folder in getattr(module, "__path__", [])]
    return tuple(
        f
        for f in dict.fromkeys(folders)
        if not any(f != other and f.startswith(other.rstrip(os.sep) + os.sep) for other in folders)
    )


@cache
def _feeds_of(packages: tuple[str, ...]) -> tuple[Feed, ...]:
    modules = pipeline_modules(packages)
    return feeds_in(modules, package_folders(modules))


def project_feeds(packages: Iterable[str] | None = None) -> tuple[Feed, ...]:
    """The feeds the pipelines declare, in Python modules and in ``defs.yaml`` files (each package read once).

    Args:
        packages: the pipeline packages (default: the environment's,
            :func:`~medallion_assets.settings.pipeline_packages`).
    """
    return _feeds_of(tuple(pipeline_packages() if packages is None else packages))


def the_kafka_feed(feeds: Iterable[Feed] | None = None) -> Feed:
    """The one feed of ``feeds`` (or the project's) declared with :class:`~medallion_assets.feeds.KafkaTopic`.

    Raises:
        ValueError: there is not exactly one.
    """
    candidates = [f for f in (project_feeds() if feeds is None else feeds) if isinstance(f.source, KafkaTopic)]
    if len(candidates) != 1:
        raise ValueError(
            f"{len(candidates)} feeds are declared with KafkaTopic() "
            f"({', '.join(f.name for f in candidates) or 'none'}): "
            "name the one to read"
        )
    return candidates[0]
