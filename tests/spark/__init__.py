"""PySpark tests: archive, analysis, redrive, bulk publishing and the spark command line."""
