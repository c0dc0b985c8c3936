"""Reports of a results store (SPEC §8, §10.4): paired tables and plots
(:mod:`~sfg.experiments.report.paired`), diagnostics (:mod:`~sfg.experiments.report.diagnostics`),
attack damage (:mod:`~sfg.experiments.report.attacks`) and export to experiment trackers."""
