"""Plumbing shared by every layer: component strings (:mod:`~sfg.util.components`), input
limits (:mod:`~sfg.util.safety`), seeded streams (:mod:`~sfg.util.rng`), lazy package exports
(:mod:`~sfg.util.lazy`), the allocator settings (:mod:`~sfg.util.alloc`) and the installable
parts, with the one error for a missing one (:mod:`~sfg.util.extras`)."""
