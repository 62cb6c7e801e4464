"""medallion_assets: a lakehouse of bronze, silver and gold Delta tables as Dagster assets."""
