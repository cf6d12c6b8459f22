"""Data-quality gates: the contract's expectations, run by Great Expectations on each batch a
job is about to publish.

A contract declares expectations per layer with a severity:

* ``warn`` records the failure and publishes;
* ``quarantine`` (row-level kinds, silver) routes the failing rows to the stream's quarantine
  table, with the expectation's name as the reason, and publishes the rest;
* ``fail`` stops before anything is published: the table's version does not move and the job
  raises :class:`~lakehouse.errors.QualityGateError` naming the table, the expectation and the
  observed value.

Each expectation compiles three ways from the one declaration: a Great Expectations (1.x)
expectation (the judge of every batch), a Spark predicate (which rows a ``quarantine``
expectation routes), and, for ``fail`` row checks, a Delta CHECK constraint on the table (so other
Delta writers are held to the contract too). Every validation goes to the results ledger (a
Delta table) and its full GX result to ``quality/validations`` for Data Docs.

Batches up to ``LAKEHOUSE_GX_PANDAS_MAX_ROWS`` rows (default 2,000,000) are validated by GX's
pandas engine on an Arrow copy of the columns the expectations read; bigger ones by GX's Spark
engine where they are. On a million rows the pandas engine took 0.4-0.5 s where the Spark engine
took 1.7-2.0 s, and a few narrow columns of two million rows fit in the driver. Where the
lakehouse's Spark server runs, the pandas engine runs in its validation service
(:mod:`lakehouse.quality.gx_service`), which imported GX once: a job then never imports GX for a
pandas-sized batch. GX is imported only when a gate runs, never when DAGs are parsed.


Modules, bottom up: :mod:`~lakehouse.quality.expectations` (compiling), :mod:`~lakehouse.quality.verdict`
(running a suite), :mod:`~lakehouse.quality.ledger` (recording), :mod:`~lakehouse.quality.gate` (the
gate a job passes), :mod:`~lakehouse.quality.gx_service` (GX imported once),
:mod:`~lakehouse.quality.reports` and :mod:`~lakehouse.quality.report_site` (Data Docs and the ledger's
results for people).
"""
