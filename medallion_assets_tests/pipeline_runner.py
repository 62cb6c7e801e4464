"""One whole-graph Dagster run in a process of its own, for tests that switch engines.

``python -m medallion_assets_tests.pipeline_runner`` lands the simulator's next
batch, then materializes every asset but the landing simulator (with the
asset checks, every month of the partitioned gold table in one run) on the
persistent instance of ``DAGSTER_HOME`` and the lake of ``MEDALLION_LAKE_ROOT``,
on the deployment ``MEDALLION_DEPLOYMENT`` and the engine ``MEDALLION_DELTA_ENGINE`` pick. It prints one JSON line: the
Delta engine each materialization recorded, and the checks that failed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    scale_factor, batches, seed = float(argv[0]), int(argv[1]), int(argv[2])
    from dagster import DagsterInstance

    from medallion_assets import simulate
    from medallion_assets.definitions import build_definitions
    from medallion_assets_tests.test_end_to_end import materialize_everything

    lake = Path(os.environ["MEDALLION_LAKE_ROOT"])
    simulate.land_next_batch(lake / "landing", scale_factor=scale_factor, batches=batches, seed=seed)
    with DagsterInstance.get() as instance:
        result = materialize_everything(build_definitions(os.environ.get("MEDALLION_DEPLOYMENT", "local")), instance)
        engines = {
            event.asset_key.to_user_string(): event.materialization.metadata["delta/engine"].value
            for event in result.get_asset_materialization_events()
            if "delta/engine" in event.materialization.metadata
        }
        failed = [e.check_name for e in result.get_asset_check_evaluations() if not e.passed]
    print(json.dumps({"engines": engines, "failed_checks": failed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
