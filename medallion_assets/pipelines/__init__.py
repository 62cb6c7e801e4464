"""The project's pipelines: each module here declares feeds and the assets built on them.

A module holds :class:`~medallion_assets.feeds.Feed` declarations (bronze,
silver, quarantine, checks and sensors are built from them) and any Dagster
assets or checks of its own, such as gold tables; the definitions pick up
both from every module of this package (see docs/adding-a-feed.md). TPC-H,
in :mod:`medallion_assets.pipelines.tpch`, is one such pipeline.
"""
