"""Reports of a results store (docs/concepts/statistics.md#paired-statistics, docs/concepts/statistics.md#report-additions): paired tables and plots
(:mod:`~sfg.experiments.report.paired`), diagnostics (:mod:`~sfg.experiments.report.diagnostics`),
attack damage (:mod:`~sfg.experiments.report.attacks`) and export to experiment trackers."""
