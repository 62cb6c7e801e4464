"""TPC-H as a pipeline of the lakehouse: the landing contract's feeds (docs/landing-contract.md).

:mod:`.feeds` declares order events (landed files and Kafka), customer changes
and the reference snapshots; :mod:`.transforms` and :mod:`.silver` hold what
is TPC-H's own: nested order events with their line items, merged by order.
"""
