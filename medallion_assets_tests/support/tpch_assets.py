"""TPC-H's bronze assets, built from their declarations as the definitions build them.

For tests that run a few assets.
"""

from medallion_assets.assets.bronze import bronze_assets
from medallion_assets.pipelines.tpch.feeds import CUSTOMERS_CDC, ORDERS_KAFKA, ORDERS_RAW

orders_raw, orders_kafka, customers_cdc = bronze_assets([ORDERS_RAW, ORDERS_KAFKA, CUSTOMERS_CDC])
