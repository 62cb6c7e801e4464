"""Pure DataFrame-in, DataFrame-out transforms, one module per layer.

Nothing here reads or writes storage: the assets hand these functions Spark
DataFrames and store what they return.
"""
