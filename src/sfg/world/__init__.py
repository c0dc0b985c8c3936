"""The world the engines run on: graphs (:mod:`~sfg.world.graphs`), outage processes
(:mod:`~sfg.world.outages`), real availability traces (:mod:`~sfg.world.traces`), datasets
(:mod:`~sfg.world.data`) and models (:mod:`~sfg.world.models`)."""
